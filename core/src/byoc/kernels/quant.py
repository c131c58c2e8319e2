"""Quantisation kernels: QuantizeLinear and DequantizeLinear (integer types).

``QuantizeLinear``: ``y = saturate(round_half_even(x / scale) + zero_point)``, the division in
the input's float type; ``DequantizeLinear``: ``y = (float32(x) - zero_point) * scale``. Both
support per-tensor, per-axis (``axis``) and blocked (``block_size``) parameters. Integer types
only (int8/uint8/int16/uint16, and int32 for DequantizeLinear); float8/int4/float4 raise a
:class:`byoc.KernelError` naming the node. These are the borders of quantised regions (see
:mod:`byoc.quantize`), and the host runs a quantise-dequantise model with them.
"""

from __future__ import annotations

import numpy as np
import onnx

from byoc.kernels.registry import NodeSpec, kernel

_RANGES = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(np.uint16): (0, 65535),
}
_DEQUANT_TYPES = set(_RANGES) | {np.dtype(np.int32)}


def _np_dtype(onnx_type: int, spec: NodeSpec) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))
    except Exception:
        raise spec.error(f"unknown output_dtype {onnx_type}") from None


def broadcast_param(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int, spec: NodeSpec,
                    what: str) -> np.ndarray:
    """Reshape a scale/zero point so it broadcasts against an input of ``shape``."""
    value = np.asarray(value)
    if value.ndim == 0 or (value.ndim == 1 and value.size == 1 and not block_size):
        return value.reshape(())
    rank = len(shape)
    if not -rank <= axis < rank:
        raise spec.error(f"axis {axis} is out of range for an input of rank {rank}")
    axis %= rank
    if not block_size:
        if value.ndim != 1 or value.size != shape[axis]:
            raise spec.error(f"{what} of shape {list(value.shape)} does not fit axis {axis} of an input of "
                             f"shape {list(shape)} (expected a scalar or {shape[axis]} values)")
        dims = [1] * rank
        dims[axis] = value.size
        return value.reshape(dims)
    if block_size < 0:
        raise spec.error(f"block_size must be positive, got {block_size}")
    blocks = -(-shape[axis] // block_size)
    want = tuple(blocks if i == axis else d for i, d in enumerate(shape))
    if value.shape != want:
        raise spec.error(f"blocked {what} has shape {list(value.shape)}, expected {list(want)} "
                         f"(block_size {block_size} on axis {axis})")
    # blocks * block_size is at most the input's axis plus one block; the result has its size
    spec.check_alloc(want[:axis] + (blocks * block_size,) + want[axis + 1:], value.dtype)
    return np.repeat(value, block_size, axis=axis)[(slice(None),) * axis + (slice(0, shape[axis]),)]


@kernel("QuantizeLinear")
def make_quantize_linear(spec: NodeSpec):
    axis = int(spec.attr("axis", 1))
    block_size = int(spec.attr("block_size", 0))
    output_dtype = int(spec.attr("output_dtype", 0))
    precision = int(spec.attr("precision", 0))
    want = _np_dtype(output_dtype, spec) if output_dtype else None
    calc = _np_dtype(precision, spec) if precision else None

    def run(x, scale, zero_point=None):
        if zero_point is not None:
            dtype = zero_point.dtype
            if want is not None and want != dtype:
                raise spec.error(f"output_dtype {want} does not match the zero point's type {dtype}")
        else:
            dtype = want if want is not None else np.dtype(np.uint8)
        if dtype not in _RANGES:
            raise spec.error(f"quantising to {dtype} is not supported by the host kernel (integer types only: "
                             f"int8, uint8, int16, uint16)")
        s = broadcast_param(scale, x.shape, axis, block_size, spec, "scale")
        q = (x.astype(calc) / s.astype(calc)) if calc is not None else x / s
        q = np.rint(q)
        if zero_point is not None:
            q = q + broadcast_param(zero_point, x.shape, axis, block_size, spec, "zero point").astype(np.float64)
        lo, hi = _RANGES[dtype]
        return (np.clip(q, lo, hi).astype(dtype),)

    return run


@kernel("DequantizeLinear")
def make_dequantize_linear(spec: NodeSpec):
    axis = int(spec.attr("axis", 1))
    block_size = int(spec.attr("block_size", 0))
    output_dtype = int(spec.attr("output_dtype", 0))
    want = _np_dtype(output_dtype, spec) if output_dtype else None

    def run(x, scale, zero_point=None):
        if x.dtype not in _DEQUANT_TYPES:
            raise spec.error(f"dequantising {x.dtype} is not supported by the host kernel (integer types only: "
                             f"int8, uint8, int16, uint16, int32)")
        if zero_point is not None and zero_point.dtype != x.dtype:
            raise spec.error(f"zero point of type {zero_point.dtype} does not match the input's type {x.dtype}")
        spec.check_alloc(x.shape, np.float64 if want == np.float64 or scale.dtype == np.float64 else np.float32)
        d = x.astype(np.float32)
        if zero_point is not None:
            d = d - broadcast_param(zero_point, x.shape, axis, block_size, spec, "zero point").astype(np.float32)
        y = d * broadcast_param(scale, x.shape, axis, block_size, spec, "scale")
        return (y.astype(want if want is not None else scale.dtype, copy=False),)

    return run
