"""Indexing and sequence helpers: GatherND, ScatterND, ScatterElements, CumSum, CumProd, NonZero, TopK, Trilu,
Einsum."""

from __future__ import annotations

import math

import numpy as np

from byoc.kernels.registry import NodeSpec, kernel

_REDUCE = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _reduction(spec: NodeSpec):
    name = spec.attr("reduction", "none")
    if name not in _REDUCE:
        raise spec.error(f"reduction must be one of {sorted(_REDUCE)}, got {name!r}")
    return _REDUCE[name]


def _normalise_indices(spec: NodeSpec, idx: np.ndarray, dims) -> np.ndarray:
    idx = idx.astype(np.int64)
    dims = np.asarray(dims, dtype=np.int64)
    idx = np.where(idx < 0, idx + dims, idx)
    if np.any(idx < 0) or np.any(idx >= dims):
        raise spec.error(f"index out of range for dimensions {dims.tolist()}")
    return idx


@kernel("GatherND")
def make_gather_nd(spec: NodeSpec):
    b = int(spec.attr("batch_dims", 0))

    def run(data, indices):
        if indices.dtype.kind not in "iu":
            raise spec.error(f"indices must be an integer tensor, got {indices.dtype}")
        k = indices.shape[-1] if indices.ndim else 0
        if not 0 <= b < min(data.ndim, indices.ndim) or not 1 <= k <= data.ndim - b:
            raise spec.error(f"batch_dims={b} and indices of shape {list(indices.shape)} do not fit data of "
                             f"shape {list(data.shape)}")
        if indices.shape[:b] != data.shape[:b]:
            raise spec.error(f"the batch dimensions of indices {list(indices.shape[:b])} and data "
                             f"{list(data.shape[:b])} differ")
        out_shape = indices.shape[:-1] + data.shape[b + k:]
        spec.check_alloc(out_shape, data.dtype)
        nb = math.prod(data.shape[:b])
        idx = _normalise_indices(spec, indices.reshape(nb, math.prod(indices.shape[b:-1]), k), data.shape[b:b + k])
        rows = spec.alloc.arange(nb)[:, None]
        out = data.reshape((nb,) + data.shape[b:])[(rows, *np.moveaxis(idx, -1, 0))]
        return (out.reshape(out_shape),)

    return run


@kernel("ScatterND")
def make_scatter_nd(spec: NodeSpec):
    op = _reduction(spec)

    def run(data, indices, updates):
        out = data.copy()
        k = indices.shape[-1]
        idx = _normalise_indices(spec, indices.reshape(-1, k), data.shape[:k])
        upd = updates.reshape((idx.shape[0],) + data.shape[k:])
        key = tuple(idx.T)
        if op is None:
            out[key] = upd
        else:
            op.at(out, key, upd)
        return (out,)

    return run


@kernel("ScatterElements", "Scatter")
def make_scatter_elements(spec: NodeSpec):
    op = _reduction(spec)
    axis = int(spec.attr("axis", 0))

    def run(data, indices, updates):
        out = data.copy()
        ax = axis + data.ndim if axis < 0 else axis
        idx = _normalise_indices(spec, indices, data.shape[ax])
        grid = list(np.ogrid[tuple(slice(0, d) for d in indices.shape)]) if indices.ndim else []
        grid[ax] = idx
        key = tuple(grid)
        if op is None:
            out[key] = updates
        else:
            op.at(out, key, updates)
        return (out,)

    return run


@kernel("CumSum", "CumProd")
def make_cumulate(spec: NodeSpec):
    exclusive = bool(spec.attr("exclusive", 0))
    reverse = bool(spec.attr("reverse", 0))
    prod = spec.op_type == "CumProd"

    def run(x, axis):
        ax = int(np.asarray(axis).reshape(()))
        if not -x.ndim <= ax < x.ndim:
            raise spec.error(f"axis {ax} out of range for rank {x.ndim}")
        spec.check_alloc(x.shape, x.dtype)
        y = np.flip(x, ax) if reverse else x
        acc = (np.cumprod if prod else np.cumsum)(y, axis=ax, dtype=x.dtype)  # in order, in x's dtype
        if exclusive:
            out = spec.alloc.full(x.shape, 1 if prod else 0, x.dtype)
            lead = (slice(None),) * (ax % x.ndim)
            out[lead + (slice(1, None),)] = acc[lead + (slice(None, -1),)]
            acc = out
        return (np.ascontiguousarray(np.flip(acc, ax)) if reverse else acc,)

    return run


@kernel("NonZero")
def make_nonzero(spec: NodeSpec):
    def run(x):
        if x.ndim == 0:
            return (spec.alloc.zeros((0, int(bool(x))), np.int64),)
        return (spec.alloc.nonzero(x),)

    return run


@kernel("TopK")
def make_topk(spec: NodeSpec):
    axis = int(spec.attr("axis", -1))
    largest = bool(spec.attr("largest", 1))
    sorted_ = bool(spec.attr("sorted", 1))

    def run(x, k):
        kk = int(np.asarray(k).reshape(-1)[0])
        ax = axis + x.ndim if axis < 0 else axis
        if kk < 0 or kk > x.shape[ax]:
            raise spec.error(f"K={kk} out of range for axis {ax} of length {x.shape[ax]}")
        # stable sort keeps the smaller index first among equal values, as ONNX asks
        if largest:
            key = np.iinfo(x.dtype).max - x if x.dtype.kind == "u" else -x
        else:
            key = x
        order = np.argsort(key, axis=ax, kind="stable")
        idx = spec.alloc.take(order, spec.alloc.arange(kk), axis=ax)
        if not sorted_:
            idx = np.sort(idx, axis=ax)
        values = spec.alloc.take_along_axis(x, idx, axis=ax)
        return values, idx.astype(np.int64)

    return run


@kernel("Trilu")
def make_trilu(spec: NodeSpec):
    upper = bool(spec.attr("upper", 1))

    def run(x, k=None):
        kk = 0 if k is None else int(np.asarray(k).reshape(()))
        kk = max(-sum(x.shape[-2:]), min(sum(x.shape[-2:]), kk))  # past the matrix: all or nothing
        spec.check_alloc(x.shape, x.dtype)  # the same size as x (np.triu/np.tril copy)
        return ((np.triu(x, kk) if upper else np.tril(x, kk)).astype(x.dtype, copy=False),)

    return run


@kernel("Einsum")
def make_einsum(spec: NodeSpec):
    equation = spec.attr("equation")
    if not isinstance(equation, str) or not equation:
        raise spec.error("the equation attribute is required")
    equation = equation.replace(" ", "")

    def run(*operands):
        try:
            return (spec.alloc.einsum(equation, *operands),)
        except ValueError as exc:
            raise spec.error(f"equation {equation!r}: {exc}") from None

    return run
