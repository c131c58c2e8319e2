"""byoc-cpu's tuning: every measured threshold of its strategy chooser and thread policy, as data.

One table per CPU profile (``byoc_cpu/profiles/NAME.json``); ``BYOC_CPU_PROFILE`` picks one,
else ``default``. Code reads the values once, at import, through :data:`TABLE`; a test fails
when a numeric threshold is written as a constant in the code instead.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from byoc.contract import PluginError
from byoc.contract import environment as _env


def load(profile: str | None = None) -> dict[str, Any]:
    """The tuning table of ``profile`` (``BYOC_CPU_PROFILE``, else ``default``)."""
    name = profile or _env.get("BYOC_CPU_PROFILE") or "default"
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise PluginError(f"cpu: BYOC_CPU_PROFILE={name!r} is not a profile name")
    try:
        text = resources.files("byoc_cpu").joinpath("profiles", f"{name}.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PluginError(f"cpu: no tuning profile {name!r} (byoc_cpu/profiles/{name}.json)") from None
    return json.loads(text)


def sides(entry: dict[str, int]) -> dict[int, int]:
    """A table entry keyed by tile size (JSON keys are strings)."""
    return {int(k): int(v) for k, v in entry.items()}


#: the table in force
TABLE = load()
CONV, GEMM, THREADS, COST = TABLE["conv"], TABLE["gemm"], TABLE["threads"], TABLE["cost"]
KERNELS = TABLE["kernels"]

__all__ = ["CONV", "COST", "GEMM", "KERNELS", "TABLE", "THREADS", "load", "sides"]
