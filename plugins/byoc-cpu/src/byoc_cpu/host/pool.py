"""Pooling on the host: float32 2-D MaxPool and AveragePool on byoc-cpu's flat-plane kernels
(the ones its generated code calls too), planes split over its pool; byoc's reference kernel
runs every other case (1-D and 3-D windows, other dtypes, dilated averages, Indices outputs,
global windows, zero-size inputs) and checks every attribute.

Window geometry (strides, pads, dilations, ceil_mode, auto_pad) follows the ONNX operator
definitions (:func:`byoc.contract.geometry.window_geometry`).
"""

from __future__ import annotations

import numba
import numpy as np

from byoc.contract import NodeSpec
from byoc.contract.geometry import auto_pad_mode, int_list, pad3, window_geometry
from byoc.kernels import make_kernel
from byoc_cpu.host import threads
from byoc_cpu.host.conv import read_only_view, valid_range
from byoc_cpu.host.gemm import split
from byoc_cpu.host.registry import kernel


def _pool_factory(spec: NodeSpec, is_max: bool):
    reference = make_kernel(spec)  # checks the attributes; runs what the flat kernels do not
    kshape = [int(k) for k in spec.attr("kernel_shape")]
    if len(kshape) != 2 or (is_max and spec.n_outputs > 1) or (not is_max and any(
            d != 1 for d in int_list(spec, "dilations", 2, 1))):
        return reference
    auto_pad = auto_pad_mode(spec)
    strides, dil = int_list(spec, "strides", 2, 1, minimum=1), int_list(spec, "dilations", 2, 1, minimum=1)
    pads = int_list(spec, "pads", 4, 0, minimum=0)
    ceil_mode, include_pad = bool(spec.attr("ceil_mode", 0)), bool(spec.attr("count_include_pad", 0))
    geometry: dict = {}

    def setup(x) -> dict | None:
        out_sp, pb, pe = window_geometry(spec, list(x.shape[2:]), kshape, strides, dil, pads, auto_pad, ceil_mode)
        whole = out_sp == [1, 1] and not any(pb) and not any(pe) and dil == [1, 1] and kshape == list(x.shape[2:])
        if min(out_sp) <= 0 or whole or x.size == 0:  # errors, global windows and zero-size inputs: the reference's
            return None
        spec.check_alloc(list(x.shape[:2]) + out_sp, x.dtype)
        return {"out_sp": out_sp, "pb": pad3(pb, 0), "pe": pad3(pe, 0)}

    k3, s3, d3 = pad3(kshape, 1), pad3(strides, 1), pad3(dil, 1)

    def run(x):
        if x.dtype != np.float32 or x.ndim != 4:
            return reference(x)
        if x.shape not in geometry:
            geometry[x.shape] = setup(x)
        g = geometry[x.shape]
        if g is None:
            return reference(x)
        oh, ow = g["out_sp"]
        x5 = np.ascontiguousarray(x).reshape(x.shape[:2] + (1,) + x.shape[2:])
        out = spec.alloc.empty(x.shape[:2] + (1, oh, ow), np.float32)
        _flat2d(x5, out, k3, s3, d3, g, is_max, include_pad)
        return (out.reshape(x.shape[:2] + (oh, ow)),)

    return run


