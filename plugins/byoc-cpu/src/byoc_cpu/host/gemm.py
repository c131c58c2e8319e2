"""Matrix products: Gemm and MatMul, and the BLAS entry points the conv kernels use.

Products go to the OpenBLAS library numpy ships, called through ctypes
(``cblas_sgemm``/``cblas_dgemm``; see :mod:`byoc_cpu.host.threads` for how it is found and why
it runs single-threaded): that exposes what numpy does not (leading dimensions, so a GEMM can
read or write a block of a larger matrix, and ``C = alpha*A@B + beta*C`` accumulation), and
lets :func:`gemm_ptr` cut a large product into row or column blocks that run on byoc's thread
pool. Transposed operands are passed as BLAS flags, never copied. Where OpenBLAS is not
reachable (another BLAS under numpy) everything falls back to ``np.dot``/``np.matmul``.

float16/bfloat16 products are computed in float32 and rounded back; integer products use
numpy's integer matmul (no BLAS). Zero-size operands (a K of 0 included) go to byoc's reference
kernel (:func:`byoc_cpu.host.registry.reference`).
"""

from __future__ import annotations

import ctypes

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from byoc.contract import environment as _env
from byoc_cpu.host import threads
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel, reference
from byoc_cpu.tuning import GEMM

# -------------------------------------------------------------------------------------------------
# direct OpenBLAS access

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _bind(name: str, real):
    fn = threads.openblas_symbol(name)
    if fn is None:
        return None
    i = ctypes.c_int64 if threads.blas_int64() else ctypes.c_int
    fn.restype = None
    fn.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int,  # order, transA, transB (C enums)
        i, i, i,  # M, N, K
        real, ctypes.c_void_p, i,  # alpha, A, lda
        ctypes.c_void_p, i,  # B, ldb
        real, ctypes.c_void_p, i,  # beta, C, ldc
    ]
    return fn


_CBLAS = {np.dtype(np.float32): _bind("cblas_sgemm", ctypes.c_float),
          np.dtype(np.float64): _bind("cblas_dgemm", ctypes.c_double)}
_CBLAS = {k: v for k, v in _CBLAS.items() if v is not None}

HAVE_SGEMM = np.dtype(np.float32) in _CBLAS


def have_blas(dtype) -> bool:
    """Whether :func:`gemm_ptr` serves ``dtype`` (float32/float64 with OpenBLAS reachable)."""
    return np.dtype(dtype) in _CBLAS

# a GEMM below this many multiply-adds runs as one call; above it is split over the pool
_PARALLEL_MIN_MACS = GEMM["parallel_min_macs"]
def _has_avx512() -> bool:
    try:
        from llvmlite import binding as llvm

        return bool(llvm.get_host_cpu_features().get("avx512f", False))
    except Exception:  # pragma: no cover - exotic platforms
        return False


#: whether this CPU holds the micro-kernel's 16-float vectors in one register each (AVX-512);
#: elsewhere LLVM splits them and OpenBLAS is the faster GEMM (measured 4-7x on an AVX2 machine)
FULL_WIDTH = _has_avx512()

# byoc's own float32 GEMM where it runs at full width; BYOC_OWN_GEMM=0 sends every float32
# product to OpenBLAS, BYOC_OWN_GEMM=1 uses byoc's on any CPU
_OWN_GEMM = {"0": False, "1": True}.get(_env.get("BYOC_OWN_GEMM"), FULL_WIDTH)
# Gemm/MatMul pack their left operand per call: worth it from this many rows
_OWN_GEMM_MIN_ROWS = GEMM["own_gemm_min_rows"]


