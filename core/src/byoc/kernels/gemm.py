"""Gemm and MatMul: numpy's matrix product (BLAS for float32 and float64).

16-bit floats are computed in float32 and rounded back; integer products are exact in the input
type (numpy's integer matmul), as ONNX keeps it.
"""

from __future__ import annotations

import numpy as np

from byoc.kernels.elementwise import compute_dtype
from byoc.kernels.registry import NodeSpec, kernel


def as_compute(x: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """``x`` as an array of its compute dtype (``dtype``'s, when given)."""
    return np.asarray(x, dtype=compute_dtype(np.dtype(x.dtype if dtype is None else dtype)))


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

    def run(a, b, c=None):
        if a.ndim != 2 or b.ndim != 2:
            raise spec.error(f"A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
        bb = as_compute(b) if b.dtype.kind == "f" else b
        aa = as_compute(a, bb.dtype) if a.dtype.kind == "f" else a
        aa = aa.T if trans_a else aa
        bb = bb.T if trans_b else bb
        if aa.shape[1] != bb.shape[0]:
            raise spec.error(f"inner dimensions differ: A{'^T' if trans_a else ''} is {list(aa.shape)}, "
                             f"B{'^T' if trans_b else ''} is {list(bb.shape)}")
        m, n = aa.shape[0], bb.shape[1]
        use_c = c is not None and beta != 0.0
        c2 = _as_2d_bias(c, m, n, spec) if use_c else None
        spec.check_alloc((m, n), aa.dtype if aa.dtype.kind == "f" else np.int64)  # (M, 1) x (1, N) can be huge
        y = np.matmul(aa, bb)
        if alpha != 1.0:
            y = y * y.dtype.type(alpha) if y.dtype.kind == "f" else y * alpha
        if use_c:
            y = y + (beta * c2 if beta != 1.0 else c2)
        return (y.astype(a.dtype, copy=False),)

    return run


@kernel("MatMul")
def make_matmul(spec: NodeSpec):
    def run(a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise spec.error("MatMul operands must have rank >= 1")
        ka = a.shape[-1]
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if ka != kb:
            raise spec.error(f"inner dimensions differ: A is {list(a.shape)}, B is {list(b.shape)}")
        bb = as_compute(b) if b.dtype.kind == "f" else b
        aa = as_compute(a, bb.dtype) if a.dtype.kind == "f" else a
        a_sh = (1,) + aa.shape if aa.ndim == 1 else aa.shape
        b_sh = bb.shape + (1,) if bb.ndim == 1 else bb.shape
        try:
            batch = np.broadcast_shapes(a_sh[:-2], b_sh[:-2])
        except ValueError:
            raise spec.error(f"batch dimensions of {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        spec.check_alloc(batch + (a_sh[-2], b_sh[-1]), np.result_type(aa.dtype, bb.dtype))
        y = np.matmul(aa, bb)
        return (y.astype(a.dtype, copy=False),)

    return run
