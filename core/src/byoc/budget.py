"""Resource budgets, checked before any allocation.

One :class:`Budget` travels from the frontend through constant folding into the kernels,
so a tiny model cannot make byoc allocate gigabytes at compile or at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from byoc.errors import ResourceLimitError

GiB = 1 << 30


@dataclass(frozen=True)
class Budget:
    """Limits that protect the process; every default is generous for real models."""

    #: largest single tensor, in bytes (declared, folded or computed at run time)
    max_tensor_bytes: int = 4 * GiB
    #: sum of all initializer/constant bytes in a model
    max_total_bytes: int = 16 * GiB
    #: nodes in a model, subgraphs included
    max_nodes: int = 1_000_000
    #: nesting depth of subgraphs (If/Loop/Scan bodies)
    max_nesting: int = 64
    #: iterations of one Loop execution
    max_loop_iterations: int = 10_000_000

    def check_alloc(self, shape, dtype, what: str) -> None:
        """Raise :class:`ResourceLimitError` if a tensor of ``shape``/``dtype`` is too big.

        ``what`` names the node or tensor for the message. Negative dimensions are refused.
        """
        dims = [int(d) for d in shape]
        for d in dims:
            if d < 0:
                raise ResourceLimitError(f"{what}: negative dimension in shape {dims}")
        itemsize = np.dtype(dtype).itemsize if dtype is not None else 1
        nbytes = math.prod(dims) * itemsize
        if nbytes > self.max_tensor_bytes:
            raise ResourceLimitError(
                f"{what}: tensor of shape {dims} ({_fmt_bytes(nbytes)}) exceeds the budget "
                f"max_tensor_bytes={_fmt_bytes(self.max_tensor_bytes)}"
            )


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


DEFAULT_BUDGET = Budget()
