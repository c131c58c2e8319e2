"""byoc-cpu's activation kernels: Relu and friends, Clip, Sigmoid/Tanh/Erf/Gelu, Softmax/LogSoftmax/Hardmax.

The pointwise activations reuse the unary range kernels of :mod:`byoc_cpu.host.elementwise`
(``f(x, p0, p1)`` with attribute values in ``p0``/``p1``, computed in the input's dtype, float16
in float32). PRelu lives with the binary kernels (its slope broadcasts). The softmax family
works on the input viewed as ``(outer, axis, inner)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba
import numpy as np

from byoc_cpu.host.elementwise import as_compute, cst, ferf, fexp, ftanh, run_ranges, unary, unary_loop
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel
from byoc_cpu.tuning import KERNELS, THREADS

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_inline = numba.njit(inline="always", error_model="numpy")

#: work units per element of the transcendental activations, for the parallel split
_HEAVY = THREADS["transcendental_cost"]


@_inline
def _relu(x, p0, p1):
    return cst(x, 0) if x < 0 else x  # keeps NaN, like np.maximum(x, 0)


@_inline
def _leaky_relu(x, alpha, p1):
    return x if x >= 0 else x * alpha


@_inline
def _thresholded_relu(x, alpha, p1):
    return x if x > alpha else cst(x, 0)


@_inline
def _clip(x, lo, hi):
    # NaN stays NaN; lo > hi gives hi (numpy/ONNX order: max first, then min)
    if x < lo:  # noqa: PLR1730  (explicit compares keep NaN)
        x = lo
    if x > hi:  # noqa: PLR1730
        x = hi
    return x


@_inline
def _sigmoid(x, p0, p1):
    # exp(-x) overflows to inf for x < -88 (float32): 1 / inf = 0, the right limit
    one = cst(x, 1.0)
    return one / (one + fexp(-x))


@_inline
def _hard_sigmoid(x, alpha, beta):
    v = alpha * x + beta
    if v < 0:
        return cst(x, 0.0)
    if v > 1:
        return cst(x, 1.0)
    return v


@_inline
def _hard_swish(x, alpha, beta):
    return x * _hard_sigmoid(x, alpha, beta)


@_inline
def _tanh(x, p0, p1):
    return ftanh(x)


@_inline
def _erf(x, p0, p1):
    return ferf(x)


@_inline
def _elu(x, alpha, p1):
    return x if x > 0 else alpha * (fexp(x) - cst(x, 1.0))


@_inline
def _selu(x, alpha, gamma):
    return gamma * x if x > 0 else gamma * (alpha * fexp(x) - alpha)


@_inline
def _celu(x, alpha, p1):
    return x if x > 0 else alpha * (fexp(x / alpha) - cst(x, 1.0))


@_inline
def _softplus(x, p0, p1):
    # log(1 + exp(x)) without overflow
    return (x if x > 0 else cst(x, 0.0)) + np.log1p(np.exp(-np.abs(x)))


@_inline
def _softsign(x, p0, p1):
    return x / (cst(x, 1.0) + np.abs(x))


@_inline
def _mish(x, p0, p1):
    return x * ftanh(_softplus(x, p0, p1))


@_inline
def _swish(x, alpha, p1):
    return x * _sigmoid(alpha * x, alpha, p1)


@_inline
def _gelu(x, half, inv_sqrt2):
    return half * x * (cst(x, 1.0) + ferf(x * inv_sqrt2))


@_inline
def _gelu_tanh(x, half, k):
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    return half * x * (cst(x, 1.0) + ftanh(k * (x + cst(x, 0.044715) * x * x * x)))


@_inline
def _shrink(x, lambd, bias):
    if x < -lambd:
        return x + bias
    if x > lambd:
        return x - bias
    return cst(x, 0)


@_jit
def k_relu(x, out, p0, p1, start, stop):
    unary_loop(_relu, x, out, p0, p1, start, stop)


@_jit
def k_leaky_relu(x, out, p0, p1, start, stop):
    unary_loop(_leaky_relu, x, out, p0, p1, start, stop)


@_jit
def k_thresholded_relu(x, out, p0, p1, start, stop):
    unary_loop(_thresholded_relu, x, out, p0, p1, start, stop)


@_jit
def k_clip(x, out, p0, p1, start, stop):
    unary_loop(_clip, x, out, p0, p1, start, stop)


@_jit
def k_sigmoid(x, out, p0, p1, start, stop):
    unary_loop(_sigmoid, x, out, p0, p1, start, stop)


@_jit
def k_hard_sigmoid(x, out, p0, p1, start, stop):
    unary_loop(_hard_sigmoid, x, out, p0, p1, start, stop)


@_jit
def k_hard_swish(x, out, p0, p1, start, stop):
    unary_loop(_hard_swish, x, out, p0, p1, start, stop)


@_jit
def k_tanh(x, out, p0, p1, start, stop):
    unary_loop(_tanh, x, out, p0, p1, start, stop)


@_jit
def k_erf(x, out, p0, p1, start, stop):
    unary_loop(_erf, x, out, p0, p1, start, stop)


@_jit
def k_elu(x, out, p0, p1, start, stop):
    unary_loop(_elu, x, out, p0, p1, start, stop)


@_jit
def k_selu(x, out, p0, p1, start, stop):
    unary_loop(_selu, x, out, p0, p1, start, stop)


@_jit
def k_celu(x, out, p0, p1, start, stop):
    unary_loop(_celu, x, out, p0, p1, start, stop)


@_jit
def k_softplus(x, out, p0, p1, start, stop):
    unary_loop(_softplus, x, out, p0, p1, start, stop)


@_jit
def k_softsign(x, out, p0, p1, start, stop):
    unary_loop(_softsign, x, out, p0, p1, start, stop)


@_jit
def k_mish(x, out, p0, p1, start, stop):
    unary_loop(_mish, x, out, p0, p1, start, stop)


@_jit
def k_swish(x, out, p0, p1, start, stop):
    unary_loop(_swish, x, out, p0, p1, start, stop)


@_jit
def k_gelu(x, out, p0, p1, start, stop):
    unary_loop(_gelu, x, out, p0, p1, start, stop)


@_jit
def k_gelu_tanh(x, out, p0, p1, start, stop):
    unary_loop(_gelu_tanh, x, out, p0, p1, start, stop)


@_jit
def k_shrink(x, out, p0, p1, start, stop):
    unary_loop(_shrink, x, out, p0, p1, start, stop)


def _pointwise(
    spec: NodeSpec, fn: Callable, p0: float = 0.0, p1: float = 0.0, kinds: str = "f", cost: int = 1
) -> Callable:
    """A run function applying a unary activation kernel; float16/bfloat16 compute in float32."""

    def run(x):
        x = np.asarray(x)
        xc = as_compute(x)
        if xc.dtype.kind not in kinds:
            raise spec.error(f"element type {x.dtype} is not supported")
        out = unary(fn, xc, None, p0, p1, cost=cost)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run


def _float_attr(spec: NodeSpec, name: str, default: float) -> float:
    v = spec.attr(name, default)
    try:
        return float(v)
    except (TypeError, ValueError):
        raise spec.error(f"attribute {name!r} must be a float, got {v!r}") from None


@kernel("Relu")
def make_relu(spec: NodeSpec):
    # stays a Numba kernel: numpy's maximum measured 3x slower on (1, 256, 56, 56) float32
    return _pointwise(spec, k_relu, kinds="if")


@kernel("LeakyRelu")
def make_leaky_relu(spec: NodeSpec):
    return _pointwise(spec, k_leaky_relu, _float_attr(spec, "alpha", 0.01))


@kernel("ThresholdedRelu")
def make_thresholded_relu(spec: NodeSpec):
    return _pointwise(spec, k_thresholded_relu, _float_attr(spec, "alpha", 1.0))


@kernel("Sigmoid")
def make_sigmoid(spec: NodeSpec):
    return _pointwise(spec, k_sigmoid, cost=_HEAVY)


@kernel("HardSigmoid")
def make_hard_sigmoid(spec: NodeSpec):
    return _pointwise(spec, k_hard_sigmoid, _float_attr(spec, "alpha", 0.2), _float_attr(spec, "beta", 0.5))


@kernel("HardSwish")
def make_hard_swish(spec: NodeSpec):
    return _pointwise(spec, k_hard_swish, 1.0 / 6.0, 0.5)


@kernel("Tanh")
def make_tanh(spec: NodeSpec):
    return _pointwise(spec, k_tanh, cost=_HEAVY)


@kernel("Erf")
def make_erf(spec: NodeSpec):
    return _pointwise(spec, k_erf, cost=_HEAVY)


@kernel("Elu")
def make_elu(spec: NodeSpec):
    return _pointwise(spec, k_elu, _float_attr(spec, "alpha", 1.0), cost=_HEAVY)


@kernel("Selu")
def make_selu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.67326319217681884765625)
    gamma = _float_attr(spec, "gamma", 1.05070102214813232421875)
    return _pointwise(spec, k_selu, alpha, gamma, cost=_HEAVY)


@kernel("Celu")
def make_celu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.0)
    if alpha == 0:
        raise spec.error("alpha must not be 0")
    return _pointwise(spec, k_celu, alpha, cost=_HEAVY)


@kernel("Softplus")
def make_softplus(spec: NodeSpec):
    return _pointwise(spec, k_softplus, cost=_HEAVY)


@kernel("Softsign")
def make_softsign(spec: NodeSpec):
    return _pointwise(spec, k_softsign)


@kernel("Mish")
def make_mish(spec: NodeSpec):
    return _pointwise(spec, k_mish, cost=_HEAVY)


@kernel("Swish")
def make_swish(spec: NodeSpec):
    return _pointwise(spec, k_swish, _float_attr(spec, "alpha", 1.0), cost=_HEAVY)


@kernel("Gelu")
def make_gelu(spec: NodeSpec):
    approx = spec.attr("approximate", "none")
    if isinstance(approx, bytes):
        approx = approx.decode()
    if approx == "none":
        return _pointwise(spec, k_gelu, 0.5, 1.0 / math.sqrt(2.0), cost=_HEAVY)
    if approx == "tanh":
        return _pointwise(spec, k_gelu_tanh, 0.5, math.sqrt(2.0 / math.pi), cost=_HEAVY)
    raise spec.error(f"approximate must be 'none' or 'tanh', got {approx!r}")


@kernel("Shrink")
def make_shrink(spec: NodeSpec):
    lambd = _float_attr(spec, "lambd", 0.5)
    bias = _float_attr(spec, "bias", 0.0)
    floats = _pointwise(spec, k_shrink, lambd, bias)

    def run(x):
        x = np.asarray(x)
        if x.dtype.kind in "iu":  # in float64, truncated back, as onnx.reference and onnxruntime do
            return (np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(x.dtype),)
        return floats(x)

    return run


def _scalar_bound(spec: NodeSpec, v, name: str) -> float | None:
    if v is None:
        return None
    a = np.asarray(v)
    if a.size != 1:
        raise spec.error(f"{name} must be a scalar, got shape {list(a.shape)}")
    return a.reshape(-1)[0].item()


@kernel("Clip")
def make_clip(spec: NodeSpec):
    attr_lo = attr_hi = None
    if spec.opset < 11:
        attr_lo = _float_attr(spec, "min", -math.inf)
        attr_hi = _float_attr(spec, "max", math.inf)

    def run(x, lo=None, hi=None):
        x = np.asarray(x)
        xc = as_compute(x)
        if xc.dtype.kind not in "iuf":
            raise spec.error(f"element type {x.dtype} is not supported")
        if spec.opset < 11:
            lo_v, hi_v = attr_lo, attr_hi
        else:
            lo_v = _scalar_bound(spec, lo, "min")
            hi_v = _scalar_bound(spec, hi, "max")
        if xc.dtype.kind == "f":
            lo_v = -math.inf if lo_v is None else lo_v
            hi_v = math.inf if hi_v is None else hi_v
        else:
            info = np.iinfo(xc.dtype)
            lo_v = info.min if lo_v is None else max(info.min, min(info.max, int(lo_v)))
            hi_v = info.max if hi_v is None else max(info.min, min(info.max, int(hi_v)))
        out = unary(k_clip, xc, None, lo_v, hi_v)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run


# ---------------------------------------------------------------------------------------------
# softmax family on (outer, n, inner)
# ---------------------------------------------------------------------------------------------


# reassociation lets the row sums vectorise; NaN/inf semantics stay IEEE
@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def k_softmax_rows(x, out, n, inner, log, start, stop):
    """:func:`k_softmax` for ``inner == 1`` (the last axis): its own kernel, so a model compiles
    only the loops it uses (each body costs about a second of Numba compilation on a first run)."""
    for o in range(start, stop):
        row = x[o * n : (o + 1) * n]
        orow = out[o * n : (o + 1) * n]
        # a NaN in the row need not reach m: exp(NaN - m) makes the sum, so the row, NaN
        m = row[0]
        for j in range(1, n):
            v = row[j]
            m = v if v > m else m
        s = 0.0  # float64 sum
        for j in range(n):
            e = fexp(row[j] - m)
            s += e
            if not log:
                orow[j] = e
        if log:
            ls = np.log(s)
            for j in range(n):
                orow[j] = row[j] - m - ls
        else:
            inv = 1.0 / s
            for j in range(n):
                orow[j] = orow[j] * inv


# reassociation lets the row sums vectorise; NaN/inf semantics stay IEEE
@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def k_softmax(x, out, n, inner, log, start, stop):
    """Softmax (``log`` False) or LogSoftmax over the middle axis of ``(outer, n, inner)``."""
    mx = np.empty(inner, x.dtype)
    sm = np.empty(inner, np.float64)
    for o in range(start, stop):
        blk = x[o * n * inner : (o + 1) * n * inner]
        oblk = out[o * n * inner : (o + 1) * n * inner]
        for i in range(inner):  # (an element loop: an array slice assignment compiles a shape-error path)
            mx[i] = blk[i]
        sm[:] = 0.0
        for j in range(1, n):
            row = blk[j * inner : (j + 1) * inner]
            for i in range(inner):
                v = row[i]
                mx[i] = v if v > mx[i] else mx[i]
        for j in range(n):
            row = blk[j * inner : (j + 1) * inner]
            orow = oblk[j * inner : (j + 1) * inner]
            for i in range(inner):
                e = fexp(row[i] - mx[i])
                sm[i] += e
                if not log:
                    orow[i] = e
        if log:
            for i in range(inner):
                sm[i] = np.log(sm[i])
            for j in range(n):
                row = blk[j * inner : (j + 1) * inner]
                orow = oblk[j * inner : (j + 1) * inner]
                for i in range(inner):
                    orow[i] = row[i] - mx[i] - sm[i]
        else:
            for i in range(inner):
                sm[i] = 1.0 / sm[i]
            for j in range(n):
                orow = oblk[j * inner : (j + 1) * inner]
                for i in range(inner):
                    orow[i] = orow[i] * sm[i]


@_jit
def k_hardmax(x, out, n, inner, start, stop):
    """One-hot of the first maximum over the middle axis of ``(outer, n, inner)``."""
    for o in range(start, stop):
        blk = x[o * n * inner : (o + 1) * n * inner]
        oblk = out[o * n * inner : (o + 1) * n * inner]
        for i in range(inner):
            best = 0
            for j in range(1, n):
                if blk[j * inner + i] > blk[best * inner + i]:
                    best = j
            for j in range(n):
                oblk[j * inner + i] = 1 if j == best else 0


def _axis_layout(spec: NodeSpec, shape: tuple[int, ...], axis: int, flatten: bool) -> tuple[int, int, int]:
    nd = len(shape)
    if nd == 0:
        raise spec.error("input must have at least one dimension")
    a = axis + nd if axis < 0 else axis
    if not 0 <= a < nd:
        raise spec.error(f"axis {axis} is out of range for rank {nd}")
    outer = math.prod(shape[:a])
    if flatten:  # before opset 13: the input is coerced to 2-D at axis
        return outer, math.prod(shape[a:]), 1
    return outer, shape[a], math.prod(shape[a + 1 :])


#: a last-axis softmax of at most this many elements (a classifier head) runs in numpy: under a
#: millisecond either way, and no Numba compilation on a first run (about 0.7 s)
SMALL_SOFTMAX = KERNELS["numpy_softmax_max_elements"]


def _softmax_rows_np(x: np.ndarray, out: np.ndarray, log: bool) -> None:
    """:func:`k_softmax_rows` in numpy on ``(outer, n)``: the row maximum, exp of the shifted
    row, a float64 row sum (as the kernel); within a few float32 ulp of the kernel."""
    with np.errstate(all="ignore"):
        m = x.max(axis=1, keepdims=True)  # a NaN row gives NaN, as in the kernel
        np.subtract(x, m, out=out)
        if log:
            s = np.exp(out).sum(axis=1, keepdims=True, dtype=np.float64)
            np.subtract(out, np.log(s), out=out, casting="unsafe")
        else:
            np.exp(out, out=out)
            s = out.sum(axis=1, keepdims=True, dtype=np.float64)
            np.multiply(out, 1.0 / s, out=out, casting="unsafe")


def _make_softmax(spec: NodeSpec, log: bool):
    flatten = spec.opset < 13
    axis = int(spec.attr("axis", 1 if flatten else -1))

    def run(x):
        x = np.asarray(x)
        xc = as_compute(x)
        if xc.dtype.kind != "f":
            raise spec.error(f"element type {x.dtype} is not supported")
        outer, n, inner = _axis_layout(spec, x.shape, axis, flatten)
        out = spec.alloc.empty(xc.shape, xc.dtype)
        if out.size and inner == 1 and out.size <= SMALL_SOFTMAX:
            _softmax_rows_np(xc.reshape(outer, n), out.reshape(outer, n), log)
        elif out.size:
            args = (xc.reshape(-1), out.reshape(-1), n, inner, log)
            run_ranges(k_softmax_rows if inner == 1 else k_softmax, outer, args, unit_cost=n * inner * _HEAVY)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run


@kernel("Softmax")
def make_softmax(spec: NodeSpec):
    return _make_softmax(spec, log=False)


@kernel("LogSoftmax")
def make_log_softmax(spec: NodeSpec):
    return _make_softmax(spec, log=True)


@kernel("Hardmax")
def make_hardmax(spec: NodeSpec):
    flatten = spec.opset < 13
    axis = int(spec.attr("axis", 1 if flatten else -1))

    def run(x):
        x = np.asarray(x)
        xc = as_compute(x)
        if xc.dtype.kind != "f":
            raise spec.error(f"element type {x.dtype} is not supported")
        outer, n, inner = _axis_layout(spec, x.shape, axis, flatten)
        out = spec.alloc.empty(xc.shape, xc.dtype)
        if out.size:
            run_ranges(k_hardmax, outer, (xc.reshape(-1), out.reshape(-1), n, inner), unit_cost=n * inner)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run
