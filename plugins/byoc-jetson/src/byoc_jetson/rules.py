"""Partition rules of the jetson target, applied in this order to each candidate region.

1. ``mac_required``: a region without a multiply-accumulate operator (Conv, ConvTranspose,
   Gemm, MatMul) is dropped: a TensorRT engine launch plus two host<->device copies cost more
   than the host spends on a few pointwise or data-movement nodes.
2. ``min_subgraph_size``: a region with fewer nodes than the option ``min_subgraph_size``
   (default 1: one MAC node alone is worth an engine) is dropped.
3. ``max_regions``: with the option ``max_regions = N``, only the first N surviving regions (in
   graph order, per graph: the main graph and each subgraph are partitioned on their own) become
   engines; later ones are dropped. Each engine holds its own weights and
   activation memory, which a Jetson board shares with the CPU.

A dropped region's nodes go to the next target in priority order, else the host; the report
names the rule and the reason.

Each rule gets the region and the partitioning's :class:`byoc.contract.SupportContext`: the
validated options, and a scratch ``state`` dict fresh for each partitioning (the region count).
"""

from __future__ import annotations

from typing import Any

from byoc.contract import Region, Rule, SupportContext
from byoc_jetson.support import MAC_OPS, is_mac


def mac_required(region: Region, ctx: SupportContext) -> Any:
    if any(is_mac(n) for n in region.nodes):
        return None
    ops = sorted({n.op_type for n in region.nodes})
    return (f"no multiply-accumulate operator ({', '.join(sorted(MAC_OPS))}) among {', '.join(ops)}: "
            "not worth a TensorRT engine")


def min_subgraph_size(region: Region, ctx: SupportContext) -> Any:
    minimum = int(ctx.options.get("min_subgraph_size") or 1)
    if len(region.nodes) < minimum:
        return f"{len(region.nodes)} node(s), fewer than min_subgraph_size={minimum}"
    return None


def max_regions(region: Region, ctx: SupportContext) -> Any:
    limit = ctx.options.get("max_regions")
    kept = ctx.state.get("jetson.kept", 0)
    if limit is not None and kept >= int(limit):
        return f"max_regions={int(limit)} engines already placed"
    ctx.state["jetson.kept"] = kept + 1
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


__all__ = ["RULES", "mac_required", "max_regions", "min_subgraph_size", "rules"]
