"""The fixed kernels generated modules call: layout moves around the GEMMs, pooling, softmax, LRN.

Padding, im2col, strided subsampling and direct (depthwise) convolution are the core's
flat-buffer entry points (:mod:`byoc_cpu.host.conv`), re-exported. What is specific to a region
(epilogues, elementwise chains) is generated per region by :mod:`byoc_cpu.emit`; what is the same for every model lives here, compiled once per machine
(``cache=True``). Every kernel works on flat float32 arrays plus element offsets, so a
generated module can pass its arena, its inputs and its constants without making views.

Thread policy (:mod:`byoc_cpu.host.threads`): BLAS owns the cores. These loops are
single-threaded (no ``prange``): they are memory-bound next to the GEMMs, and an OpenMP pool
spinning beside OpenBLAS's makes both slower.
"""

from __future__ import annotations

import math
import threading
import weakref

import numba
import numpy as np

# the window geometry and the convolution drivers are the core's (one copy, byoc_cpu.host.conv);
# re-exported here under the names the generated code calls
from byoc_cpu.host import conv as _conv
from byoc_cpu.host.blocked import conv8, conv16, reorder8
from byoc_cpu.host.conv import conv_direct, im2col, pad_planes, phase_planes, subsample
# U: indices cast to unsigned, so that LLVM vectorises (see byoc_cpu.host.pool)
from byoc_cpu.host.pool import U, avgpool2d, maxpool2d

_jit = numba.njit(cache=True, boundscheck=False, nogil=True)


# max and average pooling of 2-D planes are the core's (byoc_cpu.host.pool), shared with the host


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
    """3x3 stride-1 convolution by the core's Winograd (:func:`byoc_cpu.host.conv.winograd`);
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
    "avgpool2d", "conv8", "conv16", "conv_direct", "copy_blocks", "global_pool", "im2col", "lrn", "maxpool2d", "pad_planes",
    "phase_planes",
    "reorder8", "softmax_rows", "subsample", "winograd",
]
