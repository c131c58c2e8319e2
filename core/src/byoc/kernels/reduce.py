"""Reduction kernels: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp, ArgMax/ArgMin.

Plain numpy reductions. Float inputs accumulate in float64, integer inputs in int64 (unsigned:
uint64); the result is cast back to the input's type, as onnx does. ReduceMax/ReduceMin compare
in the input's type (bool too); an empty reduction gives the identity (0, 1, the lowest or the
highest value; ReduceMean's is 0, as onnxruntime's).

``axes`` is an attribute before opset 18 (ReduceSum: before 13) and an optional input after.
With no axes every axis is reduced, unless ``noop_with_empty_axes=1``: then nothing is, and
the result is the elementwise part of the reduction (``x**2`` for ReduceSumSquare, ``x`` for
ReduceSum), as in onnx.reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from byoc.kernels.elementwise import compute_dtype
from byoc.kernels.registry import NodeSpec, kernel

#: ``fn(x, axes, acc)``: the reduction of ``x`` over ``axes`` (kept as size 1), accumulating in ``acc``
Reduction = Callable[[np.ndarray, tuple[int, ...], np.dtype], np.ndarray]


def _extreme(x: np.ndarray, low: bool):
    """The lowest (``low``) or highest value of ``x``'s type: the identity of max (min)."""
    if x.dtype == np.bool_:
        return not low
    if x.dtype.kind == "f":
        return -np.inf if low else np.inf
    info = np.iinfo(x.dtype)
    return info.min if low else info.max


def _sum(x, axes, acc):
    return np.sum(x, axis=axes, dtype=acc, keepdims=True)


def _mean(x, axes, acc):
    s = _sum(x, axes, acc) / max(1, math.prod(x.shape[a] for a in axes))  # empty: 0, as onnxruntime
    return s if acc.kind == "f" else np.trunc(s)  # integers: the quotient truncated, as numpy's mean


def _log_sum_exp(x, axes, acc):
    """``m + log(sum(exp(x - m)))``, ``m`` the maximum (0 where it is infinite), in float64."""
    m = np.asarray(np.max(x, axis=axes, keepdims=True, initial=_extreme(x, True)), dtype=np.float64)
    m[~np.isfinite(m)] = 0.0
    return np.log(np.sum(np.exp(np.subtract(x, m, dtype=np.float64)), axis=axes, keepdims=True)) + m


_OPS: dict[str, tuple[Reduction, str]] = {  # op -> (reduction, the element kinds it takes)
    "ReduceSum": (_sum, "iuf"),
    "ReduceMean": (_mean, "iuf"),
    "ReduceSumSquare": (lambda x, axes, acc: _sum(np.square(x, dtype=acc), axes, acc), "iuf"),
    "ReduceL1": (lambda x, axes, acc: _sum(np.abs(x, dtype=acc), axes, acc), "iuf"),
    "ReduceL2": (lambda x, axes, acc: np.sqrt(_sum(np.square(x, dtype=acc), axes, acc)), "iuf"),
    "ReduceLogSum": (lambda x, axes, acc: np.log(_sum(x, axes, acc)), "iuf"),
    "ReduceLogSumExp": (_log_sum_exp, "iuf"),
    "ReduceProd": (lambda x, axes, acc: np.prod(x, axis=axes, dtype=acc, keepdims=True), "iuf"),
    "ReduceMax": (lambda x, axes, acc: np.max(x, axis=axes, keepdims=True, initial=_extreme(x, True)), "iufb"),
    "ReduceMin": (lambda x, axes, acc: np.min(x, axis=axes, keepdims=True, initial=_extreme(x, False)), "iufb"),
}

#: the opset from which ``axes`` is an input
_AXES_INPUT_FROM = {"ReduceSum": 13}


def _acc_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64 if dt.kind == "f" else np.uint64 if dt.kind == "u" else np.int64)


def _normalize_axes(spec: NodeSpec, axes, nd: int) -> tuple[int, ...]:
    out = []
    for a in axes:
        a = int(a)
        if not -nd <= a < max(nd, 1):
            raise spec.error(f"axis {a} is out of range for rank {nd}")
        out.append(a + nd if a < 0 else a)
    if len(set(out)) != len(out):
        raise spec.error(f"axes {list(axes)} repeat an axis")
    return tuple(sorted(a for a in out if a < nd))


def _make_reduce(spec: NodeSpec, fn: Reduction, kinds: str):
    keepdims = bool(spec.attr("keepdims", 1))
    noop = bool(spec.attr("noop_with_empty_axes", 0))
    from_opset = _AXES_INPUT_FROM.get(spec.op_type, 18)
    axes_from_input = spec.opset >= from_opset
    if axes_from_input and spec.attr("axes") is not None:
        raise spec.error(f"'axes' is an input from opset {from_opset}, not an attribute")
    attr_axes = None if axes_from_input else spec.attr("axes")

    def run(x, axes=None):
        x = np.asarray(x)
        xc = x.astype(compute_dtype(x.dtype), copy=False)
        if xc.dtype.kind not in kinds:
            raise spec.error(f"element type {x.dtype} is not supported")
        ax = np.asarray(axes).reshape(-1).tolist() if axes_from_input and axes is not None else attr_axes
        if ax:
            red = _normalize_axes(spec, ax, xc.ndim)
        else:  # no axes: all of them, or none (each element its own group)
            red = () if noop else tuple(range(xc.ndim))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = np.asarray(fn(xc, red, _acc_dtype(xc.dtype)), dtype=x.dtype)
        if not keepdims:
            y = y.reshape([n for d, n in enumerate(y.shape) if d not in red])
        return (y,)

    return run


def _register(op_type: str, fn: Reduction, kinds: str) -> None:
    @kernel(op_type)
    def make(spec: NodeSpec):
        return _make_reduce(spec, fn, kinds)

    make.__name__ = f"make_{op_type.lower()}"


for _name, (_fn, _kinds) in _OPS.items():
    _register(_name, _fn, _kinds)


def _make_arg(spec: NodeSpec, argfn: Callable):
    axis = int(spec.attr("axis", 0))
    keepdims = bool(spec.attr("keepdims", 1))
    last = bool(spec.attr("select_last_index", 0))

    def run(x):
        x = np.asarray(x)
        xc = x.astype(compute_dtype(x.dtype), copy=False)
        if xc.dtype.kind not in "iufb":
            raise spec.error(f"element type {x.dtype} is not supported")
        nd = xc.ndim
        if not -nd <= axis < max(nd, 1):
            raise spec.error(f"axis {axis} is out of range for rank {nd}")
        if nd == 0:
            return (np.asarray(0, dtype=np.int64),)
        a = axis + nd if axis < 0 else axis
        n = xc.shape[a]
        if n == 0:
            raise spec.error(f"cannot take {spec.op_type} over the empty axis {axis}")
        # ties: the first index; a NaN beats every number (the first NaN); select_last_index: the last
        if last:
            idx = (n - 1) - argfn(np.flip(xc, axis=a), axis=a, keepdims=keepdims)
        else:
            idx = argfn(xc, axis=a, keepdims=keepdims)
        return (np.asarray(idx, dtype=np.int64),)

    return run


@kernel("ArgMax")
def make_argmax(spec: NodeSpec):
    return _make_arg(spec, np.argmax)


@kernel("ArgMin")
def make_argmin(spec: NodeSpec):
    return _make_arg(spec, np.argmin)
