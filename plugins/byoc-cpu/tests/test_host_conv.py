"""byoc-cpu's host convolution strategies (shift, im2col, Winograd, blocked, direct), each forced,
and their flat kernels against their definitions. The properties every convolution must have
are core/tests/kernels/test_conv.py's, which ``tox -e cpu`` runs with byoc-cpu's host executor
serving the Conv nodes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec
from cpu_helpers import host_kernel as make_kernel
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


@pytest.mark.parametrize("how", ["shift", "im2col", "winograd2", "winograd4", "openblas"])
def test_conv_each_strategy(how, monkeypatch):
    """Every strategy on the same layers, forced through the tuning table's thresholds."""
    from byoc_cpu.host import gemm as G
    from byoc_cpu.tuning import CONV as T

    if how == "im2col":
        monkeypatch.setitem(T, "shift_min_channels", 10**9)
    if how == "shift":
        monkeypatch.setitem(T, "shift_blas_min_channels", 0)
    if how.startswith("winograd"):
        monkeypatch.setattr(G, "_OWN_GEMM", False)  # Winograd is chosen only with OpenBLAS's GEMM
        monkeypatch.setitem(T, "winograd_min_side", {"2": 1, "4": 1 if how == "winograd4" else 10**9})
        monkeypatch.setitem(T, "winograd_f2_min_side", 1)
        monkeypatch.setitem(T, "winograd_min_cm", 0)
    if how == "openblas":
        monkeypatch.setattr(G, "_OWN_GEMM", False)
        monkeypatch.setitem(T, "winograd_min_side", {"2": 10**9, "4": 10**9})
    rng = np.random.default_rng(11)
    for xshape, wshape, attrs in [
        ((2, 16, 18, 17), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 20, 11, 9), (8, 20, 3, 3), {"pads": [0, 1, 2, 1]}),
        ((1, 16, 13, 12), (8, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ((1, 3, 20, 20), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
        ((2, 24, 9, 10), (12, 24, 1, 1), {}),
    ]:
        x = rng.standard_normal(xshape).astype(np.float32)
        w = (rng.standard_normal(wshape) / np.sqrt(np.prod(wshape[1:]))).astype(np.float32)
        b = rng.standard_normal(wshape[0]).astype(np.float32)
        # Winograd F(4x4, 3x3) rounds more than a direct sum (its transforms scale by up to 8)
        tol = {"rtol": 1e-3, "atol": 1e-3} if how == "winograd4" else {}
        check("Conv", [x, w, b], attrs, **tol)


def test_conv_large_im2col_is_blocked():
    # the patch matrix (27 x 65536 floats) exceeds one block only when made larger; force blocks
    from byoc_cpu.host import conv as C

    old = C._COL_BLOCK
    C._COL_BLOCK = 1000
    try:
        rng = np.random.default_rng(3)
        x = rng.standard_normal((1, 3, 20, 17)).astype(np.float32)
        w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
        check("Conv", [x, w], {"strides": [2, 1], "pads": [1, 1, 0, 0]})
    finally:
        C._COL_BLOCK = old


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
def thin_group_geometry(draw):
    groups = draw(st.integers(1, 6))
    cg = draw(st.integers(1, 3))
    mult = draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pt, pl = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    pb, pr = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, (kh - 1) * dh + 1 - pt - pb), 13))
    w = draw(st.integers(max(1, (kw - 1) * dw + 1 - pl - pr), 13))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    return groups, cg, mult, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, h, w, dtype


@settings(max_examples=60, deadline=None)
@given(thin_group_geometry(), st.integers(0, 2**31 - 1))
def test_flat_direct_kernel_matches_the_loop_nest(geom, seed):
    # the flat stride-phase kernel (host 1-D/2-D grouped convolutions and byoc-cpu's conv_direct)
    # sums in the loop nest's order: bit-identical, every output written, nothing outside it
    from byoc_cpu.host.conv import _conv_direct, _direct2d

    groups, cg, mult, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, h, w, dtype = geom
    c, m = groups * cg, groups * mult
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(c * h * w).astype(dtype)
    wt = rng.standard_normal(m * cg * kh * kw).astype(dtype)
    bias = rng.standard_normal(m).astype(dtype)
    want = np.zeros((1, m, 1, oh, ow), dtype)
    _conv_direct(x.reshape(1, c, 1, h, w), wt.reshape(m, cg, 1, kh, kw), bias, True, groups, 1, sh, sw, 1, dh, dw,
                 0, pt, pl, 0, m, want)
    m0 = int(rng.integers(0, m))
    m1 = int(rng.integers(m0 + 1, m + 1))
    got = np.full(5 + m * oh * ow + 3, np.nan, dtype)
    _direct2d(x, 0, c, h, w, wt, 0, m, cg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, m0, m1, bias, True, got, 5)
    body = got[5:5 + m * oh * ow].reshape(m, oh, ow)
    np.testing.assert_array_equal(body[m0:m1], want[0, m0:m1, 0])
    assert np.isnan(body[:m0]).all() and np.isnan(body[m1:]).all()
    assert np.isnan(got[:5]).all() and np.isnan(got[-3:]).all()


