"""Conv and ConvTranspose (1-D, 2-D and 3-D, groups, dilations, every padding mode).

Every input is viewed in the canonical 5-D layout ``(N, C, D, H, W)``
(:func:`byoc.contract.geometry.canon5`), so one Numba specialisation per dtype serves all ranks.

Conv is an im2col patch matrix (a Numba loop) times the weight matrix (numpy's BLAS product,
on BLAS's threads), per image and group; grouped convolutions with few channels per group
(depthwise) run a direct loop nest instead. ConvTranspose is the transposed product followed by
a col2im scatter. 16-bit floats are computed in float32. The loops are serial: an OpenMP pool
(Numba's ``prange``) keeps spinning after its loop and measured 3-8x slower BLAS products next
to it.
"""

from __future__ import annotations

import numba
import numpy as np

from byoc.contract.geometry import auto_pad_mode, canon5, int_list, pad3, window_geometry
from byoc.kernels.elementwise import compute_dtype
from byoc.kernels.registry import NodeSpec, kernel

#: grouped convolutions with fewer input channels per group run the direct loop nest
_DIRECT_MAX_CHANNELS = 8


def check_geometry(spec: NodeSpec, x: np.ndarray, m: int, g: dict) -> None:
    """The budget, before anything is allocated: the output and one image's patch matrix."""
    spec.check_alloc([x.shape[0], m, *g["out_sp"]], x.dtype)
    taps = int(np.prod(g["k"], dtype=np.int64))
    spec.check_alloc([g["cg"], taps, *g["out_sp"]], x.dtype)


@numba.njit(cache=True, nogil=True)
def valid_range(o_n, s, off, n):
    """Outputs ``o`` in ``[0, o_n)`` whose input index ``o*s + off`` lies in ``[0, n)``."""
    lo = 0
    if off < 0:
        lo = (-off + s - 1) // s
    hi = 0
    if n - 1 - off >= 0:
        hi = (n - 1 - off) // s + 1
    hi = min(hi, o_n)
    return min(lo, hi), hi


@numba.njit(cache=True, nogil=True)
def _im2col(x, xo, c, d, h, w, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, pt, pl, od, oh, ow, col, co):
    """The patch matrix of one image (and group): ``x[xo:]`` holds ``(c, d, h, w)``; row
    ``((ci*kd + a)*kh + b)*kw + e`` of ``col[co:]`` (``od*oh*ow`` wide) holds tap ``(a, b, e)``
    of channel ``ci`` at every output position, zero outside the input."""
    n_out = od * oh * ow
    for ci in range(c):
        for a in range(kd):
            for b in range(kh):
                for e in range(kw):
                    row = co + (((ci * kd + a) * kh + b) * kw + e) * n_out
                    lo, hi = valid_range(ow, sw, e * dw - pl, w)
                    for z in range(od):
                        iz = z * sd - pd + a * dd
                        for i in range(oh):
                            ih = i * sh - pt + b * dh
                            dst = row + (z * oh + i) * ow
                            if iz < 0 or iz >= d or ih < 0 or ih >= h:
                                col[dst:dst + ow] = 0
                                continue
                            src = xo + ((ci * d + iz) * h + ih) * w + e * dw - pl
                            col[dst:dst + lo] = 0
                            for j in range(lo, hi):
                                col[dst + j] = x[src + j * sw]
                            col[dst + hi:dst + ow] = 0


