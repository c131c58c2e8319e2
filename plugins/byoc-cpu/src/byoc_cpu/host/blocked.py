"""Direct convolution on channel-blocked input (NCHWc8), for KxK convolutions.

The input is reordered once per call into blocks of 8 channels, each block a zero-padded plane
of ``L`` pixels with the 8 channels of a pixel adjacent (``x8[cb][L][8]``); the weights are
blocked once at load into ``[M/16][C/8][kh][kw][8][16]`` (a plain transpose of the weights'
own bytes, see :func:`blocked_weights_axes`). Each output tile is 6 pixels x 16 channels held
in twelve 8-float registers; for every (channel block, tap) the kernel loads 16 weights per input
channel and broadcasts 6 input values, with the 8 channels of the block unrolled: 12 FMAs per
2 weight loads and 6 broadcasts, no im2col, no operand packing per call.

One tap is one fixed offset into the plane: output pixel ``(i, j)`` reads the plane's position
``i * wp + j`` at each tap's offset. The kernels write output rows of any width ``ow``: where
``ow`` is the plane's width (every position of the padded width, as the shift strategy's; the
caller's epilogue drops the ``wp - ow`` extra columns) the tiles run over the rows as one run of
positions and may span rows; where ``ow`` is the output's own width each row is cut into tiles
and the output is written in place, nothing computed for the padding columns. A strided
convolution reads stride-phase planes instead (as the phase-shift strategy's): the reorder
writes the ``sh * sw`` phases of each channel block, each ``(oh + (kh-1)//sh, ow + (kw-1)//sw)``
pixels, and tap ``(a, d)`` is again one fixed offset, into phase ``(a % sh, d % sw)``.

Measured on the development machine (AVX2, one core, ResNet-50's 3x3 shapes 56x56x64 to
7x7x512): 62-89 GFLOP/s against 49-77 for the shift strategy's OpenBLAS GEMMs on the same
planar output.

The wide form (:func:`conv16`) is the same kernel in 16-float vectors for CPUs with AVX-512
(:data:`WIDE`): tiles of 14 pixels x 32 channels in 28 registers (a rest of at most 7
pixels in a tile of 7), weights blocked ``[M/32][C/8][kh][kw][8][32]``, the input layout unchanged. On an
Intel Xeon with AVX-512 (one core, the same shapes, each row its own tiles): 155-208 GFLOP/s,
against 125-186 for tiles of 8 pixels over the padded width and OpenBLAS's square SGEMM at 166.

A weight block serves every tile of its output channels; where those are few (ResNet-50's 7x7
stage: four tiles per block, 2-9 MB of weights per layer) the first tile would stream the block
from memory alone, so the first four tiles of each block prefetch the next block's weights into
L2, a quarter each, a share at every tap.
"""

from __future__ import annotations


import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from byoc.contract import environment as _env
from byoc_cpu.host._spin import claim, finish, float32_at, int64_at, wait_done
from byoc_cpu.host.gemm import FULL_WIDTH, ir_accumulate, ir_store_tile, ir_vector_ops
from byoc_cpu.tuning import CONV

_U = np.uint64  # unsigned indices: no negative-index wraparound, so LLVM vectorises

#: output tile: pixels x (vectors of 8 channels); channel blocks of the input: 8
MR, NV, VW, CB = 6, 2, 8, 8
#: output channels per weight block
MB = NV * VW
#: the wide form (:func:`conv16`, 16-float vectors): pixels per tile (:data:`MR_SHORT` for a rest
#: of at most that many), output channels per block
MR_WIDE, MR_SHORT, MB_WIDE = 14, 7, 32

#: whether the wide form (:func:`conv16`, 16-float vectors) is the one that pays: on every CPU with
#: AVX-512 measured, Intel's full-rate units and Zen 4's, which runs each 512-bit FMA as two 256-bit
#: halves. On Zen 4 (one core, ResNet-50's 3x3 shapes) the wide form's tiles of 14 pixels x 32
#: channels ran at 91-113 GFLOP/s against 52-92 for :func:`conv8`'s 6 x 16 (fewer loads and
#: broadcasts per FMA, no padding columns computed); elsewhere :func:`conv8`
WIDE = FULL_WIDTH
_ENV = _env.get("BYOC_BLOCKED_CONV")


def _pays() -> bool:
    return _env.get("BYOC_BLOCKED_CONV") != "0"


