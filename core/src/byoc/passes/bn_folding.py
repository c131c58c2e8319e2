"""Fold an inference BatchNormalization into the Conv or Gemm that feeds it.

``BN(Conv(x, W, B))`` equals ``Conv(x, W * s, (B - mean) * s + bias)`` with
``s = scale / sqrt(var + eps)`` per output channel; likewise for Gemm along its output
columns. Folding applies only when all parameters are constants and the Conv/Gemm output feeds
nothing but the BatchNormalization.

Exporters also write a BatchNormalization out as its two steps, ``Mul`` by a per-channel
constant then ``Add`` of one (the model zoo's Inception v2 has 69 such pairs): a Conv whose only
consumer is such a ``Mul`` or ``Add`` takes it into its weights and bias the same way.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from byoc.passes.base import PassContext, add_initializer, const_array, replace_value


def _bn_params(bn: ir.Node):
    if len(bn.inputs) < 5 or any(len(o.uses()) or o.is_graph_output() for o in bn.outputs[1:]):
        return None
    training = bn.attributes.get("training_mode")
    if training is not None and training.as_int() != 0:
        return None
    arrays = [const_array(v) for v in bn.inputs[1:5]]
    if any(a is None for a in arrays):
        return None
    eps_attr = bn.attributes.get("epsilon")
    eps = eps_attr.as_float() if eps_attr is not None else 1e-5
    scale, bias, mean, var = (a.astype(np.float64) for a in arrays)
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


def _single_consumer(node: ir.Node) -> ir.Node | None:
    out = node.outputs[0]
    uses = out.uses()
    if out.is_graph_output() or len(uses) != 1:
        return None
    consumer = uses[0].node
    if consumer.op_type != "BatchNormalization" or consumer.domain not in ("", "ai.onnx"):
        return None
    if uses[0].idx != 0:
        return None
    return consumer


def _fold_conv(node: ir.Node, bn: ir.Node, s: np.ndarray, shift: np.ndarray) -> list[np.ndarray] | None:
    w = const_array(node.inputs[1])
    if w is None or w.dtype != np.float32 or w.shape[0] != s.shape[0]:
        return None
    b = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.zeros(w.shape[0])
    if b is None:
        return None
    # the weights are scaled in float32 (one pass over them, no float64 copies): the factors are
    # computed in float64 and rounded once, so each folded weight is within one ulp
    w2 = w * s.astype(np.float32).reshape((-1,) + (1,) * (w.ndim - 1))
    b2 = (b.astype(np.float64) * s + shift).astype(np.float32)
    return [w2, b2]


def _fold_gemm(node: ir.Node, bn: ir.Node, s: np.ndarray, shift: np.ndarray) -> list[np.ndarray] | None:
    b = const_array(node.inputs[1])
    if b is None or b.dtype != np.float32 or b.ndim != 2:
        return None
    attrs = node.attributes
    trans_b = attrs["transB"].as_int() if "transB" in attrs else 0
    beta = attrs["beta"].as_float() if "beta" in attrs else 1.0
    n_out = b.shape[0] if trans_b else b.shape[1]
    if n_out != s.shape[0]:
        return None
    c = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.zeros(n_out)
    if c is None or c.size not in (1, n_out) or (c.ndim == 2 and c.shape[0] != 1):
        return None
    s32 = s.astype(np.float32)
    b2 = b * (s32[:, None] if trans_b else s32[None, :])
    c2 = beta * np.broadcast_to(c.astype(np.float64).reshape(-1), (n_out,)) * s + shift
    return [b2, c2.astype(np.float32)]


def fold_batchnorm(model: ir.Model, ctx: PassContext) -> bool:
    graph = model.graph
    changed = False
    for node in list(graph):
        if node.op_type not in ("Conv", "Gemm") or node.domain not in ("", "ai.onnx"):
            continue
        if node.graph is None:  # removed earlier in this loop
            continue
        bn = _single_consumer(node)
        if bn is None:
            continue
        params = _bn_params(bn)
        if params is None:
            continue
        # BN normalises axis 1: for Gemm that is the output column axis
        folded = (_fold_conv if node.op_type == "Conv" else _fold_gemm)(node, bn, *params)
        if folded is None:
            continue
        weight = add_initializer(graph, f"{node.inputs[1].name}_bnfolded", folded[0])
        bias = add_initializer(graph, f"{bn.outputs[0].name}_bias_bnfolded", folded[1])
        attrs = [a for k, a in node.attributes.items() if k != "beta"]
        new = ir.Node(node.domain, node.op_type, [node.inputs[0], weight, bias], attributes=attrs, name=node.name)
        graph.insert_after(bn, new)
        replace_value(bn.outputs[0], new.outputs[0])
        graph.remove([bn, node], safe=True)
        changed = True
    return changed


def _per_channel(value: ir.Value | None, m: int, rank: int) -> np.ndarray | None:
    """``value`` as ``m`` float64 factors when it is a float32 constant that broadcasts against a
    rank-``rank`` (N, M, ...) tensor along the channel axis only (shapes (M, 1, 1), (1, M, 1, 1),
    (1,), scalars), else None."""
    a = const_array(value)
    if a is None or a.dtype != np.float32 or a.ndim > rank:
        return None
    shape = (1,) * (rank - a.ndim) + a.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, m):
        return None
    return np.broadcast_to(a.astype(np.float64).reshape(-1), (m,))


def _affine_consumer(node: ir.Node) -> tuple[ir.Node, int] | None:
    """The Mul or Add that alone consumes ``node``'s output, and which of its inputs that is."""
    out = node.outputs[0]
    uses = out.uses()
    if out.is_graph_output() or len(uses) != 1:
        return None
    consumer, idx = uses[0].node, uses[0].idx
    if consumer.op_type not in ("Mul", "Add") or consumer.domain not in ("", "ai.onnx") or len(consumer.inputs) != 2:
        return None
    if consumer.inputs[0] is consumer.inputs[1]:
        return None
    return consumer, idx


