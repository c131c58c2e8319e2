"""The fixed kernels generated modules call: layout moves around the GEMMs, pooling, softmax, LRN.

Padding, im2col, strided subsampling and direct (depthwise) convolution are the core's
flat-buffer entry points (:mod:`byoc.kernels.conv`), re-exported. What is specific to a region
(epilogues, elementwise chains) is generated per region by :mod:`byoc_cpu.emit`; what is the same for every model lives here, compiled once per machine
(``cache=True``). Every kernel works on flat float32 arrays plus element offsets, so a
generated module can pass its arena, its inputs and its constants without making views.

Thread policy (:mod:`byoc.kernels.threads`): BLAS owns the cores. These loops are
single-threaded (no ``prange``): they are memory-bound next to the GEMMs, and an OpenMP pool
spinning beside OpenBLAS's makes both slower.
"""

from __future__ import annotations

import math
import threading
import weakref

import numba
import numpy as np

# the window geometry and the convolution drivers are the core's (one copy, byoc.kernels.conv);
# re-exported here under the names the generated code calls
from byoc.kernels import conv as _conv
from byoc.kernels.blocked import conv8, reorder8
from byoc.kernels.conv import conv_direct, im2col, pad_planes, phase_planes, subsample, valid_range

#: indices are cast to unsigned: Numba then skips its negative-index wraparound, which would
#: otherwise keep LLVM from vectorising every ``base + i`` access (measured 10x on pooling)
U = np.uint64
F0 = np.float32(0.0)
F1 = np.float32(1.0)
NEG_INF = np.float32(-np.inf)
NAN = np.float32(np.nan)

_jit = numba.njit(cache=True, boundscheck=False, nogil=True)


@_jit
def _cells(o, s, p, k, n, end, include_pad):
    """Window ``o`` of a 1-D average pool (stride ``s``, leading pad ``p``, kernel ``k`` over
    ``n`` inputs): the range ``[k0, k1)`` of its taps inside the input and the cells it counts
    (``include_pad``: padding up to the padded extent ``end`` counts too)."""
    a = o * s - p
    k0, k1 = valid_range(k, 1, a, n)
    if include_pad:
        return k0, k1, min(a + k, end - p) - max(a, -p)
    return k0, k1, k1 - k0


@_jit
def _maxpool2d_rows(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo):
    """Max over each window (padding never wins; like the host kernels, a NaN never replaces the
    running maximum: ``fmax``, which also vectorises where a compare-and-select measured 5x
    slower). Per output row: the maximum of the window's input rows into a row buffer that holds
    the left/right padding as -inf (so every column tap is in bounds), then of its columns."""
    wb = (ow - 1) * sw + (kw - 1) * dw + 1
    rp = np.empty(wb, np.float32)
    q1 = max(0, min(w, wb - pl))
    for ci in range(c):
        plane = xo + ci * h * w
        for i in range(oh):
            for q in range(wb):
                rp[q] = NEG_INF
            k0, k1 = valid_range(kh, dh, i * sh - pt, h)
            for ki in range(k0, k1):
                row = plane + (i * sh - pt + ki * dh) * w
                for q in range(q1):
                    rp[U(pl + q)] = np.fmax(rp[U(pl + q)], x[U(row + q)])
            out = yo + (ci * oh + i) * ow
            if sw == 2 and dw == 1 and kw == 3:  # the common 3x3/2 window: one expression per output
                for j in range(ow):  # vectorises (a loop over the taps did not: 2-3.4x measured)
                    y[U(out + j)] = np.fmax(np.fmax(rp[U(2 * j)], rp[U(2 * j + 1)]), rp[U(2 * j + 2)])
            elif sw == 2 and dw == 1 and kw == 2:
                for j in range(ow):
                    y[U(out + j)] = np.fmax(rp[U(2 * j)], rp[U(2 * j + 1)])
            elif sw == 1:
                for j in range(ow):
                    y[U(out + j)] = rp[U(j)]
                for kj in range(1, kw):
                    off = kj * dw
                    for j in range(ow):
                        y[U(out + j)] = np.fmax(y[U(out + j)], rp[U(j + off)])
            else:
                for j in range(ow):
                    m = rp[U(j * sw)]
                    for kj in range(1, kw):
                        m = np.fmax(m, rp[U(j * sw + kj * dw)])
                    y[U(out + j)] = m


