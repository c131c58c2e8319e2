"""Support verdicts, patterns, cycle-free regions, rules, outlining (core internals).

The types plugins exchange with the partitioner live in :mod:`byoc.contract`.
"""