def fold_affine(model: ir.Model, ctx: PassContext) -> bool:
    """Fold a per-channel constant ``Mul`` or ``Add`` into the Conv (constant float32 weights)
    that alone feeds it, repeatedly (``Conv -> Mul -> Add`` becomes one Conv)."""
    graph = model.graph
    changed = False
    progress = True
    while progress:
        progress = False
        for node in list(graph):
            if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or node.graph is None:
                continue
            w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            if w is None or w.dtype != np.float32 or w.ndim < 3:
                continue
            found = _affine_consumer(node)
            if found is None:
                continue
            op, idx = found
            m = w.shape[0]
            factors = _per_channel(op.inputs[1 - idx], m, w.ndim)  # the output has the weight's rank
            if factors is None:
                continue
            if op.op_type == "Mul":
                folded = _fold_conv(node, op, factors, np.zeros(m))
            else:
                folded = _fold_conv(node, op, np.ones(m), factors)
            if folded is None:
                continue
            weight = add_initializer(graph, f"{node.inputs[1].name}_folded", folded[0]) if op.op_type == "Mul" \
                else node.inputs[1]
            bias = add_initializer(graph, f"{op.outputs[0].name}_bias_folded", folded[1])
            new = ir.Node(node.domain, node.op_type, [node.inputs[0], weight, bias],
                          attributes=list(node.attributes.values()), name=node.name)
            graph.insert_after(op, new)
            replace_value(op.outputs[0], new.outputs[0])
            graph.remove([op, node], safe=True)
            changed = progress = True
    return changed


def fold_batchnorm_and_affine(model: ir.Model, ctx: PassContext) -> bool:
    """The ``bn_folding`` pass: BatchNormalization nodes, then their Mul/Add form."""
    a = fold_batchnorm(model, ctx)
    b = fold_affine(model, ctx)
    return a or b
