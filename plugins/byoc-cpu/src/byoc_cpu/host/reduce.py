"""byoc-cpu's reduction kernels: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp, ArgMax/ArgMin.

Every reduction runs on the input viewed as ``(outer, r, inner)``: the reduced axes, after
size-1 axes are dropped and neighbours merged, form one block ``r``. When the reduced axes are
not adjacent (``axes=[0, 2]`` of a 3-D tensor) the input is first transposed (a copy) so that
they are. Float inputs accumulate in float64 (float16 is read as float32), integer inputs in
int64; the result is cast back to the input's type, as onnx does.

``axes`` is an attribute before opset 18 (ReduceSum: before 13) and an optional input after.
With no axes every axis is reduced, unless ``noop_with_empty_axes=1``: then nothing is, and
the result is the elementwise part of the reduction (``x**2`` for ReduceSumSquare, ``x`` for
ReduceSum), as in onnx.reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from byoc_cpu.host.elementwise import as_compute, run_ranges
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
# sums may be reordered (vectorised partial sums); NaN/inf semantics stay IEEE
_jit_sum = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
_inline = numba.njit(inline="always", error_model="numpy")


# ---------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReduceLayout:
    #: permutation to apply first (None: the reduced axes are already one block)
    perm: tuple[int, ...] | None
    outer: int
    r: int
    inner: int
    out_shape: tuple[int, ...]


@functools.lru_cache(maxsize=2048)
def reduce_layout(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> ReduceLayout:
    """Layout for reducing ``shape`` over ``axes`` (normalised, sorted, unique)."""
    nd = len(shape)
    red = [d in axes for d in range(nd)]
    if keepdims:
        out_shape = tuple(1 if red[d] else shape[d] for d in range(nd))
    else:
        out_shape = tuple(shape[d] for d in range(nd) if not red[d])
    # groups of neighbouring axes with the same role; size-1 axes play no role
    groups: list[list] = []
    for d in range(nd):
        if shape[d] == 1:
            continue
        if groups and groups[-1][1] == red[d]:
            groups[-1][0] *= shape[d]
        else:
            groups.append([shape[d], red[d]])
    n_red_groups = sum(1 for _, r in groups if r)
    if n_red_groups <= 1:
        outer, r, inner = 1, 1, 1
        seen = False
        for n, is_red in groups:
            if is_red:
                r = n
                seen = True
            elif seen:
                inner *= n
            else:
                outer *= n
        return ReduceLayout(None, outer, r, inner, out_shape)
    kept = [d for d in range(nd) if not red[d]]
    reduced = [d for d in range(nd) if red[d]]
    outer = math.prod(shape[d] for d in kept)
    r = math.prod(shape[d] for d in reduced)
    return ReduceLayout(tuple(kept + reduced), outer, r, 1, out_shape)


# ---------------------------------------------------------------------------------------------
# kernels: (x, out, r, inner, init, rr, start, stop) over outer rows [start, stop)
# ---------------------------------------------------------------------------------------------


@_inline
def _reduce(step, fin, x, out, r, inner, init, rr, start, stop):
    if inner == 1:
        for o in range(start, stop):
            row = x[o * r : (o + 1) * r]
            a = init
            for j in range(r):
                a = step(a, row[j])
            out[o] = fin(a, rr)
        return
    acc = np.full(inner, init)
    for o in range(start, stop):
        blk = x[o * r * inner : (o + 1) * r * inner]
        acc[:] = init
        for j in range(r):
            row = blk[j * inner : (j + 1) * inner]
            for i in range(inner):
                acc[i] = step(acc[i], row[i])
        orow = out[o * inner : (o + 1) * inner]
        for i in range(inner):
            orow[i] = fin(acc[i], rr)


#: independent accumulators of a row max/min: they break the loop-carried dependency, so the
#: compiler vectorises it without fast-math (sums vectorise under reassociation alone)
_LANES = 16


@_inline
def _minmax(step, plain, x, out, r, inner, init, start, stop):
    """max/min: ``step`` propagates NaN, ``plain`` is the NaN-free compare for the fast path."""
    if inner != 1 or r < 2 * _LANES:
        _reduce(step, _f_id, x, out, r, inner, init, 1.0, start, stop)
        return
    lanes = np.full(_LANES, init)
    nb = r // _LANES
    for o in range(start, stop):
        row = x[o * r : (o + 1) * r]
        nan = False
        for j in range(r):  # branch-free, vectorised
            nan |= row[j] != row[j]  # noqa: PLR0124
        a = init
        if nan:
            for j in range(r):
                a = step(a, row[j])
        else:
            lanes[:] = init
            for b in range(nb):
                blk = row[b * _LANES : (b + 1) * _LANES]
                for i in range(_LANES):
                    lanes[i] = plain(lanes[i], blk[i])
            for i in range(_LANES):
                a = plain(a, lanes[i])
            for j in range(nb * _LANES, r):
                a = plain(a, row[j])
        out[o] = a


@_inline
def _s_sum(a, v):
    return a + v


@_inline
def _s_sum_square(a, v):
    return a + v * v


@_inline
def _s_l1(a, v):
    return a + (v if v >= 0 else -v)


@_inline
def _s_prod(a, v):
    return a * v


@_inline
def _s_max(a, v):
    return v if (v > a or v != v) else a  # noqa: PLR0124  (NaN propagates)


@_inline
def _s_min(a, v):
    return v if (v < a or v != v) else a  # noqa: PLR0124


@_inline
def _p_max(a, v):
    return v if v > a else a


@_inline
def _p_min(a, v):
    return v if v < a else a


@_inline
def _f_id(a, rr):
    return a


@_inline
def _f_mean(a, rr):
    return a / rr


@_inline
def _f_mean_int(a, rr):
    # integer mean: the float quotient truncated, as numpy's mean with an integer dtype
    return int(a / rr)


@_inline
def _f_sqrt(a, rr):
    return np.sqrt(a)


@_inline
def _f_log(a, rr):
    return np.log(a)


@_jit_sum
def k_sum(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_sum, _f_id, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_mean(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_sum, _f_mean, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_mean_int(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_sum, _f_mean_int, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_sum_square(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_sum_square, _f_id, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_l1(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_l1, _f_id, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_l2(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_sum_square, _f_sqrt, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_log_sum(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_sum, _f_log, x, out, r, inner, init, rr, start, stop)


@_jit_sum
def k_prod(x, out, r, inner, init, rr, start, stop):
    _reduce(_s_prod, _f_id, x, out, r, inner, init, rr, start, stop)


@_jit
def k_max(x, out, r, inner, init, rr, start, stop):
    _minmax(_s_max, _p_max, x, out, r, inner, init, start, stop)


@_jit
def k_min(x, out, r, inner, init, rr, start, stop):
    _minmax(_s_min, _p_min, x, out, r, inner, init, start, stop)


@_jit
def k_log_sum_exp(x, out, r, inner, init, rr, start, stop):
    """log(sum(exp(x))) = m + log(sum(exp(x - m))), m the maximum (0 when it is infinite)."""
    for o in range(start, stop):
        blk = x[o * r * inner : (o + 1) * r * inner]
        for i in range(inner):
            m = -np.inf
            for j in range(r):
                v = np.float64(blk[j * inner + i])
                if v > m or v != v:  # noqa: PLR0124
                    m = v
            shift = m if (m > -np.inf and m < np.inf) else 0.0
            s = 0.0
            for j in range(r):
                s += np.exp(np.float64(blk[j * inner + i]) - shift)
            out[o * inner + i] = np.log(s) + shift


@_inline
def _gt(v, best):
    return v > best


@_inline
def _ge(v, best):
    return v >= best


@_inline
def _lt(v, best):
    return v < best


@_inline
def _le(v, best):
    return v <= best


@_inline
def _arg_rows(better, x, out, r, start, stop):
    # inner == 1: one contiguous row per output
    for o in range(start, stop):
        row = x[o * r : (o + 1) * r]
        best = row[0]
        bi = 0
        for j in range(1, r):
            v = row[j]
            if better(v, best):
                best = v
                bi = j
        out[o] = bi


@_inline
def _arg_blocks(better, x, out, r, inner, start, stop):
    best = np.empty(inner, x.dtype)
    idx = np.empty(inner, np.int64)
    for o in range(start, stop):
        blk = x[o * r * inner : (o + 1) * r * inner]
        for i in range(inner):  # not a slice copy: that compiles Numba's shape-error path
            best[i] = blk[i]
        idx[:] = 0
        for j in range(1, r):
            row = blk[j * inner : (j + 1) * inner]
            for i in range(inner):
                if better(row[i], best[i]):
                    best[i] = row[i]
                    idx[i] = j
        orow = out[o * inner : (o + 1) * inner]
        for i in range(inner):
            orow[i] = idx[i]


@_inline
def _arg_nan_fixup(x, out, r, inner, last, start, stop):
    # NaN as numpy (and onnx.reference) treat it: a NaN beats every number; the first NaN wins,
    # the last one with select_last_index. One vectorised pass looks for NaN at all.
    nan = False
    seg = x[start * r * inner : stop * r * inner]
    for k in range(seg.size):
        nan |= seg[k] != seg[k]  # noqa: PLR0124
    if not nan:
        return
    for o in range(start, stop):
        blk = x[o * r * inner : (o + 1) * r * inner]
        for i in range(inner):
            found = -1
            for j in range(r):
                v = blk[j * inner + i]
                if v != v:  # noqa: PLR0124
                    found = j
                    if not last:
                        break
            if found >= 0:
                out[o * inner + i] = found


@_inline
def _arg(strict, loose, x, out, r, inner, last, start, stop):
    # ties: the first index with a strict comparison, the last with a loose one
    if inner == 1:
        if last:
            _arg_rows(loose, x, out, r, start, stop)
        else:
            _arg_rows(strict, x, out, r, start, stop)
    elif last:
        _arg_blocks(loose, x, out, r, inner, start, stop)
    else:
        _arg_blocks(strict, x, out, r, inner, start, stop)
    _arg_nan_fixup(x, out, r, inner, last, start, stop)


@_jit
def k_argmax(x, out, r, inner, last, start, stop):
    _arg(_gt, _ge, x, out, r, inner, last, start, stop)


@_jit
def k_argmin(x, out, r, inner, last, start, stop):
    _arg(_lt, _le, x, out, r, inner, last, start, stop)


# ---------------------------------------------------------------------------------------------
# operators
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Op:
    fn: Callable
    #: "acc": accumulate in float64/int64 (sums, products); "same": in the input type (max/min)
    acc: str
    #: initial value: "zero", "one", "low" (lowest value), "high" (highest value)
    init: str
    kinds: str = "iuf"
    int_fn: Callable | None = None


_OPS = {
    "ReduceSum": _Op(k_sum, "acc", "zero"),
    "ReduceMean": _Op(k_mean, "acc", "zero", int_fn=k_mean_int),
    "ReduceSumSquare": _Op(k_sum_square, "acc", "zero"),
    "ReduceL1": _Op(k_l1, "acc", "zero"),
    "ReduceL2": _Op(k_l2, "acc", "zero"),
    "ReduceLogSum": _Op(k_log_sum, "acc", "zero"),
    "ReduceLogSumExp": _Op(k_log_sum_exp, "acc", "zero"),
    "ReduceProd": _Op(k_prod, "acc", "one"),
    "ReduceMax": _Op(k_max, "same", "low", kinds="iufb"),
    "ReduceMin": _Op(k_min, "same", "high", kinds="iufb"),
}

#: the opset from which ``axes`` is an input
_AXES_INPUT_FROM = {"ReduceSum": 13}


def _acc_dtype(dt: np.dtype, how: str) -> np.dtype:
    if how == "same":
        return dt
    if dt.kind == "f":
        return np.dtype(np.float64)
    if dt.kind == "u":
        return np.dtype(np.uint64)
    return np.dtype(np.int64)


def _init_value(dt: np.dtype, how: str):
    if how == "zero":
        return dt.type(0)
    if how == "one":
        return dt.type(1)
    if dt.kind == "f":
        return dt.type(-np.inf if how == "low" else np.inf)
    info = np.iinfo(dt)
    return dt.type(info.min if how == "low" else info.max)


def _normalize_axes(spec: NodeSpec, axes, nd: int) -> tuple[int, ...]:
    out = []
    for a in axes:
        a = int(a)
        if not -nd <= a < max(nd, 1):
            raise spec.error(f"axis {a} is out of range for rank {nd}")
        out.append(a + nd if a < 0 else a)
    if len(set(out)) != len(out):
        raise spec.error(f"axes {list(axes)} repeat an axis")
    return tuple(sorted(out))


def _make_reduce(spec: NodeSpec, op: _Op):
    keepdims = bool(spec.attr("keepdims", 1))
    noop = bool(spec.attr("noop_with_empty_axes", 0))
    axes_from_input = spec.opset >= _AXES_INPUT_FROM.get(spec.op_type, 18)
    attr_axes = None if axes_from_input else spec.attr("axes")
    if axes_from_input and spec.attr("axes") is not None:
        raise spec.error(f"'axes' is an input from opset {_AXES_INPUT_FROM.get(spec.op_type, 18)}, not an attribute")

    def run(x, axes=None):
        x = np.asarray(x)
        orig = x.dtype
        is_bool = orig == np.bool_
        if is_bool and "b" in op.kinds:
            x = x.view(np.uint8)
        xc = as_compute(x)
        if xc.dtype.kind not in op.kinds.replace("b", ""):
            raise spec.error(f"element type {orig} is not supported")
        nd = xc.ndim
        ax = attr_axes if not axes_from_input else (None if axes is None else np.asarray(axes).reshape(-1).tolist())
        if not ax:
            if noop:
                # nothing reduced: each element is its own group (x**2 for SumSquare, ...)
                layout = ReduceLayout(None, xc.size, 1, 1, xc.shape)
            else:
                layout = reduce_layout(xc.shape, tuple(range(nd)), keepdims)
        else:
            layout = reduce_layout(xc.shape, _normalize_axes(spec, ax, nd), keepdims)
        if layout.perm is not None:
            xc = np.ascontiguousarray(xc.transpose(layout.perm))
        acc_dt = _acc_dtype(xc.dtype, op.acc)
        init = _init_value(acc_dt, op.init)
        if is_bool:
            init = np.uint8(op.init == "high")  # the bool range is [0, 1]
        fn = op.int_fn if (op.int_fn is not None and xc.dtype.kind in "iu") else op.fn
        out = spec.alloc.empty(layout.out_shape, xc.dtype)
        if out.size:
            # an empty reduction's mean is 0 (as onnxruntime's): divided by 1, not 0
            args = (xc.reshape(-1), out.reshape(-1), layout.r, layout.inner, init, float(max(layout.r, 1)))
            run_ranges(fn, layout.outer, args, unit_cost=layout.r * layout.inner)
        if is_bool:
            return (out.view(np.bool_),)
        return (out if out.dtype == orig else out.astype(orig),)

    return run


def _register(op_type: str, op: _Op) -> None:
    @kernel(op_type)
    def make(spec: NodeSpec):
        return _make_reduce(spec, op)

    make.__name__ = f"make_{op_type.lower()}"


for _name, _op in _OPS.items():
    _register(_name, _op)


def _make_arg(spec: NodeSpec, fn: Callable):
    axis = int(spec.attr("axis", 0))
    keepdims = bool(spec.attr("keepdims", 1))
    last = bool(spec.attr("select_last_index", 0))

    def run(x):
        x = np.asarray(x)
        if x.dtype == np.bool_:
            x = x.view(np.uint8)
        xc = as_compute(x)
        if xc.dtype.kind not in "iuf":
            raise spec.error(f"element type {x.dtype} is not supported")
        nd = xc.ndim
        if not -nd <= axis < max(nd, 1):
            raise spec.error(f"axis {axis} is out of range for rank {nd}")
        a = axis + nd if axis < 0 else axis
        shape = xc.shape
        if nd and shape[a] == 0:
            raise spec.error(f"cannot take {spec.op_type} over the empty axis {axis}")
        out_shape = shape[:a] + ((1,) if keepdims else ()) + shape[a + 1 :] if nd else ()
        out = spec.alloc.empty(out_shape, np.int64)
        if out.size:
            r = shape[a] if nd else 1
            inner = math.prod(shape[a + 1 :]) if nd else 1
            outer = math.prod(shape[:a]) if nd else 1
            run_ranges(fn, outer, (xc.reshape(-1), out.reshape(-1), r, inner, last), unit_cost=r * inner)
        return (out,)

    return run


@kernel("ArgMax")
def make_argmax(spec: NodeSpec):
    return _make_arg(spec, k_argmax)


@kernel("ArgMin")
def make_argmin(spec: NodeSpec):
    return _make_arg(spec, k_argmin)
