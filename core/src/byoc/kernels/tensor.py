"""Data-movement and shape kernels.

Reshape, Flatten, Transpose, Concat, Split, Slice, Squeeze, Unsqueeze, Gather, GatherElements,
Shape, Size, ConstantOfShape, Constant, Expand, Tile, Pad and Range, with ONNX semantics from
opset 11 to 25 (the attribute -> input moves of Split/Squeeze/Unsqueeze at 13, Pad at 11/18,
Slice at 10 and Shape's start/end at 15 are read from ``spec.opset``).

Pure data movement uses numpy and returns views where it can (kernels never write into their
inputs, so a view is safe). Pad's index mapping runs in :func:`gather_nd`, which copies
elements by per-axis index maps; it is shared with Resize's nearest mode.

Every allocation goes through ``spec.alloc`` (:class:`byoc.budget.Alloc`), which checks the size
against the budget first: ConstantOfShape, Expand, Tile, Range, Pad, Concat and Gather can all be
asked for far more than their inputs hold.
"""

from __future__ import annotations

import math

import numpy as np

from byoc.budget import DEFAULT_BUDGET, Alloc
from byoc.kernels.registry import NodeSpec, kernel

# ---------------------------------------------------------------------------------------------
# helpers


def _ints(spec: NodeSpec, arr, what: str) -> list[int]:
    """A 0-D/1-D integer tensor as a list of Python ints."""
    a = np.asarray(arr)
    if a.dtype.kind not in "iu":
        raise spec.error(f"{what} must be an integer tensor, got {a.dtype}")
    if a.ndim > 1:
        raise spec.error(f"{what} must be 1-D, got shape {list(a.shape)}")
    return [int(v) for v in a.reshape(-1)]