#: whether the host kernels and byoc-cpu prefer this kernel where it :func:`applies` (with the
#: block :func:`block_for` gives): on every CPU measured so far, against OpenBLAS (AVX2), against
#: byoc's 16-wide GEMM on AVX-512 (the wide form: on an Intel Xeon, ResNet-50's 3x3 shapes at
#: 123-163 GFLOP/s on one core).
#: ``BYOC_BLOCKED_CONV=0``/``1`` decides instead.
PAYS = _pays()


def block_for(m: int) -> int:
    """Output channels per weight block for ``m`` output channels on this CPU: :data:`MB_WIDE`
    (:func:`conv16`) where :data:`WIDE` and ``m`` is a multiple of it, else :data:`MB` (:func:`conv8`)."""
    return MB_WIDE if WIDE and m % MB_WIDE == 0 else MB


#: on a :data:`WIDE` CPU, the blocked kernel where at least this share of the positions its tiles
#: compute are output pixels (:func:`useful_share`): below, byoc's narrow-output GEMM is faster.
#: Measured on 2 threads with tiles of 8 over the padded width, ResNet-50's 512 -> 512 3x3 layers:
#: at 7x7 (49 of 64) 1.25-1.30 ms blocked against 1.15; 14x14 -> 7x7 stride 2 (49 of 56) 1.35
#: against 1.61-1.71; 256 -> 256 at 14x14 (196 of 224) 0.99-1.06 against 1.13
WIDE_MIN_SHARE = CONV["blocked_wide_min_share"]


def tile_pixels(mb: int) -> int:
    """Pixels per register tile of the form with ``mb`` output channels per block (the most: a
    run of positions whose last tile has at most :data:`MR_SHORT` left takes a tile of that many)."""
    return MR_WIDE if mb == MB_WIDE else MR


def computed(run: int) -> int:
    """Positions :func:`conv16`'s tiles compute for a run of ``run``: whole tiles of :data:`MR_WIDE`,
    the rest in one of :data:`MR_SHORT` where it fits."""
    rest = run % MR_WIDE
    return run - rest + (0 if rest == 0 else MR_SHORT if rest <= MR_SHORT else MR_WIDE)


def own_rows(ow: int, wq: int) -> bool:
    """Whether :func:`conv16` writes output rows ``ow`` wide in place: where the (phase) planes'
    rows are as wide (``wq == ow``, a 1x1 kernel: one run of positions), or where cutting each row
    into its own tiles computes no more positions per row than the planes' width ``wq`` (else the
    rows are the planes', one run of positions whose padding columns are cropped after)."""
    return ow == wq or computed(ow) <= wq


#: a stem (fewer than 8 input channels, zero-padded to 8 in the blocked layout) takes the wide
#: form where the GEMMs' depth (channels x taps) is below this: their tiles then starve.
#: SqueezeNet's 3x3/2 stem (depth 27): 1.1-1.4 ms on the host's GEMMs, 0.73 blocked on 2 threads;
#: ResNet-50's 7x7/2 (147): 3.1 blocked against 2.1. byoc-cpu's
#: compiled GEMM stem keeps that rule (ResNet-50 cpu 1.13 against 1.24 of onnxruntime with the
#: 7x7 blocked); the host's GEMM stem runs Python chunks and crops an accumulator of the padded
#: width, while its blocked kernel is one compiled job writing in place, which wins in-model up to
#: the 11x11 stems: :data:`HOST_STEM_MAX_DEPTH`
STEM_MAX_DEPTH = CONV["blocked_stem_max_depth"]["codegen"]
#: the host's :data:`STEM_MAX_DEPTH` (ResNet-50 host-only 47.5-48.5 -> 45.4-47.4 ms with the 7x7/2
#: stem blocked, Xeon, 2 threads; DenseNet-121, Inception v1, ZFNet within noise)
HOST_STEM_MAX_DEPTH = CONV["blocked_stem_max_depth"]["host"]


def useful_share(oh: int, ow: int, wq: int) -> float:
    """The share of the positions :func:`conv16`'s tiles compute for an ``oh x ow`` output whose
    (phase) planes are ``wq`` wide that are output pixels (rows of their own where :func:`own_rows`)."""
    cut = ow != wq and own_rows(ow, wq)  # each row its own tiles, else one run over the planes' rows
    return oh * ow / (oh * computed(ow) if cut else computed(oh * wq))


