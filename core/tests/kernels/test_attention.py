"""RMSNormalization, GroupNormalization, RotaryEmbedding and Attention (byoc.kernels.attention)
against onnx.reference and onnxruntime.

onnx.reference is the oracle except where it departs from the operator definition: Attention's
``qk_matmul_output_mode=0`` output with a softcap (it returns the capped product; the spec and
onnxruntime the raw one) and GroupNormalization at opset 18 (onnx.reference has opset 21's only).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

EXAMPLES = settings(max_examples=40)
seeds = st.integers(0, 2**16)


def check(op, inputs, attrs, *, opset, oracle=run_reference, n_outputs=1, **tol):
    model, feeds = single_node_model(op, inputs, attrs, n_outputs=n_outputs, opset=opset)
    expected = oracle(model, feeds)
    for out, arr in zip(model.graph.output, expected):  # outputs shape inference left untyped
        if not out.type.tensor_type.elem_type:
            out.type.CopyFrom(onnx.helper.make_tensor_type_proto(
                onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    got = run_byoc(model, feeds)
    assert_close(got, expected, **(tol or {"rtol": 1e-4, "atol": 1e-5}))
    return got, expected


# -------------------------------------------------------------------------------------------------
# normalisations


@EXAMPLES
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(), seed=seeds,
       eps=st.sampled_from([1e-5, 1e-2]), dtype=st.sampled_from([np.float32, np.float64]))
def test_rms_normalization_matches_reference(shape, data, seed, eps, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    norm_shape = shape[axis:]
    scale_shape = data.draw(st.sampled_from([norm_shape, norm_shape[-1:], [1]]))
    x, scale = rng.standard_normal(shape).astype(dtype), rng.standard_normal(scale_shape).astype(dtype)
    check("RMSNormalization", [x, scale], {"axis": axis, "epsilon": eps}, opset=23)


def test_rms_normalization_float16_rounds_once():
    rng = np.random.default_rng(0)
    x, scale = rng.standard_normal((3, 8)).astype(np.float16), rng.standard_normal(8).astype(np.float16)
    check("RMSNormalization", [x, scale], {}, opset=23, oracle=run_onnxruntime, rtol=2e-3, atol=2e-3)


@EXAMPLES
@given(n=st.integers(1, 2), groups=st.integers(1, 3), per_group=st.integers(1, 3),
       spatial=st.lists(st.integers(1, 4), max_size=2), seed=seeds, opset=st.sampled_from([18, 21]))
def test_group_normalization(n, groups, per_group, spatial, seed, opset):
    c = groups * per_group
    rng = np.random.default_rng(seed)
    x = rng.standard_normal([n, c, *spatial]).astype(np.float32)
    params = [rng.standard_normal(groups if opset == 18 else c).astype(np.float32) for _ in range(2)]
    attrs = {"num_groups": groups, "epsilon": 1e-3}
    if opset == 21:
        check("GroupNormalization", [x, *params], attrs, opset=21)
        return
    # opset 18 (one scale and bias per group): the ONNX checker refuses it as deprecated, so
    # byoc.compile does too; the kernel at that opset against onnxruntime, which still runs it
    model, feeds = single_node_model("GroupNormalization", [x, *params], attrs, opset=18)
    model.graph.output[0].type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, x.shape))
    run = make_kernel(NodeSpec("GroupNormalization", attrs=attrs, opset=18, n_inputs=3))
    assert_close(run(x, *params), run_onnxruntime(model, feeds))


def test_group_normalization_refuses_bad_parameters():
    run = make_kernel(NodeSpec("GroupNormalization", name="gn", attrs={"num_groups": 2}, opset=21, n_inputs=3))
    x = np.zeros((1, 4, 3), np.float32)
    with pytest.raises(KernelError, match="gn.*shape"):
        run(x, np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(KernelError, match="groups"):
        run(np.zeros((1, 3, 3), np.float32), np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(KernelError, match="num_groups"):
        make_kernel(NodeSpec("GroupNormalization", name="gn", attrs={}, opset=21))


# -------------------------------------------------------------------------------------------------
# RotaryEmbedding


@EXAMPLES
@given(b=st.integers(1, 2), s=st.integers(1, 4), heads=st.integers(1, 3), half=st.integers(1, 4),
       data=st.data(), seed=seeds)
def test_rotary_embedding_matches_reference(b, s, heads, half, data, seed):
    rng = np.random.default_rng(seed)
    head = 2 * half + data.draw(st.sampled_from([0, 0, 2, 3]))
    rd = data.draw(st.sampled_from([0, 2 * half]))  # 0: the whole head
    attrs = {"interleaved": data.draw(st.integers(0, 1)), "rotary_embedding_dim": rd}
    if rd == 0:
        half = head // 2
        head = 2 * half
    x = rng.standard_normal((b, heads, s, head)).astype(np.float32)
    if data.draw(st.booleans()):
        x = x.transpose(0, 2, 1, 3).reshape(b, s, heads * head)
        attrs["num_heads"] = heads
    with_ids = data.draw(st.booleans())
    positions = s + 3 if with_ids else None
    cache_shape = (positions, half) if with_ids else (b, s, half)
    angles = rng.uniform(0, 6, cache_shape)
    inputs = [x, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)]
    if with_ids:
        inputs.append(rng.integers(0, positions, (b, s)).astype(np.int64))
    check("RotaryEmbedding", inputs, attrs, opset=23)


def test_rotary_embedding_refuses_bad_positions():
    run = make_kernel(NodeSpec("RotaryEmbedding", name="rope", opset=23, n_inputs=4))
    x = np.zeros((1, 1, 2, 4), np.float32)
    cache = np.zeros((3, 2), np.float32)
    with pytest.raises(KernelError, match="rope.*position_ids out of range"):
        run(x, cache, cache, np.array([[0, 3]], np.int64))
    with pytest.raises(KernelError, match="cos_cache"):
        run(x, np.zeros((1, 2, 1), np.float32), np.zeros((1, 2, 1), np.float32))


# -------------------------------------------------------------------------------------------------
# Attention


@st.composite
def attention_cases(draw):
    rng = np.random.default_rng(draw(seeds))
    b, kv_heads, groups = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    q_heads = kv_heads * groups
    sq, skv, past = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.sampled_from([0, 0, 2]))
    dq, dv = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    q = rng.standard_normal((b, q_heads, sq, dq)).astype(np.float32)
    k = rng.standard_normal((b, kv_heads, skv, dq)).astype(np.float32)
    v = rng.standard_normal((b, kv_heads, skv, dv)).astype(np.float32)
    attrs = {"is_causal": draw(st.integers(0, 1)), "qk_matmul_output_mode": draw(st.integers(0, 3))}
    if draw(st.booleans()):
        attrs["scale"] = draw(st.sampled_from([0.1, 1.0, 2.5]))
    if draw(st.booleans()):
        attrs["softcap"] = draw(st.sampled_from([1.0, 5.0]))
    inputs = [q, k, v]
    total = skv + past
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    if mask_kind:
        rank = draw(st.integers(2, 4))
        keys = draw(st.integers(1, total))  # shorter masks are padded (masked) to every key
        # batch and head dimensions may broadcast; the query dimension may not: onnxruntime
        # refuses that, and onnx.reference's causal mask then takes the mask's query length
        shape = [draw(st.sampled_from([1, d])) for d in [b, q_heads][4 - rank:]] + [sq, keys]
        if mask_kind == "bool":
            mask = rng.random(shape) < 0.7
        else:
            mask = np.where(rng.random(shape) < 0.2, -np.inf, rng.standard_normal(shape)).astype(np.float32)
        inputs.append(mask)
    if past:
        inputs += [None] * (4 - len(inputs))
        inputs += [rng.standard_normal((b, kv_heads, past, dq)).astype(np.float32),
                   rng.standard_normal((b, kv_heads, past, dv)).astype(np.float32)]
    if draw(st.booleans()):  # 3-D inputs: (batch, sequence, heads * size)
        for i in range(3):
            t = inputs[i]
            inputs[i] = t.transpose(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], -1)
        attrs.update(q_num_heads=q_heads, kv_num_heads=kv_heads)
    return inputs, attrs


@settings(max_examples=80)
@given(attention_cases(), st.integers(1, 4))
def test_attention_matches_reference(case, n_outputs):
    inputs, attrs = case
    if attrs.get("softcap") and attrs["qk_matmul_output_mode"] == 0:
        # onnx.reference returns the product after the softcap; the spec and onnxruntime before
        # (onnxruntime refuses a mask shorter than the keys)
        mask = inputs[3] if len(inputs) > 3 else None
        keys = inputs[1].shape[-2] + (inputs[4].shape[2] if len(inputs) > 4 else 0)
        if mask is None or mask.shape[-1] == keys:
            check("Attention", inputs, attrs, opset=23, n_outputs=4, oracle=run_onnxruntime)
        attrs["qk_matmul_output_mode"] = 1
    check("Attention", inputs, attrs, opset=23, n_outputs=n_outputs)


@pytest.mark.parametrize("attrs", [{"is_causal": 1}, {"left_window_size": 1}, {"left_window_size": 0,
                                                                                 "right_window_size": 1}])
def test_attention_nonpad_kv_seqlen_and_windows(attrs):
    # opset 24's external cache (nonpad_kv_seqlen) and opset 25's sliding window
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    k = rng.standard_normal((2, 2, 6, 4)).astype(np.float32)
    v = rng.standard_normal((2, 2, 6, 5)).astype(np.float32)
    nonpad = np.array([4, 6], np.int64)
    mask = rng.random((3, 6)) < 0.8
    attrs = dict(attrs, is_causal=attrs.get("is_causal", 0))
    check("Attention", [q, k, v, mask, None, None, nonpad], attrs, opset=25, n_outputs=4)
    check("Attention", [q, k, v, None, None, None, nonpad], attrs, opset=25)


def test_attention_causal_with_a_mask_broadcast_over_queries():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    run = make_kernel(NodeSpec("Attention", attrs={"is_causal": 1}, opset=23, n_inputs=4))
    assert_close(run(q, k, v, np.ones((1, 3), np.bool_)), run(q, k, v, np.ones((3, 3), np.bool_)))
    (y,), _ = check("Attention", [q, k, v], {"is_causal": 1}, opset=23)
    assert_close(run(q, k, v, np.zeros((1, 3), np.float32)), [y])


def test_attention_fully_masked_rows_are_zero():
    q = np.ones((1, 1, 2, 2), np.float32)
    kv = np.ones((1, 1, 3, 2), np.float32)
    mask = np.array([[True, False, True], [False, False, False]])
    (y, *_), _ = check("Attention", [q, kv, kv, mask], {"qk_matmul_output_mode": 3}, opset=23, n_outputs=4)
    np.testing.assert_array_equal(y[0, 0, 1], 0)


def test_attention_refuses_mismatched_shapes():
    run = make_kernel(NodeSpec("Attention", name="attn", opset=23, n_inputs=3))
    q = np.zeros((1, 3, 2, 4), np.float32)
    with pytest.raises(KernelError, match="attn.*do not fit"):
        run(q, np.zeros((1, 2, 2, 4), np.float32), np.zeros((1, 2, 2, 4), np.float32))  # 3 heads over 2
    with pytest.raises(KernelError, match="q_num_heads"):
        run(np.zeros((1, 2, 4), np.float32), np.zeros((1, 2, 4), np.float32), np.zeros((1, 2, 4), np.float32))
