"""SGEMM on flat float32 buffers with element offsets and leading dimensions.

Generated code calls :func:`sgemm` with the arena, the region's inputs and the packed
constants as flat arrays. It goes to the OpenBLAS that numpy ships (found by
:mod:`byoc_cpu.host.threads`, which also applies byoc's thread policy: OpenBLAS owns the cores).
Without OpenBLAS (numpy on MKL or Accelerate) it falls back to ``np.dot`` on strided views,
slower but the same numbers.
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numba
import numpy as np
from numpy.lib.stride_tricks import as_strided

from byoc_cpu.host import gemm, threads
from byoc_cpu.host.gemm import CW, _gemm_narrow, _gemm_table
from byoc_cpu.tuning import GEMM

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

_cblas = threads.openblas_symbol("cblas_sgemm")
if _cblas is not None:
    _I = ctypes.c_int64 if threads.blas_int64() else ctypes.c_int
    _cblas.restype = None
    _cblas.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, _I, _I, _I, ctypes.c_float, ctypes.c_void_p, _I,
                       ctypes.c_void_p, _I, ctypes.c_float, ctypes.c_void_p, _I]

#: whether OpenBLAS's cblas_sgemm is reachable (else the numpy fallback runs)
HAVE_CBLAS = _cblas is not None

_cblas_gemv = threads.openblas_symbol("cblas_sgemv")
if _cblas_gemv is not None:
    _cblas_gemv.restype = None
    _cblas_gemv.argtypes = [ctypes.c_int, ctypes.c_int, _I, _I, ctypes.c_float, ctypes.c_void_p, _I,
                            ctypes.c_void_p, _I, ctypes.c_float, ctypes.c_void_p, _I]

#: products with at most this many rows (batch-1 fully connected layers) run as matrix-vector
#: products: SGEMM's blocking is wasted on them, SGEMV streams the weights (3.6x measured)
GEMV_MAX_ROWS = GEMM["gemv_max_rows"]


# ``arr.ctypes.data`` builds a ctypes helper object on every call (2 us: DenseNet-121 makes ~1,800
# such calls per run); generated code passes the same few arrays (the arena, the constants)
# to every GEMM, so each thread remembers the last few arrays' addresses, weakly (an array
# freed and a new one at the same id is a miss: the weak reference is dead)
_addr_cache = threading.local()
_ADDR_SLOTS = 8


def _addr(a: np.ndarray) -> int:
    slots = getattr(_addr_cache, "slots", None)
    if slots is None:
        slots = _addr_cache.slots = {}
    hit = slots.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    p = a.ctypes.data
    if len(slots) >= _ADDR_SLOTS:
        slots.clear()
    slots[id(a)] = (weakref.ref(a), p)
    return p


def _view(buf: np.ndarray, off: int, rows: int, cols: int, ld: int, trans: bool) -> np.ndarray:
    """The (rows, cols) operand op(X) of a row-major matrix stored at ``buf[off:]`` with leading dim ``ld``."""
    if trans:
        stored = as_strided(buf[off:], shape=(cols, rows), strides=(ld * 4, 4))
        return stored.T
    return as_strided(buf[off:], shape=(rows, cols), strides=(ld * 4, 4))


def sgemm(m: int, n: int, k: int, a: np.ndarray, ao: int, lda: int, b: np.ndarray, bo: int, ldb: int,
          c: np.ndarray, co: int, ldc: int, beta: float = 0.0, alpha: float = 1.0,
          trans_a: bool = False, trans_b: bool = False) -> None:
    """Row-major ``C = alpha * op(A) @ op(B) + beta * C``; ``A``, ``B``, ``C`` are flat float32 arrays
    with the matrices starting at element offsets ``ao``, ``bo``, ``co``."""
    if _cblas_gemv is not None and m <= GEMV_MAX_ROWS:
        pa, pb, pc = _addr(a) + 4 * ao, _addr(b) + 4 * bo, _addr(c) + 4 * co
        for i in range(m):
            x, incx = (pa + 4 * i, lda) if trans_a else (pa + 4 * i * lda, 1)
            if trans_b:  # B stored (n, k): y = B @ x
                _cblas_gemv(_ROW_MAJOR, _NO_TRANS, n, k, alpha, pb, ldb, x, incx, beta, pc + 4 * i * ldc, 1)
            else:  # B stored (k, n): y = B^T @ x
                _cblas_gemv(_ROW_MAJOR, _TRANS, k, n, alpha, pb, ldb, x, incx, beta, pc + 4 * i * ldc, 1)
        return
    if _cblas is not None:
        _cblas(_ROW_MAJOR, _TRANS if trans_a else _NO_TRANS, _TRANS if trans_b else _NO_TRANS, m, n, k, alpha,
               _addr(a) + 4 * ao, lda, _addr(b) + 4 * bo, ldb, beta, _addr(c) + 4 * co, ldc)
        return
    prod = np.dot(_view(a, ao, m, k, lda, trans_a), _view(b, bo, k, n, ldb, trans_b))
    out = as_strided(c[co:], shape=(m, n), strides=(ldc * 4, 4))
    if alpha != 1.0:
        prod *= np.float32(alpha)
    if beta == 0.0:
        out[...] = prod
    else:
        out *= np.float32(beta)
        out += prod


class Weight:
    """A GEMM left operand (m, k), prepared once at load: packed for byoc's micro-kernel
    (:func:`byoc_cpu.host.gemm.pack`) where it runs at full width, or in the narrow form
    (:func:`byoc_cpu.host.gemm.pack_narrow`) when every product it takes part in has few output
    columns; else kept as a block of its constant for OpenBLAS."""

    __slots__ = ("a", "ao", "lda", "m", "k", "packed", "narrow")

    def __init__(self, a: np.ndarray, ao: int, m: int, k: int, lda: int, use_microkernel: bool,
                 narrow: bool = False):
        self.a, self.ao, self.m, self.k, self.lda = a, ao, m, k, lda
        self.packed = self.narrow = None
        if use_microkernel and narrow:
            self.narrow = gemm.pack_narrow(a, ao, m, k, lda)
        elif use_microkernel:
            self.packed = gemm.pack(a, ao, m, k, lda)


class Rows:
    """Where each row of an indirect GEMM's B starts: runs of ``(start, count, stride)``."""

    __slots__ = ("segments", "table")

    def __init__(self, segments):
        self.segments = tuple((int(a), int(n), int(s)) for a, n, s in segments)
        self.table = np.concatenate([a + s * np.arange(n, dtype=np.int64) for a, n, s in self.segments])


