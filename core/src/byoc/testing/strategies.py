"""Hypothesis strategies for tensors, shapes and operator attributes.

Building blocks of the conformance kit, public so a vendor can write properties of their own::

    from hypothesis import given
    from byoc.testing import strategies as bst

    @given(bst.tensors("float32", bst.shapes(min_rank=4, max_rank=4)))
    def test_my_kernel(x): ...

* :func:`tensors`: arrays of any ONNX-relevant dtype with bounded, finite values (or a grid of
  values exact in float16, for operators that are discontinuous);
* :func:`shapes` (``zero_dims=True``: with a 0 side, :func:`zero_side`), :func:`broadcast_shape_to`
  (a shape that broadcasts with a given one, both directions), :func:`axes`, :func:`permutations`;
* :func:`conv_attrs` and :func:`pool_attrs`: valid kernel/stride/pad/dilation/group/auto_pad
  combinations for a given input shape, asymmetric padding included;
* random graphs: :mod:`byoc.testing.graphs`; one-operator instances of every operator:
  :func:`byoc.testing.cases.op_cases`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

#: dtype name -> numpy dtype, for every dtype the strategies produce
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name)
    for name in ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
}
FLOATS = ("float32", "float16", "float64")
#: float elements are 0 or at least this large in magnitude (float16's normal range starts at 6.1e-5)
TINY = 2.0**-10
INTS = ("int8", "uint8", "int16", "int32", "int64")


def _dtype(dtype: Any) -> np.dtype:
    return np.dtype(dtype)


def elements(dtype: Any, lo: float = -4.0, hi: float = 4.0, *, grid: bool = False) -> st.SearchStrategy:
    """Values for one element of ``dtype`` in ``[lo, hi]`` (clipped to the dtype's range).

    ``grid=True`` draws multiples of 1/8 (exact in float16 and bfloat16, never a tie of
    Round): use it for operators that are discontinuous (Floor, Round, Sign, comparisons,
    ArgMax), where a target that rounds its inputs would otherwise legitimately differ.
    """
    dt = _dtype(dtype)
    if dt == np.bool_:
        return st.booleans()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return st.integers(max(int(np.ceil(lo)), int(info.min)), min(int(np.floor(hi)), int(info.max)))
    if grid:
        return st.integers(int(np.ceil(lo * 8)), int(np.floor(hi * 8))).map(lambda k: k / 8.0 + 1 / 16.0
                                                                              if k % 4 == 0 else k / 8.0)
    width = {2: 16, 4: 32, 8: 64}[dt.itemsize]
    lo, hi = _representable(lo, dt, up=True), _representable(hi, dt, up=False)
    floats = st.floats(lo, hi, width=width, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    # nothing between 0 and TINY: a target computing in float16 flushes such values to zero
    return floats.map(lambda v: 0.0 if abs(v) < TINY and lo <= 0.0 <= hi else (TINY if 0 < v < TINY else v))


def _representable(v: float, dt: np.dtype, up: bool) -> float:
    """``v`` moved inwards to the nearest value exactly representable in ``dt``."""
    r = dt.type(v)
    if float(r) < v and up:
        r = np.nextafter(r, dt.type(np.inf))
    elif float(r) > v and not up:
        r = np.nextafter(r, dt.type(-np.inf))
    return float(r)


@st.composite
def unidirectional_shape_to(draw, shape: Sequence[int]) -> tuple[int, ...]:
    """A shape that broadcasts *to* ``shape`` (numpy rules, one direction: the result is ``shape``)."""
    shape = tuple(shape)
    keep = draw(st.integers(0, len(shape)))
    return tuple(draw(st.sampled_from([d, 1])) for d in shape[len(shape) - keep:])


def tensors(dtype: Any, shape: Any, *, lo: float = -4.0, hi: float = 4.0, grid: bool = False,
            elements_strategy: st.SearchStrategy | None = None) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``dtype`` and ``shape`` (a tuple or a strategy of tuples), values as :func:`elements`."""
    dt = _dtype(dtype)
    elems = elements_strategy if elements_strategy is not None else elements(dt, lo, hi, grid=grid)
    return hnp.arrays(dt, shape, elements=elems)


#: how :func:`seeded_tensors` fills an array; the shrinker moves towards the first (simplest)
VALUE_STYLES = ("ones", "ramp", "random")


def _fit(values: np.ndarray, dt: np.dtype, lo: float, hi: float, grid: bool) -> np.ndarray:
    """Float ``values`` mapped into ``[lo, hi]`` and made valid for ``dt`` (a grid, no tiny values)."""
    if dt == np.bool_:
        return (values > 0.5 * (lo + hi)) if values.dtype.kind == "f" else values.astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        a, b = max(int(np.ceil(lo)), int(info.min)), min(int(np.floor(hi)), int(info.max))
        return np.clip(np.rint(values), a, b).astype(dt)
    v = np.clip(values, lo, hi)
    if grid:
        k = np.clip(np.rint(v * 8), np.ceil(lo * 8), np.floor(hi * 8))
        v = np.where(k % 4 == 0, k / 8.0 + 1 / 16.0, k / 8.0)
    elif lo <= 0.0 <= hi:
        v = np.where(np.abs(v) < TINY, 0.0, v)
    return v.astype(dt)


@st.composite
def seeded_tensors(draw, dtype: Any, shape: Sequence[int], *, lo: float = -4.0, hi: float = 4.0,
                   grid: bool = False) -> np.ndarray:
    """Arrays like :func:`tensors`, cheap to draw and shrink: a value style and a seed.

    Styles (:data:`VALUE_STYLES`): ``"ones"`` (1, or the nearest value in range), ``"ramp"``
    (distinct values, so a permuted or shifted element shows), ``"random"`` (uniform in
    ``[lo, hi]`` from a drawn seed). The shrinker moves towards ones: the smallest failing
    examples are readable. For element-by-element control use :func:`tensors`.
    """
    dt = _dtype(dtype)
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape)) if shape else 1
    style = draw(st.sampled_from(VALUE_STYLES))
    if style == "ones":
        one = 1.0 if lo <= 1.0 <= hi else (lo + hi) / 2.0
        values = np.full(n, one)
    elif style == "ramp":
        span = hi - lo
        step = 0.5 if dt.kind == "f" else 1.0
        m = max(1, int(span / step))
        values = lo + ((np.arange(n) * 7 + 1) % (m + 1)) * step if m else np.full(n, lo)
        if dt == np.bool_:
            values = (np.arange(n) % 2 == 0).astype(np.float64) * (hi - lo) + lo
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        values = rng.uniform(lo, hi, size=n)
        if dt == np.bool_:
            values = (rng.random(n) < 0.5).astype(np.float64) * (hi - lo) + lo
    return _fit(values.reshape(shape), dt, lo, hi, grid)


