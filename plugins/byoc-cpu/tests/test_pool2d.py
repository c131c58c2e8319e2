"""The 2-D pooling kernels on flat float32 buffers (``byoc_cpu.host.pool``: the host's float32
MaxPool/AveragePool and byoc-cpu's generated code): the row-buffer kernels equal the direct ones on any geometry
(including NaN and infinities), and hostile strides/pads take the direct kernels, which size no
buffer from the attributes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc_cpu.host import pool as K


def _out(n, k, s, d, p0, p1):
    return (n + p0 + p1 - (k - 1) * d - 1) // s + 1


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9), kh=st.integers(1, 4), kw=st.integers(1, 4),
       sh=st.integers(1, 3), sw=st.integers(1, 3), dh=st.integers(1, 2), dw=st.integers(1, 2),
       pt=st.integers(0, 2), pl=st.integers(0, 2), pb=st.integers(0, 2), pr=st.integers(0, 2),
       include_pad=st.booleans(), seed=st.integers(0, 2**16))
def test_row_buffer_kernels_equal_the_direct_ones(c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, include_pad, seed):
    oh, ow = _out(h, kh, sh, dh, pt, pb), _out(w, kw, sw, dw, pl, pr)
    if oh <= 0 or ow <= 0:
        return
    x = np.random.default_rng(seed).standard_normal(c * h * w).astype(np.float32)
    x[::7] = np.nan
    x[::11] = np.inf
    a, b = np.empty(c * oh * ow, np.float32), np.empty(c * oh * ow, np.float32)
    K._maxpool2d_rows(x, 0, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, a, 0)
    K._maxpool2d_direct(x, 0, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, b, 0)
    assert np.array_equal(a, b, equal_nan=True)
    # average pooling has no dilations
    oh, ow = _out(h, kh, sh, 1, pt, pb), _out(w, kw, sw, 1, pl, pr)
    if oh <= 0 or ow <= 0:
        return
    x = np.random.default_rng(seed).standard_normal(c * h * w).astype(np.float32)
    a, b = np.empty(c * oh * ow, np.float32), np.empty(c * oh * ow, np.float32)
    args = (kh, kw, sh, sw, pt, pl, oh, ow, h + pt + pb, w + pl + pr, include_pad)
    K._avgpool2d_rows(x, 0, c, h, w, *args, a, 0)
    K._avgpool2d_direct(x, 0, c, h, w, *args, b, 0)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # (NaN where a window counts no cell)


def test_hostile_strides_take_the_direct_kernels():
    # windows 10^8 apart: a row buffer over every window would be 400 MB; the direct kernel reads
    # the input where the windows are
    x = np.arange(12, dtype=np.float32)
    y = np.empty(2, np.float32)
    assert K._sparse(12, 2, 2, (2 - 1) * 10**8 + 2)
    K.maxpool2d(x, 0, 1, 1, 12, 1, 2, 1, 10**8, 1, 1, 0, 0, 1, 2, y, 0)
    assert y.tolist() == [1.0, float("-inf")]
    K.avgpool2d(x, 0, 1, 1, 12, 1, 2, 1, 10**8, 0, 0, 1, 2, 1, 10**8 + 2, True, y, 0)
    assert y[0] == 0.5


def test_the_specialised_stride_two_windows_equal_the_direct_kernel():
    # 3x3/2 and 2x2/2 take one expression per output (no loop over the column taps)
    rng = np.random.default_rng(2)
    for kh, kw, pads in [(3, 3, (0, 0)), (3, 3, (1, 1)), (2, 2, (0, 0)), (3, 2, (1, 0))]:
        c, h, w = 3, 11, 13
        oh, ow = _out(h, kh, 2, 1, pads[0], pads[0]), _out(w, kw, 2, 1, pads[1], pads[1])
        x = rng.standard_normal(c * h * w).astype(np.float32)
        x[::5], x[::13] = np.nan, -np.inf
        a, b = np.empty(c * oh * ow, np.float32), np.empty(c * oh * ow, np.float32)
        K._maxpool2d_rows(x, 0, c, h, w, kh, kw, 2, 2, 1, 1, pads[0], pads[1], oh, ow, a, 0)
        K._maxpool2d_direct(x, 0, c, h, w, kh, kw, 2, 2, 1, 1, pads[0], pads[1], oh, ow, b, 0)
        assert np.array_equal(a, b, equal_nan=True), (kh, kw, pads)


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 3), h=st.integers(1, 12), w=st.integers(1, 12), include_pad=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_same_size_three_by_three_window_equals_the_direct_kernel(c, h, w, include_pad, seed):
    # 3x3, stride 1, pad 1 (Inception's pooling branch) runs over whole planes (_pool_same3)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(c * h * w).astype(np.float32)
    x[::5], x[::13] = np.nan, -np.inf
    a, b = np.empty(c * h * w, np.float32), np.empty(c * h * w, np.float32)
    K.maxpool2d(x, 0, c, h, w, 3, 3, 1, 1, 1, 1, 1, 1, h, w, a, 0)
    K._maxpool2d_direct(x, 0, c, h, w, 3, 3, 1, 1, 1, 1, 1, 1, h, w, b, 0)
    assert np.array_equal(a, b, equal_nan=True)
    x = rng.standard_normal(c * h * w).astype(np.float32)
    args = (3, 3, 1, 1, 1, 1, h, w, h + 2, w + 2, include_pad)
    K.avgpool2d(x, 0, c, h, w, *args, a, 0)
    K._avgpool2d_direct(x, 0, c, h, w, *args, b, 0)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