def wgemm(wt: Weight, b: np.ndarray, bo: int, rows: Rows, c: np.ndarray, co: int, ldc: int, lo: int, hi: int,
          accumulate: int, period: int = 0, valid: int = 0) -> None:
    """Columns ``[lo, hi)`` of ``C (+)= W @ B`` (``accumulate`` 0 overwrites): row ``kk`` of B starts at
    ``b[bo + rows.table[kk]]``, C at ``c[co:]`` with row stride ``ldc``. With ``period`` > 0 only
    the columns ``j % period < valid`` are needed (a shifted convolution's accumulator, whose
    padding columns the epilogue drops): the narrow form computes only those."""
    if wt.narrow is not None:
        gemm.gemm_narrow(wt.narrow, wt.m, wt.k, b, bo, rows.table, c, co, ldc, lo, hi, accumulate, None, period, valid)
        return
    if wt.packed is not None:
        gemm.gemm_table(wt.packed, wt.m, wt.k, b, bo, rows.table, c, co, ldc, lo, hi, accumulate)
        return
    # OpenBLAS: one GEMM per run of equally spaced rows, over the matching columns of W
    k0 = 0
    for i, (start, count, stride) in enumerate(rows.segments):
        sgemm(wt.m, hi - lo, count, wt.a, wt.ao + k0, wt.lda, b, bo + start + lo, stride, c, co + lo, ldc,
              1.0 if (accumulate or i) else 0.0)
        k0 += count


@numba.njit(cache=True, nogil=True, boundscheck=False)
def wgemm_packed(narrow, wp, m, k, b, bo, rows, c, co, ldc, lo, hi, accumulate, period, valid):
    """:func:`wgemm` inside compiled code (a native region, :mod:`byoc_cpu.emit`): ``wp`` is the
    weight packed by :func:`byoc_cpu.host.gemm.pack` or, with ``narrow``, by
    :func:`~byoc_cpu.host.gemm.pack_narrow`; ``rows`` is the row table."""
    if m == 0 or hi <= lo:
        return
    if narrow:
        zero_bias = np.zeros(-(-m // CW) * CW, np.float32)
        _gemm_narrow(wp, m, k, b, bo, rows, c, co, ldc, lo, hi, period, valid if period > 0 else 0, accumulate,
                     zero_bias)
    else:
        _gemm_table(wp, m, k, b, bo, rows, c, co, ldc, lo, hi, accumulate)


__all__ = ["HAVE_CBLAS", "Rows", "Weight", "sgemm", "wgemm", "wgemm_packed"]
