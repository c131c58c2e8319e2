"""Operator support: one check for every operator the ``cpu`` target is offered.

The check runs :func:`byoc_cpu.ops.analyze`, the same analysis the lowering uses, so a node
placed on ``cpu`` is always one the code generator can compile. Its rejection reasons
("Conv: the weight must be a constant ...") are what ``byoc explain`` shows.
"""

from __future__ import annotations

import onnx_ir as ir

from byoc.contract import SupportContext

from byoc_cpu.ops import OPERATORS, Unsupported, analyze


def opset_of(node: ir.Node) -> int:
    graph = node.graph
    while graph is not None:
        imports = graph.opset_imports
        if "" in imports or "ai.onnx" in imports:
            return int(imports.get("", imports.get("ai.onnx")))
        parent = getattr(graph, "parent", None)  # subgraphs have no imports of their own
        graph = parent.graph if parent is not None else None
    return int(node.version or 21)


def check(node: ir.Node, ctx: SupportContext):
    """``True``, or the reason the ``cpu`` code generator cannot take ``node``."""
    try:
        analyze(node, ctx.shape, ctx.const, opset_of(node), dtype_of=ctx.dtype)
    except Unsupported as exc:
        return str(exc)
    return True


__all__ = ["OPERATORS", "check", "opset_of"]
