"""Reduction kernels (Reduce*, ArgMax, ArgMin) against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
#: operators onnx.reference (and byoc) compute for integer inputs too
INT_OPS = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare"}


def data_for(op, shape, dtype, rng):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(-3 if dtype.kind == "i" else 0, 4, size=shape).astype(dtype)
    if op == "ReduceLogSum":
        x = rng.uniform(0.1, 2.0, size=shape)  # the sum must be positive
    elif op == "ReduceProd":
        x = rng.uniform(0.5, 1.5, size=shape)  # keep products in range
    else:
        x = rng.uniform(-3.0, 3.0, size=shape)
    return np.asarray(x.astype(dtype))


@st.composite
def axes_for(draw, rank):
    """None (attribute/input absent), [] (empty), or a set of distinct axes, some negative."""
    choice = draw(st.sampled_from(["none", "empty", "some", "some"]))
    if choice == "none" or rank == 0:
        return None if choice == "none" else []
    if choice == "empty":
        return []
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    return [a - rank if draw(st.booleans()) else a for a in axes]


def tol(op, dtype) -> dict:
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        # float16 sums: onnx.reference accumulates in float16, byoc in float64
        return {"rtol": 1e-2, "atol": 1e-2}
    if dtype == np.float32:
        # byoc accumulates float32 sums in float64; onnx.reference uses float32 pairwise sums
        return {"rtol": 2e-4, "atol": 1e-4}
    return {}


@SETTINGS
@given(
    op=st.sampled_from(REDUCE_OPS),
    dtype=st.sampled_from([np.float32, np.float32, np.float64, np.float16, np.int32, np.int64]),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=5),
    keepdims=st.sampled_from([None, 0, 1]),
    noop=st.sampled_from([None, 0, 1]),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_reductions_match_reference(op, dtype, shape, keepdims, noop, data, seed):
    if np.dtype(dtype).kind in "iu" and op not in INT_OPS:
        dtype = np.float32
    if op == "ReduceLogSumExp" and shape == ():
        shape = (1,)  # onnx.reference's ReduceLogSumExp fails on 0-d tensors
    axes = data.draw(axes_for(len(shape)))
    x = data_for(op, shape, dtype, np.random.default_rng(seed))
    attrs = {}
    if keepdims is not None:
        attrs["keepdims"] = keepdims
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    inputs = [x] if axes is None else [x, np.array(axes, dtype=np.int64)]
    # axes as a constant (the usual case) or as a runtime input
    const = data.draw(st.sampled_from([(), (1,)])) if axes is not None else ()
    model, feeds = single_node_model(op, inputs, attrs, const_inputs=const)
    expected = run_reference(model, feeds)
    if np.dtype(dtype).kind in "iu":
        # numpy's sum promotes int32 to int64 where onnx.reference passes no dtype (ReduceSumSquare
        # of a 0-d int32 tensor); the ONNX output type is the input type
        expected = [e.astype(dtype) for e in expected]
    assert_close(run_byoc(model, feeds), expected, **tol(op, dtype))


@SETTINGS
@given(
    op=st.sampled_from(REDUCE_OPS),
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5),
    keepdims=st.sampled_from([0, 1]),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_reductions_with_axes_attribute_before_opset18(op, shape, keepdims, data, seed):
    # opset 13 (ReduceSum: 11): axes is an attribute; the kernel is built at that opset
    opset = 11 if op == "ReduceSum" else 13
    axes = data.draw(axes_for(len(shape)))
    attrs = {"keepdims": keepdims}
    if axes:
        attrs["axes"] = axes
    x = data_for(op, shape, np.float32, np.random.default_rng(seed))
    model, feeds = single_node_model(op, [x], attrs, opset=opset)
    expected = run_reference(model, feeds)
    run = make_kernel(NodeSpec(op, opset=opset, attrs=attrs))
    assert_close(run(x), expected, **tol(op, np.float32))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool_and_nan(op):
    b = np.array([[True, False, False], [False, False, False]])
    model, feeds = single_node_model(op, [b, np.array([1], np.int64)])
    assert_close(run_byoc(model, feeds), run_reference(model, feeds))
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], np.float32)
    model, feeds = single_node_model(op, [x, np.array([1], np.int64)], {"keepdims": 0})
    assert_close(run_byoc(model, feeds), run_reference(model, feeds))
    # long rows: a NaN anywhere in a row still wins
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.int32, np.int8):
        x = (rng.standard_normal((4, 203)) * 50).astype(dtype)
        if x.dtype.kind == "f":
            x[1, 150] = np.nan
            x[2, 7] = -np.inf
        model, feeds = single_node_model(op, [x, np.array([-1], np.int64)])
        assert_close(run_byoc(model, feeds), run_reference(model, feeds))


def test_reduce_empty_reduction_gives_identity_values():
    x = np.zeros((0, 3), np.float32)
    axes = np.array([0], np.int64)
    for op in ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceSumSquare"]:
        model, feeds = single_node_model(op, [x, axes], {"keepdims": 0})
        assert_close(run_byoc(model, feeds), run_reference(model, feeds))


def test_large_float32_sums_are_accurate():
    x = np.random.default_rng(0).uniform(0, 1, size=(64, 4096, 3)).astype(np.float32)
    got = make_kernel(NodeSpec("ReduceSum", n_inputs=2))(x, np.array([1], np.int64))[0]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1, keepdims=True), rtol=1e-6)
    total = make_kernel(NodeSpec("ReduceMean"))(x)[0]
    np.testing.assert_allclose(total, x.astype(np.float64).mean(keepdims=True), rtol=1e-6)


# -------------------------------------------------------------------------------------------------
# ArgMax / ArgMin


@SETTINGS
@given(
    op=st.sampled_from(["ArgMax", "ArgMin"]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8]),
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
    keepdims=st.sampled_from([None, 0, 1]),
    last=st.sampled_from([None, 0, 1]),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_argmax_argmin_match_reference(op, dtype, shape, keepdims, last, data, seed):
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    # few distinct values: ties decide select_last_index
    x = np.random.default_rng(seed).integers(0, 4, size=shape).astype(dtype)
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if keepdims is not None:
        attrs["keepdims"] = keepdims
    if last is not None:
        attrs["select_last_index"] = last
    model, feeds = single_node_model(op, [x], attrs)
    assert_close(run_byoc(model, feeds), run_reference(model, feeds))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis", [0, 1])
def test_arg_nan(op, last, axis):
    x = np.array([[1, np.nan, 3, np.nan, 2], [5, 5, np.nan, 1, np.nan], [np.nan, 0, 0, 7, np.nan]], np.float32)
    model, feeds = single_node_model(op, [x], {"axis": axis, "select_last_index": last})
    assert_close(run_byoc(model, feeds), run_reference(model, feeds))


def test_errors():
    with pytest.raises(KernelError, match="out of range"):
        make_kernel(NodeSpec("ReduceSum", n_inputs=2))(np.ones((2, 3), np.float32), np.array([2], np.int64))
    with pytest.raises(KernelError, match="repeat"):
        make_kernel(NodeSpec("ReduceMean", n_inputs=2))(np.ones((2, 3), np.float32), np.array([1, -1], np.int64))
    with pytest.raises(KernelError, match="out of range"):
        make_kernel(NodeSpec("ArgMax", attrs={"axis": 2}))(np.ones((2, 3), np.float32))
    with pytest.raises(KernelError, match="empty axis"):
        make_kernel(NodeSpec("ArgMin", attrs={"axis": 0}))(np.ones((0, 3), np.float32))
    with pytest.raises(KernelError, match="element type"):
        make_kernel(NodeSpec("ReduceLogSumExp"))(np.array(["a"]))