@_jit
def _avgpool2d_rows(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo):
    """Mean over each window; ``include_pad`` counts padding cells (up to the padded extent
    ``hp_end x wp_end``), else only cells inside the input. Separable like :func:`maxpool2d`:
    column sums of the window's rows into a zero-padded row buffer, then sums of its columns,
    then one division by the cell count."""
    wb = (ow - 1) * sw + kw
    rp = np.empty(wb, np.float32)
    cols_f = np.empty(ow, np.float32)
    q1 = max(0, min(w, wb - pl))
    for j in range(ow):
        _, _, cols = _cells(j, sw, pl, kw, w, wp_end, include_pad)
        # a window with no cell to count (only where pads reach past the kernel) is NaN, as on
        # the host (0 / 0); a NaN divisor gives it without a division by zero
        cols_f[j] = np.float32(cols) if cols > 0 else NAN
    for ci in range(c):
        plane = xo + ci * h * w
        for i in range(oh):
            h0 = i * sh - pt
            k0, k1, rows = _cells(i, sh, pt, kh, h, hp_end, include_pad)
            for q in range(wb):
                rp[q] = F0
            for ki in range(k0, k1):
                row = plane + (h0 + ki) * w
                for q in range(q1):
                    rp[U(pl + q)] += x[U(row + q)]
            out = yo + (ci * oh + i) * ow
            fr = np.float32(rows) if rows > 0 else NAN
            if sw == 1:
                for j in range(ow):
                    y[U(out + j)] = rp[U(j)]
                for kj in range(1, kw):
                    for j in range(ow):
                        y[U(out + j)] += rp[U(j + kj)]
            else:
                for j in range(ow):
                    acc = rp[U(j * sw)]
                    for kj in range(1, kw):
                        acc += rp[U(j * sw + kj)]
                    y[U(out + j)] = acc
            for j in range(ow):
                y[U(out + j)] = y[U(out + j)] / (fr * cols_f[j])


@_jit
def _maxpool2d_direct(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo):
    """:func:`maxpool2d` without a padded row buffer (windows far apart: see :func:`_sparse`)."""
    rowmax = np.empty(w, np.float32)
    for ci in range(c):
        plane = xo + ci * h * w
        for i in range(oh):
            k0, k1 = valid_range(kh, dh, i * sh - pt, h)
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
                lo, hi = valid_range(ow, sw, off, w)
                for j in range(lo, hi):
                    v = rowmax[U(j * sw + off)]
                    t = y[U(out + j)]
                    y[U(out + j)] = v if v > t else t


@_jit
def _avgpool2d_direct(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo):
    """:func:`avgpool2d` without a padded row buffer (windows far apart: see :func:`_sparse`)."""
    for ci in range(c):
        plane = xo + ci * h * w
        out = yo + ci * oh * ow
        for i in range(oh):
            h0 = i * sh - pt
            k0, k1, rows = _cells(i, sh, pt, kh, h, hp_end, include_pad)
            for j in range(ow):
                w0 = j * sw - pl
                l0, l1, cols = _cells(j, sw, pl, kw, w, wp_end, include_pad)
                acc = F0
                for ki in range(k0, k1):
                    row = plane + (h0 + ki) * w + w0
                    for kj in range(l0, l1):
                        acc += x[U(row + kj)]
                y[U(out + i * ow + j)] = acc / np.float32(rows * cols) if rows * cols > 0 else NAN


@_jit
def _pool_same3(x, xo, c, h, w, is_max, hp_end, wp_end, include_pad, y, yo):
    """The 3x3, stride 1, pad 1 window that keeps the plane's size (the pooling branch of the
    Inception blocks), max or average, over whole planes: a vertical pass over the flat plane
    (one long loop per plane instead of short ones per row; 28x28 planes: 3-4x faster), then a
    horizontal one whose first and last columns are redone per row. Same values as
    :func:`_maxpool2d_rows` (the maximum starts at -inf, ``fmax``) and :func:`_avgpool2d_rows`
    (rows summed top to bottom, then columns left to right, one division)."""
    n = h * w
    v = np.empty(n, np.float32)
    div = np.empty(n, np.float32)
    if not is_max:
        for i in range(h):
            fr = np.float32(_cells(i, 1, 1, 3, h, hp_end, include_pad)[2])
            for j in range(w):
                cols = _cells(j, 1, 1, 3, w, wp_end, include_pad)[2]
                div[U(i * w + j)] = fr * np.float32(cols) if fr * cols > 0 else NAN
    for ci in range(c):
        p = xo + ci * n
        o = yo + ci * n
        if is_max:
            for f in range(w):
                v[U(f)] = np.fmax(np.fmax(NEG_INF, x[U(p + f)]), x[U(p + w + f)]) if h > 1 else np.fmax(NEG_INF, x[U(p + f)])
            for f in range(w, n - w):
                v[U(f)] = np.fmax(np.fmax(np.fmax(NEG_INF, x[U(p + f - w)]), x[U(p + f)]), x[U(p + f + w)])
            if h > 1:
                for f in range(n - w, n):
                    v[U(f)] = np.fmax(np.fmax(NEG_INF, x[U(p + f - w)]), x[U(p + f)])
            for f in range(1, n - 1):
                y[U(o + f)] = np.fmax(np.fmax(v[U(f - 1)], v[U(f)]), v[U(f + 1)])
            for i in range(h):
                r = i * w
                y[U(o + r)] = np.fmax(v[U(r)], v[U(r + 1)]) if w > 1 else v[U(r)]
                if w > 1:
                    y[U(o + r + w - 1)] = np.fmax(v[U(r + w - 2)], v[U(r + w - 1)])
        else:
            for f in range(w):
                v[U(f)] = x[U(p + f)] + x[U(p + w + f)] if h > 1 else x[U(p + f)]
            for f in range(w, n - w):
                v[U(f)] = x[U(p + f - w)] + x[U(p + f)] + x[U(p + f + w)]
            if h > 1:
                for f in range(n - w, n):
                    v[U(f)] = x[U(p + f - w)] + x[U(p + f)]
            for f in range(1, n - 1):
                y[U(o + f)] = (v[U(f - 1)] + v[U(f)] + v[U(f + 1)]) / div[U(f)]
            for i in range(h):
                r = i * w
                y[U(o + r)] = (v[U(r)] + v[U(r + 1)] if w > 1 else v[U(r)]) / div[U(r)]
                if w > 1:
                    y[U(o + r + w - 1)] = (v[U(r + w - 2)] + v[U(r + w - 1)]) / div[U(r + w - 1)]