def shapes(min_rank: int = 0, max_rank: int = 4, min_side: int = 1, max_side: int = 5, *,
           zero_dims: bool = False) -> st.SearchStrategy:
    """Shapes (tuples of ints) of rank ``min_rank..max_rank`` with sides ``min_side..max_side``;
    ``zero_dims=True``: rank at least 1 and one side 0 (:func:`zero_side`)."""
    drawn = hnp.array_shapes(min_dims=max(min_rank, int(zero_dims)), max_dims=max(max_rank, int(zero_dims)),
                             min_side=min_side, max_side=max_side)
    return drawn.flatmap(zero_side) if zero_dims else drawn


def zero_side(shape: Sequence[int], axes: Sequence[int] | None = None) -> st.SearchStrategy[tuple[int, ...]]:
    """``shape`` with one of ``axes`` (default: every axis; none: unchanged) set to 0: a zero-size tensor."""
    shape, axes = tuple(shape), list(range(len(shape)) if axes is None else axes)
    if not axes:
        return st.just(shape)
    return st.sampled_from(axes).map(lambda a: shape[:a] + (0,) + shape[a + 1:])


@st.composite
def broadcast_shape_to(draw, shape: Sequence[int], max_extra_rank: int = 1, max_side: int = 5) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape`` in numpy's multidirectional sense.

    Each trailing dimension is kept, set to 1, or (where ``shape`` has a 1) grown; leading
    dimensions may be dropped or (up to ``max_extra_rank``) added.
    """
    shape = tuple(shape)
    keep = draw(st.integers(0, len(shape)))  # trailing dims aligned with shape
    out = []
    for d in shape[len(shape) - keep:]:
        if d == 1:
            out.append(draw(st.sampled_from([1, draw(st.integers(1, max_side))])))
        else:
            out.append(draw(st.sampled_from([d, 1])))
    extra = draw(st.integers(0, max_extra_rank)) if keep == len(shape) else 0
    lead = [draw(st.integers(1, max_side)) for _ in range(extra)]
    return tuple(lead + out)


def broadcast(*shapes_: Sequence[int]) -> tuple[int, ...]:
    """The broadcast result of ``shapes_`` (raises ``ValueError`` if they do not broadcast)."""
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes_]))


@st.composite
def axes(draw, rank: int, *, min_size: int = 1, max_size: int | None = None, negative: bool = True,
         unique: bool = True) -> list[int]:
    """A list of axes of a tensor of ``rank`` (each possibly negative), sorted by position."""
    if rank == 0:
        return []
    max_size = rank if max_size is None else min(max_size, rank)
    picked = draw(st.lists(st.integers(0, rank - 1), min_size=min(min_size, max_size), max_size=max_size,
                           unique=unique))
    picked = sorted(picked)
    if negative:
        picked = [a - rank if draw(st.booleans()) else a for a in picked]
    return picked


def axis(rank: int, negative: bool = True) -> st.SearchStrategy[int]:
    """One axis of a tensor of ``rank`` (``rank >= 1``)."""
    lo = -rank if negative else 0
    return st.integers(lo, rank - 1)


def permutations(rank: int) -> st.SearchStrategy[list[int]]:
    return st.permutations(list(range(rank)))


# -- convolution and pooling attributes -------------------------------------------------------


@dataclass
class WindowAttrs:
    """A valid window configuration; :meth:`attrs` gives the ONNX attributes."""

    kernel: list[int]
    strides: list[int]
    pads: list[int]  # begins then ends
    dilations: list[int]
    auto_pad: str = "NOTSET"
    group: int = 1
    ceil_mode: int = 0
    explicit_kernel_shape: bool = True

    def attrs(self, *, with_dilations: bool = True, with_group: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"strides": self.strides}
        if self.explicit_kernel_shape:
            out["kernel_shape"] = self.kernel
        if self.auto_pad == "NOTSET":
            out["pads"] = self.pads
        else:
            out["auto_pad"] = self.auto_pad
        if with_dilations:
            out["dilations"] = self.dilations
        if with_group:
            out["group"] = self.group
        if self.ceil_mode:
            out["ceil_mode"] = self.ceil_mode
        return out


def _out_size(size: int, k: int, s: int, pb: int, pe: int, d: int, ceil: bool = False) -> int:
    eff = d * (k - 1) + 1
    span = size + pb + pe - eff
    if span < 0:
        return 0
    return (-(-span // s) if ceil else span // s) + 1


@st.composite
def conv_attrs(draw, spatial: Sequence[int], *, max_kernel: int = 3, max_stride: int = 3, max_pad: int = 2,
               max_dilation: int = 2, auto_pad: bool = True) -> WindowAttrs:
    """Kernel, strides, (asymmetric) pads, dilations and auto_pad valid for a convolution over ``spatial``."""
    mode = draw(st.sampled_from(["NOTSET"] * 5 + (["SAME_UPPER", "SAME_LOWER", "VALID"] if auto_pad else [])))
    kernel, strides, dilations, begins, ends = [], [], [], [], []
    for size in spatial:
        d = draw(st.integers(1, max_dilation))
        s = draw(st.integers(1, max_stride))
        pb = draw(st.integers(0, max_pad)) if mode == "NOTSET" else 0
        pe = draw(st.integers(0, max_pad)) if mode == "NOTSET" else 0
        room = size + pb + pe if mode != "SAME_UPPER" and mode != "SAME_LOWER" else size + 2 * max_kernel
        # the dilated kernel must fit the padded input
        k_max = max(1, min(max_kernel, (room - 1) // d + 1))
        k = draw(st.integers(1, k_max))
        if (d * (k - 1) + 1) > room:
            d = 1
        kernel.append(k)
        strides.append(s)
        dilations.append(d)
        begins.append(pb)
        ends.append(pe)
    return WindowAttrs(kernel, strides, begins + ends, dilations, mode,
                       explicit_kernel_shape=draw(st.booleans()))


@st.composite
def pool_attrs(draw, spatial: Sequence[int], *, max_kernel: int = 3, max_stride: int = 3, dilations: bool = True,
               ceil_mode: bool = True, auto_pad: bool = True) -> WindowAttrs:
    """A valid pooling window over ``spatial``: every pad smaller than the kernel (ONNX's rule)."""
    mode = draw(st.sampled_from(["NOTSET"] * 5 + (["SAME_UPPER", "SAME_LOWER", "VALID"] if auto_pad else [])))
    kernel, strides, dils, begins, ends = [], [], [], [], []
    for size in spatial:
        d = draw(st.integers(1, 2)) if dilations else 1
        k = draw(st.integers(1, max(1, min(max_kernel, (size - 1) // d + 1))))
        s = draw(st.integers(1, max_stride))
        pb = draw(st.integers(0, k - 1)) if mode == "NOTSET" else 0
        pe = draw(st.integers(0, k - 1)) if mode == "NOTSET" else 0
        kernel.append(k)
        strides.append(s)
        dils.append(d)
        begins.append(pb)
        ends.append(pe)
    ceil = int(draw(st.booleans())) if ceil_mode and mode == "NOTSET" else 0
    w = WindowAttrs(kernel, strides, begins + ends, dils, mode, ceil_mode=ceil)
    if ceil:
        # ceil mode: the last window must start inside the (begin-padded) input
        for i, size in enumerate(spatial):
            out = _out_size(size, kernel[i], strides[i], begins[i], ends[i], dils[i], True)
            if (out - 1) * strides[i] >= size + begins[i]:
                w.ceil_mode = 0
    return w


__all__ = [
    "DTYPES",
    "TINY",
    "VALUE_STYLES",
    "FLOATS",
    "INTS",
    "WindowAttrs",
    "axes",
    "axis",
    "broadcast",
    "broadcast_shape_to",
    "unidirectional_shape_to",
    "conv_attrs",
    "elements",
    "permutations",
    "pool_attrs",
    "seeded_tensors",
    "shapes",
    "tensors",
    "zero_side",
]