@numba.njit(cache=True, nogil=True)
def im2col(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1, col, co):
    """2-D patch matrix of output rows ``[r0, r1)`` of one image on flat buffers: ``x[xo:]``
    holds ``(c, h, w)``; ``col[co:]`` receives ``(c*kh*kw, (r1-r0)*ow)``, row ``(ci*kh + b)*kw
    + e``. Public: plugins that keep tensors in flat buffers call it."""
    n_out = (r1 - r0) * ow
    for ci in range(c):
        for b in range(kh):
            for e in range(kw):
                row = co + ((ci * kh + b) * kw + e) * n_out
                lo, hi = valid_range(ow, sw, e * dw - pl, w)
                for i in range(r0, r1):
                    ih = i * sh - pt + b * dh
                    dst = row + (i - r0) * ow
                    if ih < 0 or ih >= h:
                        col[dst:dst + ow] = 0
                        continue
                    src = xo + (ci * h + ih) * w + e * dw - pl
                    col[dst:dst + lo] = 0
                    for j in range(lo, hi):
                        col[dst + j] = x[src + j * sw]
                    col[dst + hi:dst + ow] = 0


@numba.njit(cache=True, nogil=True)
def _direct(x, w, bias, group, sd, sh, sw, dd, dh, dw, pd, ph, pw, out):
    """Grouped convolution as a loop nest, one output channel of one image at a time."""
    nb, _, d_, h_, w_ = x.shape
    m_, cg, kd_, kh_, kw_ = w.shape
    _, _, od_, oh_, ow_ = out.shape
    mg = m_ // group
    for u in range(nb * m_):
        n, m = u // m_, u % m_
        g = m // mg
        o = out[n, m]
        o[:] = bias[m]
        for c in range(cg):
            xc = x[n, g * cg + c]
            for kd in range(kd_):
                for kh in range(kh_):
                    for kw in range(kw_):
                        wv = w[m, c, kd, kh, kw]
                        offw = kw * dw - pw
                        lo, hi = valid_range(ow_, sw, offw, w_)
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
                                for j in range(lo, hi):
                                    dst[j] += wv * src[j * sw + offw]


@numba.njit(cache=True, nogil=True)
def _col2im_add(col, kd_, kh_, kw_, sd, sh, sw, dd, dh, dw, pd, ph, pw, id_n, ih_n, iw_n, n, m0, mg, out):
    """ConvTranspose scatter: ``out[n, m0+m, i*s - p + k*d] += col[(m, k), i]``."""
    _, _, od_, oh_, ow_ = out.shape
    for m in range(mg):
        o = out[n, m0 + m]
        for kd in range(kd_):
            for kh in range(kh_):
                for kw in range(kw_):
                    row = col[((m * kd_ + kd) * kh_ + kh) * kw_ + kw]
                    offw = kw * dw - pw
                    lo, hi = valid_range(iw_n, sw, offw, ow_)
                    for i in range(id_n):
                        od = i * sd - pd + kd * dd
                        if od < 0 or od >= od_:
                            continue
                        for j in range(ih_n):
                            oh = j * sh - ph + kh * dh
                            if oh < 0 or oh >= oh_:
                                continue
                            dst = o[od, oh]
                            base = (i * ih_n + j) * iw_n
                            for k in range(lo, hi):
                                dst[k * sw + offw] += row[base + k]


def _float_input(spec: NodeSpec, x: np.ndarray) -> np.dtype:
    dt = compute_dtype(x.dtype)
    if dt.kind != "f":
        raise spec.error(f"X must be a float tensor, got {x.dtype}")
    return dt


def _check_weights(spec: NodeSpec, x: np.ndarray, w: np.ndarray, c_axis_ok: bool) -> int:
    nd = x.ndim - 2
    if nd < 1 or nd > 3:
        raise spec.error(f"supports 1 to 3 spatial dimensions, got input shape {list(x.shape)}")
    if w.ndim != x.ndim:
        raise spec.error(f"W has rank {w.ndim}, X has rank {x.ndim}")
    if not c_axis_ok:
        group = int(spec.attr("group", 1))
        raise spec.error(f"channels do not match: X has {x.shape[1]}, W is {list(w.shape)} with group={group}")
    kshape = spec.attr("kernel_shape")
    if kshape is not None and [int(k) for k in kshape] != list(w.shape[2:]):
        raise spec.error(f"kernel_shape {list(kshape)} differs from the weight shape {list(w.shape[2:])}")
    return nd


