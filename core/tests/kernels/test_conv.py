"""Conv and ConvTranspose against onnx.reference (and onnxruntime where the reference is wrong)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# float32 sums of up to a few hundred products: results differ from the oracle's (another
# summation order) by a few float32 ulps of the *terms*, so small outputs need an absolute
# tolerance above the default 1e-5
TOL = {"rtol": 1e-4, "atol": 1e-4}


def check(op, inputs, attrs, oracle=run_reference, const=(1, 2), opset=None, **tol):
    kw = {} if opset is None else {"opset": opset}
    model, feeds = single_node_model(op, inputs, attrs, const_inputs=const, **kw)
    assert_close(run_byoc(model, feeds), oracle(model, feeds), **(tol or TOL))


def conv_run(x, w, b=None, **attrs):
    """The kernel alone, without compiling a model (for error cases)."""
    spec = NodeSpec("Conv", name="c", attrs=attrs, n_inputs=3 if b is not None else 2)
    return make_kernel(spec)(x, w, b)[0]


@st.composite
def conv_cases(draw, min_cg=1, max_cg=4, stride_one=False, ranks=(1, 2, 3)):
    nd = draw(st.sampled_from(ranks))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.integers(min_cg, max_cg))
    mg = draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    max_side = {1: 12, 2: 9, 3: 5}[nd]
    k = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [1] * nd if stride_one else [draw(st.integers(1, 3)) for _ in range(nd)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    spatial = [draw(st.integers((k[i] - 1) * dil[i] + 1, max_side)) for i in range(nd)]
    attrs = {"group": group, "dilations": dil, "strides": strides, "kernel_shape": k}
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = auto_pad
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal([n, cg * group] + spatial).astype(np.float32)
    w = rng.standard_normal([mg * group, cg] + k).astype(np.float32)
    b = rng.standard_normal(mg * group).astype(np.float32) if draw(st.booleans()) else None
    const = (1, 2) if draw(st.booleans()) else ()
    return x, w, b, attrs, const


@SETTINGS
@given(conv_cases())
def test_conv_property(case):
    x, w, b, attrs, const = case
    check("Conv", [x, w] + ([b] if b is not None else []), attrs, const=const)


@SETTINGS
@given(conv_cases(min_cg=16, max_cg=20, stride_one=True, ranks=(1, 2)))
def test_conv_shift_strategy_property(case):
    # >= 16 channels per group at stride 1: the tap-accumulating SGEMM path
    x, w, b, attrs, const = case
    check("Conv", [x, w] + ([b] if b is not None else []), attrs, const=const)


@SETTINGS
@given(conv_cases(min_cg=5, max_cg=9))
def test_conv_im2col_strategy_property(case):
    x, w, b, attrs, const = case
    check("Conv", [x, w] + ([b] if b is not None else []), attrs, const=const)


@SETTINGS
@given(conv_cases(min_cg=16, max_cg=20, ranks=(1, 2)))
def test_conv_strided_strategies_property(case):
    # >= 16 channels per group with strides: stride-phase planes (shift over phases, or im2col
    # from phases for small channel counts once _SHIFT_MIN_CHANNELS is raised)
    x, w, b, attrs, const = case
    check("Conv", [x, w] + ([b] if b is not None else []), attrs, const=const)


@pytest.mark.parametrize(
    "xshape,wshape,attrs",
    [
        # ResNet-50 layer kinds at reduced size
        ((1, 3, 32, 32), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
        ((1, 32, 14, 14), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((2, 32, 14, 14), (16, 32, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ((1, 64, 7, 7), (32, 64, 1, 1), {}),
        ((2, 64, 8, 8), (32, 64, 1, 1), {"strides": [2, 2]}),
        ((2, 32, 6, 6), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # shift with a batch of two
        # depthwise, MobileNet style
        ((1, 16, 10, 10), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}),
        ((1, 16, 10, 10), (32, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
        # asymmetric pads and dilation on the shift path
        ((1, 24, 9, 13), (8, 24, 3, 5), {"pads": [0, 2, 1, 1], "dilations": [2, 1]}),
        # 1x1 with padding: the zero border gets the bias
        ((1, 4, 5, 5), (3, 4, 1, 1), {"pads": [1, 0, 1, 2]}),
        # 3-D, one output depth read from the depth padding, strided in H/W (found by hypothesis:
        # the strided 2-D path read input depth 0 instead)
        ((1, 5, 1, 1, 1), (1, 5, 1, 1, 1), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 0, 0]}),
        ((1, 3, 2, 5, 6), (2, 3, 1, 2, 2), {"strides": [3, 2, 2], "pads": [1, 0, 1, 0, 0, 0]}),
    ],
)
def test_conv_regressions(xshape, wshape, attrs):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    check("Conv", [x, w, b], attrs)
    check("Conv", [x, w], attrs, const=())


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_conv_other_dtypes(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 20, 6, 7)).astype(dtype)
    w = (rng.standard_normal((4, 20, 3, 3)) * 0.2).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    # float16: byoc computes in float32 and rounds once; the reference accumulates in float16
    tol = {"rtol": 1e-9, "atol": 1e-9} if dtype == np.float64 else {"rtol": 2e-2, "atol": 2e-2}
    check("Conv", [x, w, b], {"pads": [1, 1, 1, 1]}, **tol)


def test_conv_errors():
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(KernelError, match="channels"):
        conv_run(x, np.zeros((2, 3, 3, 3), np.float32))
    with pytest.raises(KernelError, match="larger than the padded input"):
        conv_run(x, np.zeros((2, 4, 7, 7), np.float32))
    with pytest.raises(KernelError, match="kernel_shape"):
        conv_run(x, np.zeros((2, 4, 3, 3), np.float32), kernel_shape=[2, 2])
    with pytest.raises(KernelError, match="auto_pad"):
        conv_run(x, np.zeros((2, 4, 3, 3), np.float32), auto_pad="SAME")
    with pytest.raises(KernelError, match="float"):
        conv_run(x.astype(np.int32), np.zeros((2, 4, 3, 3), np.int32))


# -------------------------------------------------------------------------------------------------
# ConvTranspose


@st.composite
def conv_transpose_cases(draw):
    nd = draw(st.sampled_from([1, 2, 2, 3]))
    group = draw(st.sampled_from([1, 1, 2]))
    cg = draw(st.integers(1, 3))
    mg = draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    max_side = {1: 7, 2: 5, 3: 3}[nd]
    k = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    spatial = [draw(st.integers(1, max_side)) for _ in range(nd)]
    attrs = {"group": group, "dilations": dil, "strides": strides}
    mode = draw(st.sampled_from(["pads", "pads", "output_shape", "SAME_UPPER", "SAME_LOWER"]))
    natural = [strides[i] * (spatial[i] - 1) + (k[i] - 1) * dil[i] + 1 for i in range(nd)]
    if mode == "pads":
        pads = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
        # keep the output non-empty
        pads = [min(p, (natural[i % nd] - 1) // 2) for i, p in enumerate(pads)]
        attrs["pads"] = pads
        opad = [draw(st.integers(0, max(0, min(strides[i], dil[i]) - 1))) for i in range(nd)]
        attrs["output_padding"] = opad
    elif mode == "output_shape":
        attrs["output_shape"] = [max(1, natural[i] + draw(st.integers(-1, 0))) for i in range(nd)]
    else:
        attrs["auto_pad"] = mode
        if group > 1:
            # a kernel narrower than the stride makes the SAME padding negative: onnxruntime (the
            # oracle for groups) then keeps the natural size, the spec and onnx.reference grow the output
            attrs["strides"] = [min(s, (k[i] - 1) * dil[i] + 1) for i, s in enumerate(strides)]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal([n, cg * group] + spatial).astype(np.float32)
    w = rng.standard_normal([cg * group, mg] + k).astype(np.float32)
    b = rng.standard_normal(mg * group).astype(np.float32) if draw(st.booleans()) else None
    return x, w, b, attrs


@SETTINGS
@given(conv_transpose_cases())
def test_conv_transpose_property(case):
    x, w, b, attrs = case
    inputs = [x, w] + ([b] if b is not None else [])
    # onnx.reference's ConvTranspose fails for group > 1 (it reshapes the grouped weight wrongly)
    # and ignores the spec's pads for NOTSET with output_shape; onnxruntime follows the spec
    oracle = run_reference if attrs["group"] == 1 and "output_shape" not in attrs else run_onnxruntime
    check("ConvTranspose", inputs, attrs, oracle=oracle)


def test_conv_transpose_regressions():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 7, 7)).astype(np.float32)
    w = rng.standard_normal((8, 4, 4, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    # the usual 2x upsampling layer
    check("ConvTranspose", [x, w, b], {"strides": [2, 2], "pads": [1, 1, 1, 1]})
    check("ConvTranspose", [x, w, b], {"strides": [2, 2], "output_shape": [14, 14]}, oracle=run_onnxruntime)
    xg = rng.standard_normal((2, 6, 4, 5)).astype(np.float32)
    wg = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    check("ConvTranspose", [xg, wg], {"group": 3, "strides": [2, 1], "output_padding": [1, 0]}, oracle=run_onnxruntime)


def test_conv_kernel_is_thread_safe():
    # one compiled model run from several threads at once: per-thread scratch buffers, the
    # shared pool (busy -> a caller runs its chunks alone), cached weight packing
    from concurrent.futures import ThreadPoolExecutor

    import byoc

    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 32, 20, 20)).astype(np.float32)
    w = rng.standard_normal((48, 32, 3, 3)).astype(np.float32)
    model, _ = single_node_model("Conv", [x, w], {"pads": [1, 1, 1, 1]}, const_inputs=(1,))
    compiled = byoc.compile(model, targets=[])
    inputs = [rng.standard_normal(x.shape).astype(np.float32) for _ in range(8)]
    expected = [compiled.run({"in0": v})["out0"] for v in inputs]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda v: compiled.run({"in0": v})["out0"], inputs * 3))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, expected[i % len(inputs)])


@pytest.mark.parametrize("attrs", [
    {"group": 24, "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"group": 24, "pads": [2, 1, 0, 2], "dilations": [2, 1]},
    {"group": 8, "pads": [1, 1, 1, 1], "strides": [3, 1]},
])
def test_depthwise_with_channel_multiplier_matches_onnxruntime(attrs):
    rng = np.random.default_rng(3)
    g = attrs["group"]
    x = rng.standard_normal((2, 24, 15, 12)).astype(np.float32)
    w = rng.standard_normal((2 * g, 24 // g, 3, 3)).astype(np.float32)
    b = rng.standard_normal(2 * g).astype(np.float32)
    check("Conv", [x, w, b], attrs, oracle=run_onnxruntime)


@pytest.mark.parametrize("depth, strides", [(2, [2, 1, 2]), (3, [3, 2, 1]), (1, [1, 2, 2])])
def test_conv3d_one_output_depth_strided(depth, strides):
    """A 3-D convolution with one output depth from an input deeper than 1 and strides in the
    plane: the strided im2col reads stride-phase planes of depth 1 only, so this one takes the
    rows kernel (a flat phase copy once read the wrong planes here: a hypothesis find)."""
    rng = np.random.default_rng(depth)
    x = rng.standard_normal((2, 5, depth, 3, 4)).astype(np.float32)
    w = rng.standard_normal((3, 5, 1, 2, 2)).astype(np.float32)
    check("Conv", [x, w], {"strides": strides, "kernel_shape": [1, 2, 2], "pads": [0] * 6}, const=(1,))


def _patches_by_definition(x, kdims, strides, dils, pads_lo, pads_hi, out_sp, r0, r1):
    """im2col of one image ``x`` (c, d, h, w) from an explicitly zero-padded copy: row
    ``((ci*kd + a)*kh + ki)*kw + kj``, column ``(r - r0)*ow + j`` for rows ``r`` of the (OD*OH)
    row space."""
    c = x.shape[0]
    (kd, kh, kw), (sd, sh, sw), (dd, dh, dw), (_, oh, ow) = kdims, strides, dils, out_sp
    big = np.zeros((c,) + tuple(n + lo + hi + 2 * k * dl for n, lo, hi, k, dl in
                                zip(x.shape[1:], pads_lo, pads_hi, kdims, dils)), x.dtype)
    big[:, pads_lo[0]:pads_lo[0] + x.shape[1], pads_lo[1]:pads_lo[1] + x.shape[2],
        pads_lo[2]:pads_lo[2] + x.shape[3]] = x
    want = np.empty((c * kd * kh * kw, (r1 - r0) * ow), x.dtype)
    for ci in range(c):
        for a in range(kd):
            for ki in range(kh):
                for kj in range(kw):
                    row = ((ci * kd + a) * kh + ki) * kw + kj
                    for r in range(r0, r1):
                        z, i = divmod(r, oh)
                        want[row, (r - r0) * ow:(r - r0 + 1) * ow] = \
                            big[ci, z * sd + a * dd, i * sh + ki * dh, kj * dw:kj * dw + ow * sw:sw]
    return want


@SETTINGS
@given(c=st.integers(1, 3), d=st.integers(1, 5), h=st.integers(1, 6), w=st.integers(1, 6),
       k=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3)),
       dl=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 2)),
       lo=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
       hi=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)))
def test_volume_windows_match_their_definition(c, d, h, w, k, s, dl, lo, hi):
    """The reference's convolution windows (1-D to 3-D, a strided view of the zero-padded input)
    are their definition."""
    from byoc.kernels import conv as C

    od, oh, ow = ((n + a + b - (kk - 1) * q - 1) // st_ + 1 for n, a, b, kk, q, st_ in
                  zip((d, h, w), lo, hi, k, dl, s))
    if min(od, oh, ow) <= 0:
        return
    x = np.random.default_rng(1).standard_normal((1, c, d, h, w)).astype(np.float32)
    win = C.windows(NodeSpec("Conv", name="conv"), x, k, s, dl, lo, (od, oh, ow))
    got = win[0].transpose(0, 4, 5, 6, 1, 2, 3).reshape(c * k[0] * k[1] * k[2], od * oh * ow)
    want = _patches_by_definition(x[0], k, s, dl, lo, hi, (od, oh, ow), 0, od * oh)
    assert np.array_equal(got, want)
