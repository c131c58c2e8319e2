"""Normalisations: BatchNormalization (inference), LayerNormalization, InstanceNormalization, LRN.

Plain numpy. 16-bit float inputs are computed in float32 and rounded back; float64 stays
float64. Means and variances are accumulated in float64.
"""

from __future__ import annotations

import math

import numpy as np

from byoc.kernels.elementwise import compute_dtype
from byoc.kernels.registry import NodeSpec, kernel


def _as_float(spec: NodeSpec, x, what: str = "X") -> np.ndarray:
    """``x`` in its compute dtype, which must be a float."""
    x = np.asarray(x)
    dt = compute_dtype(x.dtype)
    if dt.kind != "f":
        raise spec.error(f"{what} must be a float tensor, got {x.dtype}")
    return x.astype(dt, copy=False)


def _normalize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (in ``x``'s dtype), the mean and ``1 / sqrt(var + eps)``
    (float64, the reduced axes kept as size 1)."""
    n = math.prod(x.shape[a] for a in axes)
    mean = x.sum(axis=axes, keepdims=True, dtype=np.float64) / n
    d = x - mean.astype(x.dtype)
    inv = 1.0 / np.sqrt(np.square(d).sum(axis=axes, keepdims=True, dtype=np.float64) / n + eps)
    d *= inv.astype(x.dtype)
    return d, mean, inv


# -------------------------------------------------------------------------------------------------
# BatchNormalization


def _bn_affine(scale, bias, mean, var, eps: float, dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The scale and shift of each channel (or element, for the legacy ``spatial=0``): in float64, then ``dt``."""
    s = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    b = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * s
    return s.astype(dt), b.astype(dt)


def _check_bn_params(spec: NodeSpec, params) -> None:
    """scale, B, mean and var (``None`` where unknown) must be tensors of rank >= 1 and one shape."""
    shapes = {}
    for name, p in zip(("scale", "B", "mean", "var"), params):
        if p is None:
            continue
        p = np.asarray(p)
        if p.ndim == 0:
            raise spec.error(f"{name} must be a tensor of one value per channel, got a scalar")
        if p.dtype.kind not in "fiub" and "float" not in p.dtype.name:
            raise spec.error(f"{name} must be numeric, got {p.dtype}")
        shapes[name] = list(p.shape)
    if len({tuple(v) for v in shapes.values()}) > 1:
        raise spec.error(f"scale, B, mean and var must have one shape, got {shapes}")


@kernel("BatchNormalization")
def make_batch_normalization(spec: NodeSpec):
    eps = float(spec.attr("epsilon", 1e-5))
    training = False
    if spec.opset >= 14:
        training = bool(spec.attr("training_mode", 0))
    elif spec.opset < 7 and "is_test" in spec.attrs:
        training = not bool(spec.attr("is_test", 0))
    if training or spec.n_outputs > 1:
        raise spec.error(
            "training-mode BatchNormalization (batch statistics, running-mean outputs) is not supported; "
            "export the model in inference mode (training_mode=0, one output)"
        )
    consts = [spec.const_inputs.get(i) for i in range(1, 5)]
    _check_bn_params(spec, consts)
    x_dtype = compute_dtype(spec.input_dtypes[0]) if spec.input_dtypes and spec.input_dtypes[0] is not None else None
    pre = None  # (compute dtype, scale, shift) from constant parameters
    if all(c is not None for c in consts) and x_dtype is not None and x_dtype.kind == "f":
        pre = (x_dtype, *_bn_affine(*consts, eps, x_dtype))

    def run(x, scale, bias, mean, var):
        xc = _as_float(spec, x)
        if xc.ndim < 2:
            raise spec.error(f"X must have rank >= 2, got shape {list(xc.shape)}")
        c = xc.shape[1]
        if pre is not None and pre[0] == xc.dtype and pre[1].shape[0] == c:
            a, b = pre[1], pre[2]
        else:
            _check_bn_params(spec, [scale, bias, mean, var])
            for name, p in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
                if p.shape[0] != c or (p.ndim > 1 and p.size != math.prod(xc.shape[1:])):
                    raise spec.error(f"{name} has shape {list(p.shape)}, expected [{c}] for X of shape {list(xc.shape)}")
            a, b = _bn_affine(scale, bias, mean, var, eps, xc.dtype)
        # one value per channel, or per element of a sample (the legacy spatial=0)
        shape = xc.shape[1:] if a.ndim > 1 else (c,) + (1,) * (xc.ndim - 2)
        if a.size != math.prod(shape):
            raise spec.error(f"per-element parameters of shape {list(a.shape)} do not match X {list(xc.shape)}")
        with np.errstate(invalid="ignore"):  # inf * 0
            y = xc * a.reshape(shape)
            y += b.reshape(shape)
        return (y.astype(np.asarray(x).dtype, copy=False),)

    return run


# -------------------------------------------------------------------------------------------------
# LayerNormalization


@kernel("LayerNormalization")
def make_layer_normalization(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", -1))
    eps = float(spec.attr("epsilon", 1e-5))
    stash = int(spec.attr("stash_type", 1))
    if stash != 1:
        raise spec.error(f"stash_type={stash} is not supported (only 1, float32 statistics)")

    def run(x, scale, bias=None):
        xc = _as_float(spec, x)
        r = xc.ndim
        axis = axis_attr + r if axis_attr < 0 else axis_attr
        if not 0 <= axis < r:
            raise spec.error(f"axis {axis_attr} is out of range for X of rank {r}")
        norm_shape = xc.shape[axis:]
        if 0 in norm_shape:  # as onnxruntime: no statistics of nothing
            raise spec.error(f"X of shape {list(x.shape)} has nothing to normalise from axis {axis_attr}")

        def param(p, name):
            try:
                return np.broadcast_to(np.asarray(p, dtype=xc.dtype), norm_shape)
            except ValueError:
                raise spec.error(f"{name} of shape {list(p.shape)} does not broadcast to {list(norm_shape)}") from None

        s = param(scale, "Scale")
        b = param(bias, "B") if bias is not None else None
        with np.errstate(divide="ignore", invalid="ignore"):
            y, mean, inv = _normalize(xc, tuple(range(axis, r)), eps)
        y *= s
        if b is not None:
            y += b
        # statistics are float32 (stash_type=1)
        stats = (mean.astype(np.float32), inv.astype(np.float32))
        return (y.astype(np.asarray(x).dtype, copy=False), *stats[: spec.n_outputs - 1])

    return run


# -------------------------------------------------------------------------------------------------
# InstanceNormalization


@kernel("InstanceNormalization")
def make_instance_normalization(spec: NodeSpec):
    eps = float(spec.attr("epsilon", 1e-5))

    def run(x, scale, bias):
        xc = _as_float(spec, x)
        if xc.ndim < 3:
            raise spec.error(f"X must have rank >= 3, got shape {list(xc.shape)}")
        c = xc.shape[1]
        if scale.shape != (c,) or bias.shape != (c,):
            raise spec.error(f"scale and B must have shape [{c}], got {list(scale.shape)} and {list(bias.shape)}")
        per_channel = (c,) + (1,) * (xc.ndim - 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = _normalize(xc, tuple(range(2, xc.ndim)), eps)[0]
        y *= np.asarray(scale, xc.dtype).reshape(per_channel)
        y += np.asarray(bias, xc.dtype).reshape(per_channel)
        return (y.astype(np.asarray(x).dtype, copy=False),)

    return run


# -------------------------------------------------------------------------------------------------
# LRN


@kernel("LRN")
def make_lrn(spec: NodeSpec):
    size = spec.attr("size")
    if size is None or int(size) < 1:
        raise spec.error(f"attribute size must be a positive integer, got {size!r}")
    size = int(size)
    alpha = float(spec.attr("alpha", 1e-4))
    beta = float(spec.attr("beta", 0.75))
    bias = float(spec.attr("bias", 1.0))
    lo = (size - 1) // 2  # channel c sums the squares of channels [c - lo, c + size - 1 - lo]

    def run(x):
        xc = _as_float(spec, x)
        if xc.ndim < 3:
            raise spec.error(f"X must have rank >= 3, got shape {list(xc.shape)}")
        c = xc.shape[1]
        window = np.square(xc, dtype=np.float64)
        for k in range(max(-lo, 1 - c), min(size - lo, c)):  # the other channel offsets within the tensor
            if k > 0:
                window[:, : c - k] += np.square(xc[:, k:], dtype=np.float64)
            elif k < 0:
                window[:, -k:] += np.square(xc[:, : c + k], dtype=np.float64)
        window *= alpha / size
        window += bias
        return ((xc * window ** -beta).astype(np.asarray(x).dtype),)

    return run