def _same3(h, w, kh, kw, sh, sw, pt, pl, oh, ow) -> bool:
    return kh == 3 and kw == 3 and sh == 1 and sw == 1 and pt == 1 and pl == 1 and oh == h and ow == w


def _sparse(w: int, ow: int, kw: int, span: int) -> bool:
    """Whether a row buffer spanning every window of an output row (``span`` elements) would be
    much larger than the input and output rows: hostile strides, pads or dilations must not size
    a work buffer (or a loop over it) from attributes alone."""
    return span > 4 * (w + ow * kw) + 4096


def maxpool2d(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo) -> None:
    """Max pooling of ``c`` planes ``(h, w)`` at ``x[xo:]`` into ``y[yo:]`` (``(oh, ow)`` each):
    a NaN never replaces the running maximum and padding never wins."""
    if dh == 1 and dw == 1 and _same3(h, w, kh, kw, sh, sw, pt, pl, oh, ow):
        _pool_same3(x, xo, c, h, w, True, h + 2, w + 2, False, y, yo)
    elif _sparse(w, ow, kw, (ow - 1) * sw + (kw - 1) * dw + 1):
        _maxpool2d_direct(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo)
    else:
        _maxpool2d_rows(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo)


def avgpool2d(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo) -> None:
    """Average pooling (``include_pad``: padding cells up to ``hp_end x wp_end`` count)."""
    if _same3(h, w, kh, kw, sh, sw, pt, pl, oh, ow):
        _pool_same3(x, xo, c, h, w, False, hp_end, wp_end, include_pad, y, yo)
    elif _sparse(w, ow, kw, (ow - 1) * sw + kw):
        _avgpool2d_direct(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo)
    else:
        _avgpool2d_rows(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo)


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


_wino_lock = threading.Lock()
_wino_cache: dict[int, np.ndarray] = {}


def _forget(key: int) -> None:
    _wino_cache.pop(key, None)


def winograd(x, xo, c, h, w, wt, m, pt, pl, oh, ow, mt, y, yo) -> None:
    """3x3 stride-1 convolution by the core's Winograd (:func:`byoc.kernels.conv.winograd`);
    ``wt`` is the constant weight array ``(m, c, 3, 3)`` of a loaded program. Its Winograd form
    is computed on the first call and kept while ``wt`` lives (keyed by the array object, and
    dropped when it is collected, so a later array at the same address never finds it)."""
    key = id(wt)
    u = _wino_cache.get(key)
    if u is None:
        with _wino_lock:
            u = _wino_cache.get(key)
            if u is None:
                u = _conv.winograd_weights(wt[:m * c * 9].reshape(m, c, 3, 3), mt)
                weakref.finalize(wt, _forget, key)
                _wino_cache[key] = u
    _conv.winograd(x, xo, c, h, w, u, m, pt, pl, oh, ow, mt, y, yo)


__all__ = [
    "avgpool2d", "conv8", "conv_direct", "copy_blocks", "global_pool", "im2col", "lrn", "maxpool2d", "pad_planes",
    "phase_planes",
    "reorder8", "softmax_rows", "subsample", "winograd",
]