def _bias(spec: NodeSpec, b, m: int, dt) -> np.ndarray:
    if b is None:
        return spec.alloc.zeros(m, dt)
    if b.shape != (m,):
        raise spec.error(f"B must have shape [{m}], got {list(b.shape)}")
    return np.ascontiguousarray(b, dtype=dt)


def _group(spec: NodeSpec) -> int:
    group = int(spec.attr("group", 1))
    if group < 1:
        raise spec.error(f"group must be >= 1, got {group}")
    return group


@kernel("Conv")
def make_conv(spec: NodeSpec):
    auto_pad = auto_pad_mode(spec)
    group = _group(spec)

    def geometry(x, w) -> dict:
        c, (m, cg) = x.shape[1], w.shape[:2]
        nd = _check_weights(spec, x, w, c == cg * group and m % group == 0)
        ksz = list(w.shape[2:])
        strides = int_list(spec, "strides", nd, 1, minimum=1)
        dil = int_list(spec, "dilations", nd, 1, minimum=1)
        pads = int_list(spec, "pads", 2 * nd, 0, minimum=0)
        out_sp, pb, _ = window_geometry(spec, list(x.shape[2:]), ksz, strides, dil, pads, auto_pad)
        if min(out_sp) <= 0:
            raise spec.error(f"output would be empty (spatial size {out_sp}) for input {list(x.shape)}")
        g = {"out_sp": out_sp, "k": pad3(ksz, 1), "s": pad3(strides, 1), "d": pad3(dil, 1), "pb": pad3(pb, 0),
             "cg": cg, "mg": m // group}
        check_geometry(spec, x, m, g)
        return g

    def run(x, w, b=None):
        dt = _float_input(spec, x)
        g = geometry(x, w)
        nb, m = x.shape[0], w.shape[0]
        cg, mg = g["cg"], g["mg"]
        od, oh, ow = pad3(g["out_sp"], 1)
        x5 = np.ascontiguousarray(canon5(x), dtype=dt)
        w5 = np.ascontiguousarray(canon5(w), dtype=dt)
        bias = _bias(spec, b, m, dt)
        out = spec.alloc.empty((nb, m, od, oh, ow), dt)
        (kd, kh, kw), (sd, sh, sw), (dd, dh, dw), (pd, pt, pl) = g["k"], g["s"], g["d"], g["pb"]
        if group > 1 and cg < _DIRECT_MAX_CHANNELS:
            _direct(x5, w5, bias, group, sd, sh, sw, dd, dh, dw, pd, pt, pl, out)
        else:
            _, c, d, h, wd = x5.shape
            n_out = od * oh * ow
            wmat = w5.reshape(group, mg, cg * kd * kh * kw)
            # a 1x1 convolution without padding reads its (strided) input as the patch matrix
            pointwise = kd * kh * kw == 1 and not any(g["pb"]) and (od, oh, ow) == tuple(
                len(range(0, n, s)) for n, s in zip((d, h, wd), (sd, sh, sw)))
            col = None if pointwise else spec.alloc.empty(cg * kd * kh * kw * n_out, dt)
            xf = x5.reshape(-1)
            outg = out.reshape(nb, group, mg, n_out)
            for n in range(nb):
                for gi in range(group):
                    if pointwise:
                        cols = x5[n, gi * cg:(gi + 1) * cg, ::sd, ::sh, ::sw].reshape(cg, n_out)
                    else:
                        _im2col(xf, (n * c + gi * cg) * d * h * wd, cg, d, h, wd, kd, kh, kw, sd, sh, sw, dd, dh, dw,
                                pd, pt, pl, od, oh, ow, col, 0)
                        cols = col.reshape(-1, n_out)
                    np.matmul(wmat[gi], cols, out=outg[n, gi])
            outg += bias.reshape(1, group, mg, 1)
        return (out.reshape((nb, m, *g["out_sp"])).astype(x.dtype, copy=False),)

    return run


def _transpose_geometry(spec: NodeSpec, x, w, group: int, auto_pad: str) -> dict:
    nd = _check_weights(spec, x, w, w.shape[0] == x.shape[1] and x.shape[1] % group == 0)
    ksz = list(w.shape[2:])
    strides = int_list(spec, "strides", nd, 1, minimum=1)
    dil = int_list(spec, "dilations", nd, 1, minimum=1)
    opad = int_list(spec, "output_padding", nd, 0, minimum=0)
    in_sp = list(x.shape[2:])
    natural = [strides[i] * (in_sp[i] - 1) + opad[i] + (ksz[i] - 1) * dil[i] + 1 for i in range(nd)]
    out_shape = spec.attr("output_shape")
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is not None:
            target = [int(v) for v in out_shape]
            target = target[2:] if len(target) == nd + 2 else target
            if len(target) != nd:
                raise spec.error(f"output_shape {target} does not have {nd} spatial dimensions")
        else:
            target = [in_sp[i] * strides[i] for i in range(nd)]
        # a target larger than the full output makes the total negative: the output then grows
        # at the side the padding would have gone to, as the spec's formula says
        total = [natural[i] - target[i] for i in range(nd)]
        pb = [t // 2 for t in total] if auto_pad == "SAME_UPPER" else [t - t // 2 for t in total]
        out_sp = target
    else:
        pads = [0] * (2 * nd) if auto_pad == "VALID" else int_list(spec, "pads", 2 * nd, 0, minimum=0)
        pb = pads[:nd]
        out_sp = [natural[i] - pads[i] - pads[i + nd] for i in range(nd)]
    if min(out_sp) <= 0:
        raise spec.error(f"output would be empty (spatial size {out_sp}) for input {list(x.shape)}")
    g = {"out_sp": out_sp, "k": pad3(ksz, 1), "s": pad3(strides, 1), "d": pad3(dil, 1), "pb": pad3(pb, 0),
         "in": pad3(in_sp, 1), "cg": x.shape[1] // group, "mg": w.shape[1]}
    check_geometry(spec, x, g["mg"] * group, g)
    return g


@kernel("ConvTranspose")
def make_conv_transpose(spec: NodeSpec):
    auto_pad = auto_pad_mode(spec)
    group = _group(spec)

    def run(x, w, b=None):
        dt = _float_input(spec, x)
        g = _transpose_geometry(spec, x, w, group, auto_pad)
        nb, cg, mg = x.shape[0], g["cg"], g["mg"]
        m = mg * group
        od, oh, ow = pad3(g["out_sp"], 1)
        out = spec.alloc.empty((nb, m, od, oh, ow), dt)
        out.reshape(nb, m, od * oh * ow)[...] = _bias(spec, b, m, dt)[None, :, None]
        idn, ihn, iwn = g["in"]
        (kd, kh, kw), (sd, sh, sw), (dd, dh, dw), (pd, ph, pw) = g["k"], g["s"], g["d"], g["pb"]
        xr = np.ascontiguousarray(canon5(x), dtype=dt).reshape(nb, x.shape[1], idn * ihn * iwn)
        wt = np.asarray(w, dtype=dt).reshape(group, cg, mg * kd * kh * kw).transpose(0, 2, 1)  # (G, Mg*K, Cg)
        spec.check_alloc((wt.shape[1], xr.shape[2]), dt)
        for n in range(nb):
            for gi in range(group):
                col = np.matmul(wt[gi], xr[n, gi * cg:(gi + 1) * cg])
                _col2im_add(col, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, idn, ihn, iwn, n, gi * mg, mg, out)
        return (out.reshape((nb, m, *g["out_sp"])).astype(x.dtype, copy=False),)

    return run
