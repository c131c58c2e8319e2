"""The placement report as plain data (the ``--json`` document; every other format renders it).

The records of a :class:`~byoc.runtime.compiled.CompiledModel` name the nodes of the model as
it was partitioned. Host nodes are still in ``compiled.model.graph``; the nodes of an offloaded
region were replaced by one ``byoc::Region`` node and live on in ``CompiledRegion.region.model``
(the standalone body, which has the same node and value names) and ``region.nodes`` (the
original nodes, whose output values keep their inferred shapes). Both are read here to recover
every node's inputs, outputs and attributes for the FLOP estimate and the graph edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from byoc._version import __version__
from byoc.report.flops import estimate_flops
from byoc.contract.types import REGION_DOMAIN, REGION_OP

if TYPE_CHECKING:  # pragma: no cover
    from byoc.runtime.protocols import CompiledView as CompiledModel

#: bump on any incompatible change of the document (see ``schema.json``)
SCHEMA_VERSION = 1
HOST = "host"


@dataclass
class _NodeView:
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)


def _dims(shape: ir.Shape | None) -> tuple | None:
    if shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in shape)


def _json_dims(shape: ir.Shape | None) -> list | None:
    if shape is None:
        return None
    return [d if isinstance(d, int) else (d.value if getattr(d, "value", None) else None) for d in shape]


def _attr_values(node: ir.Node) -> dict[str, Any]:
    out = {}
    for name, attr in node.attributes.items():
        if attr.type in (ir.AttributeType.INT, ir.AttributeType.INTS, ir.AttributeType.FLOAT,
                         ir.AttributeType.STRING):
            out[name] = attr.value
    return out


def _view(node: ir.Node) -> _NodeView:
    return _NodeView(
        node.op_type,
        node.domain or "",
        [v.name if v is not None and v.name else "" for v in node.inputs],
        [v.name or "" for v in node.outputs],
        _attr_values(node),
    )


class _GraphIndex:
    """Node views and value shapes of the whole model, offloaded regions included."""

    def __init__(self, compiled: "CompiledModel"):
        self.views: dict[str, _NodeView] = {}
        self.shapes: dict[str, tuple | None] = {}
        graph = compiled.model.graph
        self._values(graph)
        for node in ir.traversal.RecursiveGraphIterator(graph):  # subgraphs (If/Loop/Scan bodies) too
            if not (node.domain == REGION_DOMAIN and node.op_type == REGION_OP):
                self.views[node.name] = _view(node)
        for cr in compiled.regions:
            region = cr.region
            for node in region.nodes:
                for v in node.outputs:
                    if v.name and v.shape is not None:
                        self.shapes.setdefault(v.name, _dims(v.shape))
            if region.model is not None:
                self._values(region.model.graph)
                for node in region.model.graph:
                    self.views.setdefault(node.name, _view(node))
                if any(self.shapes.get(v.name) is None for node in region.model.graph for v in node.outputs):
                    self._infer(region.model)
            for node in region.nodes:  # no body (e.g. loaded from a bundle): outputs only
                if node.name not in self.views:
                    self.views[node.name] = _NodeView(node.op_type, node.domain or "", [],
                                                      [v.name or "" for v in node.outputs], _attr_values(node))

    def _infer(self, model: ir.Model) -> None:
        """Shapes of a body's inner values (a body read back from a bundle keeps none)."""
        try:
            inferred = onnx.shape_inference.infer_shapes(ir.to_proto(model))
        except Exception:  # best effort: the estimate then stays unknown
            return
        for vi in inferred.graph.value_info:
            if self.shapes.get(vi.name) is None and vi.type.HasField("tensor_type") \
                    and vi.type.tensor_type.HasField("shape"):
                self.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                             for d in vi.type.tensor_type.shape.dim)

    def _values(self, graph: ir.Graph) -> None:
        def add(v: ir.Value | None) -> None:
            if v is None or not v.name:
                return
            shape = v.shape
            if shape is None and v.const_value is not None:
                shape = v.const_value.shape
            if shape is not None and self.shapes.get(v.name) is None:
                self.shapes[v.name] = _dims(shape)

        for v in graph.inputs:
            add(v)
        for v in graph.initializers.values():
            add(v)
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for v in node.inputs:
                add(v)
            for v in node.outputs:
                add(v)


