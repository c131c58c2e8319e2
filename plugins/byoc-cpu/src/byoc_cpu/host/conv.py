"""Convolutions: Conv and ConvTranspose (1-D, 2-D and 3-D, groups, dilations, every padding mode).

Every input is viewed in a canonical 5-D layout ``(N, C, D, H, W)`` (1-D and 2-D convolutions
get unit leading spatial axes), so one Numba specialisation per dtype serves all ranks.

Conv picks a strategy per node and input shape. All but ``direct`` are GEMMs: byoc's own
float32 GEMM (:func:`byoc_cpu.host.gemm.gemm_acc`, weights packed once per constant weight
tensor) or OpenBLAS for other dtypes; the first depth block of each GEMM writes the bias, so
no separate pass initialises the output. Work is split over byoc's thread pool
(:mod:`byoc_cpu.host.threads`).

``pointwise``
    1x1 kernels without padding: the input *is* the GEMM operand (``W[M,C] @ X[C,HW]``), after
    a strided subsample when strides > 1. No im2col at all.
``shift``
    stride-1 1-D/2-D convolutions with >= 16 channels per group: the input is zero-padded
    once, and each kernel tap is one GEMM accumulating into the output, reading the padded
    input at the tap's offset. Outputs are computed on the padded width and the few extra
    columns dropped, so no im2col matrix (kernel-size times the input) is ever written.
    Measured on ResNet-50's 3x3 layers: 2x faster than im2col + GEMM.
``phase_shift``
    the same for strided convolutions: the padded input is split into one plane per stride
    phase, and each tap reads one phase plane at an offset.
``im2col``
    everything else with channels worth a GEMM (ResNet's 7x7 stem, 3-D): the patch matrix,
    built in row blocks to bound memory (from stride-phase planes when strided, so every copy
    is contiguous) times the weight matrix.
``winograd``
    F(2x2, 3x3) / F(4x4, 3x3) for 3x3 stride-1 layers, only where the GEMM is OpenBLAS's
    (float64, a CPU without AVX-512, or ``BYOC_OWN_GEMM=0``): with byoc's GEMM ``shift`` measured as fast.
``direct``
    grouped convolutions with few channels per group (depthwise): a Numba loop nest, one
    vectorisable row update per kernel tap.

ConvTranspose is one GEMM per image and group (``W^T @ X``) followed by a col2im scatter.

A zero-size input or weight (a batch, channels or filters of 0) goes to byoc's reference kernel
(:func:`byoc_cpu.host.registry.reference`): nothing to compute, its results and errors.
"""

from __future__ import annotations

import numba
import numpy as np

from byoc.contract.geometry import auto_pad_mode, canon5, int_list, pad3, window_geometry
from byoc.contract import KernelError
from byoc_cpu.host import blocked, threads
from byoc_cpu.strategy import ConvShape, choose_conv
from byoc_cpu.host.gemm import (
    MR,
    PackCache,
    compute_dtype,
    CW,
    gemm_acc,
    gemm_narrow_acc,
    gemm_narrow_panels,
    gemm_rows,
    have_blas,
    matmul_into,
    pack_a,
    pack_narrow,
    prefers_narrow,
    split,
    use_own_gemm,
)
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel, reference
from byoc_cpu.tuning import CONV

_U = np.uint64  # unsigned indices: Numba skips negative-index wraparound, so LLVM vectorises

# im2col buffers are built in blocks of output rows of at most this many elements
_COL_BLOCK = CONV["col_block_elements"]
_COL_BLOCK_L2 = CONV["col_block_l2_elements"]
# grouped convolutions split over the pool from this many multiply-adds
_DIRECT_PAR_MIN_MACS = CONV["direct_parallel_min_macs"]


# -------------------------------------------------------------------------------------------------
# attribute parsing and geometry (shared with the pooling kernels)


def check_geometry(spec: NodeSpec, x: np.ndarray, m: int, g: dict) -> None:
    """The budget, before anything is allocated: the output, the padded input, one im2col panel."""
    nb = x.shape[0]
    spec.check_alloc([nb, m, *g["out_sp"]], x.dtype)
    if "pe" in g:
        spec.check_alloc([nb, x.shape[1], *[i + b + e for i, b, e in zip(g["in"], g["pb"], g["pe"])]], x.dtype)
    taps = int(np.prod(g["k"], dtype=np.int64))
    spec.check_alloc([g["cg"], taps, *g["out_sp"]], x.dtype)