def preferred(c: int, m: int, group: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
              oh: int, ow: int, stem_max_depth: int = STEM_MAX_DEPTH) -> int:
    """The block (:func:`block_for`) byoc's kernels run this convolution (output ``oh x ow``)
    with by default, or 0 where they prefer another strategy: where the kernel does not apply or
    :data:`PAYS` is off, a 1x1 convolution except in the wide form (byoc's pointwise GEMM; the wide
    form beat it on ResNet-50's 1x1 layers by 10-30%), and on a
    :data:`WIDE` CPU where only the 8-wide form would apply or too few of the positions its tiles
    compute are output pixels (:data:`WIDE_MIN_SHARE`; byoc's GEMMs are faster there), or a stem
    deeper than ``stem_max_depth`` (channels x taps; :data:`STEM_MAX_DEPTH`), unless
    ``BYOC_BLOCKED_CONV=1``."""
    if not (PAYS and applies(c, m, group, kh, kw, sh, sw, dh, dw)):
        return 0
    mb = block_for(m)
    if _ENV == "1":
        return mb
    if kh * kw == 1 and mb != MB_WIDE:  # 1x1: byoc's GEMMs, except on the wide form's CPUs
        return 0
    if c % CB and not (mb == MB_WIDE and c * kh * kw < stem_max_depth):  # a stem: the GEMMs, unless shallow
        return 0
    if not WIDE:
        return mb
    return mb if mb == MB_WIDE and useful_share(oh, ow, phase_extent(ow, kw, sw)) >= WIDE_MIN_SHARE else 0