def _value_info(v: ir.Value) -> dict[str, Any]:
    return {"name": v.name, "dtype": v.dtype.name.lower() if v.dtype is not None else None,
            "shape": _json_dims(v.shape)}


def _target_entry(t: Any) -> dict[str, Any]:
    return {
        "name": t.name,
        "version": t.version,
        "device": t.device,
        "description": t.description,
        "plugin": t.plugin,
        "distribution": t.distribution,
        "runtime_path": t.runtime_path,
    }


def _fault_entry(f: Any) -> dict[str, Any]:
    return {
        "plugin": f.plugin,
        "hook": f.hook,
        "kind": getattr(f, "kind", "error"),
        "message": f.message,
        "distribution": getattr(f, "distribution", ""),
        "version": getattr(f, "version", ""),
        "text": str(f),
    }


def report_data(compiled: "CompiledModel") -> dict[str, Any]:
    """The placement report of ``compiled`` as a JSON-ready dict (validates against ``schema.json``)."""
    index = _GraphIndex(compiled)
    target_names = [t.name for t in compiled.targets]
    nodes: list[dict[str, Any]] = []
    for name, rec in compiled.records.items():
        view = index.views.get(name)
        flops = None
        if view is not None:
            flops = estimate_flops(view.op_type, view.attrs, view.inputs, view.outputs, index.shapes)
        verdicts = {t: rec.verdicts[t] for t in target_names if t in rec.verdicts}
        verdicts.update({t: r for t, r in rec.verdicts.items() if t not in verdicts})
        nodes.append({
            "name": name,
            "scope": getattr(rec, "scope", "") or "",
            "op_type": rec.op_type,
            "domain": view.domain if view is not None else "",
            "device": rec.device,
            "region": rec.region,
            "pattern": rec.pattern,
            "verdicts": verdicts,
            "rule": rec.rule,
            "fallback": rec.fallback,
            "flops": flops,
            "inputs": [n for n in view.inputs if n] if view is not None else [],
            "outputs": [n for n in view.outputs if n] if view is not None else [],
        })

    flops_of = {n["name"]: n["flops"] or 0 for n in nodes}
    host_fallback = dict(getattr(compiled, "host_fallback", None) or {})
    estimates = (getattr(compiled, "options", None) or {}).get("placement_estimates", {}).get("regions", {})
    regions = []
    for cr in compiled.regions:
        region = cr.region
        members = [n.name for n in region.nodes]
        pattern_counts: dict[str, int] = {}
        for p in region.patterns.values():
            pattern_counts[p] = pattern_counts.get(p, 0) + 1
        regions.append({
            "name": region.name,
            "target": region.target,
            "nodes": members,
            "inputs": [v.name for v in region.inputs],
            "outputs": [v.name for v in region.outputs],
            "patterns": pattern_counts,
            "flops": sum(flops_of.get(m, 0) for m in members),
            "plugin": cr.plugin,
            "host_fallback": host_fallback.get(region.name),
            "note": cr.note,
            "artifact": {"format": cr.artifact.format, "bytes": len(cr.artifact.data), "sha256": cr.artifact.sha256},
        })
        if region.name in estimates:  # placement="cost": the alternatives it was chosen among
            regions[-1]["estimated_s"] = dict(estimates[region.name]["estimated_s"])

    devices = list(dict.fromkeys(target_names + [n["device"] for n in nodes if n["device"] != HOST] + [HOST]))
    total_flops = sum(flops_of.values())
    by_device: dict[str, dict[str, Any]] = {}
    for dev in devices:
        dev_nodes = [n for n in nodes if n["device"] == dev]
        dev_flops = sum(n["flops"] or 0 for n in dev_nodes)
        by_device[dev] = {
            "nodes": len(dev_nodes),
            "regions": sum(1 for r in regions if r["target"] == dev and not r["host_fallback"]),
            "flops": dev_flops,
            "flops_share": (dev_flops / total_flops) if total_flops else 0.0,
        }
    fallbacks: list[dict[str, Any]] = []
    by_reason: dict[str, dict[str, Any]] = {}
    for n in nodes:
        if n["fallback"]:
            entry = by_reason.get(n["fallback"])
            if entry is None:
                entry = by_reason[n["fallback"]] = {"reason": n["fallback"], "nodes": []}
                fallbacks.append(entry)
            entry["nodes"].append(n["name"])
    graph = compiled.model.graph
    return {
        "schema_version": SCHEMA_VERSION,
        "generator": f"byoc {__version__}",
        "model": {
            "name": graph.name or "",
            "inputs": [_value_info(v) for v in graph.inputs if v.name not in graph.initializers],
            "outputs": [_value_info(v) for v in graph.outputs],
        },
        "targets": [_target_entry(t) for t in compiled.targets],
        "nodes": nodes,
        "regions": regions,
        "totals": {
            "nodes": len(nodes),
            "regions": sum(1 for r in regions if not r["host_fallback"]),
            "flops": total_flops,
            "unknown_flops_nodes": sum(1 for n in nodes if n["flops"] is None),
            "fallback_nodes": sum(1 for n in nodes if n["fallback"]),
            "dropped_nodes": sum(1 for n in nodes if n["rule"]),
            "by_device": by_device,
        },
        "faults": [_fault_entry(f) for f in compiled.faults],
        "fallbacks": fallbacks,
        **_optional_sections(compiled),
    }


