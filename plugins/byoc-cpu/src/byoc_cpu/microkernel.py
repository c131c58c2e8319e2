"""The plugin's float32 GEMM: packed weights times an activation matrix read in place.

``C[m, j_lo:j_hi] (+)= A @ B[:, j_lo:j_hi]``, where ``A`` (the constant: a convolution's
weights) was packed once at load time by :func:`pack`, and ``B`` and ``C`` are blocks of flat
float32 buffers (element offset + leading dimension), so a chunk of a convolution can multiply
straight out of the padded input and into its accumulator.

The inner loop is one register tile: ``MR`` rows of ``A`` times ``NR`` columns of ``B``, kept in
``MR * NR / W`` vector registers of ``W`` floats, one fused multiply-add per register per step
of ``k``. It is written as LLVM IR (a Numba intrinsic) because Numba has no vector type; the
accumulators live in ``alloca`` slots that LLVM promotes to registers. ``W`` is 16 (one AVX-512
register) where the CPU has AVX-512, which is the only case the generated code uses it for
(:data:`AVAILABLE`); elsewhere OpenBLAS is the better GEMM and the plugin calls it instead.

Packed layout (the idea every BLIS-style GEMM uses): depth blocks of ``KC``, inside each
``ceil(m / MR)`` panels of ``MR`` rows, each panel ``kc x MR`` with the ``MR`` values of one
``k`` side by side; rows past ``m`` are zero.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

MR = 8  # rows of A per register tile (part of the packed layout)
KC = 256  # depth block (part of the packed layout)
W = 16  # floats per vector register
NV = 2  # vector registers per tile row
NR = W * NV  # columns of B per register tile


def _has_avx512() -> bool:
    try:
        from llvmlite import binding as llvm

        features = llvm.get_host_cpu_features()
        return bool(features.get("avx512f", False))
    except Exception:  # pragma: no cover - exotic platforms
        return False


#: whether this machine runs the micro-kernel at full width (else the plugin uses OpenBLAS)
AVAILABLE = _has_avx512()


@intrinsic
def _tile(typingctx, kc, a, ao, b, bo, ldb, c, co, ldc, accumulate):
    """``c[co + i*ldc + j] (+)= sum_k a[ao + k*MR + i] * b[bo + k*ldb + j]``, ``i < MR``, ``j < NR``."""
    sig = types.void(types.int64, a, types.int64, b, types.int64, types.int64, c, types.int64, types.int64,
                     types.int64)

    def codegen(context, builder, signature, args):
        kc_v, a_v, ao_v, b_v, bo_v, ldb_v, c_v, co_v, ldc_v, acc_v = args
        f32 = ir.FloatType()
        i64 = ir.IntType(64)
        vec = ir.VectorType(f32, W)
        vptr = vec.as_pointer()
        pa = builder.gep(context.make_array(signature.args[1])(context, builder, a_v).data, [ao_v])
        pb = builder.gep(context.make_array(signature.args[3])(context, builder, b_v).data, [bo_v])
        pc = builder.gep(context.make_array(signature.args[6])(context, builder, c_v).data, [co_v])
        fma_name = f"llvm.fma.v{W}f32"
        fma = builder.module.globals.get(fma_name) or ir.Function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), name=fma_name)
        zero = ir.Constant(vec, [0.0] * W)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(MR * NV)]
        splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), W), [0] * W)
        with cgutils.for_range(builder, kc_v) as loop:
            k = loop.index
            brow = builder.gep(pb, [builder.mul(k, ldb_v)])
            bvec = [builder.load(builder.bitcast(builder.gep(brow, [ir.Constant(i64, v * W)]), vptr), align=4)
                    for v in range(NV)]
            arow = builder.gep(pa, [builder.mul(k, ir.Constant(i64, MR))])
            for i in range(MR):
                av = builder.load(builder.gep(arow, [ir.Constant(i64, i)]), align=4)
                one = builder.insert_element(ir.Constant(vec, ir.Undefined), av, ir.Constant(ir.IntType(32), 0))
                splat = builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), splat_mask)
                for v in range(NV):
                    slot = accs[i * NV + v]
                    builder.store(builder.call(fma, [splat, bvec[v], builder.load(slot)]), slot)
        add = builder.icmp_signed("!=", acc_v, ir.Constant(i64, 0))
        for i in range(MR):
            row = builder.gep(pc, [builder.mul(ir.Constant(i64, i), ldc_v)])
            for v in range(NV):
                ptr = builder.bitcast(builder.gep(row, [ir.Constant(i64, v * W)]), vptr)
                val = builder.load(accs[i * NV + v])
                old = builder.select(add, builder.load(ptr, align=4), zero)
                builder.store(builder.fadd(old, val), ptr, align=4)
        return context.get_dummy_value()

    return sig, codegen


_jit = numba.njit(cache=True, nogil=True, boundscheck=False)
U = np.uint64  # unsigned indices: no negative-index wraparound in the loops


def packed_size(m: int, k: int) -> int:
    return max(1, -(-k // KC)) * -(-m // MR) * KC * MR


@_jit
def pack_into(w, wo, m, k, ld, out):
    """Pack the (m, k) matrix at ``w[wo:]`` (row stride ``ld``) into ``out`` (:func:`packed_size`)."""
    mp = (m + MR - 1) // MR
    for pcb in range((k + KC - 1) // KC):
        pc = pcb * KC
        kc = min(KC, k - pc)
        for ip in range(mp):
            base = (pcb * mp + ip) * KC * MR
            i0 = ip * MR
            im = min(MR, m - i0)
            for kk in range(kc):
                o = base + kk * MR
                for i in range(im):
                    out[U(o + i)] = w[U(wo + (i0 + i) * ld + pc + kk)]
                for i in range(im, MR):
                    out[U(o + i)] = 0.0


def pack(w: np.ndarray, wo: int, m: int, k: int, ld: int) -> np.ndarray:
    out = np.empty(packed_size(m, k), dtype=np.float32)
    pack_into(w, wo, m, k, ld, out)
    return out


@_jit
def gemm(ap, m, k, b, bo, ldb, c, co, ldc, j_lo, j_hi, accumulate):
    """``C[:, j_lo:j_hi] (+)= A @ B[:, j_lo:j_hi]`` with ``A`` packed; B at ``b[bo:]`` (row stride
    ``ldb``), C at ``c[co:]`` (row stride ``ldc``). ``accumulate=0`` overwrites C."""
    mp = (m + MR - 1) // MR
    tile = np.empty(MR * NR, np.float32)
    bt = np.empty(KC * NR, np.float32)
    for pcb in range((k + KC - 1) // KC):
        pc = pcb * KC
        kc = min(KC, k - pc)
        add = 1 if (accumulate or pcb > 0) else 0
        for j0 in range(j_lo, j_hi, NR):
            jn = min(NR, j_hi - j0)
            full_cols = jn == NR
            if not full_cols:  # a partial column panel: zero-padded copy of B
                for kk in range(kc):
                    src = bo + (pc + kk) * ldb + j0
                    for j in range(jn):
                        bt[U(kk * NR + j)] = b[U(src + j)]
                    for j in range(jn, NR):
                        bt[U(kk * NR + j)] = 0.0
            for ip in range(mp):
                i0 = ip * MR
                aoff = (pcb * mp + ip) * KC * MR
                if full_cols and i0 + MR <= m:
                    _tile(kc, ap, aoff, b, bo + pc * ldb + j0, ldb, c, co + i0 * ldc + j0, ldc, add)
                else:
                    if full_cols:
                        _tile(kc, ap, aoff, b, bo + pc * ldb + j0, ldb, tile, 0, NR, 0)
                    else:
                        _tile(kc, ap, aoff, bt, 0, NR, tile, 0, NR, 0)
                    for i in range(min(MR, m - i0)):
                        dst = co + (i0 + i) * ldc + j0
                        if add:
                            for j in range(jn):
                                c[U(dst + j)] += tile[U(i * NR + j)]
                        else:
                            for j in range(jn):
                                c[U(dst + j)] = tile[U(i * NR + j)]


__all__ = ["AVAILABLE", "KC", "MR", "NR", "gemm", "pack", "pack_into", "packed_size"]
