"""Activation kernels: Relu and friends, Clip, Sigmoid/Tanh/Erf/Gelu, Softmax/LogSoftmax/Hardmax.

Plain numpy, computed in the input's dtype (float16 and bfloat16 in float32, rounded back once).
Erf is ``math.erf`` in a small Numba loop (numpy has no erf). PRelu lives with the binary
kernels (its slope broadcasts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba
import numpy as np

from byoc.kernels.elementwise import compute_dtype
from byoc.kernels.registry import NodeSpec, kernel

Fn = Callable[[np.ndarray], np.ndarray]


@numba.njit(cache=True, nogil=True)
def erf(x):
    """``math.erf`` of every element of the 1-D ``x`` (a new array of its float dtype)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.erf(x[i])
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))``; ``exp(-x)`` overflows to inf for very negative x, giving the limit 0."""
    y = np.exp(-x)
    y += 1
    return np.reciprocal(y, out=y)


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))`` without overflow."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _float_attr(spec: NodeSpec, name: str, default: float) -> float:
    v = spec.attr(name, default)
    try:
        return float(v)
    except (TypeError, ValueError):
        raise spec.error(f"attribute {name!r} must be a float, got {v!r}") from None


def _compute(spec: NodeSpec, x, kinds: str) -> np.ndarray:
    x = np.asarray(x)
    dt = compute_dtype(x.dtype)
    if dt.kind not in kinds:
        raise spec.error(f"element type {x.dtype} is not supported")
    return x.astype(dt, copy=False)


def _pointwise(spec: NodeSpec, fn: Fn, kinds: str = "f"):
    """A run function applying ``fn`` to the input flattened to 1-D, in the compute dtype, and
    casting back. Overflow to inf and inf/NaN arithmetic (``-inf * 0``) are expected: no warnings."""

    def run(x):
        xc = _compute(spec, x, kinds)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            y = fn(xc.reshape(-1))
        return (y.reshape(xc.shape).astype(np.asarray(x).dtype, copy=False),)

    return run


def _split(x: np.ndarray, neg: Fn) -> np.ndarray:
    """``x`` where positive, else ``neg(x)`` (``neg(0)`` must be 0): ``max(x, 0) + neg(min(x, 0))``,
    which keeps NaN and, unlike ``np.where``, has no branch to mispredict."""
    return np.maximum(x, 0) + neg(np.minimum(x, 0))


@kernel("Relu")
def make_relu(spec: NodeSpec):
    return _pointwise(spec, lambda x: np.maximum(x, 0), kinds="if")  # keeps NaN


@kernel("LeakyRelu")
def make_leaky_relu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 0.01)
    if alpha == 0:  # inf * 0 is NaN: the max below would lose +inf
        return _pointwise(spec, lambda x: _split(x, lambda n: n * alpha))
    # x for x >= 0, alpha * x below: the larger of the two where alpha <= 1, else the smaller
    pick = np.maximum if alpha <= 1 else np.minimum
    return _pointwise(spec, lambda x: pick(x, x * alpha))


@kernel("ThresholdedRelu")
def make_thresholded_relu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.0)
    return _pointwise(spec, lambda x: np.where(x > alpha, x, 0))


@kernel("Sigmoid")
def make_sigmoid(spec: NodeSpec):
    return _pointwise(spec, sigmoid)


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    y = x * alpha
    y += beta
    return np.clip(y, 0, 1, out=y)


@kernel("HardSigmoid")
def make_hard_sigmoid(spec: NodeSpec):
    alpha, beta = _float_attr(spec, "alpha", 0.2), _float_attr(spec, "beta", 0.5)
    return _pointwise(spec, lambda x: _hard_sigmoid(x, alpha, beta))


@kernel("HardSwish")
def make_hard_swish(spec: NodeSpec):
    return _pointwise(spec, lambda x: x * _hard_sigmoid(x, 1.0 / 6.0, 0.5))


@kernel("Tanh")
def make_tanh(spec: NodeSpec):
    return _pointwise(spec, np.tanh)


@kernel("Erf")
def make_erf(spec: NodeSpec):
    return _pointwise(spec, erf)


@kernel("Elu")
def make_elu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.0)
    return _pointwise(spec, lambda x: _split(x, lambda n: alpha * np.expm1(n)))


@kernel("Selu")
def make_selu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.67326319217681884765625)
    gamma = _float_attr(spec, "gamma", 1.05070102214813232421875)
    return _pointwise(spec, lambda x: gamma * _split(x, lambda n: alpha * np.expm1(n)))


@kernel("Celu")
def make_celu(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.0)
    if alpha == 0:
        raise spec.error("alpha must not be 0")
    return _pointwise(spec, lambda x: _split(x, lambda n: alpha * np.expm1(n / alpha)))


@kernel("Softplus")
def make_softplus(spec: NodeSpec):
    return _pointwise(spec, softplus)


@kernel("Softsign")
def make_softsign(spec: NodeSpec):
    return _pointwise(spec, lambda x: x / (1 + np.abs(x)))


@kernel("Mish")
def make_mish(spec: NodeSpec):
    return _pointwise(spec, lambda x: x * np.tanh(softplus(x)))


@kernel("Swish")
def make_swish(spec: NodeSpec):
    alpha = _float_attr(spec, "alpha", 1.0)
    return _pointwise(spec, lambda x: x * sigmoid(x * alpha))


@kernel("Gelu")
def make_gelu(spec: NodeSpec):
    approx = spec.attr("approximate", "none")
    if isinstance(approx, bytes):
        approx = approx.decode()
    if approx == "none":
        return _pointwise(spec, lambda x: 0.5 * x * (1 + erf(x * (1 / math.sqrt(2)))))
    if approx == "tanh":
        k = math.sqrt(2 / math.pi)
        return _pointwise(spec, lambda x: 0.5 * x * (1 + np.tanh(k * (x + 0.044715 * x * x * x))))
    raise spec.error(f"approximate must be 'none' or 'tanh', got {approx!r}")


@kernel("Shrink")
def make_shrink(spec: NodeSpec):
    lambd, bias = _float_attr(spec, "lambd", 0.5), _float_attr(spec, "bias", 0.0)
    # integers compute in float64 and are truncated back, as onnx.reference and onnxruntime do
    return _pointwise(spec, lambda x: np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)), kinds="iuf")


def _scalar_bound(spec: NodeSpec, v, name: str) -> float | int | None:
    if v is None:
        return None
    a = np.asarray(v)
    if a.size != 1:
        raise spec.error(f"{name} must be a scalar, got shape {list(a.shape)}")
    return a.reshape(-1)[0].item()


@kernel("Clip")
def make_clip(spec: NodeSpec):
    attrs = (_float_attr(spec, "min", -math.inf), _float_attr(spec, "max", math.inf)) if spec.opset < 11 else None

    def run(x, lo=None, hi=None):
        xc = _compute(spec, x, "iuf")
        lo, hi = attrs if attrs else (_scalar_bound(spec, lo, "min"), _scalar_bound(spec, hi, "max"))
        if xc.dtype.kind == "f":
            lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
        else:  # bounds within the integer type's range (so they convert)
            info = np.iinfo(xc.dtype)
            lo = info.min if lo is None else min(max(int(lo), info.min), info.max)
            hi = info.max if hi is None else min(max(int(hi), info.min), info.max)
        # NaN stays NaN; lo > hi gives hi (np.clip is the max with lo first, then the min with hi)
        return (np.asarray(np.clip(xc, lo, hi), dtype=np.asarray(x).dtype),)

    return run


# -------------------------------------------------------------------------------------------------
# softmax family


def _axis(spec: NodeSpec, x: np.ndarray, axis: int, flatten: bool) -> tuple[np.ndarray, int]:
    """``x`` (before opset 13: coerced to 2-D at ``axis``) and the axis to work along."""
    nd = x.ndim
    if nd == 0:
        raise spec.error("input must have at least one dimension")
    a = axis + nd if axis < 0 else axis
    if not 0 <= a < nd:
        raise spec.error(f"axis {axis} is out of range for rank {nd}")
    if flatten:
        return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:])), 1
    return x, a


def softmax(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Softmax (or LogSoftmax) along ``axis``: the maximum subtracted first, a float64 sum."""
    with np.errstate(invalid="ignore", divide="ignore"):  # inf - inf and NaN rows give NaN
        y = x - x.max(axis=axis, keepdims=True)
        e = np.exp(y)
        s = e.sum(axis=axis, keepdims=True, dtype=np.float64)
        if log:
            y -= np.log(s)  # x - max - log(sum): finite where softmax underflows
            return y
        e /= s
        return e


def _make_softmax(spec: NodeSpec, log: bool):
    flatten = spec.opset < 13
    axis = int(spec.attr("axis", 1 if flatten else -1))

    def run(x):
        xc = _compute(spec, x, "f")
        x2, a = _axis(spec, xc, axis, flatten)
        y = softmax(x2, a, log) if x2.size else x2.copy()
        return (y.reshape(xc.shape).astype(np.asarray(x).dtype, copy=False),)

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
        xc = _compute(spec, x, "f")
        x2, a = _axis(spec, xc, axis, flatten)
        y = spec.alloc.zeros(x2.shape, xc.dtype)
        if y.size:  # one-hot of the first maximum (a NaN counts as the maximum)
            np.put_along_axis(y, np.argmax(x2, axis=a, keepdims=True), 1, axis=a)
        return (y.reshape(xc.shape).astype(np.asarray(x).dtype, copy=False),)

    return run
