"""The partitioned model as ONNX: each region a ``byoc::Region`` node carrying its body.

In memory, a compiled model's regions are ``byoc::Region`` nodes without bodies (the runtime
calls the vendor's callable). The export works on a copy: every Region node gets a graph
attribute ``body`` built from ``CompiledRegion.region.model`` (inputs/outputs in the node's
order, the constants the region uses bound inside), and initializers only the regions used are
dropped from the outer graph. The result passes ``onnx.checker.check_model`` and opens in any
ONNX viewer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx
import onnx_ir as ir

from byoc.errors import ByocError
from byoc.contract import REGION_DOMAIN, REGION_OP

if TYPE_CHECKING:  # pragma: no cover
    from byoc.runtime.protocols import CompiledView as CompiledModel


def _region_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every Region node of ``graph`` and its subgraphs (regions inside If/Loop/Scan bodies)."""
    out = []
    for node in graph.node:
        if node.domain == REGION_DOMAIN and node.op_type == REGION_OP:
            out.append(node)
            continue
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                out.extend(_region_nodes(attr.g))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    out.extend(_region_nodes(g))
    return out


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Names read by nodes of ``graph`` and its control-flow subgraphs (not by region bodies,
    which bind their own constants)."""
    used = set()
    for node in graph.node:
        used.update(node.input)
        if node.domain == REGION_DOMAIN and node.op_type == REGION_OP:
            continue
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for g in subs:
                used |= _used_names(g)
                used.update(v.name for v in g.output)
    return used


def partitioned_onnx(compiled: "CompiledModel") -> onnx.ModelProto:
    """A self-contained ONNX model of ``compiled``'s partitioned graph (``compiled`` is not changed)."""
    proto = ir.to_proto(compiled.model)
    bodies = {cr.region.name: cr.region for cr in compiled.regions}
    for node in _region_nodes(proto.graph):
        region = bodies.get(node.name)
        if region is None or region.model is None:
            raise ByocError(f"region {node.name!r} has no body to export (compiled model without region bodies)")
        body_model = ir.to_proto(region.model)
        # the outer model's IR version governs its subgraphs: a body without its initializers
        # among its inputs needs IR >= 4 (old zoo models declare 3)
        proto.ir_version = max(proto.ir_version, body_model.ir_version, 4)
        body = body_model.graph
        body.name = region.name
        if [v.name for v in body.input] != list(node.input) or [v.name for v in body.output] != list(node.output):
            raise ByocError(f"region {node.name!r}: its body's inputs/outputs do not match the Region node")
        del node.attribute[:]
        node.attribute.extend([
            onnx.helper.make_attribute("target", region.target),
            onnx.helper.make_attribute("region", region.name),
            onnx.helper.make_attribute("body", body),
        ])
        if region.patterns:
            node.doc_string = "patterns: " + ", ".join(sorted(set(region.patterns.values())))
    used = _used_names(proto.graph)
    used.update(v.name for v in proto.graph.output)
    used.update(v.name for v in proto.graph.input)
    keep = [t for t in proto.graph.initializer if t.name in used]
    if len(keep) != len(proto.graph.initializer):
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(keep)
    value_names = {n for node in proto.graph.node for n in list(node.input) + list(node.output)}
    keep_vi = [vi for vi in proto.graph.value_info if vi.name in value_names]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(keep_vi)
    if not any(op.domain == REGION_DOMAIN for op in proto.opset_import) and bodies:
        proto.opset_import.append(onnx.helper.make_opsetid(REGION_DOMAIN, 1))
    return proto


__all__ = ["partitioned_onnx"]