def read_only_view(a: np.ndarray) -> np.ndarray:
    """``a``, or a read-only view of it: one Numba type for an input whatever its origin."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


# -------------------------------------------------------------------------------------------------
# Numba kernels


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _valid_range(o_n, s, off, n):
    """Outputs ``o`` in ``[0, o_n)`` whose input index ``o*s + off`` lies in ``[0, n)``."""
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _im2col_rows(x, xo, c, d, h, w, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, pt, pl, oh, ow, r0, r1, col, co):
    """The one patch-matrix kernel (1-D, 2-D and 3-D; the host and compiled code): output rows
    ``[r0, r1)`` of the (OD*OH) row space of one image whose ``(c, d, h, w)`` planes are at
    ``x[xo:]``. ``col[co:]`` receives ``(c*kd*kh*kw, (r1-r0)*ow)``, row
    ``((ci*kd + a)*kh + ki)*kw + kj``. Plain loops on unsigned flat indices (no slice objects
    per output row, no slice-to-slice copy: its shape-error path costs seconds of compilation),
    so each row copy vectorises."""
    ncols = (r1 - r0) * ow
    for ci in range(c):
        for a in range(kd):
            for ki in range(kh):
                for kj in range(kw):
                    dst = co + (((ci * kd + a) * kh + ki) * kw + kj) * ncols
                    offw = kj * dw - pl
                    lo, hi = _valid_range(ow, sw, offw, w)
                    r = r0
                    while r < r1:  # one output depth at a time: the rows of one input plane
                        z = r // oh
                        i_lo = r - z * oh
                        i_hi = min(oh, i_lo + r1 - r)
                        d0 = dst + (r - r0) * ow
                        r += i_hi - i_lo
                        iz = z * sd - pd + a * dd
                        if iz < 0 or iz >= d:
                            for j in range((i_hi - i_lo) * ow):
                                col[_U(d0 + j)] = 0
                            continue
                        plane = xo + (ci * d + iz) * h * w
                        for i in range(i_lo, i_hi):
                            ih = i * sh - pt + ki * dh
                            dr = d0 + (i - i_lo) * ow
                            if ih < 0 or ih >= h:
                                for j in range(ow):
                                    col[_U(dr + j)] = 0
                                continue
                            src = plane + ih * w + offw
                            for j in range(lo):
                                col[_U(dr + j)] = 0
                            if sw == 1:
                                for j in range(lo, hi):
                                    col[_U(dr + j)] = x[_U(src + j)]
                            else:
                                for j in range(lo, hi):
                                    col[_U(dr + j)] = x[_U(src + j * sw)]
                            for j in range(hi, ow):
                                col[_U(dr + j)] = 0


def _flat(a: np.ndarray) -> np.ndarray:
    """``a`` as one flat view (a kernel writes through it, so no copy may stand in)."""
    if not a.flags.c_contiguous:
        raise ValueError("conv: a scratch or output buffer is not contiguous")
    return a.reshape(-1)


def _pad_planes(x, c0, ca, cb, pt, pl, hp, wp, xp):
    """Zero-padded copy for the shift strategy, channels ``[ca, cb)`` of the group starting at
    ``c0`` of the 5-D ``x`` (depth 1): channel ``c`` of image ``n`` lands at
    ``xp[c, n*hp*wp : (n+1)*hp*wp]`` as an ``(hp, wp)`` plane; the rest of the row (borders,
    slack) is zero. Offsets only: the copy is :func:`pad_images`."""
    if x.shape[2] != 1:
        raise ValueError("conv: the plane copies take 1-D / 2-D input (depth 1)")
    nb, c_all, _, h_, w_ = x.shape
    if cb > ca:
        ld = xp.shape[1]
        pad_images(np.ascontiguousarray(x).reshape(-1), (c0 + ca) * h_ * w_, c_all * h_ * w_, nb, cb - ca, h_, w_,
                   _flat(xp), ca * ld, ld, hp, wp, pt, pl)


def _phase_planes(x, n, c0, ca, cb, sh, sw, pt, pl, hq, wq, xp):
    """Strided shift strategy: for channels ``[ca, cb)`` (of the group at ``c0``) of image ``n``
    of the 5-D ``x`` (depth 1), ``xp[c, (py*sw+px)*hq*wq + i*wq + j] = xpad[i*sh + py, j*sw + px]``
    (zero outside the input), one (hq, wq) plane per stride phase; the tail of the row is zero.
    Offsets only: the copy is :func:`phase_planes`."""
    if x.shape[2] != 1:
        raise ValueError("conv: the plane copies take 1-D / 2-D input (depth 1)")
    c_all, h_, w_ = x.shape[1], x.shape[3], x.shape[4]
    if cb > ca:
        ld = xp.shape[1]
        phase_planes(np.ascontiguousarray(x).reshape(-1), (n * c_all + c0 + ca) * h_ * w_, cb - ca, h_, w_,
                     _flat(xp), ca * ld, ld, sh, sw, pt, pl, hq, wq)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _im2col_phases(xp, cn, offsets, wq, ow_, r0, r1, col):
    """Patch matrix rows ``c*T + t`` (tap ``t``) for output rows ``[r0, r1)`` from phase planes
    (:func:`_phase_planes`): every row segment is a contiguous copy."""
    nt = offsets.shape[0]
    for c in range(cn):
        src = xp[c]
        for t in range(nt):
            row = col[c * nt + t]
            off = offsets[t]
            base = 0
            for r in range(r0, r1):
                o = off + r * wq
                for j in range(ow_):
                    row[base + j] = src[o + j]
                base += ow_


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _crop_planes(acc, hp, wp, oh_, ow_, bias, m0, ma, mb, out):
    """``out[n, m0+m, 0] = acc[m, n*hp*wp + (i*wp + j)] + bias[m0+m]`` for ``m`` in ``[ma, mb)``,
    ``i < OH, j < OW``."""
    nb = out.shape[0]
    plane = hp * wp
    for n in range(nb):
        for m in range(ma, mb):
            a = acc[m]
            b = bias[m0 + m]
            dst = out[n, m0 + m, 0]
            base = n * plane
            for i in range(oh_):
                row = dst[i]
                o = base + i * wp
                for j in range(ow_):
                    row[j] = a[o + j] + b


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _crop_rows(acc, hp, wp, oh_, ow_, bias, m0, r0, r1, out):
    """Like :func:`_crop_planes` for every output channel, padded rows ``[r0, r1)`` of the
    accumulator (row ``r`` is image ``r // hp``, output row ``r % hp``)."""
    mg = acc.shape[0]
    for r in range(r0, r1):
        n = r // hp
        i = r - n * hp
        if i >= oh_:
            continue
        o = r * wp
        for m in range(mg):
            a = acc[m]
            b = bias[m0 + m]
            row = out[n, m0 + m, 0, i]
            for j in range(ow_):
                row[j] = a[o + j] + b


def _subsample(x, sd, sh, sw, od_, oh_, ow_, out):
    """``out = x[:, :, ::sd, ::sh, ::sw]`` (the first ``od_, oh_, ow_``) for 5-D ``x`` and
    ``out``. Offsets only: the copy is :func:`subsample_volumes`."""
    nb, c, d_, h_, w_ = x.shape
    subsample_volumes(np.ascontiguousarray(x).reshape(-1), 0, nb * c, d_, h_, w_, sd, sh, sw, od_, oh_, ow_,
                      _flat(out), 0)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _conv_direct(x, w, bias, has_bias, group, sd, sh, sw, dd, dh, dw, pd, ph, pw, ma, mb, out):
    """Grouped convolution as a loop nest over output channels ``[ma, mb)``: for each output
    channel and kernel tap, one vectorisable update of each output row."""
    nb, c_, d_, h_, w_ = x.shape
    m_, cg, kd_, kh_, kw_ = w.shape
    _, _, od_, oh_, ow_ = out.shape
    mg = m_ // group
    for n in range(nb):
        for m in range(ma, mb):
            g = m // mg
            o = out[n, m]
            o[:] = bias[m] if has_bias else 0
            for c in range(cg):
                xc = x[n, g * cg + c]
                for kd in range(kd_):
                    for kh in range(kh_):
                        for kw in range(kw_):
                            wv = w[m, c, kd, kh, kw]
                            offw = kw * dw - pw
                            lo, hi = _valid_range(ow_, sw, offw, w_)
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
                                    if sw == 1:
                                        for j in range(lo, hi):
                                            dst[j] += wv * src[j + offw]
                                    else:
                                        for j in range(lo, hi):
                                            dst[j] += wv * src[j * sw + offw]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _direct2d(x, xo, c, h, w, wt, wo, m, cg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, m0, m1, bias, has_bias, y, yo):
    """Output channels ``[m0, m1)`` of a 1-D/2-D grouped convolution (depthwise and other thin
    groups) of one image on flat buffers: ``x[xo:]`` holds ``(c, h, w)``, ``wt[wo:]`` the
    weights ``(m, cg, kh, kw)``, ``y[yo:]`` receives ``(m, oh, ow)``.

    Each input plane is copied once, zero-padded, into ``sh x sw`` stride-phase planes (row
    ``r``, column ``q`` of phase ``(ph, pw)`` is padded pixel ``(r*sh + ph, q*sw + pw)``), so
    every kernel tap reads one phase plane at a fixed offset: one long contiguous multiply-add
    over all output rows at once (computed on the phase width; the few extra columns are
    dropped when the result is written), nothing inside it tests a border. Sums run bias, then
    channels, then taps in order (the same order as :func:`_conv_direct`)."""
    groups = c // cg
    mg = m // groups
    wq = ow + ((kw - 1) * dw) // sw
    hq = oh + ((kh - 1) * dh) // sh
    plane = hq * wq
    xp = np.empty(sh * sw * plane, y.dtype)
    acc = np.empty(oh * wq, y.dtype)
    zero = y.dtype.type(0)
    loaded = -1
    span = (oh - 1) * wq + ow
    for mo in range(m0, m1):
        gi = mo // mg
        b0 = bias[mo] if has_bias else zero
        for t in range(oh * wq):
            acc[_U(t)] = b0
        for ci in range(cg):
            cin = gi * cg + ci
            if cin != loaded:  # depthwise with a channel multiplier reuses the loaded plane
                loaded = cin
                src = xo + cin * h * w
                for p in range(sh * sw):
                    prow, pcol = p // sw, p % sw
                    lo, hi = _valid_range(wq, sw, pcol - pl, w)
                    for r in range(hq):
                        d = p * plane + r * wq
                        ih = r * sh + prow - pt
                        if ih < 0 or ih >= h:
                            for q in range(wq):
                                xp[_U(d + q)] = zero
                            continue
                        s = src + ih * w + pcol - pl
                        for q in range(lo):
                            xp[_U(d + q)] = zero
                        if sw == 1:
                            for q in range(lo, hi):
                                xp[_U(d + q)] = x[_U(s + q)]
                        else:
                            for q in range(lo, hi):
                                xp[_U(d + q)] = x[_U(s + q * sw)]
                        for q in range(hi, wq):
                            xp[_U(d + q)] = zero
            wbase = wo + (mo * cg + ci) * kh * kw
            for a in range(kh):
                ra = a * dh
                for b in range(kw):
                    wv = wt[_U(wbase + a * kw + b)]
                    cb = b * dw
                    base = ((ra % sh) * sw + cb % sw) * plane + (ra // sh) * wq + cb // sw
                    for t in range(span):
                        acc[_U(t)] += wv * xp[_U(base + t)]
        out = yo + mo * oh * ow
        for i in range(oh):
            for j in range(ow):
                y[_U(out + i * ow + j)] = acc[_U(i * wq + j)]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _col2im_add(col, kd_, kh_, kw_, sd, sh, sw, dd, dh, dw, pd, ph, pw, id_n, ih_n, iw_n, n, m0, ma, mb, out):
    """ConvTranspose scatter: ``out[n, m0+m, i*s - p + k*d] += col[(m, k), i]`` for ``m`` in
    ``[ma, mb)`` (bounds-checked)."""
    _, _, od_, oh_, ow_ = out.shape
    for m in range(ma, mb):
        o = out[n, m0 + m]
        for kd in range(kd_):
            for kh in range(kh_):
                for kw in range(kw_):
                    row = col[((m * kd_ + kd) * kh_ + kh) * kw_ + kw]
                    offw = kw * dw - pw
                    # inputs iw with 0 <= iw*sw + offw < OW
                    lo = 0
                    if offw < 0:
                        lo = (-offw + sw - 1) // sw
                    hi = 0
                    if ow_ - 1 - offw >= 0:
                        hi = (ow_ - 1 - offw) // sw + 1
                    if hi > iw_n:
                        hi = iw_n
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
                            if sw == 1:
                                for k in range(lo, hi):
                                    dst[k + offw] += row[base + k]
                            else:
                                for k in range(lo, hi):
                                    dst[k * sw + offw] += row[base + k]


# Winograd F(m x m, 3 x 3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"):
# Y = A^T [(G g G^T) * (B^T d B)] A per m x m output tile, alpha = m + 2 input tile.
_WINO = {
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: (
        [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
         [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _wino_input(xp, bt, m, th, tw, hp, wp, nb, ca, cb, v):
    """``v[i*a+j, c, t] = (B^T d_t B)[i, j]`` for channels ``[ca, cb)`` and every tile ``t``
    (image, tile row, tile column); ``xp[c]`` holds each image's zero-padded plane. The tiles
    of a plane are gathered first so every transform step runs over all of them at once."""
    a = bt.shape[0]
    tt = th * tw
    d = np.empty((a, a, tt), dtype=v.dtype)
    tmp = np.empty((a, a, tt), dtype=v.dtype)
    plane = hp * wp
    for c in range(ca, cb):
        row = xp[c]
        for n in range(nb):
            for k in range(a):
                for l_ in range(a):
                    dk = d[k, l_]
                    for ty in range(th):
                        o = n * plane + (ty * m + k) * wp + l_
                        for tx in range(tw):
                            dk[ty * tw + tx] = row[o + tx * m]
            # tmp[k, j] = sum_l d[k, l] B[l, j] = sum_l BT[j, l] d[k, l]
            for k in range(a):
                for j in range(a):
                    tk = tmp[k, j]
                    tk[:] = 0
                    for l_ in range(a):
                        f = bt[j, l_]
                        if f != 0:
                            src = d[k, l_]
                            for t in range(tt):
                                tk[t] += f * src[t]
            t0 = n * tt
            for i in range(a):
                for j in range(a):
                    dst = v[i * a + j, c, t0:t0 + tt]
                    dst[:] = 0
                    for k in range(a):
                        f = bt[i, k]
                        if f != 0:
                            src = tmp[k, j]
                            for t in range(tt):
                                dst[t] += f * src[t]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _wino_output(mo, at, bias, m0, ma, mb, th, tw, out):
    """``out[n, m0+o] = A^T M A + bias`` for output channels ``o`` in ``[ma, mb)`` (tiles cropped
    to the output)."""
    mt, a = at.shape
    nb = out.shape[0]
    oh_, ow_ = out.shape[3], out.shape[4]
    tt = th * tw
    tmp = np.empty((mt, a, tt), dtype=out.dtype)
    y = np.empty((mt, mt, tt), dtype=out.dtype)
    for o in range(ma, mb):
        b = bias[m0 + o]
        for n in range(nb):
            t0 = n * tt
            # tmp[i, l] = sum_k AT[i, k] M[k, l]
            for i in range(mt):
                for l_ in range(a):
                    ti = tmp[i, l_]
                    ti[:] = 0
                    for k in range(a):
                        f = at[i, k]
                        if f != 0:
                            src = mo[k * a + l_, o, t0:t0 + tt]
                            for t in range(tt):
                                ti[t] += f * src[t]
            # y[i, j] = bias + sum_l tmp[i, l] AT[j, l]
            for i in range(mt):
                for j in range(mt):
                    yi = y[i, j]
                    yi[:] = b
                    for l_ in range(a):
                        f = at[j, l_]
                        if f != 0:
                            src = tmp[i, l_]
                            for t in range(tt):
                                yi[t] += f * src[t]
            dst = out[n, m0 + o, 0]
            for i in range(mt):
                for ty in range(th):
                    r = ty * mt + i
                    if r >= oh_:
                        continue
                    drow = dst[r]
                    for j in range(mt):
                        yj = y[i, j]
                        last = (ow_ - j + mt - 1) // mt  # tiles whose column j is inside
                        if last > tw:
                            last = tw
                        for tx in range(last):
                            drow[tx * mt + j] = yj[ty * tw + tx]


# -------------------------------------------------------------------------------------------------
# Conv


def _float_input(spec: NodeSpec, x: np.ndarray, what: str) -> None:
    if x.dtype.kind != "f" and compute_dtype(x.dtype).kind != "f":
        raise spec.error(f"{what} must be a float tensor, got {x.dtype}")


def _check_group(spec: NodeSpec, w: np.ndarray | None, group: int, axis: int) -> None:
    """A constant weight tensor must split into ``group`` groups along ``axis`` (before packing)."""
    if w is None:
        return
    if w.ndim < 3:
        raise spec.error(f"W must have rank >= 3, got shape {list(w.shape)}")
    if w.shape[axis] % group:
        raise spec.error(f"group={group} does not divide the {w.shape[axis]} channels on axis {axis} "
                         f"of W {list(w.shape)}")
    x_shape = spec.input_shapes[0] if spec.input_shapes else None
    if spec.op_type == "Conv" and x_shape is not None and len(x_shape) > 1 and isinstance(x_shape[1], int) \
            and x_shape[1] != w.shape[1] * group:
        raise spec.error(f"channels do not match: X has {x_shape[1]}, W is {list(w.shape)} with group={group}")


class _ConvWeights:
    """A weight tensor laid out for each strategy on first use (once, for constant weights)."""

    def __init__(self, w: np.ndarray, group: int, dtype: np.dtype):
        self.w5 = np.ascontiguousarray(canon5(w), dtype=dtype)  # (M, Cg, KD, KH, KW)
        m, cg = self.w5.shape[:2]
        self.group = group
        self.mg = m // group
        self.mat = self.w5.reshape(group, self.mg, -1)  # im2col / pointwise: (G, Mg, Cg*K)
        self._taps = None
        self._blocked: dict = {}
        self._wino2 = self._wino4 = None
        self._packs: dict = {}

    def packed(self, key, a: np.ndarray) -> np.ndarray:
        """``a`` in byoc's GEMM panel layout, made once per ``key``."""
        ap = self._packs.get(key)
        if ap is None:
            ap = self._packs[key] = pack_a(a)
        return ap

    def narrow(self, key, a: np.ndarray) -> np.ndarray:
        """``a`` packed for byoc's narrow-output GEMM (:func:`byoc_cpu.host.gemm.pack_narrow`), once per ``key``."""
        key = ("narrow", key)
        ap = self._packs.get(key)
        if ap is None:
            m, k = a.shape
            ap = self._packs[key] = pack_narrow(np.ascontiguousarray(a).reshape(-1), 0, m, k, k)
        return ap

    def gemm(self, key, a: np.ndarray, b: np.ndarray, c: np.ndarray, parallel: bool = True, init: bool = False,
             bias: np.ndarray | None = None) -> None:
        """``c += a @ b`` (with ``init``: ``c = a @ b + bias[:, None]``) where ``a`` is a (fixed,
        per ``key``) matrix derived from these weights: byoc's micro-kernel GEMM on a
        panel-packed copy of ``a`` (made once) for float32, BLAS otherwise."""
        m, k = a.shape
        if c.dtype == np.float32 and use_own_gemm(m, b.shape[1], k):
            if prefers_narrow(b.shape[1], m):
                gemm_narrow_acc(self.narrow(key, a), m, k, b, c, parallel, init, bias)
                return
            ap = self._packs.get(key)
            if ap is None:
                ap = self._packs[key] = pack_a(a)
            gemm_acc(ap, m, k, b, c, parallel, init, bias)
        else:
            if init:
                c[...] = 0 if bias is None else bias[:, None]
            matmul_into(a, b, c, 1.0, 1.0, parallel)

    def wino(self, m: int) -> np.ndarray:
        """Winograd-domain weights ``G g G^T``: (G, alpha^2, Mg, Cg)."""
        key = f"_wino{m}"
        u = getattr(self, key, None)
        if u is None:
            u = winograd_weights(self.w5[:, :, 0], m, self.group)
            setattr(self, key, u)
        return u

    def blocked(self, mb: int) -> np.ndarray:
        """The weights blocked for :mod:`byoc_cpu.host.blocked`'s form with ``mb`` output channels
        per block (2-D, one group)."""
        wb = self._blocked.get(mb)
        if wb is None:
            wb = self._blocked[mb] = blocked.blocked_weights(self.w5[:, :, 0], mb)
        return wb

    @property
    def taps(self) -> np.ndarray:
        # shift: (G, KD*KH*KW, Mg, Cg), one (Mg, Cg) matrix per tap
        if self._taps is None:
            g, mg = self.group, self.mg
            w = self.w5.reshape((g, mg) + self.w5.shape[1:])
            self._taps = np.ascontiguousarray(w.transpose(0, 3, 4, 5, 1, 2).reshape(g, -1, mg, self.w5.shape[1]))
        return self._taps


@kernel("Conv")
def make_conv(spec: NodeSpec):
    auto_pad = auto_pad_mode(spec)
    group = int(spec.attr("group", 1))
    if group < 1:
        raise spec.error(f"group must be >= 1, got {group}")
    kshape_attr = spec.attr("kernel_shape")
    w_const = spec.const_inputs.get(1)
    x_dtype = spec.input_dtypes[0] if spec.input_dtypes else None
    _check_group(spec, w_const, group, 0)
    packed = PackCache(w_const, lambda w, dt: _ConvWeights(w, group, dt))
    if w_const is not None and w_const.ndim >= 3 and w_const.size and x_dtype is not None:
        packed.get(w_const, compute_dtype(x_dtype))  # lay the constant weights out now, not on the first run
    b_const = spec.const_inputs.get(2)
    geometry: dict = {}
    ref = reference(spec)

    def setup(x, w):
        nd = x.ndim - 2
        if nd < 1 or nd > 3:
            raise spec.error(f"supports 1 to 3 spatial dimensions, got input shape {list(x.shape)}")
        if w.ndim != x.ndim:
            raise spec.error(f"W has rank {w.ndim}, X has rank {x.ndim}")
        c = x.shape[1]
        m, cg = w.shape[:2]
        if c != cg * group or m % group != 0:
            raise spec.error(f"channels do not match: X has {c}, W is {list(w.shape)} with group={group}")
        ksz = list(w.shape[2:])
        if kshape_attr is not None and [int(k) for k in kshape_attr] != ksz:
            raise spec.error(f"kernel_shape {list(kshape_attr)} differs from the weight shape {ksz}")
        strides = int_list(spec, "strides", nd, 1, minimum=1)
        dil = int_list(spec, "dilations", nd, 1, minimum=1)
        pads = int_list(spec, "pads", 2 * nd, 0, minimum=0)
        out_sp, pb, pe = window_geometry(spec, list(x.shape[2:]), ksz, strides, dil, pads, auto_pad)
        if min(out_sp) <= 0:
            raise spec.error(f"output would be empty (spatial size {out_sp}) for input {list(x.shape)}")
        # a stride past the padded input gives one window, as any larger one (INT64_MAX would size planes)
        strides = [min(s, n + b + e + 1) for s, n, b, e in zip(strides, x.shape[2:], pb, pe)]
        g = {
            "nd": nd, "out_sp": out_sp, "k": pad3(ksz, 1), "s": pad3(strides, 1), "d": pad3(dil, 1),
            "pb": pad3(pb, 0), "pe": pad3(pe, 0), "in": pad3(list(x.shape[2:]), 1), "cg": cg, "mg": m // group,
        }
        float32 = compute_dtype(x.dtype) == np.float32
        # byoc's GEMM reads the kernel taps straight out of the padded input (an implicit GEMM
        # over K = channels x taps): no channel minimum. OpenBLAS needs one GEMM per tap.
        g["implicit"] = float32 and use_own_gemm(m // group, 4096, cg * int(np.prod(ksz)))
        (_, pd, pt, pl), (_, pdb, pbt, pr) = [0] + g["pb"], [0] + g["pe"]
        (kd, kh, kw), (_, sh, sw), (_, dh, dw), (_, h, wd) = g["k"], g["s"], g["d"], g["in"]
        od, oh, ow = pad3(out_sp, 1)
        choice = choose_conv(ConvShape(
            c, m, group, kh, kw, sh, sw, dh, dw, pt, pl, pbt, pr, h, wd, oh, ow, nb=x.shape[0], nd=nd, kd=kd,
            pd=pd + pdb, float32=float32, gemm=have_blas(x.dtype),
            own_gemm=float32 and use_own_gemm(m // group, 4096, cg), implicit=g["implicit"]), "host")
        g["how"] = {"phase": "phase_shift"}.get(choice.strategy, choice.strategy)
        if choice.strategy == "winograd":
            g["wm"] = choice.tile
        elif choice.strategy == "blocked":
            g["mb"] = choice.block
            g["hq"] = blocked.phase_extent(oh, kh, sh)
            g["wq"] = blocked.phase_extent(ow, kw, sw)
        elif choice.strategy == "shift":
            g["hp"], g["wp"] = h + pt + pbt, wd + pl + pr
            g["ncols"] = (x.shape[0] - 1) * g["hp"] * g["wp"] + oh * g["wp"]
        elif choice.strategy == "phase":
            g["hq"], g["wq"] = oh + ((kh - 1) * dh) // sh, ow + ((kw - 1) * dw) // sw
        return g

    def weights(w, dt) -> _ConvWeights:
        return packed.get(w, dt)

    def geometry_of(x, w) -> dict:
        key = (x.shape, w.shape)
        g = geometry.get(key)
        if g is None:
            g = setup(x, w)
            check_geometry(spec, x, w.shape[0], g)
            geometry[key] = g
        return g

    def fuses(x, w) -> bool:
        """Whether ``run(x, w, b, epi=...)`` takes an epilogue: float32 by the blocked kernel's wide
        form, written in place (it applies the epilogue as it stores its tiles)."""
        _float_input(spec, x, "X")
        if x.size == 0 or w.size == 0:
            return False
        g = geometry_of(x, w)
        return (x.dtype == np.float32 and g["how"] == "blocked" and g["mb"] == blocked.MB_WIDE
                and blocked.own_rows(g["out_sp"][-1], g["wq"]))

    jobs: dict = {}  # (X's shape, epilogue) -> _BlockedJob, for the constant weights and bias

    def fast(x, w, b, res, relu, into=None):
        """The step as a job made before for this shape and epilogue, or None: a shape run
        before, its checks and geometry done (the steady state of a model: little Python)."""
        if w is w_const and b is b_const and type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous:
            job = jobs.get((x.shape, _epilogue(res, relu)))
            if job is not None:
                return job.run(x, res, relu, into)
        return None

    def run(x, w, b=None, epi=None, into=None):
        # epi: (a residual of Y's shape or None, relu), only where fuses(x, w) (fused_conv asks);
        # into: that residual, to be written over (fused_conv's over)
        res, relu = epi if epi is not None else (None, False)
        done = fast(x, w, b, res, relu, into)
        if done is not None:
            return done
        if x.size == 0 or w.size == 0:
            return ref(x, w, b)
        _float_input(spec, x, "X")
        dt = compute_dtype(x.dtype)
        g = geometry_of(x, w)
        if g["how"] in ("shift", "phase_shift", "blocked") and dt != np.float32:
            g = dict(g, how="im2col")
        pw = weights(w, dt)
        # input-only arrays always read-only: a graph input (read-only) and an activation
        # (writable) would otherwise be two Numba specialisations of every kernel (startup.md)
        x5 = read_only_view(np.ascontiguousarray(canon5(x), dtype=dt))
        nb = x.shape[0]
        m = w.shape[0]
        od, oh, ow = pad3(g["out_sp"], 1)
        out = spec.alloc.empty((nb, m, od, oh, ow), dt) if into is None else into.reshape(nb, m, od, oh, ow)
        has_bias = b is not None
        if has_bias:
            if b.shape != (m,):
                raise spec.error(f"B must have shape [{m}], got {list(b.shape)}")
            bias = b if (b is b_const and b.dtype == dt) else np.ascontiguousarray(b, dtype=dt)
        else:
            bias = spec.alloc.zeros(m, dt)
        bias = read_only_view(bias)
        how = g["how"]
        if how == "direct":
            kd, kh, kw = g["k"]
            sd, sh, sw = g["s"]
            dd, dh, dw = g["d"]
            pd, ph, pw_ = g["pb"]
            w5 = pw.w5
            macs = nb * m * od * oh * ow * w5.shape[1] * kd * kh * kw
            # a hand-off to the pool pays from ~8M multiply-adds (measured for byoc-cpu, issue 4):
            # ShuffleNet's depthwise layers (0.1-2M) run on the calling thread
            blocks = split(m, threads.num_threads() * 2) if macs >= _DIRECT_PAR_MIN_MACS else [(0, m)]
            # 1-D and 2-D: the flat phase-plane kernel, shared with byoc-cpu (unless huge strides,
            # dilations or pads would make its planes much larger than the input and output)
            flat = g["nd"] <= 2 and direct2d_fits(x5.shape[3], x5.shape[4], kh, kw, sh, sw, dh, dw, oh, ow)
            xf, wf, of = x5.reshape(-1), w5.reshape(-1), out.reshape(-1)
            c, h, wd = x5.shape[1], x5.shape[3], x5.shape[4]

            def chunk(i):
                ma, mb = blocks[i]
                if not flat:
                    _conv_direct(x5, w5, bias, has_bias, group, sd, sh, sw, dd, dh, dw, pd, ph, pw_, ma, mb, out)
                    return
                for n in range(nb):
                    _direct2d(xf, n * c * h * wd, c, h, wd, wf, 0, m, w5.shape[1], kh, kw, sh, sw, dh, dw, ph, pw_,
                              oh, ow, ma, mb, bias, has_bias, of, n * m * oh * ow)

            threads.parallel_for(chunk, len(blocks))
        elif how == "shift":
            _shift(x5, pw, g, bias, out)
        elif how == "blocked":
            job = _blocked_conv(x5, pw, g, bias, out, epi)
            if (job is not None and w is w_const and b is b_const and x.dtype == np.float32
                    and x.flags.c_contiguous):
                if len(jobs) >= 8:  # a model of many input shapes: keep the latest few
                    jobs.clear()
                jobs[(x.shape, job.ep)] = job
        elif how == "winograd":
            _winograd(x5, pw, g, bias, out)
        elif how == "phase_shift":
            _phase_shift(x5, pw, g, bias, out)
        else:
            # the GEMMs write their first depth block together with the bias: no separate pass
            bias_or_none = bias if has_bias else None
            if how == "pointwise":
                _pointwise(x5, pw, g, out.reshape(nb, m, -1), bias_or_none)
            else:
                _im2col_conv(x5, pw, g, out, bias_or_none)
        y = out.reshape(out.shape[:2] + tuple(g["out_sp"]))
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return (y,)

    run.fuses = fuses
    run.fast = fast
    run.out_shape = lambda x, w: (x.shape[0], w.shape[0], *geometry_of(x, w)["out_sp"])
    return run


def fused_conv(conv_run, add_run=None, relu_run=None, over=False):
    """A Conv's run function followed by an Add/Sum of a second tensor (``add_run``, that node's
    own kernel) and/or a Relu (``relu_run``): ``run(x, w, b=None, res=None)``.

    Where the convolution takes an epilogue (``conv_run.fuses``: the blocked kernel's wide form)
    and the residual is float32 of the output's shape (or there is none), the kernel applies them
    as it stores its tiles; otherwise the nodes' own kernels run after it. The result is the same
    either way (the same float32 operations in the same order). ``over``: the caller gives the
    residual up (nothing else sees it, it dies here; the plan decides): the kernel then writes
    the output over it (each value read before it is written: no second stream of the output's
    size through the caches)."""
    fuses, fast = getattr(conv_run, "fuses", None), getattr(conv_run, "fast", None)
    relu = relu_run is not None

    def run(x, w, b=None, res=None):
        into = res if over and res is not x and _writable(res) else None
        if fast is not None and (res is None) == (add_run is None):
            done = fast(x, w, b, res, relu, into)
            if done is not None:
                return done
        if fuses is not None and isinstance(x, np.ndarray) and isinstance(w, np.ndarray) and fuses(x, w):
            if add_run is None:
                return conv_run(x, w, b, epi=(None, relu))
            if isinstance(res, np.ndarray) and res.dtype == np.float32 and res.shape == conv_run.out_shape(x, w):
                return conv_run(x, w, b, epi=(res, relu), into=into)
        (y,) = conv_run(x, w, b)
        if add_run is not None:
            (y,) = add_run(y, res)
        if relu:
            (y,) = relu_run(y)
        return (y,)

    run.over = over
    return run


def _writable(a) -> bool:
    return type(a) is np.ndarray and a.flags.c_contiguous and a.flags.writeable


def _epilogue(res, relu: bool) -> int:
    """The blocked kernel's epilogue flags: 2 adds the residual ``res`` (where not None), 1 Relu."""
    return (0 if res is None else 2) + int(relu)


def _by_rows(oh: int, wq: int, nt: int) -> bool:
    """Whether a blocked convolution splits its kernel over ``nt`` threads by output rows (a wide
    output), else by blocks of output channels."""
    return nt > 1 and oh * wq >= 256 * nt


def _bias_slice(bias, gi, mg):
    return None if bias is None else bias[gi * mg:(gi + 1) * mg]


def _pointwise(x5, pw: _ConvWeights, g, outr, bias):
    nb, c = x5.shape[:2]
    s = g["s"]
    od, oh, ow = pad3(g["out_sp"], 1)
    if any(v != 1 for v in s):
        xs = threads.scratch("conv.sub", (nb, c, od, oh, ow), x5.dtype)
        _subsample(x5, s[0], s[1], s[2], od, oh, ow, xs)
        x5 = xs
    cg, mg = g["cg"], g["mg"]
    xr = x5.reshape(nb, c, -1)
    for n in range(nb):
        for gi in range(pw.group):
            pw.gemm(("mat", gi), pw.mat[gi], xr[n, gi * cg:(gi + 1) * cg], outr[n, gi * mg:(gi + 1) * mg],
                    init=True, bias=_bias_slice(bias, gi, mg))


def _im2col_conv(x5, pw: _ConvWeights, g, out, bias):
    nb = x5.shape[0]
    dt = x5.dtype
    cg, mg = g["cg"], g["mg"]
    kd, kh, kw = g["k"]
    sd, sh, sw = g["s"]
    dd, dh, dw = g["d"]
    pd, ph, pw_ = g["pb"]
    od, oh, ow = out.shape[2:]
    rows = od * oh
    s_out = rows * ow
    krows = cg * kd * kh * kw
    outr = out.reshape(nb, out.shape[1], -1)
    nt = threads.gemm_split()
    max_rows = max(1, _COL_BLOCK // max(1, krows * ow))
    if kd == 1 and od == 1 and pd == 0 and x5.shape[2] == 1 and (sh > 1 or sw > 1):
        # strided 1-D / 2-D: from stride-phase planes (depth > 1 with one output depth: the rows kernel)
        _im2col_strided(x5, pw, g, outr, max_rows, bias)
        return
    c_all, id_, ih, iw = x5.shape[1:]
    xf = np.ascontiguousarray(x5).reshape(-1)

    def patches(n, c0, r0, r1, col):
        _im2col_rows(xf, (n * c_all + c0) * id_ * ih * iw, cg, id_, ih, iw, kd, kh, kw, sd, sh, sw, dd, dh, dw,
                     pd, ph, pw_, oh, ow, r0, r1, _flat(col), 0)

    if nt > 1 and s_out >= 512 * nt:
        # wide output: blocks of output rows, each built and multiplied by one thread
        nblocks = max(2 * nt, -(-rows // max_rows))
        blocks = split(rows, nblocks)
        for n in range(nb):
            for gi in range(pw.group):
                dst = outr[n, gi * mg:(gi + 1) * mg]

                def chunk(i, n=n, gi=gi, dst=dst):
                    r0, r1 = blocks[i]
                    col = threads.scratch("conv.col_block", (krows, (r1 - r0) * ow), dt)
                    patches(n, gi * cg, r0, r1, col)
                    pw.gemm(("mat", gi), pw.mat[gi], col, dst[:, r0 * ow:r1 * ow], parallel=False, init=True,
                            bias=_bias_slice(bias, gi, mg))

                threads.parallel_for(chunk, len(blocks))
        return
    # narrow output (or no pool): the patch matrix in row blocks bounded in memory, each
    # multiplied with the GEMM split over the pool
    block = min(rows, max_rows)
    col_buf = threads.scratch("conv.col", (krows * block * ow,), dt)
    for n in range(nb):
        for gi in range(pw.group):
            for r0 in range(0, rows, block):
                r1 = min(rows, r0 + block)
                col = col_buf[: krows * (r1 - r0) * ow].reshape(krows, (r1 - r0) * ow)
                patches(n, gi * cg, r0, r1, col)
                pw.gemm(("mat", gi), pw.mat[gi], col, outr[n, gi * mg:(gi + 1) * mg, r0 * ow:r1 * ow], init=True,
                        bias=_bias_slice(bias, gi, mg))


def _im2col_strided(x5, pw: _ConvWeights, g, outr, max_rows, bias):
    """im2col for strided 1-D/2-D convolutions, built from stride-phase planes so that every
    copy is contiguous (a strided gather per element measured 2-3x slower)."""
    nb = x5.shape[0]
    dt = x5.dtype
    cg, mg = g["cg"], g["mg"]
    _, kh, kw = g["k"]
    _, sh, sw = g["s"]
    _, dh, dw = g["d"]
    _, pt, pl = g["pb"]
    _, oh, ow = pad3(g["out_sp"], 1)
    hq = oh + ((kh - 1) * dh) // sh
    wq = ow + ((kw - 1) * dw) // sw
    plane = hq * wq
    offsets = np.array([(((i * dh) % sh) * sw + (j * dw) % sw) * plane + ((i * dh) // sh) * wq + (j * dw) // sw
                        for i in range(kh) for j in range(kw)], dtype=np.int64)
    krows = cg * kh * kw
    xp = threads.scratch("conv.pad", (cg, sh * sw * plane), dt)
    nt = threads.num_threads()
    cblocks = split(cg, nt)
    # blocks small enough that the patch rows stay in L2 between their copy and the GEMM
    rows_l2 = max(1, min(max_rows, _COL_BLOCK_L2 // max(1, krows * ow)))
    gt = threads.gemm_split()
    blocks = split(oh, max(2 * gt if gt > 1 else 1, -(-oh // rows_l2)))
    for n in range(nb):
        for gi in range(pw.group):
            c0 = gi * cg

            def pad_chunk(i, c0=c0, n=n):
                ca, cb = cblocks[i]
                _phase_planes(x5, n, c0, ca, cb, sh, sw, pt, pl, hq, wq, xp)

            threads.parallel_for(pad_chunk, len(cblocks))
            dst = outr[n, gi * mg:(gi + 1) * mg]

            def chunk(i, gi=gi, dst=dst):
                r0, r1 = blocks[i]
                col = threads.scratch("conv.col_block", (krows, (r1 - r0) * ow), dt)
                _im2col_phases(xp, cg, offsets, wq, ow, r0, r1, col)
                pw.gemm(("mat", gi), pw.mat[gi], col, dst[:, r0 * ow:r1 * ow], parallel=False, init=True,
                        bias=_bias_slice(bias, gi, mg))

            threads.gemm_for(chunk, len(blocks))


def _winograd(x5, pw: _ConvWeights, g, bias, out):
    u = pw.wino(g["wm"])
    _, pt, pl = g["pb"]

    def gemm(gi, e, a, b, c):
        pw.gemm(("wino", g["wm"], gi, e), a, b, c, parallel=False, init=True)

    _wino_run(x5, u, pw.group, g["cg"], g["mg"], g["wm"], pt, pl, gemm, bias, out)


def _wino_run(x5, u, group, cg, mg, mt, pt, pl, gemm, bias, out):
    """Winograd F(mt x mt, 3 x 3) of ``x5`` (N, C, 1, H, W) into ``out`` (N, M, 1, OH, OW) with
    Winograd-domain weights ``u`` (G, alpha^2, Mg, Cg) and ``gemm(gi, e, a, b, c)`` computing
    ``c = a @ b``: input transform, alpha^2 GEMMs and output transform, each over the pool."""
    nb = x5.shape[0]
    dt = x5.dtype
    a = mt + 2
    oh, ow = out.shape[3:]
    th, tw = -(-oh // mt), -(-ow // mt)
    hp, wp = th * mt + 2, tw * mt + 2
    ntiles = nb * th * tw
    bt = np.asarray(_WINO[mt][0], dtype=dt)
    at = np.asarray(_WINO[mt][2], dtype=dt)
    xp = threads.scratch("conv.pad", (cg, nb * hp * wp), dt)
    v = threads.scratch("conv.wino_v", (a * a, cg, ntiles), dt)
    mo = threads.scratch("conv.wino_m", (a * a, mg, ntiles), dt)
    nt = threads.num_threads()
    cblocks = split(cg, 2 * nt)
    mblocks = split(mg, 2 * nt)
    for gi in range(group):
        c0 = gi * cg

        def in_chunk(i, c0=c0):
            ca, cb = cblocks[i]
            _pad_planes(x5, c0, ca, cb, pt, pl, hp, wp, xp)
            _wino_input(xp, bt, mt, th, tw, hp, wp, nb, ca, cb, v)

        threads.parallel_for(in_chunk, len(cblocks))
        ug = u[gi]

        def gemm_chunk(e, ug=ug, gi=gi):
            gemm(gi, e, ug[e], v[e], mo[e])

        threads.gemm_for(gemm_chunk, a * a)

        def out_chunk(i, gi=gi):
            ma, mb = mblocks[i]
            _wino_output(mo, at, bias, gi * mg, ma, mb, th, tw, out)

        threads.parallel_for(out_chunk, len(mblocks))


def _phase_shift(x5, pw: _ConvWeights, g, bias, out):
    nb = x5.shape[0]
    cg, mg = g["cg"], g["mg"]
    _, kh, kw = g["k"]
    _, sh, sw = g["s"]
    _, dh, dw = g["d"]
    _, pt, pl = g["pb"]
    hq, wq = g["hq"], g["wq"]
    oh, ow = out.shape[3:]
    plane = hq * wq
    ncols = oh * wq
    # tap (i, j) reads phase ((i*dh) % sh, (j*dw) % sw) at row/column offset ((i*dh)//sh, (j*dw)//sw)
    offsets = [(((i * dh) % sh) * sw + (j * dw) % sw) * plane + ((i * dh) // sh) * wq + (j * dw) // sw
               for i in range(kh) for j in range(kw)]
    ld = sh * sw * plane + wq  # slack: reads past a plane only feed dropped columns
    xp = threads.scratch("conv.pad", (cg, ld), np.float32)
    acc = threads.scratch("conv.acc", (mg, ncols), np.float32)
    taps = None if g.get("implicit", False) else pw.taps
    nt = threads.num_threads()
    implicit_gemm = g.get("implicit", False)
    cblocks = split(cg, nt)
    gt = nt if implicit_gemm else threads.gemm_split()  # byoc's own GEMM always uses the pool
    if gt > 1 and ncols >= 256 * gt:
        blocks = [(r0 * wq, r1 * wq, r0, r1) for r0, r1 in split(oh, 2 * gt)]
    else:
        blocks = None
        mblocks = split(mg, gt, 8)
    implicit = g.get("implicit", False)
    if implicit:
        rowoff = (np.arange(cg, dtype=np.int64)[:, None] * ld + np.asarray(offsets, np.int64)[None, :]).ravel()
        xflat = xp.reshape(-1)
        mp = -(-mg // MR)
        pblocks = split(mp, nt)
    for n in range(nb):
        out_n = out[n:n + 1]
        for gi in range(pw.group):
            c0 = gi * cg

            def pad_chunk(i, c0=c0, n=n):
                ca, cb = cblocks[i]
                _phase_planes(x5, n, c0, ca, cb, sh, sw, pt, pl, hq, wq, xp)

            threads.parallel_for(pad_chunk, len(cblocks))
            if implicit:
                ap = pw.packed(("mat", gi), pw.mat[gi])
                if blocks is not None:

                    def imp_cols(i, ap=ap, gi=gi, out_n=out_n):
                        lo, hi, r0, r1 = blocks[i]
                        gemm_rows(ap, mg, xflat, rowoff, acc, lo, hi, init=True)
                        _crop_rows(acc, oh, wq, oh, ow, bias, gi * mg, r0, r1, out_n)

                    threads.parallel_for(imp_cols, len(blocks))
                else:

                    def imp_rows(i, ap=ap, gi=gi, out_n=out_n):
                        p0, p1 = pblocks[i]
                        gemm_rows(ap, mg, xflat, rowoff, acc, 0, ncols, p0, p1, init=True)
                        _crop_planes(acc, oh, wq, oh, ow, bias, gi * mg, p0 * MR, min(mg, p1 * MR), out_n)

                    threads.parallel_for(imp_rows, len(pblocks))
                continue
            wg = taps[gi]
            if blocks is not None:

                def col_chunk(i, wg=wg, gi=gi, out_n=out_n):
                    lo, hi, r0, r1 = blocks[i]
                    dst = acc[:, lo:hi]
                    for t, off in enumerate(offsets):
                        pw.gemm(("tap", gi, t), wg[t], xp[:, off + lo:off + hi], dst, parallel=False, init=t == 0)
                    _crop_rows(acc, oh, wq, oh, ow, bias, gi * mg, r0, r1, out_n)

                threads.gemm_for(col_chunk, len(blocks))
            else:

                def row_chunk(i, wg=wg, gi=gi, out_n=out_n):
                    ma, mb = mblocks[i]
                    dst = acc[ma:mb]
                    for t, off in enumerate(offsets):
                        pw.gemm(("tap", gi, t, ma), wg[t][ma:mb], xp[:, off:off + ncols], dst, parallel=False,
                                init=t == 0)
                    _crop_planes(acc, oh, wq, oh, ow, bias, gi * mg, ma, mb, out_n)

                threads.gemm_for(row_chunk, len(mblocks))


class _BlockedJob:
    """The wide blocked kernel writing its output in place (:func:`blocked.own_rows`) for one
    input shape, epilogue, weights and bias, image by image as a compiled job
    (:func:`blocked.conv_job`): the input's reorder and the kernel's chunks claimed by the
    threads, with no Python and no GIL hand-off between them (two kernel chunks per thread, as
    the Python pool's: four measured slower in-model, each chunk reading every weight block
    again; a helper that joins late takes what is left). Its argument block is laid out once; a
    call fills in the arrays. A model step's Python runs between kernels that evict it from the
    caches: ResNet-50's took ~140 us a layer in-model against ~50 us warm, so the steady state is as little Python as this."""

    __slots__ = ("template", "x8_size", "keep", "images", "x_image", "y_image", "out_shape", "ep")

    def __init__(self, x_shape, out_shape, g, wb: np.ndarray, bias: np.ndarray, ep: int):
        nb, c, _, h, w = x_shape
        m, oh, ow = out_shape[1], out_shape[3], out_shape[4]
        _, kh, kw = g["k"]
        _, sh, sw = g["s"]
        _, pt, pl = g["pb"]
        hq, wq = g["hq"], g["wq"]
        plane, cb, nbk = blocked.plane_length(hq, wq, kw, sh, sw), -(-c // blocked.CB), m // g["mb"]
        nt = threads.num_threads()
        wide = _by_rows(oh, wq, nt)
        self.template = blocked.conv_job_block(dict(
            xo=0, c=c, h=h, w=w, L=plane, hq=hq, wq=wq, sh=sh, sw=sw, pt=pt, pl=pl, cb=cb, kh=kh, kw=kw, m=m,
            ldc=oh * ow, ow=ow, ep=ep, yo=0, oh=oh, nbk=nbk, reorder_chunks=min(cb, 4 * nt),
            chunks=min(oh, 2 * nt) if wide else min(nbk, 2 * nt), by_rows=int(wide)))
        for name, arr in (("wb", wb), ("b", bias)):
            self.template[blocked.JOB_ARRAY[name]:blocked.JOB_ARRAY[name] + 2] = arr.ctypes.data, arr.size
        self.keep = (wb, bias)  # alive while the template holds their addresses
        self.x8_size = cb * plane * blocked.CB
        self.images, self.x_image, self.y_image = nb, c * h * w, m * oh * ow
        self.out_shape = (nb, m, oh, ow)
        self.ep = ep

    def __call__(self, xf: np.ndarray, res: np.ndarray | None, out: np.ndarray) -> None:
        """The input (flat, contiguous), the residual (None where the epilogue adds none) and the
        contiguous output (the residual itself where it is written over)."""
        yf = out.reshape(-1)
        rf = yf if res is None else np.ascontiguousarray(res).reshape(-1)
        x8 = threads.scratch("conv.x8", (self.x8_size,), np.float32)
        block = self.template.copy()  # one per call: a plan may run on several threads at once
        address = blocked.bind_job(block, xf, x8, rf, yf)
        job = blocked.conv_job()
        for n in range(self.images):
            if n:
                block[blocked.JOB_INT["xo"]], block[blocked.JOB_INT["yo"]] = n * self.x_image, n * self.y_image
                block[blocked.JOB_SYNC:] = 0
            threads.run_job(job, block, address)

    def run(self, x: np.ndarray, res, relu: bool, into) -> tuple | None:
        """The step for ``x`` (float32, contiguous, the shape this job was made for), with the
        residual ``res`` (or None) and Relu this job's epilogue applies, written ``into`` the
        residual where given; None where the residual does not fit (the caller's full path then
        decides)."""
        if res is not None and not (type(res) is np.ndarray and res.dtype == np.float32 and res.shape == self.out_shape):
            return None
        out = np.empty(self.out_shape, np.float32) if into is None else into  # the size was checked before
        self(x.reshape(-1), res, out)
        return (out,)


def _blocked_conv(x5, pw: _ConvWeights, g, bias, out, epi=None) -> _BlockedJob | None:
    """A 2-D convolution by the channel-blocked direct kernel, image by image: the input
    reordered into blocks of 8 channels (their stride phases for a strided one; in parallel by
    blocks), then blocks of output rows (wide outputs) or of ``g["mb"]`` output channels, the
    kernel adding the bias. The wide form writes the output's rows in place (where
    :func:`blocked.own_rows`), applying the epilogue ``epi`` (residual or None, relu) as it
    stores, as a :class:`_BlockedJob` (returned for the caller to keep); else the kernel writes
    a planar accumulator of the (phase) planes' width, cropped into ``out`` (as the shift
    strategy's)."""
    nb, c = x5.shape[:2]
    h, w = x5.shape[3:]
    _, kh, kw = g["k"]
    _, sh, sw = g["s"]
    _, pt, pl = g["pb"]
    hq, wq = g["hq"], g["wq"]
    m, oh, ow = out.shape[1], out.shape[3], out.shape[4]
    mbw = g["mb"]
    xf, wb = x5.reshape(-1), pw.blocked(mbw)
    if mbw == blocked.MB_WIDE and blocked.own_rows(ow, wq):  # output pixel (i, j) at i * ow + j of each channel
        res, relu = epi if epi is not None else (None, False)
        job = _BlockedJob(x5.shape, out.shape, g, wb, bias, _epilogue(res, relu))
        job(xf, res, out)
        return job
    if epi is not None:  # fused_conv asks fuses() first: only the in-place form takes one
        raise KernelError("internal: an epilogue for a blocked convolution that crops its output")
    kernel, reorder8 = blocked.host_conv(mbw), blocked.host_reorder(sh, sw)  # the loops alone
    plane, cb, nbk = blocked.plane_length(hq, wq, kw, sh, sw), -(-c // blocked.CB), m // mbw
    x8 = threads.scratch("conv.x8", (cb * plane * blocked.CB,), np.float32)
    acc = threads.scratch("conv.acc", (m, hq * wq), np.float32)
    ldc, yf = hq * wq, acc.reshape(-1)
    rf = read_only_view(yf)  # the residual argument (unread: no epilogue)
    zero = threads.scratch("conv.zero", (m,), np.float32)  # the crop's bias: the kernel added it
    zero.fill(0.0)
    nt = threads.num_threads()
    cblocks = split(cb, nt)
    wide = _by_rows(oh, wq, nt)
    blocks = split(oh, 2 * nt) if wide else split(nbk, nt)
    for n in range(nb):
        xo, on = n * c * h * w, out[n:n + 1]

        def reorder(i, xo=xo):
            b0, b1 = cblocks[i]
            reorder8(xf, xo + b0 * blocked.CB * h * w, min(c, b1 * blocked.CB) - b0 * blocked.CB, h, w, plane, hq,
                     wq, sh, sw, pt, pl, x8, b0 * plane * blocked.CB)

        def part(i, on=on):
            a, b = blocks[i]
            if wide:  # output rows [a, b), every channel block
                kernel(x8, 0, wb, bias, 0, rf, 0, cb, plane, wq, hq, sh, sw, kh, kw, m, ldc, 0, nbk, a, b, wq, 0, yf, 0)
                _crop_rows(acc, hq, wq, oh, ow, zero, 0, a, b, on)
            else:  # channel blocks [a, b), every row
                kernel(x8, 0, wb, bias, 0, rf, 0, cb, plane, wq, hq, sh, sw, kh, kw, m, ldc, a, b, 0, oh, wq, 0, yf, 0)
                _crop_planes(acc, hq, wq, oh, ow, zero, 0, a * mbw, b * mbw, on)

        threads.parallel_for(reorder, len(cblocks))
        threads.parallel_for(part, len(blocks))
    return None


def _shift(x5, pw: _ConvWeights, g, bias, out):
    nb = x5.shape[0]
    cg, mg = g["cg"], g["mg"]
    _, kh, kw = g["k"]
    _, dh, dw = g["d"]
    _, pt, pl = g["pb"]
    hp, wp, ncols = g["hp"], g["wp"], g["ncols"]
    oh, ow = out.shape[3:]
    # one row per channel: all images' padded planes side by side, then slack for the last
    # taps' reads past the final plane (they only feed dropped columns)
    ldb = nb * hp * wp + (kw - 1) * dw
    xp = threads.scratch("conv.pad", (cg, ldb), np.float32)
    acc = threads.scratch("conv.acc", (mg, ncols), np.float32)
    taps = None if g.get("implicit", False) else pw.taps
    nt = threads.num_threads()
    implicit_gemm = g.get("implicit", False)
    cblocks = split(cg, nt)
    offsets = [i * dh * wp + j * dw for i in range(kh) for j in range(kw)]
    prow = -(-ncols // wp)  # padded rows (of width wp) the accumulator covers
    gt = nt if implicit_gemm else threads.gemm_split()  # byoc's own GEMM always uses the pool
    if gt > 1 and ncols >= 256 * gt:
        # wide: blocks of padded rows (columns of the accumulator), every tap, then the crop
        blocks = [(r0 * wp, min(ncols, r1 * wp), r0, r1) for r0, r1 in split(prow, 2 * gt)]
    else:
        blocks = None
        mblocks = split(mg, gt, 8)
    implicit = g.get("implicit", False)
    if implicit:
        rowoff = (np.arange(cg, dtype=np.int64)[:, None] * ldb + np.asarray(offsets, np.int64)[None, :]).ravel()
        xflat = xp.reshape(-1)
        mp = -(-mg // MR)
        pblocks = split(mp, nt)
    narrow = implicit and prefers_narrow(ncols, mg)
    if narrow:
        qblocks = split(-(-mg // CW), nt)  # the narrow form's blocks of CW output channels
        zeros = read_only_view(np.zeros(qblocks[-1][1] * CW, np.float32))
        xflat_ro = read_only_view(xflat)  # the narrow form reads its input read-only, as the pointwise path
    for gi in range(pw.group):
        c0 = gi * cg

        def pad_chunk(i, c0=c0):
            ca, cb = cblocks[i]
            _pad_planes(x5, c0, ca, cb, pt, pl, hp, wp, xp)

        threads.parallel_for(pad_chunk, len(cblocks))
        if narrow:
            # a few dozen columns (7x7, 14x14 maps): the narrow form, blocks of CW output channels
            apn = pw.narrow(("mat", gi), pw.mat[gi])

            def nar_rows(i, apn=apn, gi=gi):
                q0, q1 = qblocks[i]
                gemm_narrow_panels(apn, mg, rowoff.shape[0], xflat_ro, rowoff, acc.reshape(-1), ncols, ncols, q0, q1,
                                   True, zeros, wp, ow)  # the crop reads the first ow of each wp
                _crop_planes(acc, hp, wp, oh, ow, bias, gi * mg, q0 * CW, min(mg, q1 * CW), out)

            threads.parallel_for(nar_rows, len(qblocks))
            continue
        if implicit:
            ap = pw.packed(("mat", gi), pw.mat[gi])
            if blocks is not None:

                def imp_cols(i, ap=ap, gi=gi):
                    lo, hi, r0, r1 = blocks[i]
                    gemm_rows(ap, mg, xflat, rowoff, acc, lo, hi, init=True)
                    _crop_rows(acc, hp, wp, oh, ow, bias, gi * mg, r0, r1, out)

                threads.parallel_for(imp_cols, len(blocks))
            else:

                def imp_rows(i, ap=ap, gi=gi):
                    p0, p1 = pblocks[i]
                    gemm_rows(ap, mg, xflat, rowoff, acc, 0, ncols, p0, p1, init=True)
                    _crop_planes(acc, hp, wp, oh, ow, bias, gi * mg, p0 * MR, min(mg, p1 * MR), out)

                threads.parallel_for(imp_rows, len(pblocks))
            continue
        wg = taps[gi]
        if blocks is not None:

            def col_chunk(i, wg=wg, gi=gi):
                lo, hi, r0, r1 = blocks[i]
                dst = acc[:, lo:hi]
                for t, off in enumerate(offsets):
                    pw.gemm(("tap", gi, t), wg[t], xp[:, off + lo:off + hi], dst, parallel=False, init=t == 0)
                _crop_rows(acc, hp, wp, oh, ow, bias, gi * mg, r0, r1, out)

            threads.gemm_for(col_chunk, len(blocks))
        else:

            def row_chunk(i, wg=wg, gi=gi):
                ma, mb = mblocks[i]
                dst = acc[ma:mb]
                for t, off in enumerate(offsets):
                    pw.gemm(("tap", gi, t, ma), wg[t][ma:mb], xp[:, off:off + ncols], dst, parallel=False,
                            init=t == 0)
                _crop_planes(acc, hp, wp, oh, ow, bias, gi * mg, ma, mb, out)

            threads.gemm_for(row_chunk, len(mblocks))


# -------------------------------------------------------------------------------------------------
# ConvTranspose


@kernel("ConvTranspose")
def make_conv_transpose(spec: NodeSpec):
    auto_pad = auto_pad_mode(spec)
    group = int(spec.attr("group", 1))
    if group < 1:
        raise spec.error(f"group must be >= 1, got {group}")
    kshape_attr = spec.attr("kernel_shape")
    out_shape_attr = spec.attr("output_shape")
    w_const = spec.const_inputs.get(1)

    def pack(w, dt):
        cg = w.shape[0] // group
        # (G, Mg*K, Cg): cols = Wt @ X
        return np.ascontiguousarray(np.asarray(w, dtype=dt).reshape(group, cg, -1).transpose(0, 2, 1))

    _check_group(spec, w_const, group, 0)
    packed = PackCache(w_const, pack)
    geometry: dict = {}
    ref = reference(spec)

    def setup(x, w):
        nd = x.ndim - 2
        if nd < 1 or nd > 3:
            raise spec.error(f"supports 1 to 3 spatial dimensions, got input shape {list(x.shape)}")
        if w.ndim != x.ndim:
            raise spec.error(f"W has rank {w.ndim}, X has rank {x.ndim}")
        c = x.shape[1]
        if w.shape[0] != c or c % group != 0:
            raise spec.error(f"channels do not match: X has {c}, W is {list(w.shape)} with group={group}")
        ksz = list(w.shape[2:])
        if kshape_attr is not None and [int(k) for k in kshape_attr] != ksz:
            raise spec.error(f"kernel_shape {list(kshape_attr)} differs from the weight shape {ksz}")
        strides = int_list(spec, "strides", nd, 1, minimum=1)
        dil = int_list(spec, "dilations", nd, 1, minimum=1)
        opad = int_list(spec, "output_padding", nd, 0, minimum=0)
        in_sp = list(x.shape[2:])
        natural = [strides[i] * (in_sp[i] - 1) + opad[i] + (ksz[i] - 1) * dil[i] + 1 for i in range(nd)]
        if out_shape_attr is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if out_shape_attr is not None:
                target = [int(v) for v in out_shape_attr]
                if len(target) == nd + 2:
                    target = target[2:]
                if len(target) != nd:
                    raise spec.error(f"output_shape {target} does not have {nd} spatial dimensions")
            else:
                target = [in_sp[i] * strides[i] for i in range(nd)]
            # a target larger than the full output (auto_pad SAME with a kernel narrower than the
            # stride, or an explicit output_shape) makes the total negative: the output then grows
            # at the side the padding would have gone to, as in the spec's formula (and onnx.reference)
            total = [natural[i] - target[i] for i in range(nd)]
            if auto_pad == "SAME_UPPER":
                pb = [t // 2 for t in total]
            else:  # SAME_LOWER, or NOTSET with output_shape
                pb = [t - t // 2 for t in total]
            out_sp = target
        else:
            pads = [0] * (2 * nd) if auto_pad == "VALID" else int_list(spec, "pads", 2 * nd, 0, minimum=0)
            pb = pads[:nd]
            out_sp = [natural[i] - pads[i] - pads[i + nd] for i in range(nd)]
        if min(out_sp) <= 0:
            raise spec.error(f"output would be empty (spatial size {out_sp}) for input {list(x.shape)}")
        return {"out_sp": out_sp, "k": pad3(ksz, 1), "s": pad3(strides, 1), "d": pad3(dil, 1), "pb": pad3(pb, 0),
                "in": pad3(in_sp, 1), "cg": c // group, "mg": w.shape[1]}

    def weights(w, dt):
        return packed.get(w, dt)

    def run(x, w, b=None):
        if x.size == 0 or w.size == 0:
            return ref(x, w, b)
        _float_input(spec, x, "X")
        dt = compute_dtype(x.dtype)
        key = (x.shape, w.shape)
        g = geometry.get(key)
        if g is None:
            g = setup(x, w)
            check_geometry(spec, x, g["mg"] * group, g)
            geometry[key] = g
        wt = weights(w, dt)
        nb = x.shape[0]
        cg, mg = g["cg"], g["mg"]
        m = mg * group
        od, oh, ow = pad3(g["out_sp"], 1)
        out = spec.alloc.empty((nb, m, od, oh, ow), dt)
        has_bias = b is not None
        if has_bias:
            if b.shape != (m,):
                raise spec.error(f"B must have shape [{m}], got {list(b.shape)}")
            out.reshape(nb, m, -1)[...] = np.asarray(b, dtype=dt)[None, :, None]
        else:
            out[...] = 0
        x5 = np.ascontiguousarray(canon5(x), dtype=dt)
        idn, ihn, iwn = g["in"]
        xr = x5.reshape(nb, x5.shape[1], -1)
        kd, kh, kw = g["k"]
        sd, sh, sw = g["s"]
        dd, dh, dw = g["d"]
        pd, ph, pw_ = g["pb"]
        kvol = kd * kh * kw
        col = threads.scratch("conv.col", (mg * kvol, idn * ihn * iwn), dt)
        blocks = split(mg, threads.num_threads())
        for n in range(nb):
            for gi in range(group):
                matmul_into(wt[gi], xr[n, gi * cg:(gi + 1) * cg], col)

                def chunk(i, n=n, gi=gi):
                    ma, mb = blocks[i]
                    _col2im_add(col, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw_, idn, ihn, iwn, n, gi * mg,
                                ma, mb, out)

                threads.parallel_for(chunk, len(blocks))
        y = out.reshape(out.shape[:2] + tuple(g["out_sp"]))
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return (y,)

    return run


# -------------------------------------------------------------------------------------------------
# flat-buffer entry points (public, for plugins: ``byoc_cpu.host.conv``)
#
# A plugin's generated code keeps its tensors in flat float32 buffers (an arena, its inputs, its
# constants) and addresses them by element offset. These call the kernels above on views of
# such buffers, so the window geometry and the convolution loops exist once, here. Every
# offset and extent is the caller's to keep in bounds (a plugin checks them when it verifies
# its program); shapes are NCHW of one image.

#: ``valid_range(o_n, s, off, n)``: the outputs ``o`` in ``[0, o_n)`` whose input index
#: ``o*s + off`` lies in ``[0, n)``, as ``(lo, hi)`` (a Numba function: callable from jitted code)
valid_range = _valid_range

_NO_BIAS = np.zeros(1, np.float32)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _planes(buf, off, c, h, w):
    return buf[off:off + c * h * w].reshape(1, c, 1, h, w)


# The flat entry points below are compiled (``nogil``), so that a compiled driver (byoc-cpu's
# native regions) calls them with no Python in between; they are called from Python as well.


@numba.njit(cache=True, nogil=True, boundscheck=False)
def pad_images(x, xo, xs, nb, c, h, w, xp, po, ldp, hp, wp, pt, pl):
    """Zero-padded copy of ``c`` planes ``(h, w)`` of ``nb`` images: plane ``ci`` of image ``n``
    (at ``x[xo + n*xs + ci*h*w:]``) lands at ``xp[po + ci*ldp + n*hp*wp:]`` laid out
    ``(hp, wp)`` with the input at ``(pt, pl)``; every other element of the rows (borders, the
    tail after ``nb*hp*wp`` up to the row length ``ldp``) is zero."""
    q_lo = min(wp, max(0, pl))
    q_hi = max(q_lo, min(wp, pl + w))
    for ci in range(c):
        d0 = po + ci * ldp
        for n in range(nb):
            d = d0 + n * hp * wp
            s = xo + n * xs + ci * h * w
            for r in range(hp):
                i = r - pt
                row = d + r * wp
                if i < 0 or i >= h:
                    for q in range(wp):
                        xp[_U(row + q)] = 0
                    continue
                src = s + i * w - pl
                for q in range(q_lo):
                    xp[_U(row + q)] = 0
                for q in range(q_lo, q_hi):
                    xp[_U(row + q)] = x[_U(src + q)]
                for q in range(q_hi, wp):
                    xp[_U(row + q)] = 0
        for f in range(nb * hp * wp, ldp):
            xp[_U(d0 + f)] = 0


@numba.njit(cache=True, nogil=True, boundscheck=False)
def pad_planes(x, xo, c, h, w, xp, po, ldp, hp, wp, pt, pl):
    """:func:`pad_images` of one image: plane ``i`` at ``x[xo:]`` becomes row ``i`` of
    ``xp[po:]`` (row length ``ldp >= hp*wp``)."""
    pad_images(x, xo, 0, 1, c, h, w, xp, po, ldp, hp, wp, pt, pl)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _phase_cols(off, sw, w, wq):
    """The output columns ``q < wq`` whose input column ``q*sw + off`` lies in ``[0, w)``."""
    lo = (-off + sw - 1) // sw if off < 0 else 0
    hi = min(wq, (w - 1 - off) // sw + 1) if w - 1 - off >= 0 else 0
    return min(lo, wq), max(min(lo, wq), hi)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def phase_planes(x, xo, c, h, w, xp, po, ldq, sh, sw, pt, pl, hq, wq):
    """The stride phases of ``c`` zero-padded planes ``(h, w)`` at ``x[xo:]``: plane ``i`` becomes
    row ``i`` of ``xp[po:]`` (row length ``ldq >= sh*sw*hq*wq``), phase ``(py, px)`` at
    ``(py*sw + px)*hq*wq`` holding ``xpad[r*sh + py, q*sw + px]`` for ``r < hq, q < wq`` (padding
    ``pt``/``pl`` before the input); every other element of the row is zero. A strided
    convolution's tap then reads one phase plane at a fixed offset (an implicit GEMM)."""
    plane = hq * wq
    for ci in range(c):
        d = po + ci * ldq
        s = xo + ci * h * w
        for py in range(sh):
            for px in range(sw):
                off = px - pl
                lo, hi = _phase_cols(off, sw, w, wq)
                base = d + (py * sw + px) * plane
                for r in range(hq):
                    i = r * sh + py - pt
                    row = base + r * wq
                    if i < 0 or i >= h:
                        for q in range(wq):
                            xp[_U(row + q)] = 0
                        continue
                    src = s + i * w + off
                    for q in range(lo):
                        xp[_U(row + q)] = 0
                    for q in range(lo, hi):
                        xp[_U(row + q)] = x[_U(src + q * sw)]
                    for q in range(hi, wq):
                        xp[_U(row + q)] = 0
        for f in range(sh * sw * plane, ldq):
            xp[_U(d + f)] = 0


@numba.njit(cache=True, nogil=True, boundscheck=False)
def im2col(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1, col, co):
    """Patch matrix of output rows ``[r0, r1)`` of a 2-D convolution (:func:`_im2col_rows`):
    ``col[co:]`` is ``(c*kh*kw, (r1-r0)*ow)``, row ``(ci*kh + ki)*kw + kj``."""
    if c * h * w > x.shape[0] - xo or c * kh * kw * (r1 - r0) * ow > col.shape[0] - co:
        raise ValueError("im2col: the planes or the patch matrix do not fit their buffers")
    _im2col_rows(x, xo, c, 1, h, w, 1, kh, kw, 1, sh, sw, 1, dh, dw, 0, pt, pl, max(r1, 1), ow, r0, r1, col, co)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def subsample_volumes(x, xo, c, d, h, w, sd, sh, sw, od, oh, ow, y, yo):
    """``y[ci, k, i, j] = x[ci, k*sd, i*sh, j*sw]`` for ``c`` volumes ``(d, h, w)`` at ``x[xo:]``
    into ``(od, oh, ow)`` at ``y[yo:]`` (a 1x1 convolution's strides)."""
    for ci in range(c):
        for k in range(od):
            for i in range(oh):
                src = xo + ((ci * d + k * sd) * h + i * sh) * w
                dst = yo + ((ci * od + k) * oh + i) * ow
                for j in range(ow):
                    y[_U(dst + j)] = x[_U(src + j * sw)]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def subsample(x, xo, c, h, w, sh, sw, oh, ow, y, yo):
    """``y[ci, i, j] = x[ci, i*sh, j*sw]``: :func:`subsample_volumes` of depth 1."""
    subsample_volumes(x, xo, c, 1, h, w, 1, sh, sw, 1, oh, ow, y, yo)


def winograd_weights(w: np.ndarray, mt: int, group: int = 1) -> np.ndarray:
    """Winograd-domain weights ``G g G^T`` of 3x3 weights ``w`` (M, Cg, 3, 3) for F(mt x mt, 3 x 3)
    (``mt`` 2 or 4), computed in float64: an array (G, alpha^2, M/G, Cg) of ``w``'s dtype."""
    gm = np.asarray(_WINO[mt][1], dtype=np.float64)
    a = mt + 2
    m, cg = w.shape[:2]
    # one matrix product with G (x) G: kron[i*a + j, k*3 + l] = G[i, k] * G[j, l] (5x faster than
    # the einsum it replaced on a first run; the float64 sums round to float32 within 1 ulp of it)
    w9 = np.asarray(w, dtype=np.float64).reshape(group, (m // group) * cg, 9)
    u = np.matmul(np.kron(gm, gm), w9.transpose(0, 2, 1))  # (G, alpha^2, Mg*Cg)
    return np.ascontiguousarray(u.reshape(group, a * a, m // group, cg), dtype=w.dtype)


def winograd(x, xo, c, h, w, u, m, pt, pl, oh, ow, mt, y, yo) -> None:
    """3x3 stride-1 convolution of one image by Winograd F(mt x mt, 3 x 3), on flat float32
    buffers: ``x[xo:]`` holds ``(c, h, w)``, ``y[yo:]`` receives ``(m, oh, ow)`` (no bias),
    ``u`` is :func:`winograd_weights` of the weights (group 1); padding ``pt``/``pl`` before the
    input, the rest after it (at most 2 each side; ``h + pt - 2 <= oh <= h + pt``, likewise for
    the width). BLAS GEMMs; input transform, GEMMs and output transform each split over the
    pool (call it from the main thread, not from inside a :func:`byoc_cpu.host.threads.parallel_for`
    chunk)."""

    def gemm(gi, e, a_, b_, c_):
        matmul_into(a_, b_, c_, 1.0, 0.0, False)

    zero_bias = threads.scratch("conv.zero_bias", (m,), y.dtype)
    zero_bias[:] = 0
    _wino_run(_planes(x, xo, c, h, w), u, 1, c, m, mt, pt, pl, gemm, zero_bias, _planes(y, yo, m, oh, ow))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def direct2d_fits(h, w, kh, kw, sh, sw, dh, dw, oh, ow):
    """Whether the flat direct kernel's stride-phase planes stay within a few times the input
    and output planes (hostile pads, strides or dilations can make them arbitrarily large; the
    loop nest then runs instead, which allocates nothing)."""
    hq = oh + ((kh - 1) * dh) // sh
    wq = ow + ((kw - 1) * dw) // sw
    return sh * sw * hq * wq <= 4 * (h * w + oh * ow) + 4096


@numba.njit(cache=True, nogil=True, boundscheck=False)
def conv_direct(x, xo, c, h, w, wt, m, cg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, m0, m1, y, yo):
    """Output channels ``[m0, m1)`` of a grouped convolution (``cg`` input channels per group) of
    one image, as a loop nest (depthwise and other thin groups); ``wt`` holds the weights
    ``(m, cg, kh, kw)`` from element 0; no bias."""
    if not direct2d_fits(h, w, kh, kw, sh, sw, dh, dw, oh, ow):
        _conv_direct(_planes(x, xo, c, h, w), wt[:m * cg * kh * kw].reshape(m, cg, 1, kh, kw), _NO_BIAS, False,
                     c // cg, 1, sh, sw, 1, dh, dw, 0, pt, pl, m0, m1, _planes(y, yo, m, oh, ow))
        return
    _direct2d(x, xo, c, h, w, wt, 0, m, cg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, m0, m1, _NO_BIAS, False, y, yo)
