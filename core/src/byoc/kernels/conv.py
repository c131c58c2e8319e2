"""Conv and ConvTranspose (1-D, 2-D and 3-D, groups, dilations, every padding mode), in numpy.

Every input is viewed in the canonical 5-D layout ``(N, C, D, H, W)``
(:func:`byoc.contract.geometry.canon5`). Conv reads the windows of the zero-padded input as a
strided view (``sliding_window_view``), copies one image's group of them into a patch matrix
and multiplies it by the weight matrix (numpy's BLAS product); a 1x1 convolution without padding
reads its input as the patch matrix, and a grouped convolution with few channels per group
(depthwise) adds one kernel tap at a time over the whole batch instead. ConvTranspose is the
transposed product followed by one strided add per kernel tap. 16-bit floats are computed in
float32. Nothing here is compiled, so a first run starts at once.
"""

from __future__ import annotations

import math

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


def _padded(spec: NodeSpec, x5: np.ndarray, pb, size) -> np.ndarray:
    """``x5`` zero-padded: ``pb`` before each spatial axis, then up to ``size`` (or its own end)."""
    full = tuple(max(p + n, s) for p, n, s in zip(pb, x5.shape[2:], size))
    if full == x5.shape[2:]:
        return x5
    xp = spec.alloc.zeros(x5.shape[:2] + full, x5.dtype)
    (a, b, c), (d, h, w) = pb, x5.shape[2:]
    xp[:, :, a:a + d, b:b + h, c:c + w] = x5
    return xp


def windows(spec: NodeSpec, x5: np.ndarray, k, s, d, pb, out_sp) -> np.ndarray:
    """The convolution windows of ``x5``: a strided view ``(N, C, od, oh, ow, kd, kh, kw)`` of its
    zero-padded copy (``pb`` leading pads; the trailing ones follow from ``out_sp``)."""
    span = [(kk - 1) * dd + 1 for kk, dd in zip(k, d)]
    xp = _padded(spec, x5, pb, [(o - 1) * ss + sp for o, ss, sp in zip(out_sp, s, span)])
    view = np.lib.stride_tricks.sliding_window_view(xp, span, axis=(2, 3, 4))
    (sd, sh, sw), (dd, dh, dw), (od, oh, ow) = s, d, out_sp
    return view[:, :, :(od - 1) * sd + 1:sd, :(oh - 1) * sh + 1:sh, :(ow - 1) * sw + 1:sw, ::dd, ::dh, ::dw]


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
        nb, m, cg, mg = x.shape[0], w.shape[0], g["cg"], g["mg"]
        out_sp, k, s, pb = pad3(g["out_sp"], 1), g["k"], g["s"], g["pb"]
        taps, n_out = math.prod(k), math.prod(out_sp)
        x5 = np.ascontiguousarray(canon5(x), dtype=dt)
        w5 = np.ascontiguousarray(canon5(w), dtype=dt).reshape(group, mg, cg, *k)
        out = spec.alloc.empty((nb, group, mg, *out_sp), dt)
        # a 1x1 convolution without padding reads its (strided) input as the patch matrix
        if taps == 1 and not any(pb) and out_sp == tuple(len(range(0, n, st)) for n, st in zip(x5.shape[2:], s)):
            win = x5[:, :, ::s[0], ::s[1], ::s[2], None, None, None]
        else:
            win = windows(spec, x5, k, s, g["d"], pb, out_sp)
        win = win.reshape(nb, group, cg, *out_sp, *k)
        if group > 1 and cg < _DIRECT_MAX_CHANNELS:
            # few channels per group (depthwise): one tap of one channel at a time, whole batch
            out[...] = 0
            term = spec.alloc.empty(out.shape, dt)
            for c in range(cg):
                for t in np.ndindex(*k):
                    np.multiply(w5[:, :, c][(..., *t, None, None, None)], win[:, :, c][(..., *t)][:, :, None], out=term)
                    out += term
        else:
            wmat, outg = w5.reshape(group, mg, cg * taps), out.reshape(nb, group, mg, n_out)
            for n in range(nb):
                for gi in range(group):
                    cols = np.ascontiguousarray(win[n, gi].transpose(0, 4, 5, 6, 1, 2, 3)).reshape(cg * taps, n_out)
                    np.matmul(wmat[gi], cols, out=outg[n, gi])
        out += _bias(spec, b, m, dt).reshape(1, group, mg, 1, 1, 1)
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
        out_sp, in_sp, k, s, d, pb = pad3(g["out_sp"], 1), g["in"], g["k"], g["s"], g["d"], g["pb"]
        # every tap adds into a full-size buffer that starts at min(0, pad) on each axis
        lo = [min(0, p) for p in pb]
        full = [max((i - 1) * st + (kk - 1) * dd + 1, p + o) - low
                for i, st, kk, dd, p, o, low in zip(in_sp, s, k, d, pb, out_sp, lo)]
        spec.check_alloc((nb, m, *full), dt)
        acc = spec.alloc.zeros((nb, group, mg, *full), dt)
        xr = np.ascontiguousarray(canon5(x), dtype=dt).reshape(nb, group, cg, math.prod(in_sp))
        wt = np.asarray(w, dtype=dt).reshape(group, cg, mg * math.prod(k)).transpose(0, 2, 1)  # (G, Mg*K, Cg)
        spec.check_alloc((wt.shape[1], xr.shape[3]), dt)
        for n in range(nb):
            for gi in range(group):
                col = np.matmul(wt[gi], xr[n, gi]).reshape(mg, *k, *in_sp)
                for t in np.ndindex(*k):
                    start = [tt * dd - low for tt, dd, low in zip(t, d, lo)]
                    acc[n, gi][(slice(None), *(slice(a, a + (i - 1) * st + 1, st)
                                             for a, i, st in zip(start, in_sp, s)))] += col[(slice(None), *t)]
        crop = tuple(slice(p - low, p - low + o) for p, low, o in zip(pb, lo, out_sp))
        out = acc.reshape(nb, m, *full)[(slice(None), slice(None), *crop)]
        out = out + _bias(spec, b, m, dt).reshape(1, m, 1, 1, 1)
        return (out.reshape((nb, m, *g["out_sp"])).astype(x.dtype, copy=False),)

    return run