def _axis(spec: NodeSpec, axis: int, rank: int, what: str = "axis") -> int:
    a = int(axis)
    if not -rank <= a < rank:
        raise spec.error(f"{what} {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _axes(spec: NodeSpec, axes, rank: int, what: str = "axes") -> list[int]:
    out = [_axis(spec, a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise spec.error(f"{what} {list(axes)} has repeated entries")
    return out


# ---------------------------------------------------------------------------------------------
# generic gather by per-axis index maps (Pad, Resize nearest)

def gather_nd(x: np.ndarray, maps: list[np.ndarray], fill=0, alloc: Alloc | None = None) -> np.ndarray:
    """Copy ``x`` into a new array by per-axis source index maps.

    ``out[i0, i1, ...] = x[maps[0][i0], maps[1][i1], ...]``, or ``fill`` where any map entry is
    negative. ``maps`` has one int64 array per axis of ``x``; the output shape is their lengths.
    One gather per axis whose map is not the identity, shrinking axes first; ``alloc`` (the
    node's budgeted allocator) checks each result.
    """
    alloc = alloc or DEFAULT_BUDGET.guard("gather_nd")
    out_shape = tuple(len(m) for m in maps)
    if x.ndim == 0:
        return x.copy()
    alloc.check(out_shape, x.dtype)
    fill = np.asarray(fill).astype(x.dtype)
    if x.size == 0 or 0 in out_shape:  # nothing to read: every element (if any) is the fill
        return alloc.full(out_shape, fill, x.dtype)
    out = x
    for a in sorted(range(x.ndim), key=lambda a: len(maps[a]) / x.shape[a]):
        m = maps[a]
        if len(m) == x.shape[a] and (np.diff(m) == 1).all() and (len(m) == 0 or m[0] == 0):
            continue
        out = alloc.take(out, np.clip(m, 0, x.shape[a] - 1), axis=a)
        bad = m < 0
        if bad.any():
            out[(slice(None),) * a + (bad,)] = fill
    return out.copy() if out is x else out


# ---------------------------------------------------------------------------------------------
# shape ops


@kernel("Reshape")
def make_reshape(spec: NodeSpec):
    allowzero = bool(spec.attr("allowzero", 0)) and spec.opset >= 14

    def run(data, shape):
        dims = _ints(spec, shape, "shape")
        if dims.count(-1) > 1:
            raise spec.error(f"shape {dims} has more than one -1")
        if allowzero and 0 in dims and -1 in dims:
            raise spec.error(f"shape {dims} has both 0 and -1 with allowzero=1")
        out = []
        for i, d in enumerate(dims):
            if d == 0 and not allowzero:
                if i >= data.ndim:
                    raise spec.error(f"shape {dims}: 0 at position {i} copies a dimension the input "
                                     f"{list(data.shape)} lacks")
                d = data.shape[i]
            elif d < -1:
                raise spec.error(f"shape {dims} has a negative dimension {d}")
            out.append(d)
        try:
            return (data.reshape(out),)
        except ValueError:
            raise spec.error(f"cannot reshape {list(data.shape)} into {dims}") from None

    return run


@kernel("Flatten")
def make_flatten(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", 1))

    def run(x):
        r = x.ndim
        if not -r <= axis_attr <= r:
            raise spec.error(f"axis {axis_attr} is out of range for rank {r}")
        axis = axis_attr + r if axis_attr < 0 else axis_attr
        return (x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])),)

    return run


@kernel("Transpose")
def make_transpose(spec: NodeSpec):
    perm = spec.attr("perm")
    perm = None if perm is None else [int(p) for p in perm]

    def run(x):
        if perm is None:
            return (x.transpose(),)
        if sorted(perm) != list(range(x.ndim)):
            raise spec.error(f"perm {perm} is not a permutation of the {x.ndim} axes")
        return (x.transpose(perm),)

    return run


@kernel("Concat")
def make_concat(spec: NodeSpec):
    if spec.attr("axis") is None:
        raise spec.error("attribute 'axis' is required")
    axis_attr = int(spec.attr("axis"))

    def run(*xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            raise spec.error("needs at least one input")
        axis = _axis(spec, axis_attr, xs[0].ndim)
        dtype = xs[0].dtype
        for x in xs[1:]:
            if x.dtype != dtype:
                raise spec.error(f"inputs have different dtypes {dtype} and {x.dtype}")
        if len(xs) == 1:
            return (xs[0],)
        try:
            return (spec.alloc.concatenate(xs, axis=axis),)
        except ValueError as exc:
            raise spec.error(f"cannot concatenate shapes {[list(x.shape) for x in xs]}: {exc}") from None

    return run


@kernel("Split")
def make_split(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", 0))
    split_attr = spec.attr("split") if spec.opset < 13 else None
    num_outputs = spec.attr("num_outputs") if spec.opset >= 18 else None
    n_out = spec.n_outputs
    if num_outputs is not None and int(num_outputs) != n_out:
        raise spec.error(f"num_outputs={num_outputs} but the node has {n_out} outputs")

    def run(x, split=None):
        if x.ndim == 0:
            raise spec.error("cannot split a scalar")
        axis = _axis(spec, axis_attr, x.ndim)
        dim = x.shape[axis]
        if split is not None and np.asarray(split).size > 0:
            sizes = _ints(spec, split, "split")
        elif split_attr:
            sizes = [int(s) for s in split_attr]
        else:
            sizes = None
        if sizes is not None:
            if len(sizes) != n_out or any(s < 0 for s in sizes) or sum(sizes) != dim:
                raise spec.error(f"split {sizes} does not divide dimension {dim} into {n_out} outputs")
        else:
            # equal parts; when uneven, each chunk is ceil(dim / n) and the last one is smaller
            chunk = -(-dim // n_out)
            last = dim - chunk * (n_out - 1)
            if last < 0:
                raise spec.error(f"cannot split dimension {dim} into {n_out} chunks of {chunk}")
            sizes = [chunk] * (n_out - 1) + [last]
        outs = []
        pos = 0
        index = [slice(None)] * x.ndim
        for s in sizes:
            index[axis] = slice(pos, pos + s)
            outs.append(x[tuple(index)])
            pos += s
        return tuple(outs)

    return run


@kernel("Slice")
def make_slice(spec: NodeSpec):
    old = spec.opset < 10
    if old:
        a_starts = [int(v) for v in spec.attr("starts", [])]
        a_ends = [int(v) for v in spec.attr("ends", [])]
        a_axes = spec.attr("axes")

    def build(x, starts, ends, axes, steps):
        if len(starts) != len(ends):
            raise spec.error(f"starts {starts} and ends {ends} differ in length")
        if axes is None:
            axes = list(range(len(starts)))
        axes = _axes(spec, axes, x.ndim)
        if len(axes) != len(starts):
            raise spec.error(f"axes {axes} and starts {starts} differ in length")
        if steps is None:
            steps = [1] * len(starts)
        if len(steps) != len(starts):
            raise spec.error(f"steps {steps} and starts {starts} differ in length")
        index = [slice(None)] * x.ndim
        for a, s, e, st in zip(axes, starts, ends, steps):
            if st == 0:
                raise spec.error("steps must not be 0")
            dim = x.shape[a]
            # ONNX clamping: negative values count from the end, then clamp to the valid range
            s = s + dim if s < 0 else s
            e = e + dim if e < 0 else e
            if st > 0:
                s = min(max(s, 0), dim)
                e = min(max(e, 0), dim)
            else:
                s = min(max(s, 0), dim - 1)
                e = min(max(e, -1), dim - 1)
            index[a] = slice(s, e if e >= 0 else None, st)
        return tuple(index)

    if old:

        def run_old(x):
            axes = None if a_axes is None else [int(v) for v in a_axes]
            return (x[build(x, a_starts, a_ends, axes, None)],)

        return run_old

    def run(x, starts, ends, axes=None, steps=None):
        s = _ints(spec, starts, "starts")
        e = _ints(spec, ends, "ends")
        ax = None if axes is None else _ints(spec, axes, "axes")
        st = None if steps is None else _ints(spec, steps, "steps")
        return (x[build(x, s, e, ax, st)],)

    return run


@kernel("Squeeze")
def make_squeeze(spec: NodeSpec):
    axes_attr = spec.attr("axes") if spec.opset < 13 else None

    def run(x, axes=None):
        if axes is not None:
            ax = _ints(spec, axes, "axes")
        elif axes_attr is not None:
            ax = [int(a) for a in axes_attr]
        else:
            ax = None
        if ax is None:
            return (x.reshape([d for d in x.shape if d != 1]),)
        ax = _axes(spec, ax, x.ndim)
        for a in ax:
            if x.shape[a] != 1:
                raise spec.error(f"cannot squeeze axis {a} of size {x.shape[a]} (shape {list(x.shape)})")
        return (x.reshape([d for i, d in enumerate(x.shape) if i not in ax]),)

    return run


@kernel("Unsqueeze")
def make_unsqueeze(spec: NodeSpec):
    axes_attr = spec.attr("axes") if spec.opset < 13 else None

    def run(x, axes=None):
        if axes is not None:
            ax = _ints(spec, axes, "axes")
        elif axes_attr is not None:
            ax = [int(a) for a in axes_attr]
        else:
            raise spec.error("axes are required")
        rank = x.ndim + len(ax)
        ax = set(_axes(spec, ax, rank))
        it = iter(x.shape)
        return (x.reshape([1 if i in ax else next(it) for i in range(rank)]),)

    return run


@kernel("Gather")
def make_gather(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", 0))

    def run(data, indices):
        if data.ndim == 0:
            raise spec.error("data must have rank >= 1")
        if indices.dtype.kind not in "iu":
            raise spec.error(f"indices must be integers, got {indices.dtype}")
        axis = _axis(spec, axis_attr, data.ndim)
        try:
            return (spec.alloc.take(data, indices, axis=axis),)
        except IndexError:
            raise spec.error(
                f"indices out of range [-{data.shape[axis]}, {data.shape[axis] - 1}] for axis {axis}"
            ) from None

    return run


@kernel("GatherElements")
def make_gather_elements(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", 0))

    def run(data, indices):
        if indices.ndim != data.ndim:
            raise spec.error(f"indices rank {indices.ndim} differs from data rank {data.ndim}")
        if indices.dtype.kind not in "iu":
            raise spec.error(f"indices must be integers, got {indices.dtype}")
        axis = _axis(spec, axis_attr, data.ndim)
        for a in range(data.ndim):
            if a != axis and indices.shape[a] > data.shape[a]:
                raise spec.error(f"indices shape {list(indices.shape)} exceeds data shape {list(data.shape)}")
        n = data.shape[axis]
        if indices.size and (indices.min() < -n or indices.max() >= n):
            raise spec.error(f"indices out of range [-{n}, {n - 1}] for axis {axis}")
        grid = list(np.ogrid[tuple(slice(0, d) for d in indices.shape)]) if indices.ndim else []
        grid[axis] = indices
        return (data[tuple(grid)],)

    return run


@kernel("Shape")
def make_shape(spec: NodeSpec):
    start = int(spec.attr("start", 0))
    end = spec.attr("end")

    def run(x):
        return (np.array(x.shape[start:end if end is None else int(end)], dtype=np.int64),)

    return run


@kernel("Size")
def make_size(spec: NodeSpec):
    def run(x):
        return (np.array(x.size, dtype=np.int64),)

    return run


# ---------------------------------------------------------------------------------------------
# constants and value-sized outputs


@kernel("Constant")
def make_constant(spec: NodeSpec):
    attrs = spec.attrs
    if "value" in attrs:
        value = np.asarray(attrs["value"])
    elif "value_float" in attrs:
        value = np.array(attrs["value_float"], dtype=np.float32)
    elif "value_floats" in attrs:
        value = np.array(attrs["value_floats"], dtype=np.float32).reshape(-1)
    elif "value_int" in attrs:
        value = np.array(attrs["value_int"], dtype=np.int64)
    elif "value_ints" in attrs:
        value = np.array(attrs["value_ints"], dtype=np.int64).reshape(-1)
    elif "value_string" in attrs:
        s = attrs["value_string"]
        value = np.array(s.decode() if isinstance(s, bytes) else s, dtype=object)
    elif "value_strings" in attrs:
        value = np.array([s.decode() if isinstance(s, bytes) else s for s in attrs["value_strings"]], dtype=object)
    elif "sparse_value" in attrs:
        raise spec.error("sparse_value is not supported")
    else:
        raise spec.error("no value attribute")

    def run():
        return (value,)

    return run


@kernel("ConstantOfShape")
def make_constant_of_shape(spec: NodeSpec):
    v = spec.attr("value")
    if v is None:
        value = np.float32(0).reshape(())
    else:
        v = np.asarray(v)
        if v.size != 1:
            raise spec.error(f"value must hold one element, got shape {list(v.shape)}")
        value = v.reshape(())

    def run(shape):
        dims = _ints(spec, shape, "shape")
        if any(d < 0 for d in dims):
            raise spec.error(f"shape {dims} has a negative dimension")
        return (spec.alloc.full(dims, value, value.dtype),)

    return run


@kernel("Expand")
def make_expand(spec: NodeSpec):
    def run(data, shape):
        dims = _ints(spec, shape, "shape")
        if any(d < 0 for d in dims):
            raise spec.error(f"shape {dims} has a negative dimension")
        try:
            out_shape = np.broadcast_shapes(data.shape, tuple(dims))
        except ValueError:
            raise spec.error(f"cannot broadcast {list(data.shape)} to {dims}") from None
        if out_shape == data.shape:
            return (data,)
        out = spec.alloc.empty(out_shape, data.dtype)
        np.copyto(out, data)
        return (out,)

    return run


@kernel("Tile")
def make_tile(spec: NodeSpec):
    def run(x, repeats):
        reps = _ints(spec, repeats, "repeats")
        if len(reps) != x.ndim:
            raise spec.error(f"repeats {reps} must have one entry per axis of the rank-{x.ndim} input")
        if any(r < 0 for r in reps):
            raise spec.error(f"repeats {reps} must not be negative")
        return (spec.alloc.tile(x, reps),)

    return run


@kernel("Range")
def make_range(spec: NodeSpec):
    stash = spec.attr("stash_type")

    def scalar(a, what):
        a = np.asarray(a)
        if a.size != 1:
            raise spec.error(f"{what} must be a scalar, got shape {list(a.shape)}")
        return a.reshape(())

    def run(start, limit, delta):
        start, limit, delta = scalar(start, "start"), scalar(limit, "limit"), scalar(delta, "delta")
        dtype = start.dtype
        if dtype.kind in "iu":
            s, lim, d = int(start), int(limit), int(delta)
            if d == 0:
                raise spec.error("delta must not be 0")
            n = max(0, -((s - lim) // d))  # ceil((lim - s) / d) in exact integer arithmetic
            spec.check_alloc([n], np.int64)  # computed in int64, then cast
            return ((spec.alloc.arange(n, np.int64) * d + s).astype(dtype),)
        if dtype.kind != "f" and "float" not in dtype.name:  # ml_dtypes' bfloat16 has kind "V"
            raise spec.error(f"unsupported dtype {dtype}")
        compute = np.float32 if (dtype.itemsize < 4 and stash == 1) or dtype == np.float32 else np.float64
        s, lim, d = (compute(v) for v in (start, limit, delta))
        if d == 0 or not (np.isfinite(s) and np.isfinite(lim) and np.isfinite(d)):
            raise spec.error(f"invalid range start={s} limit={lim} delta={d}")
        n = max(0, math.ceil((float(lim) - float(s)) / float(d)))
        # value i is start + i * delta (computed in double precision, then rounded once)
        return ((float(s) + spec.alloc.arange(n, np.float64) * float(d)).astype(dtype),)

    return run


# ---------------------------------------------------------------------------------------------
# Pad


def pad_length(spec: NodeSpec, n: int, before: int, after: int) -> int:
    """Length of one axis of ``n`` elements after padding; negative pads crop."""
    m = n - max(0, -before) - max(0, -after)
    if m < 0:
        raise spec.error(f"pads ({before}, {after}) remove more than the {n} elements of an axis")
    return m + max(before, 0) + max(after, 0)


def pad_map(spec: NodeSpec, mode: str, n: int, before: int, after: int) -> np.ndarray:
    """Source index for every output position along one axis (-1: constant fill).

    Negative pads crop first; the padding modes then read from the cropped range.
    """
    length = pad_length(spec, n, before, after)
    lo = max(0, -before)
    m = n - lo - max(0, -after)
    b = max(before, 0)
    # the map and up to three temporaries of its length are alive at once
    spec.alloc.check_bytes(4 * 8 * length, f"Pad's index map for an axis of {length}")
    p = spec.alloc.arange(length, np.int64) - b
    if mode == "constant":
        return np.where((p >= 0) & (p < m), p + lo, -1)
    if m == 0:
        if length:
            raise spec.error(f"mode {mode!r} cannot pad an empty axis")
        return p
    if mode == "edge":
        return np.clip(p, 0, m - 1) + lo
    if mode == "wrap":
        return np.mod(p, m) + lo
    # reflect (edge not repeated); pads longer than the axis keep reflecting back and forth
    if m == 1:
        return p * 0 + lo
    period = 2 * (m - 1)
    q = np.mod(p, period)
    return np.where(q >= m, period - q, q) + lo


@kernel("Pad")
def make_pad(spec: NodeSpec):
    mode = spec.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    modes = ("constant", "reflect", "edge") + (("wrap",) if spec.opset >= 19 else ())
    if mode not in modes:
        raise spec.error(f"mode {mode!r} is not one of {list(modes)} (opset {spec.opset})")
    old = spec.opset < 11
    pads_attr = spec.attr("pads", spec.attr("paddings")) if old else None
    value_attr = float(spec.attr("value", 0.0)) if old else 0.0

    def run(data, pads=None, constant_value=None, axes=None):
        if old:
            if pads_attr is None:
                raise spec.error("attribute 'pads' is required")
            p = [int(v) for v in pads_attr]
            value = value_attr
        else:
            if pads is None:
                raise spec.error("input 'pads' is required")
            p = _ints(spec, pads, "pads")
            value = 0
            if constant_value is not None and np.asarray(constant_value).size:
                value = np.asarray(constant_value).reshape(-1)[0]
        rank = data.ndim
        if axes is not None and spec.opset >= 18:
            ax = _axes(spec, _ints(spec, axes, "axes"), rank)
        else:
            ax = list(range(rank))
        if len(p) != 2 * len(ax):
            raise spec.error(f"pads {p} must have 2 entries per padded axis ({len(ax)} axes)")
        before = [0] * rank
        after = [0] * rank
        for i, a in enumerate(ax):
            before[a], after[a] = p[i], p[len(ax) + i]
        # the output size is known from the pads alone: check it before building any index map
        out_shape = [pad_length(spec, data.shape[a], before[a], after[a]) for a in range(rank)]
        spec.check_alloc(out_shape, data.dtype)
        if rank == 0:
            return (data.copy(),)
        if 0 in out_shape:
            return (spec.alloc.empty(out_shape, data.dtype),)
        maps = [pad_map(spec, mode, data.shape[a], before[a], after[a]) for a in range(rank)]
        return (gather_nd(data, maps, value, spec.alloc),)

    return run


__all__ = ["gather_nd", "pad_map"]
