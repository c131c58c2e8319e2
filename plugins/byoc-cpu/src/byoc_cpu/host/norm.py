"""byoc-cpu's normalisations: BatchNormalization (inference), LayerNormalization, InstanceNormalization, LRN.

16-bit float inputs are computed in float32 and rounded back; float64 stays float64. Means and
variances are accumulated in float64. A zero-size input of BatchNormalization, InstanceNormalization
or LRN goes to byoc's reference kernel; LayerNormalization refuses an empty normalised extent.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from byoc_cpu.host.elementwise import compute_dtype
from byoc_cpu.host.threads import run_blocks
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel, reference


def _over_pool(fn, n: int, size: int) -> None:
    """``fn(lo, hi)`` over blocks of ``range(n)`` (``size`` elements in all; a normalisation reads
    each element several times and does a division per element, so it counts 16 a piece)."""
    run_blocks(fn, n, 16 * max(1, size // max(1, n)))


def _check_float(spec: NodeSpec, x: np.ndarray, what: str = "X") -> np.dtype:
    dt = compute_dtype(x.dtype)
    if dt.kind != "f":
        raise spec.error(f"{what} must be a float tensor, got {x.dtype}")
    return dt


# -------------------------------------------------------------------------------------------------
# BatchNormalization


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _channel_affine(x, scale, shift, out, c0, c1):
    """``out[n, c, s] = x[n, c, s] * scale[c, s|0] + shift[c, s|0]`` for channels ``[c0, c1)``."""
    nb, c_, s_ = x.shape
    full = scale.shape[1] > 1
    for n in range(nb):
        for c in range(c0, c1):
            xi = x[n, c]
            o = out[n, c]
            if full:
                a = scale[c]
                b = shift[c]
                for i in range(s_):
                    o[i] = xi[i] * a[i] + b[i]
            else:
                a0 = scale[c, 0]
                b0 = shift[c, 0]
                for i in range(s_):
                    o[i] = xi[i] * a0 + b0


def _bn_affine(scale, bias, mean, var, eps, dt):
    """Per-channel (or per-element, for the legacy ``spatial=0``) scale and shift, in float64 then ``dt``."""
    s = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    b = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * s
    c = s.shape[0]
    return (np.ascontiguousarray(s.reshape(c, -1), dtype=dt), np.ascontiguousarray(b.reshape(c, -1), dtype=dt))


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
    x_dtype = spec.input_dtypes[0] if spec.input_dtypes else None
    pre, ref = None, reference(spec)
    if all(c is not None and c.size for c in consts) and x_dtype is not None and compute_dtype(x_dtype).kind == "f":
        pre = (compute_dtype(x_dtype), *_bn_affine(*consts, eps, compute_dtype(x_dtype)))

    def run(x, scale, bias, mean, var):
        if x.size == 0:
            return ref(x, scale, bias, mean, var)
        dt = _check_float(spec, x)
        if x.ndim < 2:
            raise spec.error(f"X must have rank >= 2, got shape {list(x.shape)}")
        c = x.shape[1]
        if pre is not None and pre[0] == dt and pre[1].shape[0] == c:
            a, b = pre[1], pre[2]
        else:
            _check_bn_params(spec, [scale, bias, mean, var])
            for name, p in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
                if p.shape[0] != c or (p.ndim > 1 and p.size != x[0].size):
                    raise spec.error(f"{name} has shape {list(p.shape)}, expected [{c}] for X of shape {list(x.shape)}")
            a, b = _bn_affine(scale, bias, mean, var, eps, dt)
        xr = np.ascontiguousarray(x, dtype=dt).reshape(x.shape[0], c, -1)
        if a.shape[1] not in (1, xr.shape[2]):
            raise spec.error(f"per-element parameters of shape {list(scale.shape)} do not match X {list(x.shape)}")
        out = spec.alloc.empty_like(xr)
        _over_pool(lambda lo, hi: _channel_affine(xr, a, b, out, lo, hi), c, xr.size)
        y = out.reshape(x.shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return (y,)

    return run


# -------------------------------------------------------------------------------------------------
# LayerNormalization


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _layer_norm(x, scale, bias, has_bias, eps, out, mean_out, inv_out, r0, r1):
    rows, cols = x.shape
    for r in range(r0, r1):
        xi = x[r]
        acc = 0.0
        for i in range(cols):
            acc += xi[i]
        mu = acc / cols
        sq = 0.0
        for i in range(cols):
            d = xi[i] - mu
            sq += d * d
        inv = 1.0 / math.sqrt(sq / cols + eps)
        mean_out[r] = mu
        inv_out[r] = inv
        o = out[r]
        if has_bias:
            for i in range(cols):
                o[i] = (xi[i] - mu) * inv * scale[i] + bias[i]
        else:
            for i in range(cols):
                o[i] = (xi[i] - mu) * inv * scale[i]


@kernel("LayerNormalization")
def make_layer_normalization(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", -1))
    eps = float(spec.attr("epsilon", 1e-5))
    stash = int(spec.attr("stash_type", 1))
    if stash != 1:
        raise spec.error(f"stash_type={stash} is not supported (only 1, float32 statistics)")

    def run(x, scale, bias=None):
        dt = _check_float(spec, x)
        r = x.ndim
        axis = axis_attr + r if axis_attr < 0 else axis_attr
        if not 0 <= axis < r:
            raise spec.error(f"axis {axis_attr} is out of range for X of rank {r}")
        norm_shape = x.shape[axis:]
        cols = int(np.prod(norm_shape))
        rows = int(np.prod(x.shape[:axis]))
        if cols == 0:  # as onnxruntime (and byoc's reference): no statistics of nothing
            raise spec.error(f"X of shape {list(x.shape)} has nothing to normalise from axis {axis_attr}")

        def flat(p, name):
            try:
                return np.ascontiguousarray(np.broadcast_to(np.asarray(p, dtype=dt), norm_shape)).reshape(cols)
            except ValueError:
                raise spec.error(f"{name} of shape {list(p.shape)} does not broadcast to {list(norm_shape)}") from None

        s = flat(scale, "Scale")
        b = flat(bias, "B") if bias is not None else s
        xr = np.ascontiguousarray(x, dtype=dt).reshape(rows, cols)
        out = spec.alloc.empty_like(xr)
        # statistics are float32 (stash_type=1); float64 inputs keep float64 statistics internally
        mean = spec.alloc.empty(rows, np.float64)
        inv = spec.alloc.empty(rows, np.float64)
        _over_pool(lambda lo, hi: _layer_norm(xr, s, b, bias is not None, eps, out, mean, inv, lo, hi), rows,
                   xr.size)
        y = out.reshape(x.shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        stat_shape = x.shape[:axis] + (1,) * (r - axis)
        res = [y]
        if spec.n_outputs > 1:
            res.append(mean.astype(np.float32).reshape(stat_shape))
        if spec.n_outputs > 2:
            res.append(inv.astype(np.float32).reshape(stat_shape))
        return tuple(res)

    return run


# -------------------------------------------------------------------------------------------------
# InstanceNormalization


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _instance_norm(x, scale, bias, eps, out, c0, c1):
    nb, c_, s_ = x.shape
    for n in range(nb):
        for c in range(c0, c1):
            xi = x[n, c]
            acc = 0.0
            for i in range(s_):
                acc += xi[i]
            mu = acc / s_
            sq = 0.0
            for i in range(s_):
                d = xi[i] - mu
                sq += d * d
            a = scale[c] / math.sqrt(sq / s_ + eps)
            b = bias[c] - mu * a
            o = out[n, c]
            for i in range(s_):
                o[i] = xi[i] * a + b


@kernel("InstanceNormalization")
def make_instance_normalization(spec: NodeSpec):
    eps = float(spec.attr("epsilon", 1e-5))
    ref = reference(spec)

    def run(x, scale, bias):
        if x.size == 0:
            return ref(x, scale, bias)
        dt = _check_float(spec, x)
        if x.ndim < 3:
            raise spec.error(f"X must have rank >= 3, got shape {list(x.shape)}")
        c = x.shape[1]
        if scale.shape != (c,) or bias.shape != (c,):
            raise spec.error(f"scale and B must have shape [{c}], got {list(scale.shape)} and {list(bias.shape)}")
        xr = np.ascontiguousarray(x, dtype=dt).reshape(x.shape[0], c, -1)
        out = spec.alloc.empty_like(xr)
        sc, bi = np.asarray(scale, np.float64), np.asarray(bias, np.float64)
        _over_pool(lambda lo, hi: _instance_norm(xr, sc, bi, eps, out, lo, hi), c, xr.size)
        y = out.reshape(x.shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return (y,)

    return run


# -------------------------------------------------------------------------------------------------
# LRN


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _lrn(x, size, alpha, beta, bias, out):
    """Across-channel LRN with a running window of squared channel planes."""
    nb, c_, s_ = x.shape
    lo_off = (size - 1) // 2
    hi_off = size - 1 - lo_off  # window [c - lo_off, c + hi_off]
    sq = np.zeros(s_, dtype=np.float64)
    k = alpha / size
    for n in range(nb):
        sq[:] = 0.0
        for c in range(min(hi_off, c_ - 1) + 1):
            xc = x[n, c]
            for i in range(s_):
                sq[i] += xc[i] * xc[i]
        for c in range(c_):
            xc = x[n, c]
            o = out[n, c]
            for i in range(s_):
                o[i] = xc[i] * (bias + k * sq[i]) ** (-beta)
            # slide: add channel c+hi_off+1, drop channel c-lo_off
            add = c + hi_off + 1
            if add < c_:
                xa = x[n, add]
                for i in range(s_):
                    sq[i] += xa[i] * xa[i]
            drop = c - lo_off
            if drop >= 0:
                xd = x[n, drop]
                for i in range(s_):
                    sq[i] -= xd[i] * xd[i]


@kernel("LRN")
def make_lrn(spec: NodeSpec):
    size = spec.attr("size")
    if size is None or int(size) < 1:
        raise spec.error(f"attribute size must be a positive integer, got {size!r}")
    size = int(size)
    alpha = float(spec.attr("alpha", 1e-4))
    beta = float(spec.attr("beta", 0.75))
    bias = float(spec.attr("bias", 1.0))
    ref = reference(spec)

    def run(x):
        if x.size == 0:
            return ref(x)
        dt = _check_float(spec, x)
        if x.ndim < 3:
            raise spec.error(f"X must have rank >= 3, got shape {list(x.shape)}")
        xr = np.ascontiguousarray(x, dtype=dt).reshape(x.shape[0], x.shape[1], -1)
        out = spec.alloc.empty_like(xr)
        _lrn(xr, size, alpha, beta, bias, out)
        y = out.reshape(x.shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return (y,)

    return run
