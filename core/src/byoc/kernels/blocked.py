"""Direct convolution on channel-blocked input (NCHWc8), for stride-1 KxK convolutions.

The input is reordered once per call into blocks of 8 channels, each block a zero-padded plane
of ``L`` pixels with the 8 channels of a pixel adjacent (``x8[cb][L][8]``); the weights are
blocked once at load into ``[M/16][C/8][kh][kw][8][16]`` (a plain transpose of the weights'
own bytes, see :func:`blocked_weights_axes`). Each output tile is 6 pixels x 16 channels held
in twelve 8-float registers; for every (channel block, tap) the kernel loads 16 weights per input
channel and broadcasts 6 input values, with the 8 channels of the block unrolled: 12 FMAs per
2 weight loads and 6 broadcasts, no im2col, no operand packing per call.

Like the shift strategy it computes every position of the padded width (``oh * wp`` outputs
per channel, the ``wp - ow`` extra columns of each row are dropped by the caller's epilogue),
so one tap is one fixed offset into the plane and a tile may span rows.

Measured on the development machine (AVX2, one core, ResNet-50's 3x3 shapes 56x56x64 to
7x7x512): 62-89 GFLOP/s against 49-77 for the shift strategy's OpenBLAS GEMMs on the same
planar output (docs/speed.md, round five).
"""

from __future__ import annotations

import os

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from byoc.kernels.gemm import FULL_WIDTH, ir_accumulate, ir_vector_ops

_U = np.uint64  # unsigned indices: no negative-index wraparound, so LLVM vectorises

#: output tile: pixels x (vectors of 8 channels); channel blocks of the input: 8
MR, NV, VW, CB = 6, 2, 8, 8
#: output channels per weight block
MB = NV * VW

#: CPUs whose AVX-512 units split each 512-bit FMA into two 256-bit halves (LLVM's CPU names):
#: there byoc's 16-wide GEMM has no more FMA throughput than this 8-wide kernel, and this one
#: reads its operands contiguously (measured on Zen 4: 94-99 GFLOP/s on one core for ResNet-50's
#: 3x3 shapes, against ~72 for the GEMM's implicit convolution)
HALF_RATE_512 = frozenset({"znver4"})


def _pays() -> bool:
    env = os.environ.get("BYOC_BLOCKED_CONV", "")
    if env in ("0", "1"):
        return env == "1"
    if not FULL_WIDTH:
        return True
    try:
        from llvmlite import binding as llvm

        return llvm.get_host_cpu_name() in HALF_RATE_512
    except Exception:  # pragma: no cover - exotic platforms
        return False


#: whether the host kernels and byoc-cpu prefer this kernel where it :func:`applies`: CPUs
#: without AVX-512 (against OpenBLAS) and those in :data:`HALF_RATE_512`; not where byoc's
#: 16-wide GEMM runs at full rate. ``BYOC_BLOCKED_CONV=0``/``1`` decides instead.
PAYS = _pays()