def test_depthwise_with_hostile_geometry_keeps_to_the_loop_nest():
    # pads and dilations that would make the stride-phase planes ~10x the input and output: the
    # loop nest (no work buffers) runs instead, with the same result
    from byoc_cpu.host.conv import direct2d_fits

    assert not direct2d_fits(3, 3, 3, 3, 1, 1, 200, 200, 203, 203)
    assert direct2d_fits(28, 28, 3, 3, 2, 2, 1, 1, 14, 14)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    check("Conv", [x, w], {"group": 2, "pads": [300, 300, 300, 300], "dilations": [200, 200]},
          oracle=run_onnxruntime)


def test_one_strategy_chooser_for_the_host_and_the_code_generator():
    """The host kernels and byoc-cpu's lowering take one chooser (byoc_cpu.strategy) and its rules."""
    from byoc_cpu import lower, strategy
    from byoc_cpu.host import conv as C

    assert C.choose_conv is strategy.choose_conv and lower.choose_conv is strategy.choose_conv
    assert strategy.winograd_tile(64, 64, 56, 56) == 0  # ResNet-50's res2: transforms weigh as much as GEMMs
    assert strategy.winograd_tile(128, 128, 56, 56) == 4  # VGG-19's 56x56 layers
    assert strategy.winograd_tile(64, 64, 224, 224) == 4  # any channels on big planes
    assert strategy.winograd_tile(256, 256, 14, 14) == 0  # F(2x2) measured slower than shift
    assert strategy.shift_pays(64, 64) and strategy.shift_pays(128, 512) and not strategy.shift_pays(32, 128)


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
@given(c=st.integers(1, 4), h=st.integers(1, 9), w=st.integers(1, 9), kh=st.integers(1, 4), kw=st.integers(1, 4),
       sh=st.integers(1, 3), sw=st.integers(1, 3), dh=st.integers(1, 2), dw=st.integers(1, 2),
       pt=st.integers(0, 3), pl=st.integers(0, 3), pb=st.integers(0, 3), pr=st.integers(0, 3), data=st.data())
def test_flat_im2col_matches_its_definition(c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, data):
    """The 2-D patch builder byoc-cpu calls writes the patch matrix's definition for any
    geometry and any block of output rows, and nothing outside it."""
    from byoc_cpu.host import conv as C

    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        return
    r0 = data.draw(st.integers(0, oh - 1))
    r1 = data.draw(st.integers(r0 + 1, oh))
    x = np.random.default_rng(0).standard_normal(7 + c * h * w).astype(np.float32)
    size = c * kh * kw * (r1 - r0) * ow
    got = np.full(size + 5, np.nan, np.float32)
    C.im2col(x, 7, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1, got, 3)
    want = _patches_by_definition(x[7:].reshape(c, 1, h, w), (1, kh, kw), (1, sh, sw), (1, dh, dw), (0, pt, pl),
                                  (0, pb, pr), (1, oh, ow), r0, r1)
    assert np.array_equal(got[3:3 + size], want.reshape(-1))
    assert np.isnan(got[:3]).all() and np.isnan(got[3 + size:]).all()


@SETTINGS
@given(c=st.integers(1, 3), d=st.integers(1, 5), h=st.integers(1, 6), w=st.integers(1, 6),
       k=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3)),
       dl=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 2)),
       lo=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
       hi=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)), data=st.data())
def test_volume_im2col_matches_its_definition(c, d, h, w, k, s, dl, lo, hi, data):
    """The one patch-matrix kernel on 3-D windows (the host's 3-D convolutions): any block of
    rows of the (OD*OH) row space, including blocks that cross output depths."""
    from byoc_cpu.host import conv as C

    od, oh, ow = ((n + a + b - (kk - 1) * q - 1) // st_ + 1 for n, a, b, kk, q, st_ in
                  zip((d, h, w), lo, hi, k, dl, s))
    if min(od, oh, ow) <= 0:
        return
    r0 = data.draw(st.integers(0, od * oh - 1))
    r1 = data.draw(st.integers(r0 + 1, od * oh))
    x = np.random.default_rng(1).standard_normal(5 + c * d * h * w).astype(np.float32)
    size = c * k[0] * k[1] * k[2] * (r1 - r0) * ow
    got = np.full(size + 4, np.nan, np.float32)
    C._im2col_rows(x, 5, c, d, h, w, *k, *s, *dl, *lo, oh, ow, r0, r1, got, 2)
    want = _patches_by_definition(x[5:].reshape(c, d, h, w), k, s, dl, lo, hi, (od, oh, ow), r0, r1)
    assert np.array_equal(got[2:2 + size], want.reshape(-1))
    assert np.isnan(got[:2]).all() and np.isnan(got[2 + size:]).all()
