"""Support verdicts, patterns, cycle-free regions, rules, outlining."""

from byoc.partition.patterns import Match, alt, any_value, const, op, tail
from byoc.partition.types import Artifact, Pattern, Region, Rule, SupportContext, Target

__all__ = [
    "Artifact",
    "Match",
    "Pattern",
    "Region",
    "Rule",
    "SupportContext",
    "Target",
    "alt",
    "any_value",
    "const",
    "op",
    "tail",
]
