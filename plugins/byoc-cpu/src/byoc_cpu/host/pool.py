"""Pooling: MaxPool (with optional Indices), AveragePool, GlobalAveragePool, GlobalMaxPool.

1-D, 2-D and 3-D inputs share one code path through the canonical ``(N, C, D, H, W)`` view of
:mod:`byoc_cpu.host.conv`. Window geometry (strides, pads, dilations, ceil_mode, auto_pad)
follows the ONNX operator definitions; with ceil_mode the last window must start inside the
input or its leading padding (as onnxruntime and PyTorch do).

The pooled value of a window is accumulated one kernel tap at a time over whole output rows,
which keeps the inner loops contiguous (vectorised) for stride 1 and cheap otherwise. 1-D and
2-D windows (and global averages) run as numpy ufuncs over strided views, separably (a row
pass, then a column pass): nothing to compile on a first run; 3-D windows and Indices outputs
use Numba kernels.
MaxPool with an Indices output scans each window in index order and keeps the first maximum.
"""

from __future__ import annotations

import numba
import numpy as np

from byoc_cpu.host import threads
from byoc_cpu.host.conv import _valid_range as _tap_range  # outputs whose tap lies inside the input
from byoc.contract.geometry import auto_pad_mode, canon5, int_list, pad3, window_geometry
from byoc_cpu.host.conv import read_only_view, valid_range
from byoc_cpu.host.gemm import compute_dtype, split
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel

# -------------------------------------------------------------------------------------------------
# Numba kernels


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pool_taps(x, kd_, kh_, kw_, sd, sh, sw, dd, dh, dw, pd, ph, pw, is_max, init, out, p0, p1):
    """Max (``is_max``) or sum of each window, one kernel tap at a time, for the planes
    ``[p0, p1)`` of the flattened (N*C) plane index."""
    nb, c_, d_, h_, w_ = x.shape
    _, _, od_, oh_, ow_ = out.shape
    for p in range(p0, p1):
        n = p // c_
        c = p - n * c_
        o = out[n, c]
        o[:] = init
        xc = x[n, c]
        for kd in range(kd_):
            for kh in range(kh_):
                for kw in range(kw_):
                    offw = kw * dw - pw
                    lo, hi = _tap_range(ow_, sw, offw, w_)
                    for od in range(od_):
                        id_ = od * sd - pd + kd * dd
                        if id_ < 0 or id_ >= d_:
                            continue
                        for oh in range(oh_):
                            ih = oh * sh - ph + kh * dh
                            if ih < 0 or ih >= h_:
                                continue
                            src = xc[id_, ih]
                            dst = o[od, oh]
                            if is_max:
                                if sw == 1:
                                    for j in range(lo, hi):
                                        v = src[j + offw]
                                        dst[j] = v if v > dst[j] else dst[j]
                                else:
                                    for j in range(lo, hi):
                                        v = src[j * sw + offw]
                                        dst[j] = v if v > dst[j] else dst[j]
                            else:
                                if sw == 1:
                                    for j in range(lo, hi):
                                        dst[j] += src[j + offw]
                                else:
                                    for j in range(lo, hi):
                                        dst[j] += src[j * sw + offw]


def _taps(n_out: int, s: int, off: int, n: int) -> tuple[int, int, slice]:
    """Outputs ``[lo, hi)`` whose input ``o*s + off`` lies in ``[0, n)``, and those inputs."""
    lo, hi = _tap_range.py_func(n_out, s, off, n)
    return lo, hi, slice(lo * s + off, (hi - 1) * s + off + 1, s)