def sgemm(m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int, c: int, ldc: int,
          alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False, trans_b: bool = False) -> None:
    """Row-major ``C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C`` on raw float32 pointers.

    ``a``, ``b``, ``c`` are addresses (``arr.ctypes.data`` plus a byte offset); the caller keeps
    the arrays alive and in bounds. Single call on the calling thread (it releases the GIL).
    Only valid when :data:`HAVE_SGEMM`.
    """
    _CBLAS[np.dtype(np.float32)](_ROW_MAJOR, _TRANS if trans_a else _NO_TRANS, _TRANS if trans_b else _NO_TRANS,
                                 m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


def split(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``range(total)`` in at most ``parts`` near-equal pieces."""
    parts = max(1, min(parts, -(-total // align)))
    step = -(-total // parts)
    step = -(-step // align) * align
    return [(s, min(total, s + step)) for s in range(0, total, step)]


def gemm_ptr(dtype, m, n, k, a, lda, b, ldb, c, ldc, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
             parallel: bool = True) -> None:
    """SGEMM/DGEMM on raw pointers (row-major), split over the thread pool when large.

    The output is cut into row blocks (when it is taller than wide) or column blocks; each
    block is one BLAS call on its own slice of the operands. ``parallel=False`` makes one call
    on the calling thread (for use inside a :func:`threads.parallel_for` chunk).
    """
    fn = _CBLAS[np.dtype(dtype)]
    ta = _TRANS if trans_a else _NO_TRANS
    tb = _TRANS if trans_b else _NO_TRANS
    es = np.dtype(dtype).itemsize
    nt = threads.gemm_split() if parallel else 1
    if nt == 1 or m * n * k < _PARALLEL_MIN_MACS:
        fn(_ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        return
    parts = 2 * nt if m * n * k >= 16 * _PARALLEL_MIN_MACS else nt
    if m >= n:
        blocks = split(m, parts, 8)

        def chunk(i):
            r0, r1 = blocks[i]
            a0 = a + r0 * (es if trans_a else lda * es)
            fn(_ROW_MAJOR, ta, tb, r1 - r0, n, k, alpha, a0, lda, b, ldb, beta, c + r0 * ldc * es, ldc)
    else:
        blocks = split(n, parts, 16)

        def chunk(i):
            c0, c1 = blocks[i]
            b0 = b + c0 * (ldb * es if trans_b else es)
            fn(_ROW_MAJOR, ta, tb, m, c1 - c0, k, alpha, a, lda, b0, ldb, beta, c + c0 * es, ldc)

    threads.parallel_for(chunk, len(blocks))


def _blas_ready(x: np.ndarray) -> bool:
    return x.ndim == 2 and x.strides[1] == x.itemsize and x.strides[0] >= x.shape[1] * x.itemsize


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, alpha: float = 1.0, beta: float = 0.0,
                parallel: bool = True) -> None:
    """``out[...] = alpha * a @ b + beta * out`` for 2-D operands, over the thread pool.

    Operands may be row-strided views with unit column stride, or transposes of such views
    (``.T``, passed to BLAS as a flag). Other dtypes/layouts fall back to ``np.dot``.
    """
    dt = out.dtype
    if dt in _CBLAS and a.dtype == dt and b.dtype == dt and _blas_ready(out):
        ta = not _blas_ready(a) and _blas_ready(a.T)
        tb = not _blas_ready(b) and _blas_ready(b.T)
        if (ta or _blas_ready(a)) and (tb or _blas_ready(b)):
            m, k = a.shape
            n = b.shape[1]
            if m == 0 or n == 0:
                return
            if k == 0:
                out[...] = 0 if beta == 0 else beta * out
                return
            es = dt.itemsize
            lda = (a.T if ta else a).strides[0] // es
            ldb = (b.T if tb else b).strides[0] // es
            gemm_ptr(dt, m, n, k, a.ctypes.data, max(lda, 1), b.ctypes.data, max(ldb, 1), out.ctypes.data,
                     max(out.strides[0] // es, 1), alpha, beta, ta, tb, parallel=parallel)
            return
    y = np.dot(a, b)
    if alpha != 1.0:
        y = y * alpha
    if beta != 0.0:
        y = y + beta * out
    out[...] = y


# -------------------------------------------------------------------------------------------------
# helpers shared by the families

_COMPUTE_AS_F32 = {np.dtype(np.float16)}
try:  # bfloat16 arrives as ml_dtypes.bfloat16 when the frontend uses it
    import ml_dtypes

    _COMPUTE_AS_F32.add(np.dtype(ml_dtypes.bfloat16))
except ImportError:  # pragma: no cover
    pass


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a float kernel computes in: float32 for 16-bit floats, else the dtype itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in _COMPUTE_AS_F32 else dtype


def as_compute(x: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """``x`` as a C-contiguous array of its compute dtype (a view when it already is one)."""
    dt = compute_dtype(x.dtype if dtype is None else dtype)
    return np.ascontiguousarray(x, dtype=dt)


# -------------------------------------------------------------------------------------------------
# constant operands


class PackCache:
    """Weights laid out once per constant weight tensor (and compute dtype).

    The execution plan hands a kernel the same read-only array for a constant input on every
    run, but not the very object the factory saw in ``spec.const_inputs``: the first time an
    array shows up it is compared with the constant, and from then on recognised by identity.
    Only read-only arrays are remembered (a writeable one could be changed in place between
    runs); anything else is packed per call.
    """

    def __init__(self, const: np.ndarray | None, make):
        self.const = const
        self.make = make
        self._known: dict = {}  # (id, dtype) -> (array, packed); holds the array so ids stay unique

    def get(self, w: np.ndarray, dt: np.dtype):
        key = (id(w), dt)
        hit = self._known.get(key)
        if hit is not None and hit[0] is w:
            return hit[1]
        c = self.const
        is_const = c is not None and (w is c or (
            not w.flags.writeable and w.shape == c.shape and w.dtype == c.dtype and np.array_equal(w, c)))
        packed = self.make(w, dt)
        if is_const and len(self._known) < 8:
            self._known[key] = (w, packed)
        return packed


# -------------------------------------------------------------------------------------------------
# Gemm


def _product_into(aa: np.ndarray, bb: np.ndarray, out: np.ndarray, alpha: float, beta: float) -> None:
    """``out = alpha * aa @ bb + beta * out`` for 2-D float operands, byoc's GEMM where it pays
    (float32, enough rows to tile, ``bb`` with unit column stride), OpenBLAS otherwise."""
    m, k = aa.shape
    n = bb.shape[1]
    if (out.dtype == np.float32 and m >= _OWN_GEMM_MIN_ROWS and use_own_gemm(m, n, k) and bb.dtype == np.float32
            and bb.strides[1] == 4 and out.flags.c_contiguous):
        if beta != 0.0 and beta != 1.0:
            out *= np.float32(beta)
        if alpha != 1.0:
            aa = aa * np.float32(alpha)
        gemm_acc(pack_a(aa), m, k, bb, out, init=beta == 0.0)
        return
    matmul_into(aa, bb, out, alpha, beta)


def _as_2d_bias(c: np.ndarray, m: int, n: int, spec: NodeSpec) -> np.ndarray:
    """C broadcast unidirectionally to (M, N), returned as (1|M, 1|N)."""
    if c.ndim > 2:
        raise spec.error(f"C must have rank <= 2, got shape {list(c.shape)}")
    shape = (1,) * (2 - c.ndim) + tuple(c.shape)
    if shape[0] not in (1, m) or shape[1] not in (1, n):
        raise spec.error(f"C of shape {list(c.shape)} does not broadcast to the output shape [{m}, {n}]")
    return c.reshape(shape)


@kernel("Gemm")
def make_gemm(spec: NodeSpec):
    alpha = float(spec.attr("alpha", 1.0))
    beta = float(spec.attr("beta", 1.0))
    trans_a = bool(spec.attr("transA", 0))
    trans_b = bool(spec.attr("transB", 0))

    # a constant B is laid out (K, N) row-major once: byoc's GEMM reads B in place with unit
    # column stride (for a B that changes per run the transpose stays a view, a BLAS flag)
    b_const = spec.const_inputs.get(1)

    def lay_out(b, dt):
        bc = np.asarray(b, dtype=dt)
        return np.ascontiguousarray(bc.T if trans_b else bc)

    b_cache = PackCache(b_const if b_const is not None and b_const.ndim == 2 else None, lay_out)
    ref = reference(spec)

    def run(a, b, c=None):
        if a.size == 0 or b.size == 0:
            return ref(a, b, c)
        if a.ndim != 2 or b.ndim != 2:
            raise spec.error(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
        out_dtype = a.dtype
        if b_cache.const is not None and b.shape == b_cache.const.shape:
            bb = b_cache.get(b, compute_dtype(b.dtype))
        else:
            bb = as_compute(b)
            bb = bb.T if trans_b else bb
        aa = as_compute(a, bb.dtype)
        aa = aa.T if trans_a else aa
        if aa.shape[1] != bb.shape[0]:
            raise spec.error(
                f"inner dimensions differ: A{'^T' if trans_a else ''} is {list(aa.shape)}, "
                f"B{'^T' if trans_b else ''} is {list(bb.shape)}"
            )
        m, n = aa.shape[0], bb.shape[1]
        dt = aa.dtype
        use_c = c is not None and beta != 0.0
        c2 = _as_2d_bias(c, m, n, spec) if use_c else None
        spec.check_alloc((m, n), dt if dt.kind == "f" else np.int64)  # (M, 1) x (1, N) can be huge
        if dt.kind == "f":
            y = spec.alloc.empty((m, n), dt)
            if use_c:
                y[...] = c2  # broadcast copy; BLAS adds the product onto it (beta)
            _product_into(aa, bb, y, alpha, beta if use_c else 0.0)
        else:  # integer Gemm: numpy's integer product, ONNX keeps the input type
            y = np.dot(aa, bb)
            if alpha != 1.0:
                y = y * alpha
            if use_c:
                y = y + (beta * c2 if beta != 1.0 else c2)
            y = y.astype(dt)
        if y.dtype != out_dtype:
            y = y.astype(out_dtype)
        return (y,)

    return run


# -------------------------------------------------------------------------------------------------
# MatMul


def _batched(aa: np.ndarray, bb: np.ndarray, spec: NodeSpec) -> np.ndarray:
    """``aa @ bb`` for operands of rank >= 2 with broadcast batch axes, batches over the pool."""
    try:
        batch = np.broadcast_shapes(aa.shape[:-2], bb.shape[:-2])
    except ValueError:
        raise spec.error(f"batch dimensions of {list(aa.shape)} and {list(bb.shape)} do not broadcast") from None
    m, n = aa.shape[-2], bb.shape[-1]
    out = spec.alloc.empty(batch + (m, n), aa.dtype)
    a_b = np.broadcast_to(aa, batch + aa.shape[-2:])
    b_b = np.broadcast_to(bb, batch + bb.shape[-2:])
    nb = int(np.prod(batch, dtype=np.int64))
    if nb == 0:
        return out
    out_f = out.reshape(nb, m, n)
    blocks = split(nb, threads.gemm_split())
    inner = len(blocks) == 1  # one block: each product may split itself over the pool

    def chunk(i):
        for j in range(*blocks[i]):
            idx = np.unravel_index(j, batch)
            matmul_into(a_b[idx], b_b[idx], out_f[j], parallel=inner)

    threads.gemm_for(chunk, len(blocks))
    return out


@kernel("MatMul")
def make_matmul(spec: NodeSpec):
    b_const = spec.const_inputs.get(1)
    b_cache = PackCache(b_const if b_const is not None and b_const.ndim == 2 else None,
                        lambda b, dt: np.ascontiguousarray(b, dtype=dt))
    ref = reference(spec)

    def run(a, b):
        if a.size == 0 or b.size == 0:
            return ref(a, b)
        out_dtype = a.dtype
        if a.ndim == 0 or b.ndim == 0:
            raise spec.error("MatMul operands must have rank >= 1")
        ka = a.shape[-1]
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if ka != kb:
            raise spec.error(f"inner dimensions differ: A is {list(a.shape)}, B is {list(b.shape)}")
        if b_cache.const is not None and b.shape == b_cache.const.shape and b.dtype.kind == "f":
            bb = b_cache.get(b, compute_dtype(b.dtype))
        else:
            bb = as_compute(b) if b.dtype.kind == "f" else b
        aa = as_compute(a, bb.dtype) if a.dtype.kind == "f" else a
        if aa.dtype != bb.dtype or aa.dtype not in _CBLAS or aa.ndim == 1 or bb.ndim == 1:
            if aa.ndim > 2 or bb.ndim > 2:
                try:
                    np.broadcast_shapes(aa.shape[:-2], bb.shape[:-2] if bb.ndim > 1 else ())
                except ValueError:
                    raise spec.error(f"batch dimensions of {list(a.shape)} and {list(b.shape)} do not broadcast") from None
            a_sh = (1,) + aa.shape if aa.ndim == 1 else aa.shape
            b_sh = bb.shape + (1,) if bb.ndim == 1 else bb.shape
            try:
                spec.check_alloc(np.broadcast_shapes(a_sh[:-2], b_sh[:-2]) + (a_sh[-2], b_sh[-1]),
                                 np.result_type(aa.dtype, bb.dtype))
            except ValueError:
                pass  # numpy names the mismatch below
            y = np.matmul(aa, bb)
        elif bb.ndim == 2:
            # (..., M, K) @ (K, N): one GEMM over all leading rows instead of one per batch
            y = spec.alloc.empty(aa.shape[:-1] + (bb.shape[1],), aa.dtype)
            _product_into(aa.reshape(-1, ka), bb, y.reshape(-1, bb.shape[1]), 1.0, 0.0)
        else:
            y = _batched(aa, bb, spec)
        if y.dtype != out_dtype:
            y = y.astype(out_dtype)
        return (y,)

    return run


# -------------------------------------------------------------------------------------------------
# byoc's own float32 GEMM: an AVX-512-width register-tiled micro-kernel written in LLVM IR
#
# OpenBLAS's SGEMM is the fallback for everything, but in the development environment it runs
# its AVX2 kernels (OPENBLAS_CORETYPE=Haswell, see threads.py): ~115 GFLOP/s on one Zen 5
# core. The micro-kernel below keeps an 8 x 32 tile of C in 16 vector registers (<16 x float>,
# one zmm each where the CPU has AVX-512; LLVM splits them on narrower machines) and runs
# 150-235 GFLOP/s on one core on ResNet-50's layer shapes (onnxruntime's MLAS: ~240).
# Constant operands (conv weights) are packed into MR-row panels once; the other operand is
# read in place (packing it into column panels measured slower on every ResNet-50 shape).

MR, _NV, _W = 8, 2, 16
NR = _NV * _W
_KC = 256
_MCP = 32  # row panels per L2 block of A: 32 * 8 rows * 256 deep * 4 bytes = 256 KiB


def ir_vector_ops(builder, width: int):
    """``(vector type, fma(a, b, c), splat(scalar))`` for vectors of ``width`` float32: the pieces
    of byoc's LLVM IR register tiles (this micro-kernel and :mod:`byoc_cpu.host.blocked`)."""
    vty = ir.VectorType(ir.FloatType(), width)
    fname = f"llvm.fma.v{width}f32"
    fn = builder.module.globals.get(fname)
    if fn is None:
        fn = ir.Function(builder.module, ir.FunctionType(vty, [vty, vty, vty]), name=fname)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)

    def fma(a, b, c):
        return builder.call(fn, [a, b, c])

    def splat(value):
        v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), mask)

    return vty, fma, splat


