"""Thin wrappers over onnx_ir's passes plus Dropout removal."""

from __future__ import annotations

import json
import warnings

import onnx
import onnx_ir as ir
from onnx_ir.passes import common

from byoc.errors import ByocError
from byoc.frontend import bounded
from byoc.passes.base import PassContext, replace_value


def infer_shapes(model: ir.Model, ctx: PassContext) -> bool:
    """ONNX shape inference (with data propagation) filling in value types and shapes.

    onnx's inference runs where the compile's time limit can stop it
    (:mod:`byoc.frontend.bounded`) on the model without its large initializers' data (their
    types and shapes stay, as inputs); it returns every value's type, which is merged here.
    """
    try:
        inferred = json.loads(bounded.call("onnx.infer_shapes", _without_large_data(model), "ONNX shape inference"))
    except ByocError:
        raise
    except Exception as exc:  # inference is an aid; kernels do not depend on it
        warnings.warn(f"shape inference failed, continuing without it: {exc}", stacklevel=2)
        return False
    modified = False
    for graph, types in zip(model.graphs(), inferred):
        for name, value in ir.convenience.create_value_mapping(graph).items():
            dtype, dims = types.get(name, (None, None))
            if dims is not None and (value.shape is None or list(value.shape) != dims):
                value.shape = ir.Shape(dims)
                modified = True
            if dtype is not None and value.dtype != ir.DataType(dtype):
                value.dtype = ir.DataType(dtype)
                modified = True
    return _ceil_mode_pool_shapes(model) or modified


#: initializers with more data than this reach shape inference as typed inputs (data propagation
#: reads the small ones: shapes, axes, indices)
_LARGE_INITIALIZER_BYTES = 1024


def _without_large_data(model: ir.Model) -> bytes:
    """The serialised model, its large initializers turned into graph inputs of the same type
    (the model is as it was afterwards)."""
    graph = model.graph
    initializers, inputs = list(graph.initializers.values()), list(graph.inputs)
    large = [v for v in initializers if v.const_value is not None and v.const_value.nbytes > _LARGE_INITIALIZER_BYTES]
    if not large:
        return ir.serde.serialize_model(model).SerializeToString()
    saved = [(v, v.const_value, v.shape, v.dtype) for v in large]
    try:
        for value in large:
            value.shape = value.shape or value.const_value.shape
            value.dtype = value.dtype or value.const_value.dtype
            graph.initializers.pop(value.name)
            value.const_value = None
            if value not in inputs:
                graph.inputs.append(value)
        return ir.serde.serialize_model(model).SerializeToString()
    finally:
        for value, data, shape, dtype in saved:
            value.const_value, value.shape, value.dtype = data, shape, dtype
        graph.inputs.clear()
        graph.inputs.extend(inputs)
        graph.initializers.clear()
        for value in initializers:
            graph.register_initializer(value)


@bounded.operation("onnx.infer_shapes")
def _infer(model: bytes) -> bytes:
    """Every value's ``(dtype, dims)`` per graph after onnx's inference (runs in the helper)."""
    inferred = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(
        onnx.ModelProto.FromString(model), check_type=False, strict_mode=False, data_prop=True))
    return json.dumps([{name: _type_of(v) for name, v in ir.convenience.create_value_mapping(g).items()}
                       for g in inferred.graphs()]).encode()


def _type_of(value: ir.Value) -> tuple[int | None, list[int | str | None] | None]:
    dims = None if value.shape is None else [d if isinstance(d, int) else d.value for d in value.shape]
    return (None if value.dtype is None else int(value.dtype)), dims


_CEIL_POOLS = ("MaxPool", "AveragePool", "LpPool")


def _ceil_mode_pool_shapes(model: ir.Model) -> bool:
    """Correct what ONNX shape inference says of ``ceil_mode`` pooling.

    With ``ceil_mode=1`` a window that would start in the trailing padding is dropped (the
    operator as onnxruntime and byoc's kernels run it, :func:`byoc.contract.geometry.window_geometry`);
    ONNX's shape inference keeps it, one element too many. The output gets the real size, and
    every value computed from it loses its static dims (they were inferred from the wrong size),
    so a declared shape never contradicts what runs.
    """
    wrong: list[ir.Value] = []
    changed = False
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type not in _CEIL_POOLS or node.domain not in ("", "ai.onnx"):
            continue
        real = _ceil_pool_dims(node)
        for out in node.outputs[:1 + (node.op_type == "MaxPool")]:
            if real is None or out is None or out.shape is None or len(out.shape) != len(real):
                continue
            dims = [d if r is None else r for d, r in zip(out.shape, real)]
            if list(out.shape) != dims:
                out.shape = ir.Shape(dims)
                changed = True
                wrong.extend(v for u in out.uses() for v in u.node.outputs)
    seen: set[int] = set()
    while wrong:
        v = wrong.pop()
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        if v.shape is not None:
            v.shape = ir.Shape([None] * len(v.shape))
        wrong.extend(w for u in v.uses() for w in u.node.outputs)
    return changed


def _ceil_pool_dims(node: ir.Node) -> list[int | None] | None:
    """The output shape of a ``ceil_mode`` pooling node with explicit pads (``None`` for the
    batch and channel dims), or ``None`` where it does not apply or is unknown."""
    a = node.attributes
    ceil = a.get("ceil_mode")
    auto_pad = a.get("auto_pad")
    if ceil is None or not ceil.value or (auto_pad is not None and auto_pad.value not in ("NOTSET", "")):
        return None
    x = node.inputs[0] if node.inputs else None
    kernel = a.get("kernel_shape")
    if x is None or x.shape is None or kernel is None:
        return None
    spatial = list(x.shape)[2:]
    nd = len(spatial)
    if nd != len(kernel.value) or not all(isinstance(d, int) for d in spatial):
        return None
    strides = list(a["strides"].value) if "strides" in a else [1] * nd
    dilations = list(a["dilations"].value) if "dilations" in a else [1] * nd
    pads = list(a["pads"].value) if "pads" in a else [0] * (2 * nd)
    if len(strides) != nd or len(dilations) != nd or len(pads) != 2 * nd or min(strides) < 1:
        return None
    dims: list[int | None] = [None, None]
    for i, n in enumerate(spatial):
        span = n + pads[i] + pads[i + nd] - ((kernel.value[i] - 1) * dilations[i] + 1)
        if span < 0:
            return None
        o = -(-span // strides[i]) + 1
        if (o - 1) * strides[i] >= n + pads[i]:
            o -= 1
        dims.append(o)
    return dims


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