def _flat2d(x5: np.ndarray, out: np.ndarray, k3, s3, d3, g: dict, is_max: bool, include_pad: bool) -> None:
    """Float32 2-D max/average pooling through :func:`maxpool2d`/:func:`avgpool2d`, planes split
    over the pool."""
    planes, h, w = x5.shape[0] * x5.shape[1], x5.shape[3], x5.shape[4]
    _, oh, ow = pad3(g["out_sp"], 1)
    _, kh, kw = k3
    _, sh, sw = s3
    _, dh, dw = d3
    _, pt, pl = g["pb"]
    _, pb, pr = g["pe"]
    xf, yf = read_only_view(x5.reshape(-1)), out.reshape(-1)  # read-only always: one compiled specialisation
    # ~64K window taps per chunk at least: a hand-off to the pool costs tens of microseconds
    blocks = split(planes, min(2 * threads.num_threads(), max(1, planes * oh * ow * kh * kw // (1 << 16))))

    # the loop maxpool2d / avgpool2d would take, called directly (only it is compiled)
    path = _path2d.py_func(h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow) if is_max else \
        _path2d.py_func(h, w, kh, kw, sh, sw, 1, 1, pt, pl, oh, ow)
    hp_end, wp_end = (h + 2, w + 2) if is_max else (pt + h + pb, pl + w + pr)

    def chunk(i):
        p0, p1 = blocks[i]
        xo, c, yo = p0 * h * w, p1 - p0, p0 * oh * ow
        if path == 0:
            _pool_same3(xf, xo, c, h, w, is_max, hp_end, wp_end, include_pad and not is_max, yf, yo)
        elif is_max:
            (_maxpool2d_direct if path == 1 else _maxpool2d_rows)(xf, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl,
                                                                  oh, ow, yf, yo)
        else:
            (_avgpool2d_direct if path == 1 else _avgpool2d_rows)(xf, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow,
                                                                  hp_end, wp_end, include_pad, yf, yo)

    threads.parallel_for(chunk, len(blocks))


@kernel("MaxPool")
def make_max_pool(spec: NodeSpec):
    return _pool_factory(spec, True)


@kernel("AveragePool")
def make_average_pool(spec: NodeSpec):
    return _pool_factory(spec, False)


# -------------------------------------------------------------------------------------------------
# 2-D planes on flat float32 buffers: the host's float32 MaxPool/AveragePool and byoc-cpu's
# generated code (``K.maxpool2d``/``K.avgpool2d``) run these

#: indices are cast to unsigned: Numba then skips its negative-index wraparound, which would
#: otherwise keep LLVM from vectorising every ``base + i`` access (measured 10x on pooling)
U = np.uint64
F0 = np.float32(0.0)
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


@_jit
def _same3(h, w, kh, kw, sh, sw, pt, pl, oh, ow):
    return kh == 3 and kw == 3 and sh == 1 and sw == 1 and pt == 1 and pl == 1 and oh == h and ow == w


@_jit
def _sparse(w, ow, kw, span):
    """Whether a row buffer spanning every window of an output row (``span`` elements) would be
    much larger than the input and output rows: hostile strides, pads or dilations must not size
    a work buffer (or a loop over it) from attributes alone."""
    return span > 4 * (w + ow * kw) + 4096


@_jit
def _path2d(h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):
    """Which loop runs a 2-D pooling: 0 the 3x3 same-size one, 1 the direct one (windows far
    apart: :func:`_sparse`), 2 the row-buffer one. Compiled code asks it inside :func:`maxpool2d`
    / :func:`avgpool2d`; the host asks its Python form and calls that loop alone, so a first run
    compiles one loop, not three (ResNet-50's MaxPool: 2.6 s of compilation on a fresh install)."""
    if dh == 1 and dw == 1 and _same3(h, w, kh, kw, sh, sw, pt, pl, oh, ow):
        return 0
    return 1 if _sparse(w, ow, kw, (ow - 1) * sw + (kw - 1) * dw + 1) else 2


@_jit
def maxpool2d(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo):
    """Max pooling of ``c`` planes ``(h, w)`` at ``x[xo:]`` into ``y[yo:]`` (``(oh, ow)`` each):
    a NaN never replaces the running maximum and padding never wins."""
    path = _path2d(h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
    if path == 0:
        _pool_same3(x, xo, c, h, w, True, h + 2, w + 2, False, y, yo)
    elif path == 1:
        _maxpool2d_direct(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo)
    else:
        _maxpool2d_rows(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, y, yo)


@_jit
def avgpool2d(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo):
    """Average pooling (``include_pad``: padding cells up to ``hp_end x wp_end`` count)."""
    path = _path2d(h, w, kh, kw, sh, sw, 1, 1, pt, pl, oh, ow)
    if path == 0:
        _pool_same3(x, xo, c, h, w, False, hp_end, wp_end, include_pad, y, yo)
    elif path == 1:
        _avgpool2d_direct(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo)
    else:
        _avgpool2d_rows(x, xo, c, h, w, kh, kw, sh, sw, pt, pl, oh, ow, hp_end, wp_end, include_pad, y, yo)