def ir_transpose_store(builder, vty, rows, py, ldc, count: int, pr=None, relu=False, res_on=None) -> None:
    """Store the transpose of ``rows`` (up to 8 vectors of 8 floats: pixel ``i``'s 8 channels)
    as 8 channel runs of ``count`` pixels each: ``py[k*ldc + i] = rows[i][k]``, through the
    unpack / shuffle / 128-bit-lane steps of an 8x8 transpose (missing rows are undefined). The
    planar store of the tiles that hold pixels x channels (the narrow form below,
    :mod:`byoc_cpu.host.blocked`). An epilogue on the way: with ``pr`` (a residual laid out as the
    output) ``+ pr[k*ldc + i]``, then with ``relu`` ``max(v, 0)`` (as byoc's Relu: NaN and -0.0 kept).
    ``relu`` and ``res_on`` may be run-time flags (``i1`` values) instead: one store for every
    epilogue (``pr`` is then always read, so it must point at readable memory laid out as the
    output, the output itself where there is no residual), the add or Relu selected per value."""
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
        for width in (8, 4, 2, 1):
            if count - done >= width:
                piece = shuf(cols[k], undef, list(range(done, done + width)))
                pty = ir.VectorType(ir.FloatType(), width).as_pointer()
                at = [builder.mul(ir.Constant(i64, k), ldc), ir.Constant(i64, done)]
                if pr is not None:
                    res = builder.load(builder.bitcast(builder.gep(builder.gep(pr, at[:1]), at[1:]), pty), align=4)
                    added = builder.fadd(piece, res)
                    piece = added if res_on is None else builder.select(res_on, added, piece)
                if relu is not False:
                    zero = ir.Constant(piece.type, [0.0] * width)
                    neg = builder.fcmp_ordered("<", piece, zero)
                    if relu is not True:  # a run-time flag
                        neg = builder.and_(neg, _splat_bool(builder, relu, width))
                    piece = builder.select(neg, zero, piece)
                builder.store(piece, builder.bitcast(builder.gep(dst, at[1:]), pty), align=4)
                done += width


