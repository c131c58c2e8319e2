"""Matrix products: Gemm and MatMul, and the BLAS entry points the conv kernels use.

The products themselves go to numpy's BLAS (``np.dot``/``np.matmul`` on contiguous float32 or
float64 arrays, which reach OpenBLAS's SGEMM/DGEMM without copies: numpy passes transposed
operands as transpose flags). Where a kernel needs what numpy does not expose (a leading
dimension, or accumulating into the output: ``C = alpha*A@B + beta*C``), :func:`sgemm` calls
OpenBLAS's ``cblas_sgemm`` directly through ctypes (see :mod:`byoc.kernels.threads` for how
the library is found); :data:`HAVE_SGEMM` says whether it is available.

float16/bfloat16 products are computed in float32 and rounded back; integer products use
numpy's integer matmul (no BLAS).
"""

from __future__ import annotations

import ctypes

import numba
import numpy as np

from byoc.kernels import threads
from byoc.kernels.registry import NodeSpec, kernel

# -------------------------------------------------------------------------------------------------
# direct OpenBLAS access

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

_cblas_sgemm = threads.openblas_symbol("cblas_sgemm")
if _cblas_sgemm is not None:
    _I = ctypes.c_int64 if threads.blas_int64() else ctypes.c_int
    _cblas_sgemm.restype = None
    _cblas_sgemm.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int,  # order, transA, transB (C enums)
        _I, _I, _I,  # M, N, K
        ctypes.c_float, ctypes.c_void_p, _I,  # alpha, A, lda
        ctypes.c_void_p, _I,  # B, ldb
        ctypes.c_float, ctypes.c_void_p, _I,  # beta, C, ldc
    ]

HAVE_SGEMM = _cblas_sgemm is not None


def sgemm(m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int, c: int, ldc: int,
          alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False, trans_b: bool = False) -> None:
    """Row-major ``C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C`` on raw float32 pointers.

    ``a``, ``b``, ``c`` are addresses (``arr.ctypes.data`` plus a byte offset); the caller keeps
    the arrays alive and in bounds. Only valid when :data:`HAVE_SGEMM`.
    """
    _cblas_sgemm(_ROW_MAJOR, _TRANS if trans_a else _NO_TRANS, _TRANS if trans_b else _NO_TRANS,
                 m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a @ b`` for 2-D operands; ``out`` may be a row-strided view (unit column stride)."""
    if out.flags.c_contiguous:
        np.dot(a, b, out=out)
        return
    if (HAVE_SGEMM and out.dtype == np.float32 and a.dtype == np.float32 and b.dtype == np.float32
            and out.strides[1] == 4 and a.flags.c_contiguous and b.flags.c_contiguous):
        m, k = a.shape
        n = b.shape[1]
        sgemm(m, n, k, a.ctypes.data, k, b.ctypes.data, n, out.ctypes.data, out.strides[0] // 4)
        return
    out[...] = np.dot(a, b)


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
# Gemm


@numba.njit(cache=True)
def _gemm_epilogue(y, alpha, c, beta):
    # y[m, n] = alpha * y + beta * c, c of shape (1|M, 1|N)
    m_, n_ = y.shape
    cm = c.shape[0] > 1
    cn = c.shape[1] > 1
    for i in range(m_):
        ci = i if cm else 0
        for j in range(n_):
            y[i, j] = alpha * y[i, j] + beta * c[ci, j if cn else 0]


@numba.njit(cache=True)
def _scale(y, alpha):
    yf = y.ravel()
    for i in range(yf.size):
        yf[i] *= alpha


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

    # a constant B is laid out once as a contiguous (K, N) operand (or its transpose, which numpy
    # passes to BLAS as a flag without copying)
    b_const = spec.const_inputs.get(1)
    b_ready = None
    if b_const is not None and b_const.ndim == 2:
        bc = as_compute(b_const)
        b_ready = bc.T if trans_b else bc

    def run(a, b, c=None):
        if a.ndim != 2 or b.ndim != 2:
            raise spec.error(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
        out_dtype = a.dtype
        if b_ready is not None and compute_dtype(b.dtype) == b_ready.dtype:
            bb = b_ready
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
        y = np.dot(aa, bb)
        if y.dtype != aa.dtype:  # mixed int dtypes: numpy promotes; ONNX keeps T
            y = y.astype(aa.dtype)
        m, n = y.shape
        if c is not None and beta != 0.0:
            c2 = np.ascontiguousarray(_as_2d_bias(c, m, n, spec), dtype=y.dtype)
            if y.dtype.kind == "f":
                _gemm_epilogue(y, y.dtype.type(alpha), c2, y.dtype.type(beta))
            else:
                y = (alpha * y + beta * c2).astype(y.dtype) if (alpha != 1 or beta != 1) else y + c2
        elif alpha != 1.0:
            if y.dtype.kind == "f":
                _scale(y, y.dtype.type(alpha))
            else:
                y = (y * alpha).astype(y.dtype)
        if y.dtype != out_dtype:
            y = y.astype(out_dtype)
        return (y,)

    return run


# -------------------------------------------------------------------------------------------------
# MatMul


@kernel("MatMul")
def make_matmul(spec: NodeSpec):
    b_const = spec.const_inputs.get(1)
    b_ready = as_compute(b_const) if b_const is not None and b_const.ndim == 2 else None

    def run(a, b):
        out_dtype = a.dtype
        if a.ndim == 0 or b.ndim == 0:
            raise spec.error("MatMul operands must have rank >= 1")
        ka = a.shape[-1]
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if ka != kb:
            raise spec.error(f"inner dimensions differ: A is {list(a.shape)}, B is {list(b.shape)}")
        if b_ready is not None and compute_dtype(b.dtype) == b_ready.dtype:
            bb = b_ready
        else:
            bb = as_compute(b) if b.dtype.kind == "f" else b
        aa = as_compute(a, bb.dtype) if a.dtype.kind == "f" else a
        if bb.ndim == 2 and aa.ndim > 2:
            # (..., M, K) @ (K, N): one GEMM over all leading rows instead of one per batch
            y = np.dot(aa.reshape(-1, ka), bb).reshape(aa.shape[:-1] + (bb.shape[1],))
        else:
            if aa.ndim > 2 or bb.ndim > 2:
                try:
                    batch = np.broadcast_shapes(aa.shape[:-2], bb.shape[:-2])
                except ValueError:
                    raise spec.error(f"batch dimensions of {list(a.shape)} and {list(b.shape)} do not broadcast") from None
                spec.check_alloc(batch + aa.shape[-2:-1] + bb.shape[-1:], bb.dtype)
            y = np.matmul(aa, bb)
        if y.dtype != out_dtype:
            y = y.astype(out_dtype)
        return (y,)

    return run
