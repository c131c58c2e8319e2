"""How the reference kernels split range work.

A kernel that computes independent output ranges calls :func:`run_ranges`. Without a host
executor that lends its threads (:attr:`byoc.contract.HostExecutor.parallel`), the whole range
runs in one call on the calling thread; with one, the executor decides how to split it.
"""

from __future__ import annotations

from typing import Callable

_runner: Callable[..., None] | None = None


def use(runner: Callable[..., None] | None) -> None:
    """Let ``runner(fn, n_units, args, unit_cost)`` split the reference kernels' range work
    (``None``: serially). The process's host executor sets it when a plan is built for it."""
    global _runner
    _runner = runner


def run_ranges(fn: Callable, n_units: int, args: tuple, unit_cost: int = 1) -> None:
    """Call ``fn(*args, start, stop)`` so that the ranges cover ``[0, n_units)``.

    ``fn`` writes disjoint outputs per unit (a ``nogil`` Numba kernel, so that ranges may run on
    several threads); ``unit_cost`` is the number of elements one unit touches.
    """
    runner = _runner
    if runner is None or n_units < 2:
        fn(*args, 0, n_units)
    else:
        runner(fn, n_units, args, unit_cost)


def run_blocks(fn: Callable[[int, int], None], n: int, unit_cost: int = 1) -> None:
    """``fn(lo, hi)`` over blocks that cover ``range(n)`` (a Python callable; see :func:`run_ranges`)."""
    run_ranges(_call_block, n, (fn,), unit_cost)


def _call_block(fn, lo, hi):
    fn(lo, hi)
