"""Pooling: MaxPool (with optional Indices), AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool.

1-D, 2-D and 3-D inputs share one code path through the canonical ``(N, C, D, H, W)`` view of
:func:`byoc.contract.geometry.canon5`. Window geometry (strides, pads, dilations, ceil_mode, auto_pad)
follows the ONNX operator definitions; with ceil_mode the last window must start inside the
input or its leading padding (as onnxruntime and PyTorch do).

The pooled value of a window is accumulated one kernel tap at a time over the whole tensor (numpy:
one strided slice of the padded input per tap). MaxPool with an Indices output scans each window
in index order and keeps the first maximum (a Numba loop).
LpPool sums ``|x| ** p`` over the window's taps inside the input and takes the ``p``-th root.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from byoc.contract.geometry import auto_pad_mode, canon5, int_list, pad3, window_geometry
from byoc.kernels.elementwise import compute_dtype
from byoc.kernels.registry import NodeSpec, kernel

# -------------------------------------------------------------------------------------------------
# Numba kernels


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


def _global_pool(x: np.ndarray, is_max: bool, out: np.ndarray) -> None:
    """``x (R, S) -> out (R,)``: the maximum, or the mean with a float64 sum."""
    if is_max:
        np.max(x, axis=1, out=out)
    else:
        np.divide(x.sum(axis=1, dtype=np.float64), x.shape[1], out=out, casting="unsafe")


def _pool_taps(spec: NodeSpec, x5: np.ndarray, k3, s3, d3, pb, is_max: bool, init, out: np.ndarray) -> None:
    """Max (``is_max``) or sum of each window into ``out``, one kernel tap at a time over the whole
    tensor: a strided slice of the input padded with ``init`` (a tap in the padding adds nothing)."""
    out_sp = out.shape[2:]
    need = [(o - 1) * st + (kk - 1) * dd + 1 for o, st, kk, dd in zip(out_sp, s3, k3, d3)]
    full = tuple(max(p + n, nd) for p, n, nd in zip(pb, x5.shape[2:], need))
    xp = x5
    if full != x5.shape[2:]:
        xp = spec.alloc.full(x5.shape[:2] + full, init, x5.dtype)
        (a, b, c), (d, h, w) = pb, x5.shape[2:]
        xp[:, :, a:a + d, b:b + h, c:c + w] = x5
    out[...] = init
    combine = np.maximum if is_max else np.add
    for t in np.ndindex(*k3):
        tap = tuple(slice(tt * dd, tt * dd + (o - 1) * st + 1, st) for tt, dd, o, st in zip(t, d3, out_sp, s3))
        combine(out, xp[(slice(None), slice(None), *tap)], out=out)


# -------------------------------------------------------------------------------------------------
# factories


def _lowest(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype.type(-np.inf)
    return np.iinfo(dtype).min


def _pool_factory(spec: NodeSpec, is_max: bool, p: float | None = None):
    """MaxPool (``is_max``), AveragePool, or LpPool of norm ``p``."""
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
        _nonempty(spec, x)
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
            raise spec.error(f"{spec.op_type} needs a float input, got {x.dtype}")
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
        if p is not None:
            x5 = np.abs(x5) ** dt.type(p)
        if g["global"] and not want_indices and x5.dtype.kind == "f" and p is None:
            _global_pool(x5.reshape(x5.shape[0] * x5.shape[1], math.prod(x5.shape[2:])), is_max, out.reshape(-1))
        elif want_indices:
            idx = spec.alloc.empty(out.shape, np.int64)
            _maxpool_indices(x5, *k3, *s3, *d3, pd, ph, pw, storage_order == 1, _lowest(dt), out, idx)
        else:
            init = _lowest(dt) if is_max else dt.type(0)
            _pool_taps(spec, x5, k3, s3, d3, g["pb"], is_max, init, out)
            if p is not None:
                np.power(out, 1 / p, out=out, casting="unsafe")
            elif not is_max:
                np.divide(out, g["divisor"], out=out, casting="unsafe")  # float64 quotient, rounded once
        shape = x.shape[:2] + tuple(g["out_sp"])
        y = out.reshape(shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        if want_indices:
            return (y, idx.reshape(shape))
        return (y,)

    return run


@kernel("MaxPool")
def make_max_pool(spec: NodeSpec):
    return _pool_factory(spec, True)


@kernel("AveragePool")
def make_average_pool(spec: NodeSpec):
    return _pool_factory(spec, False)


@kernel("LpPool")
def make_lp_pool(spec: NodeSpec):
    return _pool_factory(spec, False, float(spec.attr("p", 2)))


def _nonempty(spec: NodeSpec, x: np.ndarray) -> None:
    """Raise unless ``x`` has elements or a zero batch (an empty window has no result; onnxruntime
    pools no other zero-size input either)."""
    if x.size == 0 and x.shape[0] != 0:
        raise spec.error(f"cannot pool the zero-size input {list(x.shape)}: only the batch may be 0")


def _global_factory(spec: NodeSpec, is_max: bool):
    def run(x):
        if x.ndim < 3:
            raise spec.error(f"input must have rank >= 3, got shape {list(x.shape)}")
        if x.dtype.kind != "f" and compute_dtype(x.dtype).kind != "f":
            raise spec.error(f"needs a float input, got {x.dtype}")
        dt = compute_dtype(x.dtype)
        r = x.shape[0] * x.shape[1]
        _nonempty(spec, x)
        xr = np.ascontiguousarray(x, dtype=dt).reshape(r, int(np.prod(x.shape[2:])))
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