def _tile_codegen(mr: int, nv: int, vw: int, split: int = 0):
    """The LLVM IR of one register tile: ``mr`` pixels x ``nv`` vectors of ``vw`` output channels.
    With ``split``, pixels from ``split`` on are the next row's: they read the input ``jump``
    elements (the intrinsic's last argument) further on."""
    mb = nv * vw

    def codegen(context, builder, signature, args):
        nt_v, x_v, xoff_v, to_v, w_v, woff_v, b_v, bo_v, r_v, ro_v, ep_v, t_v, y_v, yo_v, ldc_v, direct_v, pf_v = args[:17]
        vty, fma, splat = ir_vector_ops(builder, vw)
        vptr = vty.as_pointer()
        i64 = ir.IntType(64)
        px = builder.gep(context.make_array(signature.args[1])(context, builder, x_v).data, [xoff_v])
        pto = context.make_array(signature.args[3])(context, builder, to_v).data
        pw0 = context.make_array(signature.args[4])(context, builder, w_v).data
        pw = builder.gep(pw0, [woff_v])
        pb = builder.gep(context.make_array(signature.args[6])(context, builder, b_v).data, [bo_v])
        pr = builder.gep(context.make_array(signature.args[8])(context, builder, r_v).data, [ro_v])
        pt = context.make_array(signature.args[11])(context, builder, t_v).data
        py = builder.gep(context.make_array(signature.args[12])(context, builder, y_v).data, [yo_v])

        def body(t, accs):
            cur = list(accs)
            xt = builder.gep(px, [builder.load(builder.gep(pto, [t]), align=8)])
            xt2 = builder.gep(xt, [args[17]]) if split else xt  # the next row's pixels
            wt = builder.gep(pw, [builder.mul(t, ir.Constant(i64, CB * mb))])
            # a quarter of the next weight block's lines per tile, a share at each tap (pf < 0: none)
            with builder.if_then(builder.icmp_signed(">=", pf_v, ir.Constant(i64, 0))):
                ahead = builder.gep(pw0, [builder.add(pf_v, builder.mul(t, ir.Constant(i64, CB * mb // 4)))])
                for line in range(CB * mb // 64):
                    ir_prefetch(builder, builder.gep(ahead, [ir.Constant(i64, 16 * line)]))
            for ci in range(CB):
                bv = [builder.load(builder.bitcast(builder.gep(wt, [ir.Constant(i64, ci * mb + v * vw)]), vptr),
                                   align=4) for v in range(nv)]
                for i in range(mr):
                    at = xt2 if split and i >= split else xt
                    i0 = i - split if split and i >= split else i
                    s = splat(builder.load(builder.gep(at, [ir.Constant(i64, i0 * CB + ci)]), align=4))
                    for v in range(nv):
                        cur[i * nv + v] = fma(s, bv[v], cur[i * nv + v])
            return cur

        # every pixel's accumulators start at the bias of the tile's channels
        bias = [builder.load(builder.bitcast(builder.gep(pb, [ir.Constant(i64, v * vw)]), vptr), align=4)
                for v in range(nv)]
        final = ir_accumulate(builder, nt_v, mr * nv, vty, body, [bias[j % nv] for j in range(mr * nv)])
        with builder.if_else(direct_v) as (then, otherwise):
            with then:  # the epilogue ep: 2 adds the residual, 1 applies Relu, selected per value in
                # one store (a store per kind was four times the code to compile, for no speed)
                res_on = builder.icmp_signed("!=", builder.and_(ep_v, ir.Constant(i64, 2)), ir.Constant(i64, 0))
                relu_on = builder.icmp_signed("!=", builder.and_(ep_v, ir.Constant(i64, 1)), ir.Constant(i64, 0))
                ir_store_tile(builder, vty, final, mr, nv, py, ldc_v, pr, relu_on, res_on)
            with otherwise:
                for i in range(mr * nv):
                    dst = builder.gep(pt, [ir.Constant(i64, i * vw)])
                    builder.store(final[i], builder.bitcast(dst, vptr), align=4)
        return context.get_dummy_value()

    return codegen


def ir_prefetch(builder, p) -> None:
    """Prefetch the cache line at ``p`` for reading into L2 (``prefetcht1``; a hint: no fault)."""
    i32 = ir.IntType(32)
    fn = builder.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32]), name="llvm.prefetch.p0")
    builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])


def _tile_sig(x, toff, w, b, r, tile, y):
    return types.void(types.intp, x, types.intp, toff, w, types.intp, b, types.intp, r, types.intp, types.intp, tile,
                      y, types.intp, types.intp, types.boolean, types.intp)


@intrinsic
def _tile(typingctx, ntap, x, xoff, toff, w, woff, b, bo, r, ro, ep, tile, y, yo, ldc, direct, pf):
    """``acc[i, j] = b[bo + j] + sum_t sum_ci x[xoff + toff[t] + i*8 + ci] * w[woff + (t*8 + ci)*16 + j]``
    for ``i < 6``, ``j < 16``, ``t < ntap`` in registers; then with ``direct`` stored transposed
    straight into the planar output, ``y[yo + j*ldc + i] = epilogue(acc[i, j])`` (a whole tile: 6
    pixels, 16 channels; the epilogue ``ep``: 2 adds ``r[ro + j*ldc + i]``, then 1 applies Relu),
    else into ``tile[i*16 + j]`` as it is (for a partial tile, copied by the caller). With
    ``pf >= 0``, tap ``t`` also prefetches ``w[pf + t*32:]`` into L2 (``t*(8*16)/4`` in general: a
    quarter of a weight block over ``ntap`` taps)."""
    return _tile_sig(x, toff, w, b, r, tile, y), _tile_codegen(MR, NV, VW)


@intrinsic
def _tile_wide(typingctx, ntap, x, xoff, toff, w, woff, b, bo, r, ro, ep, tile, y, yo, ldc, direct, pf):
    """:func:`_tile` for :data:`MR_WIDE` pixels x :data:`MB_WIDE` channels in 16-float vectors."""
    return _tile_sig(x, toff, w, b, r, tile, y), _tile_codegen(MR_WIDE, NV, 16)


@intrinsic
def _tile_short(typingctx, ntap, x, xoff, toff, w, woff, b, bo, r, ro, ep, tile, y, yo, ldc, direct, pf):
    """:func:`_tile_wide` for :data:`MR_SHORT` pixels."""
    return _tile_sig(x, toff, w, b, r, tile, y), _tile_codegen(MR_SHORT, NV, 16)


@intrinsic
def _tile_pair(typingctx, ntap, x, xoff, toff, w, woff, b, bo, r, ro, ep, tile, y, yo, ldc, direct, pf, jump):
    """:func:`_tile_wide` over two output rows of :data:`MR_SHORT` pixels, adjacent in the output
    (rows 7 wide): the second row's pixels read the input ``jump`` elements (one plane row) on."""
    sig = _tile_sig(x, toff, w, b, r, tile, y)
    return types.void(*sig.args, types.intp), _tile_codegen(MR_WIDE, NV, 16, MR_SHORT)


def plane_length(hq: int, wq: int, kw: int, sh: int = 1, sw: int = 1) -> int:
    """Pixels per channel block of the reordered input: ``sh * sw`` stride-phase planes of
    ``(hq, wq)`` pixels (for stride 1 one plane, the padded input) plus the slack the last tile
    reads past them (a tile covers up to 14 positions; the ones past the output are dropped)."""
    return sh * sw * hq * wq + kw + max(MR, MR_WIDE)


def phase_extent(out: int, k: int, s: int) -> int:
    """Rows (or columns) of each stride-phase plane for ``out`` output rows, kernel ``k``,
    stride ``s``: tap ``a`` of output row ``i`` reads row ``i + a // s`` of phase ``a % s``
    (for stride 1, the padded input's height)."""
    return out + (k - 1) // s


@numba.njit(cache=True, nogil=True, boundscheck=False)
def reorder8(x, xo, c, h, w, L, hq, wq, sh, sw, pt, pl, y, yo):
    """``x[xo:]`` holding ``(c, h, w)`` -> ``y[yo:]`` holding ``ceil(c/8)`` blocks of ``L`` pixels x 8
    channels. Each block holds ``sh * sw`` stride-phase planes of ``(hq, wq)`` pixels: pixel
    ``(r, q)`` of phase ``(a, d)`` at ``((a*sw + d)*hq + r)*wq + q`` is the zero-padded input's
    pixel ``(r*sh + a, q*sw + d)``; zero where padding, past the planes, or past channel ``c``.
    For stride 1 that is one padded plane, of which only the padding is zeroed and each input
    row of 8 channels is written as one contiguous run of ``8 * w`` values."""
    if sh == 1 and sw == 1:
        _reorder_plane(x, xo, c, h, w, L, hq, wq, pt, pl, y, yo)
    else:
        _reorder_phases(x, xo, c, h, w, L, hq, wq, sh, sw, pt, pl, y, yo)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _reorder_plane(x, xo, c, h, w, L, hp, wp, pt, pl, y, yo):
    nb = (c + CB - 1) // CB
    zero = y.dtype.type(0)
    top = (pt * wp + pl) * CB  # the rows above and the left pad of the first row
    for b in range(nb):
        base = yo + b * L * CB
        kn = min(CB, c - b * CB)
        for t in range(top):
            y[_U(base + t)] = zero
        for r in range(h):
            row = base + ((r + pt) * wp + pl) * CB
            if kn == CB:
                for q in range(w):
                    for k in range(CB):
                        y[_U(row + q * CB + k)] = x[_U(xo + ((b * CB + k) * h + r) * w + q)]
            else:
                for q in range(w):
                    for k in range(CB):
                        y[_U(row + q * CB + k)] = x[_U(xo + ((b * CB + k) * h + r) * w + q)] if k < kn else zero
            # the right pad of this row and the left pad of the next (after the last row: the
            # bottom rows and the slack)
            gap_end = row + wp * CB if r + 1 < h else base + L * CB
            for t in range(row + w * CB, gap_end):
                y[_U(t)] = zero


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _reorder_phases(x, xo, c, h, w, L, hq, wq, sh, sw, pt, pl, y, yo):
    nb = (c + CB - 1) // CB
    zero = y.dtype.type(0)
    for b in range(nb):
        base = yo + b * L * CB
        kn = min(CB, c - b * CB)
        for a in range(sh):
            for d in range(sw):
                pbase = base + (a * sw + d) * hq * wq * CB
                for r in range(hq):
                    sr = r * sh + a - pt
                    for q in range(wq):
                        dst = pbase + (r * wq + q) * CB
                        sq = q * sw + d - pl
                        if 0 <= sr < h and 0 <= sq < w:
                            for k in range(CB):
                                y[_U(dst + k)] = x[_U(xo + ((b * CB + k) * h + sr) * w + sq)] if k < kn else zero
                        else:
                            for k in range(CB):
                                y[_U(dst + k)] = zero
        for t in range(base + sh * sw * hq * wq * CB, base + L * CB):
            y[_U(t)] = zero


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _conv(x8, xo, wb, b, bo, r, ro, cb, L, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep, y, yo, wide):
    mbw, mr = (MB_WIDE, MR_WIDE) if wide else (MB, MR)
    ntap = cb * kh * kw
    toff = np.empty(ntap, np.int64)
    n = 0
    for q in range(cb):
        for a in range(kh):
            for d in range(kw):
                toff[n] = (q * L + ((a % sh) * sw + d % sw) * hq * wq + (a // sh) * wq + d // sw) * CB
                n += 1
    tile = np.empty(mr * mbw, np.float32)
    # runs of positions cut into tiles: each output row, or all rows as one where the output's
    # rows are the planes' (then the plane's and the output's positions are the same); rows of
    # 7 in the wide form two at a time (one tile of 14, the output's rows being adjacent)
    runs, run = (1, (r1 - r0) * wq) if ow == wq else (r1 - r0, ow)
    step = 2 if wide and runs > 1 and run == MR_SHORT else 1
    for mb in range(mb0, mb1):
        woff, boff = mb * ntap * CB * mbw, bo + mb * mbw
        cn = min(mbw, m - mb * mbw)
        j = 0  # the block's tiles so far: the first four prefetch the next block's weights
        for k in range(0, runs, step):
            src, at = (r0 + k) * wq, mb * mbw * ldc + (r0 + k) * ow  # at: the output's (and residual's) offset
            if step == 2 and k + 1 < runs:  # rows k and k + 1: 14 adjacent output pixels
                xt, yt, rt = xo + src * CB, yo + at, ro + at
                whole = cn == mbw
                pf = woff + ntap * CB * mbw + j * ntap * CB * mbw // 4 if mb + 1 < mb1 and j < 4 else -1
                j += 1
                _tile_pair(ntap, x8, xt, toff, wb, woff, b, boff, r, rt, ep, tile, y, yt, ldc, whole, pf, wq * CB)
                if not whole:
                    _store_rest(tile, mbw, cn, mr, ep, r, rt, y, yt, ldc)
                continue
            for t in range(0, run, mr):
                nt = min(mr, run - t)
                xt, yt, rt = xo + (src + t) * CB, yo + at + t, ro + at + t
                pf = woff + ntap * CB * mbw + j * ntap * CB * mbw // 4 if mb + 1 < mb1 and j < 4 else -1
                j += 1
                if not wide:
                    whole = nt == mr and cn == mbw
                    _tile(ntap, x8, xt, toff, wb, woff, b, boff, r, rt, ep, tile, y, yt, ldc, whole, pf)
                elif nt > MR_SHORT:
                    whole = nt == mr and cn == mbw
                    _tile_wide(ntap, x8, xt, toff, wb, woff, b, boff, r, rt, ep, tile, y, yt, ldc, whole, pf)
                else:  # a rest of at most 7: the short tile
                    whole = nt == MR_SHORT and cn == mbw
                    _tile_short(ntap, x8, xt, toff, wb, woff, b, boff, r, rt, ep, tile, y, yt, ldc, whole, pf)
                if not whole:
                    _store_rest(tile, mbw, cn, nt, ep, r, rt, y, yt, ldc)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _store_rest(tile, mbw, cn, nt, ep, r, rt, y, yt, ldc):
    """A partial tile from its scratch copy (``tile[i*mbw + co]``): ``cn`` channels of ``nt``
    pixels into the planar output, with the epilogue ``ep``."""
    for co in range(cn):
        for i in range(nt):
            v = tile[i * mbw + co]
            if ep & 2:
                v += r[rt + co * ldc + i]
            if ep & 1 and v < 0:
                v = 0.0
            y[yt + co * ldc + i] = v


@numba.njit(cache=True, nogil=True, boundscheck=False)
def conv8(x8, xo, wb, b, bo, r, ro, cb, L, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep, y, yo):
    """Output channel blocks ``[mb0, mb1)`` (16 each; the last may be partial when ``m`` is not a
    multiple of 16) on output rows ``[r0, r1)`` of ``ow`` pixels (at most the planes' width ``wq``):
    ``y[yo + co*ldc + i*ow + j] = epilogue(b[bo + co] + sum over (channel, tap) of x8 * weights)``
    (the bias ``b`` holds a whole block's channels past ``m``: ``ceil(m/16)*16``), ``x8[xo:]`` from
    :func:`reorder8` with the same ``L, hq, wq, sh, sw`` (output pixel ``(i, j)`` reads position
    ``i*wq + j``; stride ``sh, sw``: tap ``(a, d)`` reads phase ``(a % sh, d % sw)`` at row offset
    ``a // sh``, column offset ``d // sw``), ``wb`` blocked weights ``[ceil(m/16)][cb][kh][kw][8][16]``.
    With ``ow == wq`` the output holds every position of the planes' rows (the padding columns
    too, from the zeros past the input). The epilogue ``ep`` (a bit set): 2 adds the residual
    ``r[ro + co*ldc + i*ow + j]`` (laid out as the output; any array where ``ep`` has no 2), then 1
    applies Relu (``v if not v < 0 else 0``, byoc's Relu), both as the tile is stored."""
    _conv(x8, xo, wb, b, bo, r, ro, cb, L, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep, y, yo, False)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def conv16(x8, xo, wb, b, bo, r, ro, cb, L, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep, y, yo):
    """:func:`conv8` in 16-float vectors, for CPUs with AVX-512 (:data:`WIDE`): blocks of 32 output
    channels, tiles of 14 pixels (a rest of at most 7 in one tile of 7), weights
    ``[ceil(m/32)][cb][kh][kw][8][32]``."""
    _conv(x8, xo, wb, b, bo, r, ro, cb, L, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep, y, yo, True)


def blocked_weights_axes(m: int, c: int, kh: int, kw: int, mb: int = MB) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, axes)``: the weights ``(m, c, kh, kw)`` viewed as ``shape`` and transposed by
    ``axes`` are the blocked weights of the form with ``mb`` channels per block (:func:`conv8`:
    16, :func:`conv16`: 32; ``m`` a multiple of ``mb``, ``c`` of 8)."""
    return (m // mb, mb, c // CB, CB, kh, kw), (0, 2, 4, 5, 3, 1)


def blocked_weights(wt: np.ndarray, mb: int = MB) -> np.ndarray:
    """The flat blocked weights of ``wt`` ``(m, c, kh, kw)`` for the form with ``mb`` channels per
    block; input channels past ``c`` up to a whole block of 8 are zeros (as :func:`reorder8`
    writes the input's)."""
    m, c, kh, kw = wt.shape
    cp = -(-c // CB) * CB
    if cp != c:
        padded = np.zeros((m, cp, kh, kw), np.float32)
        padded[:, :c] = wt
        wt = padded
    shape, axes = blocked_weights_axes(m, cp, kh, kw, mb)
    return np.ascontiguousarray(wt.reshape(shape).transpose(axes), dtype=np.float32).reshape(-1)


def host_conv(mb: int):
    """The kernel of the form with ``mb`` channels per block, for callers in Python (the host):
    the loops :func:`conv8` / :func:`conv16` wrap, called directly with their arguments. A wrapper
    is the same loops optimised a second time on a fresh install's first run (about 1 s)."""
    wide = mb == MB_WIDE
    return lambda *args: _conv(*args, wide)


def host_reorder(sh: int, sw: int):
    """:func:`reorder8`'s loop for strides ``sh, sw`` with its arguments, for callers in Python
    (as :func:`host_conv`: only the loop a model takes is compiled)."""
    if sh == 1 and sw == 1:
        return lambda x, xo, c, h, w, L, hq, wq, _sh, _sw, pt, pl, y, yo: _reorder_plane(x, xo, c, h, w, L, hq, wq, pt,
                                                                                      pl, y, yo)
    return _reorder_phases


# -------------------------------------------------------------------------------------------------
# the host's blocked convolution as one compiled job (byoc_cpu.host.threads.run_job): the reorder
# and the kernel's chunks, claimed by whichever threads run it, with no Python between them and no
# GIL for a helper to take (each Python hand-off cost ResNet-50's host run 60-90 us, two per layer)

#: the job's argument block: the arrays (address, size) it reads and writes, then its integers
_JOB_ARRAYS = ("sync", "x", "x8", "wb", "b", "r", "y")
_JOB_INTS = ("xo", "c", "h", "w", "L", "hq", "wq", "sh", "sw", "pt", "pl", "cb", "kh", "kw", "m", "ldc", "ow",
             "ep", "yo", "oh", "nbk", "reorder_chunks", "chunks", "by_rows")
_I = 2 * len(_JOB_ARRAYS)


def _conv_job(p):  # compiled as a cfunc by conv_job()
    a = numba.carray(p, _I + len(_JOB_INTS))
    sync = numba.carray(int64_at(a[0]), a[1])
    x, x8 = numba.carray(float32_at(a[2]), a[3]), numba.carray(float32_at(a[4]), a[5])
    wb, b = numba.carray(float32_at(a[6]), a[7]), numba.carray(float32_at(a[8]), a[9])
    r, y = numba.carray(float32_at(a[10]), a[11]), numba.carray(float32_at(a[12]), a[13])
    xo, c, h, w, L, hq, wq, sh, sw, pt, pl, cb = a[_I:_I + 12]
    kh, kw, m, ldc, ow, ep, yo, oh, nbk, nre, nk, by_rows = a[_I + 12:_I + 24]
    # (one call site per loop, every argument an int64 or an array: one compiled version of each)
    per = (cb + nre - 1) // nre  # channel blocks of 8 per reorder chunk
    while True:
        i = claim(sync, 0)
        if i >= nre:
            break
        b0, b1 = i * per, min(cb, (i + 1) * per)
        if b0 < b1:
            xs, cs, ys = xo + b0 * CB * h * w, min(c, b1 * CB) - b0 * CB, b0 * L * CB
            if sh == 1 and sw == 1:
                _reorder_plane(x, xs, cs, h, w, L, hq, wq, pt, pl, x8, ys)
            else:
                _reorder_phases(x, xs, cs, h, w, L, hq, wq, sh, sw, pt, pl, x8, ys)
        finish(sync, 0)
    wait_done(sync, 0, nre)
    total = oh if by_rows else nbk
    per = (total + nk - 1) // nk  # output rows, or blocks of output channels, per kernel chunk
    zero = xo - xo
    while True:
        i = claim(sync, 1)
        if i >= nk:
            break
        s0, s1 = i * per, min(total, (i + 1) * per)
        if s0 < s1:
            mb0, mb1, r0, r1 = (zero, nbk, s0, s1) if by_rows else (s0, s1, zero, oh)
            _conv(x8, zero, wb, b, zero, r, yo, cb, L, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep, y,
                  yo, True)
        finish(sync, 1)
    wait_done(sync, 1, nk)


_conv_job_compiled = None


def conv_job() -> int:
    """The wide kernel writing its output in place (:func:`own_rows`), with its input's reorder,
    for one image as a compiled job: the address of a ``cfunc`` compiled on first use, for
    :func:`byoc_cpu.host.threads.run_job` (its argument block: :func:`conv_job_block`)."""
    global _conv_job_compiled
    if _conv_job_compiled is None:
        _conv_job_compiled = numba.cfunc(types.void(types.CPointer(types.int64)), cache=True)(_conv_job).address
    return _conv_job_compiled


#: where :func:`conv_job`'s argument block holds each array's address (its size next to it), each
#: integer, and the job's claim counters (zeros in a fresh block; :func:`conv_job_block`)
JOB_ARRAY = {name: 2 * k for k, name in enumerate(_JOB_ARRAYS)}
JOB_INT = {name: _I + k for k, name in enumerate(_JOB_INTS)}
JOB_SYNC = _I + len(_JOB_INTS)


def conv_job_block(ints: dict) -> np.ndarray:
    """A template of :func:`conv_job`'s argument block: its integers from ``ints`` (the kernel's
    own arguments; ``reorder_chunks`` and ``chunks`` pieces of the reorder and of the kernel, the
    kernel's by output rows where ``by_rows``, else by blocks of output channels) and room for
    its claim counters at :data:`JOB_SYNC` (two per work unit and an abort flag). The caller
    fills in, per call, the arrays' addresses and sizes (:data:`JOB_ARRAY`: ``x`` the planar
    input, ``x8`` the reorder's buffer, ``wb`` the blocked weights, ``b`` the bias, ``r`` the
    residual, ``y`` the output, all flat contiguous float32 kept alive until the job returns)
    and ``sync``, the counters' own address in the copy it runs."""
    block = np.zeros(JOB_SYNC + 5, np.int64)
    block[_I:JOB_SYNC] = [int(ints[name]) for name in _JOB_INTS]
    block[JOB_ARRAY["sync"] + 1] = 5
    return block


@numba.njit(cache=True, nogil=True)
def bind_job(block, x, x8, r, y):
    """Fill in :func:`conv_job_block`'s copy ``block`` with the call's arrays (and its claim
    counters' address; the indices: :data:`JOB_ARRAY`); returns the block's address."""
    at = block.ctypes.data
    block[0], block[2], block[3] = at + 8 * JOB_SYNC, x.ctypes.data, x.size
    block[4], block[5], block[10], block[11], block[12], block[13] = x8.ctypes.data, x8.size, r.ctypes.data, r.size, \
        y.ctypes.data, y.size
    return at


def kernel_for(mb: int):
    """:func:`conv16` for blocks of :data:`MB_WIDE` channels, else :func:`conv8`."""
    return conv16 if mb == MB_WIDE else conv8


def applies(c: int, m: int, group: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int) -> bool:
    """Whether :func:`conv8` runs this convolution: dilation 1, strides up to the kernel's size
    (any for 1x1: its tap reads the first stride phase), one group, input channels in whole blocks
    of 8 (or fewer than 8, an RGB stem's, zero-padded to one block), output channels of 16."""
    strides = 1 <= sh and 1 <= sw and (kh * kw == 1 or (sh <= kh and sw <= kw))
    return group == 1 and strides and dh == 1 and dw == 1 and (c % CB == 0 or c < CB) and m % MB == 0


__all__ = ["CB", "HOST_STEM_MAX_DEPTH", "JOB_ARRAY", "JOB_INT", "JOB_SYNC", "MB", "MB_WIDE", "MR", "MR_SHORT", "MR_WIDE",
           "PAYS", "STEM_MAX_DEPTH", "WIDE", "WIDE_MIN_SHARE", "applies", "bind_job", "conv_job", "conv_job_block",
           "block_for", "blocked_weights", "blocked_weights_axes", "computed", "conv16", "conv8", "kernel_for", "own_rows",
           "phase_extent", "plane_length", "preferred", "reorder8", "tile_pixels", "useful_share"]
