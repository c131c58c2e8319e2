"""Thin wrappers over onnx_ir's passes plus Dropout removal."""

from __future__ import annotations

import warnings

import onnx_ir as ir
from onnx_ir.passes import common

from byoc.passes.base import PassContext, replace_value


def infer_shapes(model: ir.Model, ctx: PassContext) -> bool:
    """ONNX shape inference (with data propagation) filling in value types and shapes."""
    try:
        return common.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model).modified
    except Exception as exc:  # inference is an aid; kernels do not depend on it
        warnings.warn(f"shape inference failed, continuing without it: {exc}", stacklevel=2)
        return False


def eliminate_common_subexpressions(model: ir.Model, ctx: PassContext) -> bool:
    """Merge nodes that compute the same operator on the same inputs with the same attributes."""
    return common.CommonSubexpressionEliminationPass()(model).modified


def remove_dead_code(model: ir.Model, ctx: PassContext) -> bool:
    """Drop nodes whose outputs nobody uses, and unused initializers."""
    return common.RemoveUnusedNodesPass()(model).modified


def remove_identities(model: ir.Model, ctx: PassContext) -> bool:
    """Remove Identity nodes and inference-mode Dropout (whose mask output is unused)."""
    changed = False
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            continue
        training = node.inputs[2] if len(node.inputs) > 2 else None
        if training is not None:
            if training.const_value is None or bool(training.const_value.numpy()):
                continue
        graph = node.graph
        x, y = node.inputs[0], node.outputs[0]
        if y.is_graph_output():
            # keep the graph's output name: an Identity the pass below removes where it can
            identity = ir.node("Identity", [x], name=node.name)
            graph.insert_after(node, identity)
            replace_value(y, identity.outputs[0])
        else:
            ir.convenience.replace_all_uses_with(y, x)
        graph.remove(node, safe=True)
        changed = True
    # our own Identity removal: onnx_ir's pass can link a value across sibling subgraphs when an
    # Identity feeds a subgraph output (seen on ONNX's AffineGrid function body)
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Identity" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
            continue
        y = node.outputs[0]
        if y.is_graph_output():
            continue  # the graph's output keeps its name; the Identity costs nothing at run time
        ir.convenience.replace_all_uses_with(y, node.inputs[0])
        node.graph.remove(node, safe=True)
        changed = True
    return changed


def drop_legacy_initializer_inputs(model: ir.Model) -> bool:
    """Before IR version 4 every initializer also had to be a graph input; those are constants.

    From IR version 4 on, an initializer listed as an input is an overridable default and stays
    an (optional) input.
    """
    if model.ir_version >= 4:
        return False
    graph = model.graph
    keep = [v for v in graph.inputs if v.name not in graph.initializers]
    if len(keep) == len(graph.inputs):
        return False
    graph.inputs[:] = keep
    return True
