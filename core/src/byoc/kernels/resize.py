"""Resize (and the deprecated Upsample).

Resize is separable: each resized axis gets a table of source indices and weights (its *taps*),
computed once in float64 from the ONNX coordinate transformation; the interpolation then applies
the tables axis by axis. Modes:

* ``nearest``: one tap per output position; the copy runs in :func:`byoc.kernels.tensor.gather_nd`
  (exact for every dtype).
* ``linear`` / ``cubic`` (optionally ``antialias``, ``exclude_outside``): one weighted sum of
  gathered slices per tap, axis by axis. Float16 computes in float32, integer types in float64
  (rounded half to even and saturated on the way back, as the ONNX reference does).

Coordinate transformation modes: half_pixel, half_pixel_symmetric, pytorch_half_pixel,
align_corners, asymmetric, tf_half_pixel_for_nn and tf_crop_and_resize (positions outside the
ROI get ``extrapolation_value``). ``axes`` and ``keep_aspect_ratio_policy`` follow opset 18.
When the input shape is static and roi/scales/sizes are constants, the tap tables are built once
at compile time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from byoc.budget import DEFAULT_BUDGET, Alloc
from byoc.errors import ByocError
from byoc.kernels.registry import NodeSpec, kernel
from byoc.kernels.tensor import gather_nd

_MODES = ("nearest", "linear", "cubic")
_CTMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _resample(x: np.ndarray, taps: AxisTaps, w: np.ndarray, alloc: Alloc) -> np.ndarray:
    """``out[..., j, ...] = sum_t w[j, t] * x[..., idx[j, t], ...]`` along ``taps.axis``; a zero
    weight adds nothing (not ``0 * inf``)."""
    shape = list(x.shape)
    shape[taps.axis] = taps.idx.shape[0]
    out = alloc.zeros(shape, x.dtype)
    along = (slice(None),) + (None,) * (x.ndim - taps.axis - 1)
    for t in range(taps.idx.shape[1]):
        weight = w[:, t][along]
        term = weight * alloc.take(x, taps.idx[:, t], axis=taps.axis)
        out += np.where(weight != 0, term, 0) if not np.all(w[:, t]) else term
    return out


# ---------------------------------------------------------------------------------------------
# tap tables


def _source_coords(ctm: str, out_len: int, in_len: int, scale: float, roi: tuple):
    """Source coordinate of each output index along one axis (ONNX formulas, float64).

    Where the spec says ``length_resized`` (align_corners, pytorch_half_pixel,
    tf_crop_and_resize) it is the integer output length, as in onnxruntime and PyTorch; the
    ONNX reference evaluator uses ``scale * length_original`` there instead, which differs
    when that product is not an integer (then corners do not align).
    """
    y = np.arange(out_len, dtype=np.float64)
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        center = in_len / 2
        return center * (1 - adjustment) + (y + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return np.zeros(out_len) if out_len <= 1 else (y + 0.5) / scale - 0.5
    if ctm == "align_corners":
        return np.zeros(out_len) if out_len <= 1 else y * (in_len - 1) / (out_len - 1)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    # tf_crop_and_resize: roi holds numpy scalars of the roi tensor's dtype; as in the reference
    # evaluator, start * (length - 1) and end - start are computed in that dtype
    start, end = roi
    diff = end - start
    base = start * (in_len - 1)
    if out_len <= 1:
        return np.full(out_len, float(diff * (in_len - 1) / 2 + base))
    return y * float(diff) * (in_len - 1) / (out_len - 1) + float(base)


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    d2 = d * d
    d3 = d2 * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


#: float64/int64 arrays of a tap table's size alive at once while it is built
_TABLE_TEMPS = 6


def _n_taps(mode: str, scale: float, antialias: bool) -> int:
    """Taps per output position (the width of :class:`AxisTaps` tables)."""
    if mode == "nearest":
        return 1
    if not antialias:
        return 2 if mode == "linear" else 4
    first = int(np.floor(-(1 if mode == "linear" else 2) / min(scale, 1.0)) + 1)
    return 2 - 2 * first


@dataclass(frozen=True)
class AxisTaps:
    axis: int
    idx: np.ndarray  # (out_len, taps) int64 source indices, clamped into the input
    w: np.ndarray | None  # (out_len, taps) float64 weights; None in nearest mode (one tap)
    extrapolate: np.ndarray | None  # bool (out_len,): positions outside a tf_crop_and_resize ROI


def axis_taps(
    axis: int,
    in_len: int,
    out_len: int,
    scale: float,
    roi: tuple,
    *,
    mode: str,
    ctm: str,
    nearest_mode: str = "round_prefer_floor",
    cubic_a: float = -0.75,
    exclude_outside: bool = False,
    antialias: bool = False,
    alloc: Alloc | None = None,
) -> AxisTaps:
    """The tap table for one resized axis.

    ``alloc`` (the node's budgeted allocator) checks the table and its temporaries first.
    """
    (alloc or DEFAULT_BUDGET.guard("Resize")).check_bytes(
        _TABLE_TEMPS * 8 * out_len * (_n_taps(mode, scale, antialias) + 1), f"Resize's tap table for an axis of {out_len}")
    x = _source_coords(ctm, out_len, in_len, scale, roi)
    # rounding noise (e.g. half_pixel_symmetric's offset term) must not move a coordinate that is
    # mathematically on the half-pixel grid off it, where nearest rounding would flip
    grid = np.round(x * 2) / 2
    x = np.where(np.abs(x - grid) < 1e-9, grid, x)
    extrap = None
    if ctm == "tf_crop_and_resize":
        extrap = (x < 0) | (x > in_len - 1)
        if not extrap.any():
            extrap = None
    fl = np.floor(x)
    frac = x - fl
    on_grid = frac == 0
    base = fl.astype(np.int64)
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            up = frac > 0.5
        elif nearest_mode == "round_prefer_ceil":
            up = frac >= 0.5
        elif nearest_mode == "floor":
            up = np.zeros(out_len, dtype=bool)
        else:  # ceil
            up = ~on_grid
        idx = np.clip(base + up, 0, in_len - 1).reshape(out_len, 1)
        return AxisTaps(axis, idx, None, extrap)
    # even-sized windows around x; on a grid point the window shifts left and the ratio is 1
    ratio = np.where(on_grid, 1.0, frac)
    if mode == "linear" and not antialias:
        offsets = np.array([0, 1])
        w = np.stack([1 - ratio, ratio], axis=1)
    elif mode == "cubic" and not antialias:
        offsets = np.array([-1, 0, 1, 2])
        w = _cubic(offsets[None, :] - ratio[:, None], cubic_a)
    else:  # antialias: the kernel is stretched by 1/scale when downsampling
        s = min(scale, 1.0)
        support = 1 if mode == "linear" else 2
        first = int(np.floor(-support / s) + 1)
        offsets = np.arange(first, 2 - first)
        d = (offsets[None, :] - ratio[:, None]) * s
        w = np.clip(1 - np.abs(d), 0, 1) if mode == "linear" else _cubic(d, cubic_a)
        w = w / w.sum(axis=1, keepdims=True)
    start = base - on_grid.astype(np.int64)
    idx = start[:, None] + offsets[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return AxisTaps(axis, np.clip(idx, 0, in_len - 1), w, extrap)


# ---------------------------------------------------------------------------------------------
# planning and execution


@dataclass(frozen=True)
class ResizePlan:
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    taps: tuple[AxisTaps, ...]  # only the axes that change


class _Resizer:
    """Attributes of one Resize/Upsample node; builds plans and runs them."""

    def __init__(self, spec: NodeSpec, *, mode, ctm, nearest_mode="round_prefer_floor", cubic_a=-0.75,
                 exclude_outside=False, extrapolation_value=0.0, antialias=False, axes=None, policy="stretch"):
        self.spec = spec
        self.mode = mode
        self.ctm = ctm
        self.nearest_mode = nearest_mode
        self.cubic_a = cubic_a
        self.exclude_outside = exclude_outside
        self.extrapolation_value = extrapolation_value
        self.antialias = antialias and mode != "nearest"
        self.axes = axes
        self.policy = policy
        if mode not in _MODES:
            raise spec.error(f"mode {mode!r} is not one of {list(_MODES)}")
        if ctm not in _CTMS:
            raise spec.error(f"coordinate_transformation_mode {ctm!r} is not one of {list(_CTMS)}")
        if nearest_mode not in _NEAREST:
            raise spec.error(f"nearest_mode {nearest_mode!r} is not one of {list(_NEAREST)}")
        if policy not in _POLICIES:
            raise spec.error(f"keep_aspect_ratio_policy {policy!r} is not one of {list(_POLICIES)}")

    def plan(self, in_shape, roi, scales, sizes) -> ResizePlan:
        spec = self.spec
        r = len(in_shape)
        if self.axes is None:
            axes = list(range(r))
        else:
            axes = [a + r if a < 0 else a for a in self.axes]
            if any(not 0 <= a < r for a in axes) or len(set(axes)) != len(axes):
                raise spec.error(f"axes {self.axes} are invalid for rank {r}")
        has_scales = scales is not None and np.asarray(scales).size > 0
        has_sizes = sizes is not None and np.asarray(sizes).size > 0
        if has_scales == has_sizes:
            raise spec.error("exactly one of 'scales' and 'sizes' must be given")
        full_scale = [1.0] * r
        out_shape = list(in_shape)
        if has_sizes:
            sz = np.asarray(sizes)
            if sz.dtype.kind not in "iu" or sz.ndim != 1 or sz.size != len(axes):
                raise spec.error(f"sizes must be {len(axes)} integers, got {sz.tolist()}")
            sz = [int(v) for v in sz]
            if any(v < 0 for v in sz):
                raise spec.error(f"sizes {sz} must not be negative")
            for a, v in zip(axes, sz):
                if in_shape[a] == 0 and v:
                    raise spec.error(f"cannot resize an empty axis {a} to {v}")
                full_scale[a] = v / in_shape[a] if in_shape[a] else 1.0
                out_shape[a] = v
            if self.policy != "stretch":
                picked = [full_scale[a] for a in axes]
                s = min(picked) if self.policy == "not_larger" else max(picked)
                for a in axes:
                    full_scale[a] = s
                    out_shape[a] = int(s * in_shape[a] + 0.5)
        else:
            sc = np.asarray(scales)
            if sc.dtype.kind != "f" or sc.ndim != 1 or sc.size != len(axes):
                raise spec.error(f"scales must be {len(axes)} floats, got {sc.tolist()}")
            for a, v in zip(axes, sc.astype(np.float64).tolist()):
                if not (v > 0 and math.isfinite(v)):
                    raise spec.error(f"scales must be positive, got {sc.tolist()}")
                full_scale[a] = v
                out_shape[a] = int(v * in_shape[a])
        rois = [(np.float32(0), np.float32(1))] * r
        if roi is not None and np.asarray(roi).size > 0 and self.ctm == "tf_crop_and_resize":
            rv = np.asarray(roi).reshape(-1)
            if rv.dtype.kind != "f":
                rv = rv.astype(np.float32)
            if rv.size != 2 * len(axes):
                raise spec.error(f"roi must have {2 * len(axes)} values, got {rv.size}")
            for i, a in enumerate(axes):
                rois[a] = (rv[i], rv[len(axes) + i])
        elif self.ctm == "tf_crop_and_resize":
            raise spec.error("coordinate_transformation_mode 'tf_crop_and_resize' needs 'roi'")
        spec.check_alloc(out_shape, np.float32)
        taps = []
        if 0 in out_shape:
            return ResizePlan(tuple(in_shape), tuple(out_shape), ())  # empty output: no tables
        for a in axes:
            n_in, n_out = in_shape[a], out_shape[a]
            if n_out == n_in and math.isclose(full_scale[a], 1.0) and \
                    math.isclose(rois[a][0], 0.0) and math.isclose(rois[a][1], 1.0):
                continue  # identity along this axis
            if n_out == 0:
                continue  # empty output: nothing to compute along this axis
            taps.append(axis_taps(
                a, n_in, n_out, full_scale[a], rois[a], mode=self.mode, ctm=self.ctm,
                nearest_mode=self.nearest_mode, cubic_a=self.cubic_a, exclude_outside=self.exclude_outside,
                antialias=self.antialias, alloc=spec.alloc,
            ))
        return ResizePlan(tuple(in_shape), tuple(out_shape), tuple(taps))

    def execute(self, plan: ResizePlan, x: np.ndarray) -> np.ndarray:
        spec = self.spec
        spec.check_alloc(plan.out_shape, x.dtype)
        if math.prod(plan.out_shape) == 0:
            return spec.alloc.empty(plan.out_shape, x.dtype)
        if not plan.taps:
            return x
        if self.mode == "nearest":
            return self._nearest(plan, x)
        return self._interpolate(plan, x)

    def _fill(self, dtype: np.dtype):
        ev = self.extrapolation_value
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return np.array(np.clip(np.round(ev), info.min, info.max)).astype(dtype)
        return np.array(ev).astype(dtype)

    def _nearest(self, plan: ResizePlan, x: np.ndarray) -> np.ndarray:
        maps = [self.spec.alloc.arange(n, np.int64) for n in plan.in_shape]
        for t in plan.taps:
            m = t.idx[:, 0]
            if t.extrapolate is not None:
                m = np.where(t.extrapolate, -1, m)
            maps[t.axis] = m
        return gather_nd(x, maps, self._fill(x.dtype), self.spec.alloc)

    def _interpolate(self, plan: ResizePlan, x: np.ndarray) -> np.ndarray:
        spec = self.spec
        dt = x.dtype
        if dt == np.float32 or dt == np.float16:
            compute = np.dtype(np.float32)
        elif dt == np.float64 or dt.kind in "iu":
            compute = np.dtype(np.float64)
        else:
            raise spec.error(f"mode {self.mode!r} does not support dtype {dt}")
        spec.check_alloc(x.shape, compute)  # integers are interpolated in float64
        cur = np.ascontiguousarray(x, dtype=compute)
        # shrink first, so intermediates stay small
        for t in sorted(plan.taps, key=lambda t: t.idx.shape[0] / max(plan.in_shape[t.axis], 1)):
            cur = _resample(cur, t, t.w.astype(compute), spec.alloc)
        for t in plan.taps:
            if t.extrapolate is not None:
                cur[(slice(None),) * t.axis + (t.extrapolate,)] = self.extrapolation_value
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return np.clip(np.round(cur), info.min, info.max).astype(dt)
        return cur if cur.dtype == dt else cur.astype(dt)


def _str(v, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def _static(shape) -> tuple[int, ...] | None:
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _make_run(spec: NodeSpec, resizer: _Resizer, params: tuple):
    """A run function that reuses a compile-time plan when the shape and parameters are constant.

    ``params`` describes (roi, scales, sizes): a node input index, ``None`` where the operator
    version has no such input, or a numpy array for a value fixed by an attribute.
    """

    def value(p, rest):
        if isinstance(p, np.ndarray):
            return p
        if p is None or p - 1 >= len(rest):
            return None
        return rest[p - 1]

    pre = None
    assumed_absent: list[int] = []
    in_shape = _static(spec.input_shapes[0]) if spec.input_shapes else None
    if in_shape is not None:
        args = []
        for p in params:
            if isinstance(p, np.ndarray) or p is None or p >= spec.n_inputs:
                args.append(p if isinstance(p, np.ndarray) else None)
            elif p in spec.const_inputs:
                args.append(spec.const_inputs[p])
            else:
                args.append(None)
                assumed_absent.append(p)
        try:
            pre = resizer.plan(in_shape, *args)
        except (ByocError, ValueError, ArithmeticError):  # invalid here: planned and reported at run time
            pre = None

    def run(x, *rest):
        if pre is not None and x.shape == pre.in_shape and all(value(p, rest) is None for p in assumed_absent):
            plan = pre
        else:
            plan = resizer.plan(x.shape, *(value(p, rest) for p in params))
        return (resizer.execute(plan, x),)

    return run


@kernel("Resize")
def make_resize(spec: NodeSpec):
    if spec.opset < 11:  # Resize-10 (only when conversion to the canonical opset failed): as Upsample
        mode = _str(spec.attr("mode"), "nearest")
        resizer = _Resizer(spec, mode=mode, ctm="asymmetric", nearest_mode="floor")
        return _make_run(spec, resizer, (None, 1, None))
    new = spec.opset >= 18
    axes = spec.attr("axes") if new else None
    resizer = _Resizer(
        spec,
        mode=_str(spec.attr("mode"), "nearest"),
        ctm=_str(spec.attr("coordinate_transformation_mode"), "half_pixel"),
        nearest_mode=_str(spec.attr("nearest_mode"), "round_prefer_floor"),
        cubic_a=float(spec.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(spec.attr("exclude_outside", 0)),
        extrapolation_value=float(spec.attr("extrapolation_value", 0.0)),
        antialias=bool(spec.attr("antialias", 0)) and new,
        axes=None if axes is None else [int(a) for a in axes],
        policy=_str(spec.attr("keep_aspect_ratio_policy"), "stretch") if new else "stretch",
    )
    return _make_run(spec, resizer, (1, 2, 3))


@kernel("Upsample")
def make_upsample(spec: NodeSpec):
    """Upsample (opsets 7-9): asymmetric coordinates; nearest rounds down."""
    mode = _str(spec.attr("mode"), "nearest")
    if mode == "bilinear":
        mode = "linear"
    resizer = _Resizer(spec, mode=mode, ctm="asymmetric", nearest_mode="floor")
    scales_attr = spec.attr("scales")
    if scales_attr is not None:  # opset 7: scales is an attribute
        return _make_run(spec, resizer, (None, np.array(scales_attr, dtype=np.float32), None))
    return _make_run(spec, resizer, (None, 1, None))


__all__ = ["AxisTaps", "ResizePlan", "axis_taps"]