def _pool_separable(x, kh_, kw_, sh, sw, dh, dw, ph, pw, is_max, init, out, p0, p1, rows):
    """2-D windows as a row pass then a column pass (max or sum over a product of ranges):
    ``kh + kw`` operations per output instead of ``kh * kw``, for the planes ``[p0, p1)`` of
    N*C; ``rows`` is scratch of shape ``(p1 - p0, H, OW)``.

    numpy ufuncs over whole planes, in the tap order of :func:`_pool_taps` (the same sums):
    as fast as a compiled loop here and nothing to compile on a first run. Max is ``fmax``:
    a NaN never wins, as ``v if v > m else m`` in the compiled kernels.
    """
    h_, w_ = x.shape[3], x.shape[4]
    oh_, ow_ = out.shape[3], out.shape[4]
    src = x.reshape(-1, h_, w_)[p0:p1]
    dst = out.reshape(-1, oh_, ow_)[p0:p1]
    op = np.fmax if is_max else np.add
    rows[...] = init
    for kw in range(kw_):
        lo, hi, cols = _taps(ow_, sw, kw * dw - pw, w_)
        if hi > lo:
            op(rows[:, :, lo:hi], src[:, :, cols], out=rows[:, :, lo:hi])
    dst[...] = init
    for kh in range(kh_):
        lo, hi, rsel = _taps(oh_, sh, kh * dh - ph, h_)
        if hi > lo:
            op(dst[:, lo:hi], rows[:, rsel], out=dst[:, lo:hi])


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _maxpool_indices(x, kd_, kh_, kw_, sd, sh, sw, dd, dh, dw, pd, ph, pw, col_major, init, out, idx):
    nb, c_, d_, h_, w_ = x.shape
    _, _, od_, oh_, ow_ = out.shape
    plane = d_ * h_ * w_
    for n in range(nb):
        for c in range(c_):
            xc = x[n, c]
            cbase = (n * c_ + c) * plane
            for od in range(od_):
                for oh in range(oh_):
                    for ow in range(ow_):
                        best = init
                        bi = -1
                        bj = -1
                        bk = -1
                        for kd in range(kd_):
                            i = od * sd - pd + kd * dd
                            if i < 0 or i >= d_:
                                continue
                            for kh in range(kh_):
                                j = oh * sh - ph + kh * dh
                                if j < 0 or j >= h_:
                                    continue
                                for kw in range(kw_):
                                    k = ow * sw - pw + kw * dw
                                    if k < 0 or k >= w_:
                                        continue
                                    v = xc[i, j, k]
                                    if bi < 0 or v > best:
                                        best = v
                                        bi = i
                                        bj = j
                                        bk = k
                        out[n, c, od, oh, ow] = best
                        if bi < 0:
                            idx[n, c, od, oh, ow] = -1
                        elif col_major:
                            idx[n, c, od, oh, ow] = cbase + bi + bj * d_ + bk * d_ * h_
                        else:
                            idx[n, c, od, oh, ow] = cbase + (bi * h_ + bj) * w_ + bk


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _global_max(x, out):
    # x (R, S) -> out (R,)
    r_, s_ = x.shape
    for r in range(r_):
        row = x[r]
        m = row[0]
        for i in range(1, s_):
            if row[i] > m:
                m = row[i]
        out[r] = m


def _global_pool(x: np.ndarray, is_max: bool, out: np.ndarray) -> None:
    """``x (R, S) -> out (R,)``: the maximum, or the mean with a float64 sum (numpy: nothing to
    compile for the global average every classifier ends with)."""
    if is_max:
        _global_max(x, out)
    else:
        np.divide(x.sum(axis=1, dtype=np.float64), x.shape[1], out=out, casting="unsafe")


# -------------------------------------------------------------------------------------------------
# factories


