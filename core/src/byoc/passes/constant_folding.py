"""Constant folding, evaluated with byoc's own kernels under the resource budget.

A node whose inputs are all compile-time constants is run once at compile time and replaced by
initializers. ``Shape`` and ``Size`` fold when their input's shape is fully static. A kernel that
would allocate past the budget raises :class:`~byoc.errors.ResourceLimitError` here, before any
allocation, so a tiny model that asks for gigabytes is refused at compile time. Folded constants
count against ``Budget.max_total_bytes`` with the model's own initializers (constants a fold
leaves unused are dropped and stop counting), so many small folds cannot add up to gigabytes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from byoc.budget import _fmt_bytes
from byoc.errors import ByocError, ResourceLimitError
from byoc.kernels.registry import get_factory
from byoc.passes.base import PassContext, add_initializer, const_array, replace_value
from byoc.runtime.plan import node_spec, opset_of

#: never folded: nondeterministic or stateful operators, and control flow
_NO_FOLD = {
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "If", "Loop", "Scan", "SequenceEmpty",
}


def _static_shape(v: ir.Value | None) -> tuple[int, ...] | None:
    if v is None or v.shape is None:
        return None
    dims = tuple(v.shape)
    return dims if all(isinstance(d, int) for d in dims) else None


def _fold_shape_op(node: ir.Node) -> list[np.ndarray] | None:
    shape = _static_shape(node.inputs[0])
    if shape is None:
        return None
    if node.op_type == "Size":
        return [np.array(math.prod(shape), dtype=np.int64)]
    start_attr = node.attributes.get("start")
    end_attr = node.attributes.get("end")
    rank = len(shape)
    start = start_attr.as_int() if start_attr is not None else 0
    end = end_attr.as_int() if end_attr is not None else rank
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [np.array(shape[start:end], dtype=np.int64)]


def _nbytes(value: ir.Value) -> int:
    t = value.const_value
    if t is None:
        return 0
    try:
        return int(t.nbytes)
    except Exception:  # a tensor type that cannot say (strings): count its elements
        return math.prod(int(d) for d in (t.shape.numpy() if t.shape is not None else ())) * 8


def _release_unused(graph: ir.Graph, node_inputs) -> int:
    """Drop initializers that the removed node was the last user of; returns the bytes freed."""
    freed = 0
    for v in node_inputs:
        if v is None or not v.is_initializer() or v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        if graph.initializers.get(v.name) is v:
            freed += _nbytes(v)
            graph.initializers.pop(v.name)
    return freed


def _fold_graph(graph: ir.Graph, ctx: PassContext, opset: int) -> bool:
    changed = False
    budget = ctx.budget
    total = sum(_nbytes(v) for v in graph.initializers.values())
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type in _NO_FOLD:
            continue
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            continue
        results = None
        if node.op_type in ("Shape", "Size") and node.inputs and const_array(node.inputs[0]) is None:
            results = _fold_shape_op(node)
        else:
            if not all(v is None or const_array(v) is not None for v in node.inputs):
                continue
            factory = get_factory(node.op_type, node.domain)
            if factory is None:
                continue
            spec = node_spec(node, opset, ctx.budget)
            args = [const_array(v) if v is not None else None for v in node.inputs]
            try:
                results = list(factory(spec)(*args))
            except ResourceLimitError:
                raise
            except ByocError:
                continue  # leave it to the run-time kernel, which reports it with context
            except Exception:
                continue
        if results is None:
            continue
        added = sum(np.asarray(a).nbytes for out, a in zip(node.outputs, results)
                    if out.uses() or out.is_graph_output())
        if total + added > budget.max_total_bytes:
            label = f"node {node.name!r} ({node.op_type})" if node.name else f"a {node.op_type} node"
            raise ResourceLimitError(
                f"{label}: constant folding would hold {_fmt_bytes(total + added)} of constants, over the "
                f"budget max_total_bytes={_fmt_bytes(budget.max_total_bytes)}")
        total += added
        inputs = list(node.inputs)
        for out, arr in zip(node.outputs, results):
            if not out.uses() and not out.is_graph_output():
                continue
            name = out.name or f"{node.name}_folded"
            out.name = f"{name}__folded"  # free the name for the initializer that replaces it
            replace_value(out, add_initializer(graph, name, np.asarray(arr)))
        graph.remove(node, safe=True)
        total -= _release_unused(graph, inputs)
        changed = True
    return changed


def fold_constants(model: ir.Model, ctx: PassContext) -> bool:
    """Fold every node whose inputs are constants (main graph; subgraphs keep their nodes)."""
    return _fold_graph(model.graph, ctx, opset_of(model.graph, ""))
