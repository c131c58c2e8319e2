"""MaxPool, AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool against onnx.reference / onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(op, x, attrs, oracle, n_outputs=1, opset=None, **tol):
    kw = {} if opset is None else {"opset": opset}
    model, feeds = single_node_model(op, [x], attrs, n_outputs=n_outputs, **kw)
    assert_close(run_byoc(model, feeds), oracle(model, feeds), **(tol or {"rtol": 1e-5, "atol": 1e-6}))


@st.composite
def pool_cases(draw, ranks=(1, 2, 2, 3)):
    nd = draw(st.sampled_from(ranks))
    max_side = {1: 10, 2: 7, 3: 4}[nd]
    k = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    ek = [(k[i] - 1) * dil[i] + 1 for i in range(nd)]
    spatial = [draw(st.integers(ek[i], max(ek[i], max_side))) for i in range(nd)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad.startswith("SAME"):
        # a window narrower than the stride needs negative SAME padding, which onnxruntime
        # rejects (byoc clamps it to zero); both oracles also leave the dilation out of the SAME
        # padding (test_same_padding_with_dilation checks byoc against the operator definition)
        dil = [1] * nd
        ek = k
        strides = [min(s, ek[i]) for i, s in enumerate(strides)]
    attrs = {"kernel_shape": k, "strides": strides, "dilations": dil}
    if auto_pad == "NOTSET":
        # onnxruntime requires pads smaller than the kernel
        attrs["pads"] = [draw(st.integers(0, k[i % nd] - 1)) for i in range(2 * nd)]
        attrs["ceil_mode"] = int(draw(st.booleans()))
    else:
        attrs["auto_pad"] = auto_pad
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal([draw(st.integers(1, 2)), draw(st.integers(1, 3))] + spatial).astype(np.float32)
    return x, attrs


def _reference_pool_ok(attrs) -> bool:
    """Whether onnx.reference's pooling is right for these attributes.

    Its shared pooling code shifts the windows when ceil_mode needs more than one element of
    extra padding (it splits the extra padding over both sides) and ignores dilations in the
    output shape of auto_pad VALID/SAME. onnxruntime follows the operator definition there.
    """
    if attrs.get("ceil_mode") and any(s > 2 for s in attrs["strides"]):
        return False
    if attrs.get("auto_pad", "NOTSET") != "NOTSET" and any(d > 1 for d in attrs["dilations"]):
        return False
    return True


@SETTINGS
@given(pool_cases())
def test_max_pool_property(case):
    # onnxruntime is the oracle: onnx.reference's MaxPool has a second code path for unit
    # strides and dilations (the older _op_common_pool) that ignores explicit pads in the
    # output shape; test_pool_regressions compares against onnx.reference where it is right
    x, attrs = case
    check("MaxPool", x, attrs, run_onnxruntime)


@SETTINGS
@given(pool_cases(ranks=(1, 2, 3)), st.integers(0, 1))
def test_max_pool_indices_property(case, storage_order):
    x, attrs = case
    attrs = dict(attrs, storage_order=storage_order)
    # onnxruntime's MaxPool with Indices accepts 1-D to 3-D and every attribute here
    check("MaxPool", x, attrs, run_onnxruntime, n_outputs=2)


@SETTINGS
@given(pool_cases(), st.integers(0, 1))
def test_average_pool_property(case, count_include_pad):
    x, attrs = case
    attrs = dict(attrs, count_include_pad=count_include_pad)
    oracle = run_reference if _reference_pool_ok(attrs) else run_onnxruntime
    check("AveragePool", x, attrs, oracle)


@SETTINGS
@given(pool_cases(), st.sampled_from([1, 2, 3]))
def test_lp_pool_property(case, p):
    # onnxruntime is the oracle: onnx.reference scales the padded average by the window size
    x, attrs = case
    check("LpPool", x, dict(attrs, p=p), run_onnxruntime, opset=18, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "op,shape,attrs",
    [
        # ResNet-50 stem and head
        ("MaxPool", (1, 4, 16, 16), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("AveragePool", (1, 8, 7, 7), {"kernel_shape": [7, 7], "strides": [1, 1]}),
        # GoogLeNet/Inception style ceil_mode pooling
        ("MaxPool", (1, 3, 13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ("AveragePool", (1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                       "count_include_pad": 1}),
        ("AveragePool", (2, 2, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                                       "ceil_mode": 1}),
    ],
)
def test_pool_regressions(op, shape, attrs):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    check(op, x, attrs, run_reference)
    check(op, x, attrs, run_onnxruntime)
    if op == "MaxPool":
        check(op, x, attrs, run_reference, n_outputs=2)


def test_max_pool_integer_and_float64():
    rng = np.random.default_rng(1)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 1], "pads": [1, 0, 0, 1]}
    x8 = rng.integers(-128, 127, (1, 2, 5, 6)).astype(np.int8)
    check("MaxPool", x8, attrs, run_reference)
    xd = rng.standard_normal((1, 2, 5, 6))
    check("MaxPool", xd, attrs, run_reference)
    check("AveragePool", xd, attrs, run_reference, rtol=1e-12, atol=1e-12)


def test_max_pool_indices_ties_keep_first():
    x = np.zeros((1, 1, 4, 4), np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    check("MaxPool", x, attrs, run_reference, n_outputs=2)
    check("MaxPool", x, dict(attrs, storage_order=1), run_reference, n_outputs=2)


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7), (1, 2, 3, 4, 5), (1, 2048, 7, 7)])
def test_global_pool(op, shape):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    # onnx.reference's GlobalMaxPool gets the output shape wrong for inputs other than 4-D
    oracle = run_onnxruntime if op == "GlobalMaxPool" and len(shape) != 4 else run_reference
    check(op, x, {}, oracle)


def test_pool_errors():
    with pytest.raises(KernelError, match="kernel_shape"):
        make_kernel(NodeSpec("MaxPool", name="p", attrs={}))
    run = make_kernel(NodeSpec("MaxPool", name="p", attrs={"kernel_shape": [3, 3]}))
    with pytest.raises(KernelError, match="rank"):
        run(np.zeros((1, 1, 5), np.float32))
    with pytest.raises(KernelError, match="larger than the padded input"):
        run(np.zeros((1, 1, 2, 2), np.float32))
    avg = make_kernel(NodeSpec("AveragePool", name="p", attrs={"kernel_shape": [2]}))
    with pytest.raises(KernelError, match="float"):
        avg(np.zeros((1, 1, 5), np.int32))


def test_same_padding_with_dilation():
    # ONNX: SAME pads so that out = ceil(in / stride), with the dilated window (k-1)*d+1;
    # onnx.reference and onnxruntime both pad for the undilated window instead
    x = np.arange(7, dtype=np.float32).reshape(1, 1, 7)[:, :, ::-1].copy()
    run = make_kernel(NodeSpec("MaxPool", name="p", attrs={"kernel_shape": [2], "dilations": [3],
                                                           "auto_pad": "SAME_LOWER", "strides": [2]}))
    (y,) = run(x)
    # window 4 wide, out = 4, total pad = 3*2 + 4 - 7 = 3: 2 before (SAME_LOWER), 1 after
    padded = np.concatenate([[-np.inf, -np.inf], x[0, 0], [-np.inf]])
    expected = [max(padded[2 * i], padded[2 * i + 3]) for i in range(4)]
    np.testing.assert_array_equal(y[0, 0], expected)