def _transpose_store(builder, vty, rows, py, ldc, count):
    """Store the transpose of ``rows`` (up to 8 vectors of 8 floats: pixel ``i``'s 8 channels)
    as 8 channel runs of ``count`` pixels each: ``py[k*ldc + i] = rows[i][k]``, through the
    unpack / shuffle / 128-bit-lane steps of an 8x8 transpose (missing rows are undefined)."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    undef = ir.Constant(vty, ir.Undefined)
    r = list(rows) + [undef] * (8 - len(rows))

    def shuf(a, b, mask):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, len(mask)), mask))

    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for k in range(0, 8, 2):
        t += [shuf(r[k], r[k + 1], lo), shuf(r[k], r[k + 1], hi)]
    pair_lo, pair_hi = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = []
    for k in (0, 4):  # rows 0-3, rows 4-7
        u += [shuf(t[k], t[k + 2], pair_lo), shuf(t[k], t[k + 2], pair_hi),
              shuf(t[k + 1], t[k + 3], pair_lo), shuf(t[k + 1], t[k + 3], pair_hi)]
    cols = [None] * 8
    for k in range(4):
        cols[k] = shuf(u[k], u[k + 4], [0, 1, 2, 3, 8, 9, 10, 11])
        cols[k + 4] = shuf(u[k], u[k + 4], [4, 5, 6, 7, 12, 13, 14, 15])
    for k in range(8):
        dst = builder.gep(py, [builder.mul(ir.Constant(i64, k), ldc)])
        done = 0
        for width in (4, 2, 1):
            if count - done >= width:
                piece = shuf(cols[k], undef, list(range(done, done + width)))
                pty = ir.VectorType(ir.FloatType(), width).as_pointer()
                builder.store(piece, builder.bitcast(builder.gep(dst, [ir.Constant(i64, done)]), pty), align=4)
                done += width


@intrinsic
def _tile(typingctx, ntap, x, xoff, toff, w, woff, tile, y, yo, ldc, direct):
    """``acc[i, j] = sum_t sum_ci x[xoff + toff[t] + i*8 + ci] * w[woff + (t*8 + ci)*16 + j]``
    for ``i < 6``, ``j < 16``, ``t < ntap`` in registers; then with ``direct`` stored transposed
    straight into the planar output, ``y[yo + j*ldc + i] = acc[i, j]`` (a whole tile: 6 pixels,
    16 channels), else into ``tile[i*16 + j]`` (for a partial tile, copied by the caller)."""
    sig = types.void(types.intp, x, types.intp, toff, w, types.intp, tile, y, types.intp, types.intp,
                     types.boolean)

    def codegen(context, builder, signature, args):
        nt_v, x_v, xoff_v, to_v, w_v, woff_v, t_v, y_v, yo_v, ldc_v, direct_v = args
        vty, fma, splat = ir_vector_ops(builder, VW)
        vptr = vty.as_pointer()
        i64 = ir.IntType(64)
        px = builder.gep(context.make_array(signature.args[1])(context, builder, x_v).data, [xoff_v])
        pto = context.make_array(signature.args[3])(context, builder, to_v).data
        pw = builder.gep(context.make_array(signature.args[4])(context, builder, w_v).data, [woff_v])
        pt = context.make_array(signature.args[6])(context, builder, t_v).data
        py = builder.gep(context.make_array(signature.args[7])(context, builder, y_v).data, [yo_v])

        def body(t, accs):
            cur = list(accs)
            xt = builder.gep(px, [builder.load(builder.gep(pto, [t]), align=8)])
            wt = builder.gep(pw, [builder.mul(t, ir.Constant(i64, CB * MB))])
            for ci in range(CB):
                bv = [builder.load(builder.bitcast(builder.gep(wt, [ir.Constant(i64, ci * MB + v * VW)]), vptr),
                                   align=4) for v in range(NV)]
                for i in range(MR):
                    s = splat(builder.load(builder.gep(xt, [ir.Constant(i64, i * CB + ci)]), align=4))
                    for v in range(NV):
                        cur[i * NV + v] = fma(s, bv[v], cur[i * NV + v])
            return cur

        final = ir_accumulate(builder, nt_v, MR * NV, vty, body)
        with builder.if_else(direct_v) as (then, otherwise):
            with then:
                for v in range(NV):
                    base = builder.gep(py, [builder.mul(ir.Constant(i64, v * VW), ldc_v)])
                    _transpose_store(builder, vty, [final[i * NV + v] for i in range(MR)], base, ldc_v, MR)
            with otherwise:
                for i in range(MR * NV):
                    dst = builder.gep(pt, [ir.Constant(i64, i * VW)])
                    builder.store(final[i], builder.bitcast(dst, vptr), align=4)
        return context.get_dummy_value()

    return sig, codegen


def plane_length(hp: int, wp: int, kw: int) -> int:
    """Pixels per channel block of the reordered input: the padded plane plus the slack the
    last tile reads past it (a tile covers 6 positions; the ones past the output are dropped)."""
    return hp * wp + kw + MR


@numba.njit(cache=True, nogil=True, boundscheck=False)
def reorder8(x, xo, c, h, w, L, hp, wp, pt, pl, y, yo):
    """``x[xo:]`` holding ``(c, h, w)`` -> ``y[yo:]`` holding ``ceil(c/8)`` blocks of ``L`` pixels x 8
    channels: pixel ``(r, q)`` of the ``(hp, wp)`` padded plane at ``r*wp + q``, zero where padding,
    past the plane, or past channel ``c``. Only the padding is zeroed; each input row of 8
    channels is written as one contiguous run of ``8 * w`` values."""
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def conv8(x8, xo, wb, cb, L, wp, kh, kw, m, ldc, mb0, mb1, t0, t1, y, yo):
    """Output channel blocks ``[mb0, mb1)`` (16 each; the last may be partial when ``m`` is not a
    multiple of 16) at flat positions ``[t0, t1)`` of the padded width: ``y[yo + co*ldc + t] =
    sum over (channel, tap) of x8 * weights``, ``x8[xo:]`` from :func:`reorder8`, ``wb`` blocked
    weights ``[ceil(m/16)][cb][kh][kw][8][16]``."""
    ntap = cb * kh * kw
    toff = np.empty(ntap, np.int64)
    n = 0
    for b in range(cb):
        for a in range(kh):
            for d in range(kw):
                toff[n] = (b * L + a * wp + d) * CB
                n += 1
    tile = np.empty(MR * MB, np.float32)
    for mb in range(mb0, mb1):
        woff = mb * ntap * CB * MB
        cn = min(MB, m - mb * MB)
        for t in range(t0, t1, MR):
            nt = min(MR, t1 - t)
            whole = nt == MR and cn == MB
            _tile(ntap, x8, xo + t * CB, toff, wb, woff, tile, y, yo + mb * MB * ldc + t, ldc, whole)
            if not whole:
                for co in range(cn):
                    base = yo + (mb * MB + co) * ldc + t
                    for i in range(nt):
                        y[base + i] = tile[i * MB + co]


def blocked_weights_axes(m: int, c: int, kh: int, kw: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, axes)``: the weights ``(m, c, kh, kw)`` viewed as ``shape`` and transposed by
    ``axes`` are :func:`conv8`'s blocked weights (``m`` a multiple of 16, ``c`` of 8)."""
    return (m // MB, MB, c // CB, CB, kh, kw), (0, 2, 4, 5, 3, 1)


def blocked_weights(wt: np.ndarray) -> np.ndarray:
    """The flat blocked weights of ``wt`` ``(m, c, kh, kw)`` (``m`` a multiple of 16, ``c`` of 8)."""
    shape, axes = blocked_weights_axes(*wt.shape)
    return np.ascontiguousarray(wt.reshape(shape).transpose(axes), dtype=np.float32).reshape(-1)


def applies(c: int, m: int, group: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int) -> bool:
    """Whether :func:`conv8` runs this convolution: stride and dilation 1, one group, a kernel
    larger than 1x1, input channels in whole blocks of 8, output channels of 16."""
    return (group == 1 and sh == 1 and sw == 1 and dh == 1 and dw == 1 and kh * kw > 1
            and c % CB == 0 and m % MB == 0)


__all__ = ["CB", "HALF_RATE_512", "MB", "MR", "PAYS", "applies", "blocked_weights", "blocked_weights_axes", "conv8",
           "plane_length", "reorder8"]
