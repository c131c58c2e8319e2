"""The fixed kernels generated modules call: layout moves around the GEMMs, pooling, softmax, LRN.

What is specific to a region (epilogues, elementwise chains) is generated per region by
:mod:`byoc_cpu.emit`; what is the same for every model lives here, compiled once per machine
(``cache=True``). Every kernel works on flat float32 arrays plus element offsets, so a
generated module can pass its arena, its inputs and its constants without making views.

Thread policy (:mod:`byoc.kernels.threads`): BLAS owns the cores. These loops are
single-threaded (no ``prange``): they are memory-bound next to the GEMMs, and an OpenMP pool
spinning beside OpenBLAS's makes both slower.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: indices are cast to unsigned: Numba then skips its negative-index wraparound, which would
#: otherwise keep LLVM from vectorising every ``base + i`` access (measured 10x on pooling)
U = np.uint64
F0 = np.float32(0.0)
F1 = np.float32(1.0)
NEG_INF = np.float32(-np.inf)

_jit = numba.njit(cache=True, boundscheck=False, nogil=True)


@_jit
def _valid(o_n, s, off, n):
    """Output positions ``o`` in ``[0, o_n)`` whose input index ``o*s + off`` is in ``[0, n)``."""
    lo = 0
    if off < 0:
        lo = (-off + s - 1) // s
    hi = 0
    if n - 1 - off >= 0:
        hi = (n - 1 - off) // s + 1
    if hi > o_n:
        hi = o_n
    if lo > hi:
        lo = hi
    return lo, hi


@_jit
def pad_planes(x, xo, c, h, w, xp, po, ldp, hp, wp, pt, pl):
    """Zero-padded copy of ``c`` planes ``(h, w)`` at ``x[U(xo:)]``: plane ``i`` becomes row ``i`` of
    ``xp[U(po:)]`` (row length ``ldp >= hp*wp``), laid out ``(hp, wp)``, every other element zero."""
    for ci in range(c):
        dst = po + ci * ldp
        src = xo + ci * h * w
        for k in range(pt * wp):
            xp[U(dst + k)] = F0
        for i in range(h):
            row = dst + (pt + i) * wp
            for k in range(pl):
                xp[U(row + k)] = F0
            s = src + i * w
            for k in range(w):
                xp[U(row + pl + k)] = x[U(s + k)]
            for k in range(pl + w, wp):
                xp[U(row + k)] = F0
        for k in range((pt + h) * wp, ldp):
            xp[U(dst + k)] = F0


@_jit
def im2col(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1, col, co):
    """Patch matrix of output rows ``[r0, r1)``: ``col[U(co:)]`` is ``(c*kh*kw, (r1-r0)*ow)``."""
    ncols = (r1 - r0) * ow
    for ci in range(c):
        for ki in range(kh):
            for kj in range(kw):
                row = co + ((ci * kh + ki) * kw + kj) * ncols
                offw = kj * dw - pl
                lo, hi = _valid(ow, sw, offw, w)
                for r in range(r0, r1):
                    ih = r * sh - pt + ki * dh
                    base = row + (r - r0) * ow
                    if ih < 0 or ih >= h:
                        for j in range(ow):
                            col[U(base + j)] = F0
                        continue
                    src = xo + (ci * h + ih) * w + offw
                    for j in range(lo):
                        col[U(base + j)] = F0
                    if sw == 1:
                        for j in range(lo, hi):
                            col[U(base + j)] = x[U(src + j)]
                    else:
                        for j in range(lo, hi):
                            col[U(base + j)] = x[U(src + j * sw)]
                    for j in range(hi, ow):
                        col[U(base + j)] = F0


@_jit
def subsample(x, xo, c, h, w, sh, sw, oh, ow, y, yo):
    """``y[U(c, i, j)] = x[U(c, i*sh, j*sw)]`` (1x1 convolutions with strides)."""
    for ci in range(c):
        for i in range(oh):
            s = xo + (ci * h + i * sh) * w
            d = yo + (ci * oh + i) * ow
            for j in range(ow):
                y[U(d + j)] = x[U(s + j * sw)]


@_jit
def conv_direct(x, xo, c, h, w, wt, m, cg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, m0, m1, y, yo):
    """Output channels ``[m0, m1)`` of a grouped convolution of one image with few channels per
    group (depthwise): for each output channel and tap, one vectorisable update of each output
    row. ``wt`` is ``(m, cg, kh, kw)``."""
    mg = m // (c // cg)
    for mi in range(m0, m1):
        g = mi // mg
        out = yo + mi * oh * ow
        for k in range(oh * ow):
            y[U(out + k)] = F0
        for ci in range(cg):
            plane = xo + (g * cg + ci) * h * w
            for ki in range(kh):
                for kj in range(kw):
                    wv = wt[U(((mi * cg + ci) * kh + ki) * kw + kj)]
                    offw = kj * dw - pl
                    lo, hi = _valid(ow, sw, offw, w)
                    for i in range(oh):
                        ih = i * sh - pt + ki * dh
                        if ih < 0 or ih >= h:
                            continue
                        src = plane + ih * w + offw
                        dst = out + i * ow
                        if sw == 1:
                            for j in range(lo, hi):
                                y[U(dst + j)] += wv * x[U(src + j)]
                        else:
                            for j in range(lo, hi):
                                y[U(dst + j)] += wv * x[U(src + j * sw)]


@_jit
def maxpool2d(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo):
    """Max over each window (padding never wins; like the host kernels, a NaN never replaces the
    running maximum, so it only shows when it comes first). Per output row: the maximum
    of the window's input rows (contiguous), then of its columns (one strided pass per tap),
    so both stages vectorise instead of chaining one comparison after another."""
    rowmax = np.empty(w, np.float32)
    for ci in range(c):
        plane = xo + ci * h * w
        for i in range(oh):
            k0, k1 = _valid(kh, dh, i * sh - pt, h)
            for q in range(w):
                rowmax[q] = NEG_INF
            for ki in range(k0, k1):
                row = plane + (i * sh - pt + ki * dh) * w
                for q in range(w):
                    v = x[U(row + q)]
                    t = rowmax[q]
                    rowmax[q] = v if v > t else t
            out = yo + (ci * oh + i) * ow
            for j in range(ow):
                y[U(out + j)] = NEG_INF
            for kj in range(kw):
                off = kj * dw - pl
                lo, hi = _valid(ow, sw, off, w)
                for j in range(lo, hi):
                    v = rowmax[U(j * sw + off)]
                    t = y[U(out + j)]
                    y[U(out + j)] = v if v > t else t


@_jit
def avgpool2d(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo):
    """Mean over each window; ``include_pad`` counts padding cells (up to the padded extent
    ``hp_end x wp_end``), else only cells inside the input."""
    for ci in range(c):
        plane = xo + ci * h * w
        out = yo + ci * oh * ow
        for i in range(oh):
            h0 = i * sh - pt
            k0, k1 = _valid(kh, 1, h0, h)
            if include_pad:
                rows = min(h0 + kh, hp_end - pt) - max(h0, -pt)
            else:
                rows = k1 - k0
            for j in range(ow):
                w0 = j * sw - pl
                l0, l1 = _valid(kw, 1, w0, w)
                acc = F0
                for ki in range(k0, k1):
                    row = plane + (h0 + ki) * w + w0
                    for kj in range(l0, l1):
                        acc += x[U(row + kj)]
                if include_pad:
                    cols = min(w0 + kw, wp_end - pl) - max(w0, -pl)
                else:
                    cols = l1 - l0
                y[U(out + i * ow + j)] = acc / np.float32(rows * cols)


@_jit
def global_pool(x, xo, rows, cols, is_max, y, yo):
    """Mean (float64 accumulation) or max (from the first element on, as the host does) of each
    of ``rows`` contiguous rows of ``cols``."""
    for r in range(rows):
        s = xo + r * cols
        if is_max:
            m = x[U(s)]
            for k in range(1, cols):
                v = x[U(s + k)]
                if v > m:
                    m = v
            y[U(yo + r)] = m
        else:
            acc = 0.0
            for k in range(cols):
                acc += x[U(s + k)]
            y[U(yo + r)] = np.float32(acc / cols)


@_jit
def softmax_rows(x, xo, rows, cols, log, y, yo):
    """Softmax (or log-softmax) of each contiguous row, max-subtracted, float64 sums."""
    for r in range(rows):
        s = xo + r * cols
        d = yo + r * cols
        m = x[U(s)]
        for k in range(1, cols):
            if x[U(s + k)] > m:
                m = x[U(s + k)]
        acc = 0.0
        for k in range(cols):
            e = math.exp(np.float64(x[U(s + k)] - m))
            acc += e
            if not log:
                y[U(d + k)] = np.float32(e)
        if log:
            lse = math.log(acc)
            for k in range(cols):
                y[U(d + k)] = np.float32(np.float64(x[U(s + k)] - m) - lse)
        else:
            inv = 1.0 / acc
            for k in range(cols):
                y[U(d + k)] = np.float32(y[U(d + k)] * inv)


@_jit
def lrn(x, xo, c, hw, size, alpha, beta, bias, y, yo):
    """Local response normalisation across channels of one image ``(c, hw)``: the window's sum
    of squares slides from channel to channel (float64), the power is taken in float32 (the
    common beta = 0.75 as two square roots)."""
    lo_off = (size - 1) // 2
    hi_off = size - 1 - lo_off
    sq = np.zeros(hw, dtype=np.float64)
    for cj in range(0, min(c - 1, hi_off) + 1):
        s = xo + cj * hw
        for k in range(hw):
            v = np.float64(x[U(s + k)])
            sq[k] += v * v
    scale = alpha / size
    three_quarters = beta == 0.75
    nbeta = np.float32(-beta)
    for ci in range(c):
        if ci > 0:
            add, drop = ci + hi_off, ci - lo_off - 1
            if add < c:
                s = xo + add * hw
                for k in range(hw):
                    v = np.float64(x[U(s + k)])
                    sq[k] += v * v
            if drop >= 0:
                s = xo + drop * hw
                for k in range(hw):
                    v = np.float64(x[U(s + k)])
                    sq[k] -= v * v
        s = xo + ci * hw
        d = yo + ci * hw
        for k in range(hw):
            base = np.float32(bias + scale * max(sq[k], 0.0))
            if three_quarters:
                r = np.float32(math.sqrt(base))
                y[U(d + k)] = x[U(s + k)] / (r * np.float32(math.sqrt(r)))
            else:
                y[U(d + k)] = x[U(s + k)] * np.float32(math.exp(nbeta * np.float32(math.log(base))))


@_jit
def copy_blocks(src, so, s_stride, dst, do, d_stride, nblocks, blen):
    """``nblocks`` blocks of ``blen`` elements from ``src`` to ``dst`` (concat pieces)."""
    for b in range(nblocks):
        s = so + b * s_stride
        d = do + b * d_stride
        for k in range(blen):
            dst[U(d + k)] = src[U(s + k)]


__all__ = [
    "avgpool2d", "conv_direct", "copy_blocks", "global_pool", "im2col", "lrn", "maxpool2d", "pad_planes",
    "softmax_rows", "subsample",
]
