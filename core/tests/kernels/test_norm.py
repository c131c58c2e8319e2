"""BatchNormalization, LayerNormalization, InstanceNormalization, LRN.

Oracles: onnx.reference for LayerNormalization and InstanceNormalization; onnxruntime for
BatchNormalization (onnx.reference treats a ``momentum`` attribute in opsets 9-13 as training
mode) and LRN (onnx.reference's LRN loops over the batch axis instead of the channels).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(op, inputs, attrs, oracle, n_outputs=1, const=(), opset=None, **tol):
    kw = {} if opset is None else {"opset": opset}
    model, feeds = single_node_model(op, inputs, attrs, n_outputs=n_outputs, const_inputs=const, **kw)
    assert_close(run_byoc(model, feeds), oracle(model, feeds), **tol)


shapes = st.lists(st.integers(1, 5), min_size=2, max_size=5).map(tuple)


@SETTINGS
@given(shape=shapes, const=st.booleans(), eps=st.sampled_from([1e-5, 1e-3, 0.1]),
       opset=st.sampled_from([9, 14, 15, 21]), seed=st.integers(0, 2**16))
def test_batch_normalization_property(shape, const, eps, opset, seed):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = rng.standard_normal(shape).astype(np.float32)
    params = [rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c), rng.uniform(0.1, 2.0, c)]
    params = [p.astype(np.float32) for p in params]
    check("BatchNormalization", [x] + params, {"epsilon": eps, "momentum": 0.9}, run_onnxruntime,
          const=(1, 2, 3, 4) if const else (), opset=opset)


def test_batch_normalization_float64_and_float16():
    rng = np.random.default_rng(0)
    for dtype, tol in ((np.float64, {"rtol": 1e-12, "atol": 1e-12}), (np.float16, {"rtol": 2e-3, "atol": 2e-3})):
        x = rng.standard_normal((2, 3, 4)).astype(dtype)
        params = [rng.standard_normal(3).astype(dtype) for _ in range(3)] + [rng.uniform(0.5, 2, 3).astype(dtype)]
        check("BatchNormalization", [x] + params, {}, run_reference, **tol)


def test_batch_normalization_training_refused():
    spec = NodeSpec("BatchNormalization", name="bn", attrs={"training_mode": 1}, opset=15, n_inputs=5)
    with pytest.raises(KernelError, match="training"):
        make_kernel(spec)
    spec = NodeSpec("BatchNormalization", name="bn", opset=9, n_inputs=5, n_outputs=5)
    with pytest.raises(KernelError, match="training"):
        make_kernel(spec)


@SETTINGS
@given(shape=shapes, data=st.data(), with_bias=st.booleans(), n_outputs=st.integers(1, 3),
       eps=st.sampled_from([1e-5, 1e-2]), seed=st.integers(0, 2**16))
def test_layer_normalization_property(shape, data, with_bias, n_outputs, eps, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    norm_shape = shape[axis:]
    # Scale and B broadcast to the normalised shape: sometimes with leading axes dropped
    drop = data.draw(st.integers(0, len(norm_shape) - 1))
    p_shape = norm_shape[drop:]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    inputs = [x, rng.standard_normal(p_shape).astype(np.float32)]
    if with_bias:
        inputs.append(rng.standard_normal(p_shape).astype(np.float32))
    check("LayerNormalization", inputs, {"axis": axis, "epsilon": eps}, run_reference, n_outputs=n_outputs,
          rtol=1e-4, atol=1e-5)


def test_layer_normalization_transformer_shape():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 64)).astype(np.float32)
    s = rng.standard_normal(64).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    check("LayerNormalization", [x, s, b], {}, run_reference, const=(1, 2))
    check("LayerNormalization", [x, s, b], {}, run_onnxruntime, n_outputs=3)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=3, max_size=5).map(tuple),
       eps=st.sampled_from([1e-5, 1e-2]), seed=st.integers(0, 2**16))
def test_instance_normalization_property(shape, eps, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 - 1).astype(np.float32)
    c = shape[1]
    check("InstanceNormalization", [x, rng.standard_normal(c).astype(np.float32),
                                    rng.standard_normal(c).astype(np.float32)], {"epsilon": eps}, run_reference,
          rtol=1e-4, atol=1e-5)


def _lrn_spec(x, size, alpha, beta, bias):
    """The ONNX definition, in float64."""
    x = x.astype(np.float64)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.stack([np.sum(x[:, max(0, i - lo):min(c, i + hi + 1)] ** 2, axis=1) for i in range(c)], axis=1)
    return x / (bias + alpha / size * sq) ** beta


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=4, max_size=4).map(tuple),
       size=st.integers(1, 7), alpha=st.sampled_from([1e-4, 0.1, 1.0]), beta=st.sampled_from([0.75, 0.5, 1.3]),
       bias=st.sampled_from([1.0, 2.0, 0.5]), seed=st.integers(0, 2**16))
def test_lrn_property(shape, size, alpha, beta, bias, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    attrs = {"size": size, "alpha": alpha, "beta": beta, "bias": bias}
    if size % 2 == 1:  # onnxruntime only accepts odd sizes
        check("LRN", [x], attrs, run_onnxruntime, rtol=1e-4, atol=1e-5)
    (y,) = make_kernel(NodeSpec("LRN", name="lrn", attrs=attrs))(x)
    np.testing.assert_allclose(y, _lrn_spec(x, size, alpha, beta, bias), rtol=1e-5, atol=1e-6)


def test_lrn_alexnet_layer():
    x = np.random.default_rng(3).standard_normal((1, 16, 13, 13)).astype(np.float32) * 10
    check("LRN", [x], {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}, run_onnxruntime)


def test_norm_errors():
    ln = make_kernel(NodeSpec("LayerNormalization", name="ln", attrs={"axis": 3}, n_inputs=2))
    with pytest.raises(KernelError, match="axis"):
        ln(np.zeros((2, 3), np.float32), np.ones(3, np.float32))
    ln = make_kernel(NodeSpec("LayerNormalization", name="ln", n_inputs=2))
    with pytest.raises(KernelError, match="broadcast"):
        ln(np.zeros((2, 3), np.float32), np.ones(4, np.float32))
    inorm = make_kernel(NodeSpec("InstanceNormalization", name="in", n_inputs=3))
    with pytest.raises(KernelError, match="shape"):
        inorm(np.zeros((1, 2, 3), np.float32), np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(KernelError, match="size"):
        make_kernel(NodeSpec("LRN", name="lrn", attrs={}))
    bn = make_kernel(NodeSpec("BatchNormalization", name="bn", n_inputs=5))
    with pytest.raises(KernelError, match="expected"):
        bn(np.zeros((1, 2, 3), np.float32), *[np.ones(3, np.float32)] * 4)
