"""Build a :class:`byoc.partition.placement.Problem` from an IR graph: per-node costs on each
device (the target's ``byoc_cost`` hook on a one-node region, else byoc's FLOPs-and-bytes
model; always the model for a target whose device is absent), the bytes on every edge, and each target's declared bandwidth and launch overhead.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import onnx_ir as ir

from byoc.contract.types import Region, Target
from byoc.partition.placement import HOST, Problem, host_throughput
from byoc.plugins import Registry
from byoc.report.flops import estimate_flops


def value_bytes(v: ir.Value | None) -> float:
    """Bytes of a value from its static shape and dtype (symbolic dims count as 1; unknown: 0)."""
    if v is None or v.shape is None:
        return 0.0
    n = 1
    for d in v.shape:
        n *= d if isinstance(d, int) and d >= 0 else 1
    try:
        size = v.dtype.itemsize if v.dtype is not None else 4
    except Exception:  # pragma: no cover - exotic dtypes
        size = 4
    return float(n * size)


def node_flops(node: ir.Node) -> float:
    shapes: dict[str, Any] = {}
    for v in list(node.inputs) + list(node.outputs):
        if v is not None and v.name:
            shapes[v.name] = None if v.shape is None else tuple(
                d if isinstance(d, int) else None for d in v.shape)
    attrs = {k: a.value for k, a in node.attributes.items()}
    flops = estimate_flops(node.op_type, attrs, [v.name if v is not None else "" for v in node.inputs],
                           [v.name for v in node.outputs], shapes)
    return float(flops or 0)


def model_cost(node: ir.Node, flops_per_s: float, bytes_per_s: float) -> float:
    """byoc's own estimate: FLOPs over throughput plus bytes read and written over bandwidth."""
    moved = sum(value_bytes(v) for v in node.inputs if v is not None and v.const_value is None)
    moved += sum(value_bytes(v) for v in node.outputs)
    return node_flops(node) / flops_per_s + moved / bytes_per_s


def build_problem(nodes: Sequence[ir.Node], preds: Sequence[Sequence[int]], targets: Sequence[Target],
                  supported: Mapping[str, Sequence[bool]], registry: Registry | None,
                  options: Mapping[str, Mapping[str, Any]],
                  make_region: Callable[[Target, ir.Node], Region],
                  on_fault: Callable[[str, str, str], None]) -> Problem:
    """The placement problem of one graph; ``supported[target][i]`` says whether target may take node i."""
    index = {id(n): i for i, n in enumerate(nodes)}
    host_flops, host_bw = host_throughput()
    devices = [HOST] + [t.name for t in targets]
    cost = [[model_cost(node, host_flops, host_bw)] + [math.inf] * len(targets) for node in nodes]
    for d, t in enumerate(targets, start=1):
        # an absent device (an emulation, run because it was named) is priced by byoc's model at
        # the host's throughput: its hook would estimate hardware that is not here
        has_hook = registry is not None and bool(registry.hookimpls("byoc_cost", t.name)) and t.is_available()
        for i, node in enumerate(nodes):
            if not supported[t.name][i]:
                continue
            est = None
            if has_hook:
                est = _hook_cost(registry, t, make_region(t, node), options.get(t.name, {}), on_fault)
            cost[i][d] = est if est is not None else model_cost(node, t.flops or host_flops, host_bw)
    edge_bytes: dict[tuple[int, int], float] = {}
    in_bytes = [0.0] * len(nodes)
    out_bytes = [0.0] * len(nodes)
    for c, node in enumerate(nodes):
        seen: set[int] = set()
        for v in node.inputs:
            if v is None or id(v) in seen:
                continue
            seen.add(id(v))
            producer = v.producer()
            if producer is not None and id(producer) in index:
                key = (index[id(producer)], c)
                edge_bytes[key] = edge_bytes.get(key, 0.0) + value_bytes(v)
            elif v.const_value is None or v.is_graph_input():
                in_bytes[c] += value_bytes(v)
        out_bytes[c] = sum(value_bytes(v) for v in node.outputs if v.is_graph_output())
    return Problem(devices, [list(p) for p in preds], cost, edge_bytes, in_bytes, out_bytes,
                   [None] + [t.bandwidth for t in targets], [0.0] + [float(t.launch_overhead) for t in targets])


def _hook_cost(registry: Registry, target: Target, region: Region, options: Mapping[str, Any],
               on_fault: Callable[[str, str, str], None]) -> float | None:
    plugin, result, faults = registry.call_first("byoc_cost", target=target.name, region=region, options=options)
    for f in faults:
        on_fault(f.plugin, "byoc_cost", f"{f.message} (node {region.nodes[0].name!r})")
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not result >= 0 or result == math.inf:
        on_fault(plugin or "?", "byoc_cost", f"returned {result!r}, expected seconds as a finite float >= 0 "
                 f"(node {region.nodes[0].name!r})")
        return None
    return float(result)


__all__ = ["build_problem", "model_cost", "node_flops", "value_bytes"]
