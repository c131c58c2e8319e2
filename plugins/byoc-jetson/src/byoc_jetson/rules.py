"""Partition rules of the jetson target, applied in this order to each candidate region.

1. ``mac_required``: a region without a multiply-accumulate operator (Conv, ConvTranspose,
   Gemm, MatMul) is dropped: a TensorRT engine launch plus two host<->device copies cost more
   than the host spends on a few pointwise or data-movement nodes.
2. ``min_subgraph_size``: a region with fewer nodes than the option ``min_subgraph_size``
   (default 1: one MAC node alone is worth an engine) is dropped.
3. ``max_regions``: with the option ``max_regions = N``, only the first N surviving regions (in
   graph order) become engines; later ones are dropped. Each engine holds its own weights and
   activation memory, which a Jetson board shares with the CPU.

A dropped region's nodes go to the next target in priority order, else the host; the report
names the rule and the reason.

Rules receive only the region, so the options of the compile in progress are handed over by
the ``byoc_pre_partition`` hook (per thread: concurrent compiles do not mix).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from byoc.partition.types import Region, Rule
from byoc_jetson.options import DEFAULT_OPTIONS
from byoc_jetson.support import MAC_OPS, is_mac

_state = threading.local()


def begin_partition(options: Mapping[str, Any]) -> None:
    """Called from ``byoc_pre_partition``: the options and a fresh region count for this compile."""
    _state.options = dict(options)
    _state.kept = 0


def _options() -> Mapping[str, Any]:
    return getattr(_state, "options", DEFAULT_OPTIONS)


def mac_required(region: Region) -> Any:
    if any(is_mac(n) for n in region.nodes):
        return None
    ops = sorted({n.op_type for n in region.nodes})
    return (f"no multiply-accumulate operator ({', '.join(sorted(MAC_OPS))}) among {', '.join(ops)}: "
            "not worth a TensorRT engine")


def min_subgraph_size(region: Region) -> Any:
    minimum = int(_options().get("min_subgraph_size") or 1)
    if len(region.nodes) < minimum:
        return f"{len(region.nodes)} node(s), fewer than min_subgraph_size={minimum}"
    return None


def max_regions(region: Region) -> Any:
    limit = _options().get("max_regions")
    kept = getattr(_state, "kept", 0)
    if limit is not None and kept >= int(limit):
        return f"max_regions={int(limit)} engines already placed"
    _state.kept = kept + 1
    return None


RULES: list[Rule] = [
    Rule("mac_required", mac_required,
         "drop regions without a Conv, ConvTranspose, Gemm or MatMul (not worth an engine)"),
    Rule("min_subgraph_size", min_subgraph_size,
         "drop regions with fewer nodes than the option min_subgraph_size"),
    Rule("max_regions", max_regions,
         "keep at most the option max_regions regions (the first ones in graph order)"),
]


def rules() -> list[Rule]:
    return list(RULES)


__all__ = ["RULES", "begin_partition", "mac_required", "max_regions", "min_subgraph_size", "rules"]