def _splat_bool(builder, flag, width: int):
    """An ``i1`` value as a vector of ``width`` lanes."""
    vec = ir.VectorType(ir.IntType(1), width)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), flag, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))


def ir_store_tile(builder, vty, accs, mr: int, nv: int, py, ldc, pr=None, relu=False, res_on=None) -> None:
    """Store a register tile of ``mr`` pixels x ``nv`` vectors of ``vty`` (``accs[i*nv + v]``:
    pixel ``i``'s channels ``[v*W, (v+1)*W)``) into planar output: channel ``j`` of pixel ``i``
    at ``py[j*ldc + i]``, through an 8x8 transpose (:func:`ir_transpose_store`, with its epilogue:
    ``pr`` a residual at the same offsets, ``relu``) per 8 lanes and up to 8 pixels."""
    i64, vw = ir.IntType(64), vty.count
    vty8 = ir.VectorType(ir.FloatType(), 8)
    for v in range(nv):
        for h in range(vw // 8):
            mask = ir.Constant(ir.VectorType(ir.IntType(32), 8), list(range(8 * h, 8 * h + 8)))
            for r0 in range(0, mr, 8):
                rows = [accs[i * nv + v] if vw == 8 else
                        builder.shuffle_vector(accs[i * nv + v], ir.Constant(vty, ir.Undefined), mask)
                        for i in range(r0, min(mr, r0 + 8))]
                at = [builder.add(builder.mul(ir.Constant(i64, v * vw + 8 * h), ldc), ir.Constant(i64, r0))]
                res = None if pr is None else builder.gep(pr, at)
                ir_transpose_store(builder, vty8, rows, builder.gep(py, at), ldc, len(rows), res, relu, res_on)


def ir_merge(builder, vty, a: list, from_a, b: list, from_b) -> list:
    """Phi nodes joining two lists of values: ``a[i]`` when control came from block ``from_a``,
    ``b[i]`` when from ``from_b``."""
    merged = []
    for x, y in zip(a, b):
        phi = builder.phi(vty)
        phi.add_incoming(x, from_a)
        phi.add_incoming(y, from_b)
        merged.append(phi)
    return merged


def ir_accumulate(builder, count, n_acc: int, vty, body, init=None) -> list:
    """Emit ``for k in range(count): accs = body(k, accs)`` over ``n_acc`` vector accumulators
    that start at zero (or at the values ``init``) and stay in registers (phi nodes); returns
    their values after the loop (the start values when ``count <= 0``)."""
    i64 = ir.IntType(64)
    zero = ir.Constant(vty, [0.0] * vty.count)
    start = list(init) if init is not None else [zero] * n_acc
    entry = builder.block
    loop = builder.append_basic_block("acc.loop")
    done = builder.append_basic_block("acc.done")
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    k = builder.phi(i64)
    k.add_incoming(ir.Constant(i64, 0), entry)
    accs = [builder.phi(vty) for _ in range(n_acc)]
    for phi, value in zip(accs, start):
        phi.add_incoming(value, entry)
    new = body(k, accs)
    k2 = builder.add(k, ir.Constant(i64, 1))
    end = builder.block
    k.add_incoming(k2, end)
    for phi, value in zip(accs, new):
        phi.add_incoming(value, end)
    builder.cbranch(builder.icmp_signed("<", k2, count), loop, done)
    builder.position_at_end(done)
    return ir_merge(builder, vty, start, entry, new, end)


def _emit_tile(builder, kc_v, pa, b_row, pc, ldc_v, pbias, init_v):
    """LLVM IR of the micro-kernel: an MR x NR tile of ``sum_k A[k, i] * B_k[j]`` in registers
    (``b_row(k)`` gives the pointer to B's row ``k``), then stored as ``bias + acc`` (init) or
    added to C."""
    vty, fma, splat = ir_vector_ops(builder, _W)
    vptr = vty.as_pointer()
    i64 = ir.IntType(64)

    def body(k, accs):
        brow = b_row(k)
        bvec = [builder.load(builder.bitcast(builder.gep(brow, [ir.Constant(i64, v * _W)]), vptr), align=4)
                for v in range(_NV)]
        arow = builder.mul(k, ir.Constant(i64, MR))
        new = []
        for i in range(MR):
            sv = splat(builder.load(builder.gep(pa, [builder.add(arow, ir.Constant(i64, i))]), align=4))
            new += [fma(sv, bvec[v], accs[i * _NV + v]) for v in range(_NV)]
        return new

    fin = ir_accumulate(builder, kc_v, MR * _NV, vty, body)
    init_b = builder.icmp_unsigned("!=", init_v, ir.Constant(init_v.type, 0))
    with builder.if_else(init_b) as (then, otherwise):
        with then:
            for i in range(MR):
                sv = splat(builder.load(builder.gep(pbias, [ir.Constant(i64, i)]), align=4))
                for v in range(_NV):
                    off = builder.add(builder.mul(ir.Constant(i64, i), ldc_v), ir.Constant(i64, v * _W))
                    ptr = builder.bitcast(builder.gep(pc, [off]), vptr)
                    builder.store(builder.fadd(sv, fin[i * _NV + v]), ptr, align=4)
        with otherwise:
            for i in range(MR):
                for v in range(_NV):
                    off = builder.add(builder.mul(ir.Constant(i64, i), ldc_v), ir.Constant(i64, v * _W))
                    ptr = builder.bitcast(builder.gep(pc, [off]), vptr)
                    builder.store(builder.fadd(builder.load(ptr, align=4), fin[i * _NV + v]), ptr, align=4)


@intrinsic
def _ukernel(typingctx, kc, a, aoff, b, boff, ldb, c, coff, ldc, bias, bi, init):
    """``acc[i, j] = sum_k a[aoff + k*MR + i] * b[boff + k*ldb + j]`` for i < MR, j < NR, then
    ``c[coff + i*ldc + j] = acc + bias[bi + i]`` when ``init`` else ``c[...] += acc``."""
    sig = types.void(types.intp, a, types.intp, b, types.intp, types.intp, c, types.intp, types.intp, bias,
                     types.intp, types.boolean)

    def codegen(context, builder, signature, args):
        kc_v, a_v, aoff_v, b_v, boff_v, ldb_v, c_v, coff_v, ldc_v, bias_v, bi_v, init_v = args
        pa = builder.gep(context.make_array(signature.args[1])(context, builder, a_v).data, [aoff_v])
        pb = builder.gep(context.make_array(signature.args[3])(context, builder, b_v).data, [boff_v])
        pc = builder.gep(context.make_array(signature.args[6])(context, builder, c_v).data, [coff_v])
        pbias = builder.gep(context.make_array(signature.args[9])(context, builder, bias_v).data, [bi_v])
        _emit_tile(builder, kc_v, pa, lambda k: builder.gep(pb, [builder.mul(k, ldb_v)]), pc, ldc_v, pbias, init_v)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _ukernel_rows(typingctx, kc, a, aoff, b, rowoff, r0, j0, c, coff, ldc, bias, bi, init):
    """:func:`_ukernel` with B row ``k`` at ``b[rowoff[r0 + k] + j0 :]`` (an implicit GEMM:
    the rows of B are gathered by offset, e.g. kernel taps over a padded image)."""
    sig = types.void(types.intp, a, types.intp, b, rowoff, types.intp, types.intp, c, types.intp, types.intp, bias,
                     types.intp, types.boolean)

    def codegen(context, builder, signature, args):
        kc_v, a_v, aoff_v, b_v, ro_v, r0_v, j0_v, c_v, coff_v, ldc_v, bias_v, bi_v, init_v = args
        pa = builder.gep(context.make_array(signature.args[1])(context, builder, a_v).data, [aoff_v])
        pb = builder.gep(context.make_array(signature.args[3])(context, builder, b_v).data, [j0_v])
        pro = builder.gep(context.make_array(signature.args[4])(context, builder, ro_v).data, [r0_v])
        pc = builder.gep(context.make_array(signature.args[7])(context, builder, c_v).data, [coff_v])
        pbias = builder.gep(context.make_array(signature.args[10])(context, builder, bias_v).data, [bi_v])
        _emit_tile(builder, kc_v, pa, lambda k: builder.gep(pb, [builder.load(builder.gep(pro, [k]), align=8)]),
                   pc, ldc_v, pbias, init_v)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack_a(a, out):
    m, k = a.shape
    mp = (m + MR - 1) // MR
    for pcb in range((k + _KC - 1) // _KC):
        pc = pcb * _KC
        kc = min(_KC, k - pc)
        for ip in range(mp):
            base = (pcb * mp + ip) * _KC * MR
            i0 = ip * MR
            im = min(MR, m - i0)
            for kk in range(kc):
                o = base + kk * MR
                for i in range(im):
                    out[o + i] = a[i0 + i, pc + kk]
                for i in range(im, MR):
                    out[o + i] = 0


def pack_a(a: np.ndarray) -> np.ndarray:
    """``a`` (M, K) float32 in the micro-kernel's panel layout (for :func:`gemm_acc`)."""
    m, k = a.shape
    out = np.zeros(max(1, -(-k // _KC)) * -(-m // MR) * _KC * MR, dtype=np.float32)
    _pack_a(a, out)
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gemm_direct(ap, m, k, b, c, j_lo, j_hi, ip_lo, ip_hi, bias, init):
    """``c[rows, j_lo:j_hi] (+)= A[rows] @ b[:, j_lo:j_hi]`` for the rows of A's panels
    ``[ip_lo, ip_hi)``: with ``init`` the result (plus ``bias[row]``) replaces ``c``, else it is
    added. B is read in place (unit column stride); a partial last column panel is copied
    (zero-padded) once per depth block. ``bias`` holds at least ``mp*MR`` values."""
    mp = (m + MR - 1) // MR
    ldc = c.strides[0] // 4
    ldb = b.strides[0] // 4
    tile = np.empty(MR * NR, np.float32)
    bt = np.empty(_KC * NR, np.float32)
    bflat = b[0]  # base pointer; rows are reached through ldb
    cflat = c[0]
    for pcb in range((k + _KC - 1) // _KC):
        pc = pcb * _KC
        kc = min(_KC, k - pc)
        first = init and pcb == 0
        # row blocks of A small enough to stay in L2 while every column panel passes by
        for ib in range(ip_lo, ip_hi, _MCP):
            ie = min(ip_hi, ib + _MCP)
            for j0 in range(j_lo, j_hi, NR):
                jn = min(NR, j_hi - j0)
                if jn == NR:
                    for ip in range(ib, ie):
                        i0 = ip * MR
                        aoff = (pcb * mp + ip) * _KC * MR
                        if i0 + MR <= m:
                            _ukernel(kc, ap, aoff, bflat, pc * ldb + j0, ldb, cflat, i0 * ldc + j0, ldc, bias, i0, first)
                        else:
                            tile[:] = 0
                            _ukernel(kc, ap, aoff, bflat, pc * ldb + j0, ldb, tile, 0, NR, bias, i0, False)
                            for i in range(m - i0):
                                for j in range(NR):
                                    if first:
                                        c[i0 + i, j0 + j] = tile[i * NR + j] + bias[i0 + i]
                                    else:
                                        c[i0 + i, j0 + j] += tile[i * NR + j]
                else:
                    for kk in range(kc):
                        for j in range(jn):
                            bt[kk * NR + j] = b[pc + kk, j0 + j]
                        for j in range(jn, NR):
                            bt[kk * NR + j] = 0
                    for ip in range(ib, ie):
                        i0 = ip * MR
                        im = min(MR, m - i0)
                        aoff = (pcb * mp + ip) * _KC * MR
                        tile[:] = 0
                        _ukernel(kc, ap, aoff, bt, 0, NR, tile, 0, NR, bias, i0, False)
                        for i in range(im):
                            for j in range(jn):
                                if first:
                                    c[i0 + i, j0 + j] = tile[i * NR + j] + bias[i0 + i]
                                else:
                                    c[i0 + i, j0 + j] += tile[i * NR + j]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gemm_rows(ap, m, k, b, bo, rowoff, c, co, ldc, j_lo, j_hi, ip_lo, ip_hi, bias, init):
    """:func:`_gemm_direct` for an implicit B on flat buffers: row ``kk`` of B is
    ``b[bo + rowoff[kk]:]``, C at ``c[co:]`` with row stride ``ldc`` (1-D ``b`` and ``c``)."""
    mp = (m + MR - 1) // MR
    tile = np.empty(MR * NR, np.float32)
    bt = np.empty(_KC * NR, np.float32)
    zero_off = np.arange(_KC) * NR
    for pcb in range((k + _KC - 1) // _KC):
        pc = pcb * _KC
        kc = min(_KC, k - pc)
        first = init and pcb == 0
        for ib in range(ip_lo, ip_hi, _MCP):
            ie = min(ip_hi, ib + _MCP)
            for j0 in range(j_lo, j_hi, NR):
                jn = min(NR, j_hi - j0)
                if jn == NR:
                    for ip in range(ib, ie):
                        i0 = ip * MR
                        aoff = (pcb * mp + ip) * _KC * MR
                        if i0 + MR <= m:
                            _ukernel_rows(kc, ap, aoff, b, rowoff, pc, bo + j0, c, co + i0 * ldc + j0, ldc, bias, i0,
                                          first)
                        else:
                            tile[:] = 0
                            _ukernel_rows(kc, ap, aoff, b, rowoff, pc, bo + j0, tile, 0, NR, bias, i0, False)
                            for i in range(m - i0):
                                o = co + (i0 + i) * ldc + j0
                                for j in range(NR):
                                    if first:
                                        c[o + j] = tile[i * NR + j] + bias[i0 + i]
                                    else:
                                        c[o + j] += tile[i * NR + j]
                else:
                    for kk in range(kc):
                        o = bo + rowoff[pc + kk] + j0
                        for j in range(jn):
                            bt[kk * NR + j] = b[o + j]
                        for j in range(jn, NR):
                            bt[kk * NR + j] = 0
                    for ip in range(ib, ie):
                        i0 = ip * MR
                        im = min(MR, m - i0)
                        aoff = (pcb * mp + ip) * _KC * MR
                        tile[:] = 0
                        _ukernel_rows(kc, ap, aoff, bt, zero_off, 0, 0, tile, 0, NR, bias, i0, False)
                        for i in range(im):
                            o = co + (i0 + i) * ldc + j0
                            for j in range(jn):
                                if first:
                                    c[o + j] = tile[i * NR + j] + bias[i0 + i]
                                else:
                                    c[o + j] += tile[i * NR + j]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gemm_table(ap, m, k, b, bo, rows, c, co, ldc, j_lo, j_hi, accumulate):
    """:func:`gemm_table` in one compiled call (no Python between the plugin's call and the tile
    loops: ~10 us saved per call)."""
    mp = (m + MR - 1) // MR
    if k == 0:
        if not accumulate:
            for i in range(m):
                for j in range(j_lo, j_hi):
                    c[co + i * ldc + j] = 0.0
        return
    _gemm_rows(ap, m, k, b, bo, rows, c, co, ldc, j_lo, j_hi, 0, mp, np.zeros(mp * MR, np.float32),
               accumulate == 0)


def gemm_rows(ap: np.ndarray, m: int, b: np.ndarray, rowoff: np.ndarray, c: np.ndarray, j_lo: int, j_hi: int,
              ip_lo: int = 0, ip_hi: int | None = None, init: bool = False, bias: np.ndarray | None = None) -> None:
    """Implicit GEMM on the calling thread: ``c[rows, j_lo:j_hi] (+)= A @ B`` where row ``k`` of
    B is ``b[rowoff[k] + j_lo : rowoff[k] + j_hi]`` of the 1-D float32 ``b`` and ``A`` (M, K) is
    packed by :func:`pack_a`; rows of A's panels ``[ip_lo, ip_hi)`` (default: all)."""
    mp = -(-m // MR)
    if m == 0 or j_hi <= j_lo:
        return
    bb = np.zeros(mp * MR, np.float32)
    if bias is not None:
        bb[:m] = bias
    # C as a flat buffer from its first element (rows ``ldc`` apart); a contiguous C as a plain
    # view, the layout gemm_table's callers pass (one compiled specialisation for both)
    ldc = c.strides[0] // 4
    if c.flags.c_contiguous:
        flat = c.reshape(-1)
    else:
        flat = np.lib.stride_tricks.as_strided(c, shape=((m - 1) * ldc + c.shape[1],), strides=(4,))
    _gemm_rows(ap, m, rowoff.shape[0], b, 0, rowoff, flat, 0, ldc, j_lo, j_hi, ip_lo, mp if ip_hi is None else ip_hi,
               bb, init)


def gemm_acc(ap: np.ndarray, m: int, k: int, b: np.ndarray, c: np.ndarray, parallel: bool = True,
             init: bool = False, bias: np.ndarray | None = None) -> None:
    """``c += A @ b`` (float32) with ``A`` (M, K) packed by :func:`pack_a`; with ``init``,
    ``c = A @ b + bias[:, None]`` instead (``c`` is not read; no bias: zero).

    ``b`` (K, N) and ``c`` (M, N) are 2-D float32 views with unit column stride (any row
    stride). Wide outputs are split into column blocks, narrow ones into row blocks, over the
    pool (``parallel=False``: one call on the calling thread, for use inside a chunk).
    """
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    mp = -(-m // MR)
    bb = np.zeros(mp * MR, np.float32)
    if bias is not None:
        bb[:m] = bias
    if k == 0:
        if init:
            c[...] = bb[:m, None]
        return
    nt = threads.num_threads() if parallel and m * n * k >= _PARALLEL_MIN_MACS else 1
    if nt == 1:
        _gemm_direct(ap, m, k, b, c, 0, n, 0, mp, bb, init)
    elif n >= 2 * NR * nt:
        blocks = split(n, 2 * nt, NR)
        threads.parallel_for(lambda i: _gemm_direct(ap, m, k, b, c, *blocks[i], 0, mp, bb, init), len(blocks))
    else:
        blocks = split(mp, 2 * nt)
        threads.parallel_for(lambda i: _gemm_direct(ap, m, k, b, c, 0, n, *blocks[i], bb, init), len(blocks))


def pack(w: np.ndarray, wo: int, m: int, k: int, ld: int) -> np.ndarray:
    """The (M, K) matrix at ``w[wo:]`` (flat float32, row stride ``ld``) packed for
    :func:`gemm_acc`, :func:`gemm_rows` and :func:`gemm_table`: the form a plugin prepares its
    constant weights in, once, at load time."""
    if m == 0 or k == 0:
        return np.zeros(MR * _KC, np.float32)
    need = wo + (m - 1) * ld + k
    if wo < 0 or ld < k or need > w.shape[0]:
        raise ValueError(f"pack: a ({m}, {k}) matrix with row stride {ld} at offset {wo} does not fit "
                         f"in {w.shape[0]} elements")
    view = np.lib.stride_tricks.as_strided(w[wo:], shape=(m, k), strides=(ld * 4, 4), writeable=False)
    return pack_a(view)


def gemm_table(ap: np.ndarray, m: int, k: int, b: np.ndarray, bo: int, rows: np.ndarray, c: np.ndarray, co: int,
               ldc: int, j_lo: int, j_hi: int, accumulate: int) -> None:
    """Columns ``[j_lo, j_hi)`` of ``C (+)= A @ B`` on flat float32 buffers, on the calling thread:
    ``A`` (M, K) packed by :func:`pack`, row ``kk`` of ``B`` at ``b[bo + rows[kk]:]`` (an int64
    row table: ``rows[kk] = kk * ldb`` is a plain matrix; a KxK convolution lists where each
    (channel, tap) row of the padded input starts), C at ``c[co:]`` with row stride ``ldc``;
    ``accumulate=0`` overwrites C. The caller keeps every access in bounds."""
    if m == 0 or j_hi <= j_lo:
        return
    _gemm_table(ap, m, k, b, bo, rows, c, co, ldc, j_lo, j_hi, accumulate)


# -------------------------------------------------------------------------------------------------
# the narrow-output form: vectors along M, pixels broadcast
#
# With few columns (a 7x7 feature map: 49 to 63), the micro-kernel above pads each row of C to a
# multiple of NR = 32 and computes 64 columns for 49: three quarters of its work is useful. The
# kernel below turns the product around: a tile is TR = 7 columns of C (7 pixels: one output row of
# a 7x7 or half of a 14x14 map) by CW = 32 rows (output channels, two vectors), A is packed with
# its rows along the vector (:func:`pack_narrow`), B's entries are broadcast. Measured on one Zen 5
# core: ResNet-50's 7x7 GEMMs 152-165 -> 205-229 GFLOP/s; wider outputs stay with the NR form.

TR, _NVT = 7, 2
CW = _NVT * _W
#: outputs at most this many columns wide take the narrow form (:func:`prefers_narrow`)
NARROW_MAX_COLS = GEMM["narrow_max_columns"]


def _narrow_body(context, builder, signature, args):
    """The narrow tile's loop, for the intrinsics whose first ten arguments are ``kc, w, woff, b,
    bo, rowoff, r0, px, pxo, s``: ``(accumulators, vector type, data)``, ``TR * _NVT``
    accumulators (pixel ``r``'s vector ``v`` at ``r * _NVT + v``) over ``kc`` rows of A's panel
    and of B; ``data(i, off)`` points at element ``off`` of array argument ``i``."""

    def data(i, off):
        return builder.gep(context.make_array(signature.args[i])(context, builder, args[i]).data, [off])

    kc_v = args[0]
    pw, pb, pro, ppx = data(1, args[2]), data(3, args[4]), data(5, args[6]), data(7, args[8])
    i64 = ir.IntType(64)
    vty, fma, splat = ir_vector_ops(builder, _W)
    vptr = vty.as_pointer()
    pxs = [builder.load(builder.gep(ppx, [ir.Constant(i64, r)]), align=8) for r in range(TR)]

    def body(k, accs):
        wrow = builder.gep(pw, [builder.mul(k, ir.Constant(i64, CW))])
        wv = [builder.load(builder.bitcast(builder.gep(wrow, [ir.Constant(i64, v * _W)]), vptr), align=4)
              for v in range(_NVT)]
        brow = builder.gep(pb, [builder.load(builder.gep(pro, [k]), align=8)])
        new = []
        for r in range(TR):
            sv = splat(builder.load(builder.gep(brow, [pxs[r]]), align=4))
            new += [fma(sv, wv[v], accs[r * _NVT + v]) for v in range(_NVT)]
        return new

    return ir_accumulate(builder, kc_v, TR * _NVT, vty, body), vty, data


@intrinsic
def _ukernel_t(typingctx, kc, w, woff, b, bo, rowoff, r0, px, pxo, s, soff, init):
    """``acc[r, i] = sum_k w[woff + k*CW + i] * b[bo + rowoff[r0 + k] + px[pxo + r]]`` for
    r < TR, i < CW, stored to ``s[soff + r*CW + i]`` (``init``) or added to it."""
    sig = types.void(types.intp, w, types.intp, b, types.intp, rowoff, types.intp, px, types.intp, s, types.intp,
                     types.boolean)

    def codegen(context, builder, signature, args):
        init_v = args[11]
        i64 = ir.IntType(64)
        fin, vty, data = _narrow_body(context, builder, signature, args)
        vptr = vty.as_pointer()
        ps = data(9, args[10])
        init_b = builder.icmp_unsigned("!=", init_v, ir.Constant(init_v.type, 0))
        ptrs = [[builder.bitcast(builder.gep(ps, [ir.Constant(i64, r * CW + v * _W)]), vptr) for v in range(_NVT)]
                for r in range(TR)]
        with builder.if_else(init_b) as (then, otherwise):
            with then:
                for r in range(TR):
                    for v in range(_NVT):
                        builder.store(fin[r * _NVT + v], ptrs[r][v], align=4)
            with otherwise:
                for r in range(TR):
                    for v in range(_NVT):
                        builder.store(builder.fadd(builder.load(ptrs[r][v], align=4), fin[r * _NVT + v]),
                                      ptrs[r][v], align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _ukernel_t_out(typingctx, kc, w, woff, b, bo, rowoff, r0, px, pxo, s, soff, first, c, co, ldc, bias, bi):
    """:func:`_ukernel_t` for a whole tile's last depth block, stored straight into C: ``c[co +
    i*ldc + r] = acc[r, i] + bias[bi + i]`` (plus ``s[soff + r*CW + i]``, the earlier depth
    blocks' sums, unless ``first``), for all TR columns and CW rows, through 8x8 transposes (no
    scalar copy through ``s``)."""
    sig = types.void(types.intp, w, types.intp, b, types.intp, rowoff, types.intp, px, types.intp, s, types.intp,
                     types.boolean, c, types.intp, types.intp, bias, types.intp)

    def codegen(context, builder, signature, args):
        first_v, ldc_v = args[11], args[14]
        i64 = ir.IntType(64)
        fin, vty, data = _narrow_body(context, builder, signature, args)
        vptr = vty.as_pointer()
        ps, pc, pbias = data(9, args[10]), data(12, args[13]), data(15, args[16])
        bvec = [builder.load(builder.bitcast(builder.gep(pbias, [ir.Constant(i64, v * _W)]), vptr), align=4)
                for v in range(_NVT)]
        out = [builder.fadd(fin[r * _NVT + v], bvec[v]) for r in range(TR) for v in range(_NVT)]
        first_b = builder.icmp_unsigned("!=", first_v, ir.Constant(first_v.type, 0))
        entry = builder.block
        with builder.if_then(builder.not_(first_b)):
            more = [builder.fadd(out[r * _NVT + v], builder.load(builder.bitcast(
                builder.gep(ps, [ir.Constant(i64, r * CW + v * _W)]), vptr), align=4))
                for r in range(TR) for v in range(_NVT)]
            added = builder.block
        ir_store_tile(builder, vty, ir_merge(builder, vty, out, entry, more, added), TR, _NVT, pc, ldc_v)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack_narrow(w, wo, m, k, ld, out):
    for iq in range((m + CW - 1) // CW):
        for i in range(min(CW, m - iq * CW)):
            src = wo + (iq * CW + i) * ld
            for kk in range(k):
                out[(iq * k + kk) * CW + i] = w[src + kk]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _narrow_tiles(j_lo, j_hi, period, valid):
    """The column tiles of :func:`_gemm_narrow`: (first column, count <= TR) each, over the
    columns of ``[j_lo, j_hi)`` with ``j % period < valid`` (``period`` 0: all), never across a
    period (a row of a padded plane): its dropped columns are skipped, not computed."""
    n = j_hi - j_lo
    first = np.empty(n, np.int64)
    count = np.empty(n, np.int64)
    nt = 0
    j = j_lo
    while j < j_hi:
        end = j_hi
        if period > 0:
            row = (j // period) * period
            if j >= row + valid:
                j = row + period
                continue
            end = min(j_hi, row + valid)
        cnt = min(TR, end - j)
        first[nt] = j
        count[nt] = cnt
        nt += 1
        j += cnt
    return first[:nt], count[:nt]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gemm_narrow(wt, m, k, b, bo, rows, c, co, ldc, j_lo, j_hi, period, valid, accumulate, bias):
    first, count = _narrow_tiles(j_lo, j_hi, period, valid)
    nt = first.shape[0]
    s = np.empty(max(1, nt) * TR * CW, np.float32)
    # each tile's TR column offsets; a partial tile repeats its last column (read, never stored)
    px = np.empty(max(1, nt) * TR, np.int64)
    for t in range(nt):
        for r in range(TR):
            px[t * TR + r] = first[t] + min(r, count[t] - 1)
    nkb = (k + _KC - 1) // _KC
    for iq in range((m + CW - 1) // CW):
        if k == 0:
            s[:] = 0
        # whole tiles of a whole panel, overwriting C: the last depth block stores straight into C
        direct = not accumulate and k > 0 and m - iq * CW >= CW
        for pcb in range(nkb):
            pc = pcb * _KC
            kc = min(_KC, k - pc)
            for t in range(nt):
                if direct and pcb == nkb - 1 and count[t] == TR:
                    _ukernel_t_out(kc, wt, (iq * k + pc) * CW, b, bo, rows, pc, px, t * TR, s, t * TR * CW, pcb == 0,
                                   c, co + iq * CW * ldc + first[t], ldc, bias, iq * CW)
                else:
                    _ukernel_t(kc, wt, (iq * k + pc) * CW, b, bo, rows, pc, px, t * TR, s, t * TR * CW, pcb == 0)
        for i in range(min(CW, m - iq * CW)):
            o = co + (iq * CW + i) * ldc
            bi = bias[iq * CW + i]
            for t in range(nt):
                if direct and count[t] == TR:
                    continue  # stored by _ukernel_t_out
                base = o + first[t]
                src = t * TR * CW + i
                if accumulate:
                    for r in range(count[t]):
                        c[base + r] += s[src + r * CW]
                else:
                    for r in range(count[t]):
                        c[base + r] = s[src + r * CW] + bi


_ZEROS = np.zeros(0, np.float32)
_ZEROS.flags.writeable = False


def _zeros(n: int) -> np.ndarray:
    """A read-only float32 zero vector of at least ``n`` values (one shared buffer, grown on demand)."""
    global _ZEROS
    z = _ZEROS
    if z.shape[0] < n:
        z = np.zeros(max(n, 2 * z.shape[0]), np.float32)
        z.flags.writeable = False
        _ZEROS = z
    return z


def prefers_narrow(n: int, m: int = CW) -> bool:
    """Whether an (M x K) @ (K x N) product runs faster in the narrow form (:func:`pack_narrow`,
    :func:`gemm_narrow`) than with :func:`pack` and :func:`gemm_table`: at most
    :data:`NARROW_MAX_COLS` columns, and more of the narrow form's lanes busy (M over CW-row
    panels, N over TR-column tiles) than of the NR-wide one's (N over NR-column panels)."""
    if not (FULL_WIDTH and 0 < n <= NARROW_MAX_COLS and m > 0):
        return False
    busy_narrow = (m / (-(-m // CW) * CW)) * (n / (-(-n // TR) * TR))
    return busy_narrow > n / (-(-n // NR) * NR)


def pack_narrow(w: np.ndarray, wo: int, m: int, k: int, ld: int) -> np.ndarray:
    """The (M, K) matrix at ``w[wo:]`` (flat float32, row stride ``ld``) packed for
    :func:`gemm_narrow`: CW-row panels, each K rows of CW values (zero past row M)."""
    need = wo + (m - 1) * ld + k
    if m > 0 and k > 0 and (wo < 0 or ld < k or need > w.shape[0]):
        raise ValueError(f"pack_narrow: a ({m}, {k}) matrix with row stride {ld} at offset {wo} does not fit "
                         f"in {w.shape[0]} elements")
    out = np.zeros(max(1, -(-m // CW) * k) * CW, np.float32)
    if m > 0 and k > 0:
        if w.flags.writeable:  # read-only always: one compiled specialisation (constant or folded weights)
            w = w.view()
            w.flags.writeable = False
        _pack_narrow(w, wo, m, k, ld, out)
    return out


def gemm_narrow(wt: np.ndarray, m: int, k: int, b: np.ndarray, bo: int, rows: np.ndarray, c: np.ndarray, co: int,
                ldc: int, j_lo: int, j_hi: int, accumulate: int, bias: np.ndarray | None = None,
                period: int = 0, valid: int = 0) -> None:
    """:func:`gemm_table` with ``A`` packed by :func:`pack_narrow` (for outputs of a few dozen
    columns); ``bias`` (M values, float32) is added to an overwritten C. With ``period`` > 0 only
    the columns ``j`` with ``j % period < valid`` are computed and written (the others, such as
    the padding columns of a shifted convolution's accumulator, are left as they are). The
    caller keeps every access in bounds."""
    if m == 0 or j_hi <= j_lo:
        return
    if bias is None or accumulate:
        bb = _zeros(-(-m // CW) * CW)
    else:
        bb = np.zeros(-(-m // CW) * CW, np.float32)
        bb[:m] = bias
        bb.flags.writeable = False  # one compiled specialisation: the bias is always read-only
    _gemm_narrow(wt, m, k, b, bo, rows, c, co, ldc, j_lo, j_hi, period, valid if period > 0 else 0,
                 accumulate, bb)


def _flat(x: np.ndarray) -> np.ndarray:
    """A 2-D float32 view with unit column stride as a flat buffer from its first element."""
    if x.flags.c_contiguous:
        return x.reshape(-1)
    return np.lib.stride_tricks.as_strided(x, shape=((x.shape[0] - 1) * (x.strides[0] // 4) + x.shape[1],),
                                           strides=(4,))


def gemm_narrow_acc(wt: np.ndarray, m: int, k: int, b: np.ndarray, c: np.ndarray, parallel: bool = True,
                    init: bool = False, bias: np.ndarray | None = None) -> None:
    """:func:`gemm_acc` with ``A`` packed by :func:`pack_narrow`: ``c (+)= A @ b`` for 2-D float32
    views ``b`` (K, N) and ``c`` (M, N) with unit column stride, split over the pool by CW-row panels."""
    n = c.shape[1]
    if m == 0 or n == 0:
        return
    bflat = _flat(b)
    if bflat.flags.writeable:  # read-only always: one compiled specialisation
        bflat = bflat.view()
        bflat.flags.writeable = False
    rowoff = np.arange(k, dtype=np.int64) * (b.strides[0] // 4)
    cflat, ldc = _flat(c), c.strides[0] // 4
    mq = -(-m // CW)
    bb = np.zeros(mq * CW, np.float32)
    if bias is not None and init:
        bb[:m] = bias
    bb.flags.writeable = False  # as gemm_narrow's (one compiled specialisation)
    nt = threads.num_threads() if parallel and m * n * k >= _PARALLEL_MIN_MACS else 1
    blocks = split(mq, nt)
    threads.parallel_for(lambda i: gemm_narrow_panels(wt, m, k, bflat, rowoff, cflat, ldc, n, *blocks[i], init, bb),
                         len(blocks))


def gemm_narrow_panels(wt: np.ndarray, m: int, k: int, b: np.ndarray, rowoff: np.ndarray, c: np.ndarray, ldc: int,
                       n: int, q0: int, q1: int, init: bool, bias: np.ndarray, period: int = 0, valid: int = 0) -> None:
    """Rows ``[q0*CW, q1*CW)`` (CW-row panels ``q0`` to ``q1``) of :func:`gemm_narrow_acc`'s product
    on flat buffers, on the calling thread: C's first ``n`` columns, row stride ``ldc``; ``bias``
    holds at least ``q1*CW`` values (added when ``init``); ``period``, ``valid``: as for
    :func:`gemm_narrow`."""
    _gemm_narrow(wt[q0 * k * CW:], min(m, q1 * CW) - q0 * CW, k, b, 0, rowoff, c, q0 * CW * ldc, ldc, 0, n,
                 period, valid, 0 if init else 1, bias[q0 * CW:])


def use_own_gemm(m: int, n: int, k: int) -> bool:
    """Whether :func:`gemm_acc` beats OpenBLAS for this float32 shape (it needs rows to tile)."""
    return _OWN_GEMM and m >= MR and n >= 16 and k >= 8
