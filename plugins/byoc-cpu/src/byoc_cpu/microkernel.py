"""The plugin's float32 GEMM: packed weights times an activation matrix found through a row table.

``C[m, j_lo:j_hi] (+)= A @ B[:, j_lo:j_hi]`` where ``A`` (m, k) is a constant (a convolution's
weights) packed once at load time by :func:`pack`, and row ``kk`` of ``B`` starts at
``b[bo + rows[kk]]``: an *indirect* GEMM. With ``rows[kk] = kk * ldb`` that is a plain
row-major matrix (1x1 convolutions, im2col patches); a KxK convolution instead lists, for tap
``t`` and channel ``c``, where channel ``c`` of the zero-padded input starts shifted by the tap
(``c * plane + di * row + dj``), so the whole convolution is one GEMM with ``k = K*K*C``
straight out of the padded input: no patch matrix in memory (only a ``k x NR`` strip at a
time, packed contiguous), and the accumulators stay in registers across every tap.

The inner loop is one register tile: ``MR`` rows of ``A`` times ``NR`` columns of ``B``, kept in
``MR * NR / W`` vector registers of ``W`` floats, one fused multiply-add per register per step
of ``k``, all of ``k`` at once (the packed panel, ``k * MR`` floats, is read straight through).
It is written as LLVM IR (a Numba intrinsic) because Numba has no vector type; the accumulators
live in ``alloca`` slots that LLVM promotes to registers. A partial tile (fewer than ``NR``
columns left) reads a zero-padded strip and masks its stores to C. ``W`` is 16 floats (one AVX-512
register): the generated code uses this GEMM only where the CPU has AVX-512 (:data:`AVAILABLE`);
elsewhere OpenBLAS is the better choice and :func:`byoc_cpu.blas.wgemm` calls it instead.

Packed layout: ``ceil(m / MR)`` panels of ``MR`` rows, each ``k x MR`` with the ``MR`` values of
one ``kk`` side by side; rows past ``m`` are zero.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

MR = 8  # rows of A per register tile (part of the packed layout)
W = 16  # floats per vector register
NV = 2  # vector registers per tile row
NR = W * NV  # columns of B per register tile


def _has_avx512() -> bool:
    try:
        from llvmlite import binding as llvm

        return bool(llvm.get_host_cpu_features().get("avx512f", False))
    except Exception:  # pragma: no cover - exotic platforms
        return False


#: whether this machine runs the micro-kernel at full width (else the plugin uses OpenBLAS)
AVAILABLE = _has_avx512()


def _make_tile(masked: bool):
    @intrinsic
    def tile(typingctx, kc, a, ao, b, bo, ldb, c, co, ldc, cols, accumulate, pf):
        """``c[co + i*ldc + j] (+)= sum_kk a[ao + kk*MR + i] * b[bo + kk*ldb + j]``, ``i < MR``,
        ``j < NR`` (``j < cols`` when masked: only C is masked, B strips are zero-padded). With
        ``pf`` > 0, each step also prefetches ``a[pf + kk*MR]``: the next panel, while this one
        computes."""
        sig = types.void(types.int64, a, types.int64, b, types.int64, types.int64, c, types.int64, types.int64,
                         types.int64, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            kc_v, a_v, ao_v, b_v, bo_v, ldb_v, c_v, co_v, ldc_v, cols_v, acc_v, pf_v = args
            f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
            vec = ir.VectorType(f32, W)
            vptr = vec.as_pointer()
            arr = context.make_array
            pa0 = arr(signature.args[1])(context, builder, a_v).data
            pa = builder.gep(pa0, [ao_v])
            pb = builder.gep(arr(signature.args[3])(context, builder, b_v).data, [bo_v])
            pc = builder.gep(arr(signature.args[6])(context, builder, c_v).data, [co_v])
            mod = builder.module

            def intr(name, ret, params):
                return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ret, params), name=name)

            fma = intr(f"llvm.fma.v{W}f32", vec, [vec, vec, vec])
            i8p = ir.IntType(8).as_pointer()
            prefetch = intr("llvm.prefetch.p0i8", ir.VoidType(), [i8p, i32, i32, i32])
            do_pf = builder.icmp_signed(">", pf_v, ir.Constant(i64, 0))
            zero = ir.Constant(vec, [0.0] * W)
            masks = []
            if masked:
                mvec = ir.VectorType(ir.IntType(1), W)
                mload = intr(f"llvm.masked.load.v{W}f32.p0v{W}f32", vec, [vptr, i32, mvec, vec])
                mstore = intr(f"llvm.masked.store.v{W}f32.p0v{W}f32", ir.VoidType(), [vec, vptr, i32, mvec])
                lanes = ir.Constant(ir.VectorType(i64, W), list(range(W)))
                undef64 = ir.Constant(ir.VectorType(i64, W), ir.Undefined)
                for v in range(NV):
                    left = builder.sub(cols_v, ir.Constant(i64, v * W))
                    splat = builder.shuffle_vector(builder.insert_element(undef64, left, ir.Constant(i32, 0)),
                                                   undef64, ir.Constant(ir.VectorType(i32, W), [0] * W))
                    masks.append(builder.icmp_signed("<", lanes, splat))

            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(MR * NV)]
            splat_mask = ir.Constant(ir.VectorType(i32, W), [0] * W)
            with cgutils.for_range(builder, kc_v) as loop:
                k = loop.index
                brow = builder.gep(pb, [builder.mul(k, ldb_v)])
                bvec = [builder.load(builder.bitcast(builder.gep(brow, [ir.Constant(i64, v * W)]), vptr), align=4)
                        for v in range(NV)]
                arow = builder.gep(pa, [builder.mul(k, ir.Constant(i64, MR))])
                with builder.if_then(do_pf, likely=False):
                    ahead = builder.gep(pa0, [builder.add(pf_v, builder.mul(k, ir.Constant(i64, MR)))])
                    builder.call(prefetch, [builder.bitcast(ahead, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                                            ir.Constant(i32, 1)])
                for i in range(MR):
                    av = builder.load(builder.gep(arow, [ir.Constant(i64, i)]), align=4)
                    one = builder.insert_element(ir.Constant(vec, ir.Undefined), av, ir.Constant(i32, 0))
                    splat = builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), splat_mask)
                    for v in range(NV):
                        slot = accs[i * NV + v]
                        builder.store(builder.call(fma, [splat, bvec[v], builder.load(slot)]), slot)
            add = builder.icmp_signed("!=", acc_v, ir.Constant(i64, 0))
            for i in range(MR):
                row = builder.gep(pc, [builder.mul(ir.Constant(i64, i), ldc_v)])
                for v in range(NV):
                    ptr = builder.bitcast(builder.gep(row, [ir.Constant(i64, v * W)]), vptr)
                    with builder.if_then(add):
                        old = (builder.call(mload, [ptr, ir.Constant(i32, 4), masks[v], zero]) if masked
                               else builder.load(ptr, align=4))
                        builder.store(builder.fadd(old, builder.load(accs[i * NV + v])), accs[i * NV + v])
                    val = builder.load(accs[i * NV + v])
                    if masked:
                        builder.call(mstore, [val, ptr, ir.Constant(i32, 4), masks[v]])
                    else:
                        builder.store(val, ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile = _make_tile(masked=False)
_tile_masked = _make_tile(masked=True)

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)
U = np.uint64  # unsigned indices: no negative-index wraparound in the loops


def packed_size(m: int, k: int) -> int:
    return -(-m // MR) * MR * k


@_jit
def pack_into(w, wo, m, k, ld, out):
    """Pack the (m, k) matrix at ``w[wo:]`` (row stride ``ld``) into ``out`` (:func:`packed_size`)."""
    for ip in range((m + MR - 1) // MR):
        base = ip * k * MR
        i0 = ip * MR
        im = min(MR, m - i0)
        for kk in range(k):
            o = base + kk * MR
            for i in range(im):
                out[U(o + i)] = w[U(wo + (i0 + i) * ld + kk)]
            for i in range(im, MR):
                out[U(o + i)] = 0.0


def pack(w: np.ndarray, wo: int, m: int, k: int, ld: int) -> np.ndarray:
    out = np.empty(packed_size(m, k), dtype=np.float32)
    pack_into(w, wo, m, k, ld, out)
    return out


@_jit
def _tile_any(k, ap, aoff, bp, bpo, c, co, ldc, cols, accumulate, m, i0, tile, pf):
    if i0 + MR <= m:
        if cols == NR:
            _tile(k, ap, aoff, bp, bpo, NR, c, co, ldc, cols, accumulate, pf)
        else:
            _tile_masked(k, ap, aoff, bp, bpo, NR, c, co, ldc, cols, accumulate, pf)
    else:  # the last rows: through a tile buffer
        _tile(k, ap, aoff, bp, bpo, NR, tile, 0, NR, NR, 0, pf)
        for i in range(m - i0):
            dst = co + i * ldc
            if accumulate:
                for j in range(cols):
                    c[U(dst + j)] += tile[U(i * NR + j)]
            else:
                for j in range(cols):
                    c[U(dst + j)] = tile[U(i * NR + j)]


@_jit
def _pack_b(b, bo, rows, k, j0, cols, out, oo):
    """The ``k x cols`` strip of B at columns ``[j0, j0+cols)``, contiguous, zero-padded to ``NR``."""
    for kk in range(k):
        src = bo + rows[kk] + j0
        dst = oo + kk * NR
        for j in range(cols):
            out[U(dst + j)] = b[U(src + j)]
        for j in range(cols, NR):
            out[U(dst + j)] = 0.0


@_jit
def gemm(ap, m, k, b, bo, rows, c, co, ldc, j_lo, j_hi, accumulate):
    """Columns ``[j_lo, j_hi)`` of ``C (+)= A @ B``: ``A`` packed, row ``kk`` of ``B`` at
    ``b[bo + rows[kk]:]``, C at ``c[co:]`` with row stride ``ldc``; ``accumulate=0`` overwrites.

    B is copied strip by strip (``k x NR``) into a contiguous buffer first: its rows may lie far
    apart (a convolution's channel planes), and every panel of A then reads the strip from
    cache instead of touching ``k`` pages per step. Either operand is re-read for every tile of
    the other; the order that moves fewer bytes is taken: wide outputs pack one strip at a time
    and run every panel over it; narrow ones (deep layers, whose weights are the big operand)
    pack all of B once and stream the weights panel by panel, prefetching the next panel.
    """
    mp = (m + MR - 1) // MR
    nt = (j_hi - j_lo + NR - 1) // NR
    tile = np.empty(MR * NR, np.float32)
    if m * nt <= (j_hi - j_lo) * mp:  # A (m x k) re-read nt times <= B (k x n) re-read mp times
        bp = np.empty(k * NR, np.float32)
        for j0 in range(j_lo, j_hi, NR):
            cols = min(NR, j_hi - j0)
            _pack_b(b, bo, rows, k, j0, cols, bp, 0)
            for ip in range(mp):
                i0 = ip * MR
                _tile_any(k, ap, ip * k * MR, bp, 0, c, co + i0 * ldc + j0, ldc, cols, accumulate, m, i0, tile, 0)
    else:
        bp = np.empty(nt * k * NR, np.float32)
        for t in range(nt):
            j0 = j_lo + t * NR
            _pack_b(b, bo, rows, k, j0, min(NR, j_hi - j0), bp, t * k * NR)
        for ip in range(mp):
            i0 = ip * MR
            for t in range(nt):
                j0 = j_lo + t * NR
                cols = min(NR, j_hi - j0)
                pf = (ip + 1) * k * MR if (t == 0 and ip + 1 < mp) else 0
                _tile_any(k, ap, ip * k * MR, bp, t * k * NR, c, co + i0 * ldc + j0, ldc, cols, accumulate,
                          m, i0, tile, pf)


__all__ = ["AVAILABLE", "MR", "NR", "gemm", "pack", "pack_into", "packed_size"]