def _lowest(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype.type(-np.inf)
    return np.iinfo(dtype).min


def _pool_factory(spec: NodeSpec, is_max: bool):
    auto_pad = auto_pad_mode(spec)
    kshape = spec.attr("kernel_shape")
    if kshape is None:
        raise spec.error("attribute kernel_shape is required")
    kshape = [int(k) for k in kshape]
    nd = len(kshape)
    if nd < 1 or nd > 3:
        raise spec.error(f"supports 1 to 3 spatial dimensions, got kernel_shape {kshape}")
    if any(k < 1 for k in kshape):
        raise spec.error(f"kernel_shape must be positive, got {kshape}")
    strides = int_list(spec, "strides", nd, 1, minimum=1)
    dil = int_list(spec, "dilations", nd, 1, minimum=1)
    pads = int_list(spec, "pads", 2 * nd, 0, minimum=0)
    ceil_mode = bool(spec.attr("ceil_mode", 0))
    count_include_pad = bool(spec.attr("count_include_pad", 0))
    storage_order = int(spec.attr("storage_order", 0))
    if storage_order not in (0, 1):
        raise spec.error(f"storage_order must be 0 or 1, got {storage_order}")
    want_indices = is_max and spec.n_outputs > 1
    geometry: dict = {}

    def setup(x):
        if x.ndim != nd + 2:
            raise spec.error(f"input of rank {x.ndim} does not match kernel_shape {kshape}")
        in_sp = list(x.shape[2:])
        out_sp, pb, pe = window_geometry(spec, in_sp, kshape, strides, dil, pads, auto_pad, ceil_mode)
        if min(out_sp) <= 0:
            raise spec.error(f"output would be empty (spatial size {out_sp}) for input {list(x.shape)}")
        # the budget, before anything is allocated (absurd pads or kernels ask for gigabytes)
        spec.check_alloc(list(x.shape[:2]) + out_sp, x.dtype)
        for o, k in zip(out_sp, kshape):
            spec.check_alloc([o, k], np.float64)
        g = {"out_sp": out_sp, "pb": pad3(pb, 0), "pe": pad3(pe, 0)}
        # one window covering the whole unpadded input (ResNet's 7x7 average): a global pool
        g["global"] = (all(o == 1 for o in out_sp) and not any(pb) and not any(pe)
                       and all(d == 1 for d in dil) and list(kshape) == in_sp)
        if not is_max:
            # window positions counted by the divisor, per axis (windows are products of axes)
            counts = []
            for i in range(nd):
                o = (spec.alloc.arange(out_sp[i])[:, None] * strides[i] - pb[i]
                     + spec.alloc.arange(kshape[i])[None, :] * dil[i])
                lo, hi = (-pb[i], in_sp[i] + pe[i]) if count_include_pad else (0, in_sp[i])
                counts.append(((o >= lo) & (o < hi)).sum(axis=1).astype(np.float64))
            cd, ch, cw = [spec.alloc.ones(1)] * (3 - nd) + counts
            # the divisor per output position, multiplied in the order the kernels used
            g["divisor"] = (cd[:, None, None] * ch[None, :, None]) * cw[None, None, :]
        return g

    k3, s3, d3 = pad3(kshape, 1), pad3(strides, 1), pad3(dil, 1)

    def run(x):
        if x.dtype.kind not in "fiu":
            raise spec.error(f"unsupported input dtype {x.dtype}")
        if not is_max and x.dtype.kind != "f" and compute_dtype(x.dtype).kind != "f":
            raise spec.error(f"AveragePool needs a float input, got {x.dtype}")
        g = geometry.get(x.shape)
        if g is None:
            g = geometry[x.shape] = setup(x)
        dt = compute_dtype(x.dtype) if x.dtype.kind == "f" or not is_max else x.dtype
        if dt.kind not in "fiu":
            dt = np.dtype(np.float32)
        x5 = np.ascontiguousarray(canon5(x), dtype=dt)
        od, oh, ow = pad3(g["out_sp"], 1)
        out = spec.alloc.empty(x.shape[:2] + (od, oh, ow), dt)
        pd, ph, pw = g["pb"]
        if g["global"] and not want_indices and x5.dtype.kind == "f":
            _global_pool(x5.reshape(-1, x5[0, 0].size), is_max, out.reshape(-1))
        elif nd == 2 and dt == np.float32 and not want_indices and (is_max or d3[1:] == [1, 1]):
            _flat2d(x5, out, k3, s3, d3, g, is_max, count_include_pad)  # the kernels byoc-cpu runs too
        elif want_indices:
            idx = spec.alloc.empty(out.shape, np.int64)
            _maxpool_indices(x5, *k3, *s3, *d3, pd, ph, pw, storage_order == 1, _lowest(dt), out, idx)
        else:
            init = _lowest(dt) if is_max else dt.type(0)
            planes = split(x.shape[0] * x.shape[1], 2 * threads.num_threads())

            if k3[0] == 1 and s3[0] == 1 and x5.shape[2] == 1:  # 1-D and 2-D: separable passes

                def chunk(i):
                    p0, p1 = planes[i]
                    rows = spec.alloc.empty((p1 - p0, x5.shape[3], ow), dt)
                    _pool_separable(x5, k3[1], k3[2], s3[1], s3[2], d3[1], d3[2], ph, pw, is_max, init, out, p0, p1,
                                    rows)
            else:

                def chunk(i):
                    _pool_taps(x5, *k3, *s3, *d3, pd, ph, pw, is_max, init, out, *planes[i])

            threads.parallel_for(chunk, len(planes))
            if not is_max:
                np.divide(out, g["divisor"], out=out, casting="unsafe")  # float64 quotient, rounded once
        shape = x.shape[:2] + tuple(g["out_sp"])
        y = out.reshape(shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        if want_indices:
            return (y, idx.reshape(shape))
        return (y,)

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


def _global_factory(spec: NodeSpec, is_max: bool):
    def run(x):
        if x.ndim < 3:
            raise spec.error(f"input must have rank >= 3, got shape {list(x.shape)}")
        if x.dtype.kind != "f" and compute_dtype(x.dtype).kind != "f":
            raise spec.error(f"needs a float input, got {x.dtype}")
        dt = compute_dtype(x.dtype)
        r = x.shape[0] * x.shape[1]
        xr = np.ascontiguousarray(x, dtype=dt).reshape(r, -1)
        if xr.shape[1] == 0:
            raise spec.error("empty spatial dimensions")
        out = spec.alloc.empty(r, dt)
        _global_pool(xr, is_max, out)
        y = out.reshape(x.shape[:2] + (1,) * (x.ndim - 2))
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return (y,)

    return run


@kernel("GlobalMaxPool")
def make_global_max_pool(spec: NodeSpec):
    return _global_factory(spec, True)


@kernel("GlobalAveragePool")
def make_global_average_pool(spec: NodeSpec):
    return _global_factory(spec, False)


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
