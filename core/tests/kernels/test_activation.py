"""Activation kernels against onnx.reference (onnxruntime for Softmax/LogSoftmax/Hardmax below
opset 13, where onnx.reference is wrong)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tol(dtype) -> dict:
    # float16 results carry 11 significant bits; byoc computes in float32 and rounds once,
    # onnx.reference rounds after each numpy step
    if np.dtype(dtype) == np.float16:
        return {"rtol": 5e-3, "atol": 5e-3}
    return {}


def check(op, inputs, attrs=None, opset=None, **tolerance):
    kw = {} if opset is None else {"opset": opset}
    model, feeds = single_node_model(op, inputs, attrs, **kw)
    assert_close(run_byoc(model, feeds), run_reference(model, feeds), **tolerance)


positive = st.floats(0.0625, 3.0, allow_nan=False, width=32)

#: op -> (strategy for its attributes, opset that defines it, input range)
POINTWISE = {
    "Relu": (st.just({}), None, 5.0),
    "LeakyRelu": (st.fixed_dictionaries({}, optional={"alpha": positive}), None, 5.0),
    "ThresholdedRelu": (st.fixed_dictionaries({}, optional={"alpha": positive}), None, 5.0),
    "Sigmoid": (st.just({}), None, 30.0),
    "HardSigmoid": (st.fixed_dictionaries({}, optional={"alpha": positive, "beta": positive}), None, 8.0),
    "HardSwish": (st.just({}), None, 8.0),
    "Tanh": (st.just({}), None, 12.0),
    "Erf": (st.just({}), None, 5.0),
    "Elu": (st.fixed_dictionaries({}, optional={"alpha": positive}), None, 5.0),
    "Selu": (st.fixed_dictionaries({}, optional={"alpha": positive, "gamma": positive}), None, 5.0),
    "Celu": (st.fixed_dictionaries({}, optional={"alpha": positive}), None, 5.0),
    "Softplus": (st.just({}), None, 20.0),
    "Softsign": (st.just({}), None, 5.0),
    "Mish": (st.just({}), None, 8.0),
    "Gelu": (st.fixed_dictionaries({}, optional={"approximate": st.sampled_from(["none", "tanh"])}), None, 6.0),
    "Shrink": (st.fixed_dictionaries({}, optional={"lambd": positive, "bias": positive}), None, 5.0),
    "Swish": (st.fixed_dictionaries({}, optional={"alpha": positive}), 24, 8.0),
}


@SETTINGS
@given(
    op=st.sampled_from(sorted(POINTWISE)),
    dtype=st.sampled_from([np.float32, np.float32, np.float64, np.float16]),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_pointwise_activations_match_reference(op, dtype, shape, seed, data):
    attrs_strategy, opset, scale = POINTWISE[op]
    attrs = data.draw(attrs_strategy)
    if op == "Softsign" and shape == ():
        shape = (1,)  # onnx.reference's Softsign fails on 0-d tensors
    x = np.random.default_rng(seed).uniform(-scale, scale, size=shape).astype(dtype)
    check(op, [x], attrs, opset=opset, **tol(dtype))


@pytest.mark.parametrize("op", ["Sigmoid", "Tanh", "Erf", "Softplus", "Elu", "Gelu", "HardSwish", "Relu"])
def test_activation_special_values(op):
    x = np.array([0.0, -0.0, 1e-30, -1e-30, 100.0, -100.0, 1e30, -1e30, np.inf, -np.inf, np.nan], np.float32)
    check(op, [x])


def test_transcendental_accuracy():
    # Tanh, Erf and Sigmoid in float32 against float64 over a dense sweep
    erf64 = np.vectorize(math.erf, otypes=[np.float64])
    x = np.linspace(-20, 20, 40_001, dtype=np.float32)
    x64 = x.astype(np.float64)
    for op, ref, rtol in [("Tanh", np.tanh, 3e-7), ("Erf", erf64, 6e-7), ("Sigmoid", lambda v: 1 / (1 + np.exp(-v)), 4e-7)]:
        got = make_kernel(NodeSpec(op))(x)[0].astype(np.float64)
        np.testing.assert_allclose(got, ref(x64), rtol=rtol, atol=1e-37, err_msg=op)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_relu_integers(dtype):
    check("Relu", [np.arange(-5, 5, dtype=dtype)])


@pytest.mark.parametrize("alpha", [-0.5, 0.0, 1.0, 2.5])
def test_leaky_relu_any_alpha(alpha):
    x = np.array([-3.0, -0.5, -0.0, 0.0, 0.25, 4.0, np.inf, -np.inf, np.nan], np.float32)
    check("LeakyRelu", [x], {"alpha": alpha})


@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
def test_shrink_integers(dtype):
    # computed in float and truncated back, as onnx.reference does
    check("Shrink", [np.arange(0 if dtype == np.uint8 else -5, 6).astype(dtype)], {"lambd": 1.5, "bias": 0.5})


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=1, min_dims=1, max_dims=4, max_side=5),
    dtype=st.sampled_from([np.float32, np.float64, np.float16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_prelu_slope_broadcast(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    x_shape = shapes.result_shape
    slope_shape = shapes.input_shapes[0]  # broadcasts (unidirectionally) to x
    x = rng.uniform(-3, 3, size=x_shape).astype(dtype)
    slope = rng.uniform(-1, 1, size=slope_shape).astype(dtype)
    check("PRelu", [x, slope], **tol(dtype))


@SETTINGS
@given(
    dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.int64, np.int8]),
    lo=st.one_of(st.none(), st.integers(-6, 6)),
    hi=st.one_of(st.none(), st.integers(-6, 6)),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_clip_matches_reference(dtype, lo, hi, shape, seed):
    # lo > hi included: every value becomes hi
    x = (np.random.default_rng(seed).uniform(-8, 8, size=shape)).astype(dtype)
    inputs = [x, None if lo is None else np.array(lo, dtype), None if hi is None else np.array(hi, dtype)]
    while inputs and inputs[-1] is None:
        inputs.pop()
    check("Clip", inputs)


def test_clip_keeps_nan_and_old_opset_attributes():
    x = np.array([-3.0, np.nan, 0.5, 9.0], np.float32)
    check("Clip", [x, np.array(-1, np.float32), np.array(1, np.float32)])
    # opset 6: min/max are attributes (compare with onnx.reference at that opset)
    model, feeds = single_node_model("Clip", [x], {"min": -0.5, "max": 2.0}, opset=6)
    expected = run_reference(model, feeds)
    run = make_kernel(NodeSpec("Clip", opset=6, attrs={"min": -0.5, "max": 2.0}))
    assert_close(run(x), expected)
    assert_close(run_byoc(model, feeds), expected)  # up-converted to Clip-11 on load


# -------------------------------------------------------------------------------------------------
# softmax family


@SETTINGS
@given(
    op=st.sampled_from(["Softmax", "LogSoftmax", "Hardmax"]),
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=7),
    dtype=st.sampled_from([np.float32, np.float32, np.float64, np.float16]),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_softmax_family_opset13_matches_reference(op, shape, dtype, data, seed):
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    attrs = {} if axis is None else {"axis": axis}
    x = np.random.default_rng(seed).uniform(-10, 10, size=shape).astype(dtype)
    if op == "Hardmax":
        x = np.round(x)  # ties: the first maximum wins
    if dtype == np.float16:
        # onnx.reference computes log(softmax) in float16 (-15.9 for -16.1); the oracle is the
        # float32 result rounded to float16
        model, feeds = single_node_model(op, [x], attrs)
        model32, feeds32 = single_node_model(op, [x.astype(np.float32)], attrs)
        expected = [r.astype(np.float16) for r in run_reference(model32, feeds32)]
        assert_close(run_byoc(model, feeds), expected, **tol(dtype))
        return
    check(op, [x], attrs)


@SETTINGS
@given(
    op=st.sampled_from(["Softmax", "LogSoftmax", "Hardmax"]),
    opset=st.sampled_from([1, 11]),
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_softmax_family_before_opset13_flattens(op, opset, shape, data, seed):
    # before opset 13 the input is coerced to 2-D at `axis` (default 1); onnx.reference gets this
    # wrong, so onnxruntime is the oracle, and the kernel is built at that opset directly
    # (byoc.compile would up-convert the model first)
    rank = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-rank if opset >= 11 else 0, rank - 1)))
    if axis is None and rank < 2:
        axis = 0
    attrs = {} if axis is None else {"axis": axis}
    x = np.random.default_rng(seed).uniform(-10, 10, size=shape).astype(np.float32)
    if op == "Hardmax":
        x = np.round(x)
    model, feeds = single_node_model(op, [x], attrs, opset=opset)
    expected = run_onnxruntime(model, feeds)
    run = make_kernel(NodeSpec(op, opset=opset, attrs=attrs))
    assert_close(run(x), expected)


def test_softmax_opset13_differs_from_flattening():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    new = make_kernel(NodeSpec("Softmax", opset=13, attrs={"axis": 1}))(x)[0]
    old = make_kernel(NodeSpec("Softmax", opset=11, attrs={"axis": 1}))(x)[0]
    np.testing.assert_allclose(new.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(old.reshape(2, 12).sum(axis=1), 1.0, rtol=1e-6)


def test_softmax_special_rows():
    x = np.array([[1.0, 2.0, 3.0], [-np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0], [1e30, 1e30, -1e30]], np.float32)
    check("Softmax", [x])
    # onnx.reference takes log(softmax(x)), -inf where softmax underflows; byoc (like onnxruntime)
    # computes x - max - log(sum), which stays finite (-2e30 in the last row)
    model, feeds = single_node_model("LogSoftmax", [x])
    assert_close(run_byoc(model, feeds), run_onnxruntime(model, feeds))


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_large(axis):
    x = np.random.default_rng(0).standard_normal((64, 300, 70)).astype(np.float32)
    got = make_kernel(NodeSpec("Softmax", attrs={"axis": axis}))(x)[0]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-7)


def test_bad_attributes_raise_kernel_errors():
    with pytest.raises(KernelError, match="approximate"):
        make_kernel(NodeSpec("Gelu", attrs={"approximate": "erf"}))
    with pytest.raises(KernelError, match="axis 3 is out of range"):
        make_kernel(NodeSpec("Softmax", attrs={"axis": 3}))(np.ones((2, 2), np.float32))
    with pytest.raises(KernelError, match="element type"):
        make_kernel(NodeSpec("Sigmoid"))(np.ones(3, np.int32))
    with pytest.raises(KernelError, match="min must be a scalar"):
        make_kernel(NodeSpec("Clip", n_inputs=3))(np.ones(3, np.float32), np.ones(2, np.float32), None)
    assert math.isfinite(make_kernel(NodeSpec("Celu", attrs={"alpha": 2.0}))(np.float32([-1]))[0][0])