def _optional_sections(compiled: "CompiledModel") -> dict[str, Any]:
    tiers = getattr(compiled, "tiers", None)
    sections = {"placement": placement_section(compiled), "specialisations": specialisation_section(compiled),
                "first_tier": None if tiers is None else tiers.describe()}
    return {key: value for key, value in sections.items() if value is not None}


def specialisation_section(compiled: "CompiledModel") -> dict[str, Any] | None:
    """A symbolic model with static-shape targets: the targets that take part per input shape, and
    each specialisation compiled so far (its shapes, and nodes and regions per device)."""
    sp = getattr(compiled, "specializer", None)
    if sp is None:
        return None
    shapes = []
    for key, cm in list(sp.cache.items()):
        by_device: dict[str, int] = {}
        for rec in cm.records.values():
            by_device[rec.device] = by_device.get(rec.device, 0) + 1
        shapes.append({"shapes": {name: list(dims) for name, dims in key}, "nodes": by_device,
                       "regions": len(cm.regions)})
    compiling = sp.describe()
    return {"static_targets": [t.name for t in sp.static_targets], "compiled": shapes,
            "refused": sp.n_refused, "compiling": compiling["compiling"], "failed": compiling["failed"],
            "preview": sp.preview()}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def placement_section(compiled: "CompiledModel") -> dict[str, Any] | None:
    """With placement="cost" or "measure": per region, the alternatives it was chosen among, their
    times (estimated, measured or read from the cache) and why the chosen one won."""
    opts = getattr(compiled, "options", None) or {}
    mode, est = opts.get("placement", "priority"), opts.get("placement_estimates") or {}
    if mode == "priority" or not est:
        return None
    decisions = est.get("decisions")
    if decisions is None:  # "cost": one decision per region, from the whole-graph estimate
        decisions = []
        for name, info in est.get("regions", {}).items():
            alts = {d: s for d, s in info["estimated_s"].items()}
            target = info["target"]
            best = min((s, d) for d, s in alts.items() if s is not None)
            if best[1] == target:
                others = [(s, d) for d, s in alts.items() if s is not None and d != target]
                why = f"{target} has the lowest estimate" + (
                    f": {_ms(min(others)[0] - alts[target])} less than {min(others)[1]}" if others else "")
            else:
                why = (f"{best[1]} alone is estimated {_ms(alts[target] - best[0])} faster, but the whole-graph "
                       f"optimum keeps it on {target}: moving its tensors or starting a region would cost more")
            decisions.append({"target": target, "regions": [name], "chosen": f"all on {target}", "why": why,
                              "alternatives": [{"plan": f"all on {d}", "seconds": s, "source": "estimated"}
                                               for d, s in alts.items()]})
    return {"mode": mode, "total_s": est.get("total_s"), "measure": est.get("measure"), "decisions": decisions}


__all__ = ["HOST", "SCHEMA_VERSION", "placement_section", "report_data"]
