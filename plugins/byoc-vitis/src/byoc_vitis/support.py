"""Which operators the DPU runs, with the limits of a Vitis-AI DPU (DPUCZDX8G-like).

Every check returns ``None`` (supported) or the reason it is not, naming the limit; the
reasons are the verdicts of the placement report. All checks need static shapes and float32
data (quantised to int8 at the region's border: the DPU computes int8 only).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from byoc.contract import SupportContext
from byoc.contract import attr as _attr
from byoc_vitis.program import LEAKY_ALPHA

#: DPU limits (README.md, "Operators and limits")
KERNEL_MAX = 16
STRIDE_MAX = 8
DILATION_MAX = 4
POOL_KERNEL_MAX = 16
GLOBAL_POOL_MAX = 64
RESIZE_FACTOR_MAX = 8
CHANNELS_MAX = 4096

Check = Callable[[ir.Node, SupportContext], Any]




def _ints(node: ir.Node, name: str, default: list[int]) -> list[int]:
    v = _attr(node, name)
    return [int(x) for x in v] if v is not None else list(default)


def _data_io(node: ir.Node, ctx: SupportContext, inputs: list[int]) -> str | None:
    """Float32 data with static shapes on the given inputs and every output."""
    values = [(f"input {i}", node.inputs[i]) for i in inputs if i < len(node.inputs) and node.inputs[i] is not None]
    values += [(f"output {j}", v) for j, v in enumerate(node.outputs[:1])]
    for what, v in values:
        dt = ctx.dtype(v)
        if dt is not None and dt != ir.DataType.FLOAT:
            return f"{node.op_type}: {what} {v.name!r} is {dt.name.lower()}; the DPU computes int8 from float32 tensors"
        shape = ctx.shape(v)
        if shape is None or any(d is None for d in shape):
            return f"{node.op_type}: {what} {v.name!r} has a dynamic or unknown shape; the DPU needs static shapes"
    return None


def _const(node: ir.Node, ctx: SupportContext, i: int) -> np.ndarray | None:
    return ctx.const(node.inputs[i]) if i < len(node.inputs) and node.inputs[i] is not None else None


def conv_pads(node: ir.Node, in_hw: tuple[int, int], kernel: list[int], strides: list[int],
              dilations: list[int]) -> list[int] | None:
    """Explicit ``[top, left, bottom, right]`` pads of a Conv/pool node (``auto_pad`` resolved)."""
    auto = _attr(node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = _ints(node, "pads", [0, 0, 0, 0])
        return [pads[0], pads[1], pads[2], pads[3]] if len(pads) == 4 else None
    if auto == "VALID":
        return [0, 0, 0, 0]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(in_hw, kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return [out[0][0], out[1][0], out[0][1], out[1][1]]
    return None


def _window_limits(op: str, kernel: list[int], strides: list[int], pads: list[int] | None,
                   kmax: int) -> str | None:
    if any(not 1 <= k <= kmax for k in kernel):
        return f"{op}: kernel {'x'.join(map(str, kernel))} is outside the DPU's 1..{kmax}"
    if any(not 1 <= s <= STRIDE_MAX for s in strides):
        return f"{op}: stride {'x'.join(map(str, strides))} is outside the DPU's 1..{STRIDE_MAX}"
    if pads is None:
        return f"{op}: unsupported padding"
    for p, k in zip(pads, kernel + kernel):
        if p < 0 or p > k - 1:
            return f"{op}: padding {pads} exceeds kernel-1 ({'x'.join(str(k - 1) for k in kernel)})"
    return None


def check_conv(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    x = ctx.shape(node.inputs[0])
    if len(x) != 4:
        return f"Conv: only 2-D convolutions (4-D tensors) run on the DPU; input is {len(x)}-D"
    w = _const(node, ctx, 1)
    if w is None:
        return "Conv: the weights must be a constant"
    if len(node.inputs) > 2 and node.inputs[2] is not None and _const(node, ctx, 2) is None:
        return "Conv: the bias must be a constant"
    group = int(_attr(node, "group", 1))
    c_in, c_out = x[1], w.shape[0]
    if group != 1 and not (group == c_in and c_out == c_in) and not ctx.options.get("grouped_conv", False):
        return (f"Conv: grouped convolution (group {group}, {c_in}->{c_out} channels) is not supported by the DPU; "
                f"only group 1 and depthwise (group = channels) run on it")
    if max(c_in, c_out) > CHANNELS_MAX:
        return f"Conv: {max(c_in, c_out)} channels exceed the DPU's {CHANNELS_MAX}"
    kernel = list(w.shape[2:])
    strides = _ints(node, "strides", [1, 1])
    dilations = _ints(node, "dilations", [1, 1])
    if any(not 1 <= d <= DILATION_MAX for d in dilations):
        return f"Conv: dilation {'x'.join(map(str, dilations))} is outside the DPU's 1..{DILATION_MAX}"
    return _window_limits("Conv", kernel, strides, conv_pads(node, x[2:], kernel, strides, dilations), KERNEL_MAX)


def check_conv_transpose(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    x = ctx.shape(node.inputs[0])
    if len(x) != 4:
        return f"ConvTranspose: only 2-D (4-D tensors); input is {len(x)}-D"
    w = _const(node, ctx, 1)
    if w is None:
        return "ConvTranspose: the weights must be a constant"
    if len(node.inputs) > 2 and node.inputs[2] is not None and _const(node, ctx, 2) is None:
        return "ConvTranspose: the bias must be a constant"
    auto = _attr(node, "auto_pad", "NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) not in ("NOTSET", ""):
        return "ConvTranspose: auto_pad is not supported; give explicit pads"
    group = int(_attr(node, "group", 1))
    if group != 1 and not (group == x[1] and w.shape[1] == 1):
        return f"ConvTranspose: grouped transposed convolution (group {group}) is not supported by the DPU"
    dilations = _ints(node, "dilations", [1, 1])
    if dilations != [1, 1]:
        return "ConvTranspose: dilation other than 1 is not supported by the DPU"
    kernel = list(w.shape[2:])
    strides = _ints(node, "strides", [1, 1])
    pads = _ints(node, "pads", [0, 0, 0, 0])
    return _window_limits("ConvTranspose", kernel, strides, pads if len(pads) == 4 else None, KERNEL_MAX)


def _pool_common(node: ir.Node, ctx: SupportContext) -> tuple[str | None, Any]:
    why = _data_io(node, ctx, [0])
    if why:
        return why, None
    x = ctx.shape(node.inputs[0])
    if len(x) != 4:
        return f"{node.op_type}: only 2-D pooling (4-D tensors); input is {len(x)}-D", None
    if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses():
        return f"{node.op_type}: the Indices output is not supported by the DPU", None
    return None, x


def _ceil_changes_shape(node: ir.Node, x, kernel, strides, pads, dilations) -> bool:
    if not int(_attr(node, "ceil_mode", 0)):
        return False
    for i in range(2):
        span = x[2 + i] + pads[i] + pads[i + 2] - ((kernel[i] - 1) * dilations[i] + 1)
        if span % strides[i]:
            return True
    return False


def check_maxpool(node: ir.Node, ctx: SupportContext) -> str | None:
    why, x = _pool_common(node, ctx)
    if why:
        return why
    kernel = _ints(node, "kernel_shape", [])
    strides = _ints(node, "strides", [1, 1])
    dilations = _ints(node, "dilations", [1, 1])
    if int(_attr(node, "storage_order", 0)):
        return "MaxPool: storage_order 1 is not supported"
    if dilations != [1, 1]:
        return "MaxPool: dilation other than 1 is not supported by the DPU"
    return _window_limits("MaxPool", kernel, strides, conv_pads(node, x[2:], kernel, strides, dilations),
                          POOL_KERNEL_MAX)


def check_avgpool(node: ir.Node, ctx: SupportContext) -> str | None:
    why, x = _pool_common(node, ctx)
    if why:
        return why
    kernel = _ints(node, "kernel_shape", [])
    strides = _ints(node, "strides", [1, 1])
    if _ints(node, "dilations", [1, 1]) != [1, 1]:
        return "AveragePool: dilation other than 1 is not supported by the DPU"
    pads = conv_pads(node, x[2:], kernel, strides, [1, 1])
    why = _window_limits("AveragePool", kernel, strides, pads, POOL_KERNEL_MAX)
    if why:
        return why
    if _ceil_changes_shape(node, x, kernel, strides, pads, [1, 1]):
        return "AveragePool: ceil_mode windows that overhang the padding are not supported by the DPU"
    return None


def check_global_pool(node: ir.Node, ctx: SupportContext) -> str | None:
    why, x = _pool_common(node, ctx)
    if why:
        return why
    if x[2] > GLOBAL_POOL_MAX or x[3] > GLOBAL_POOL_MAX:
        return f"{node.op_type}: a {x[2]}x{x[3]} window exceeds the DPU's {GLOBAL_POOL_MAX}x{GLOBAL_POOL_MAX}"
    return None


def _operands(node: ir.Node, ctx: SupportContext) -> str | None:
    out = ctx.shape(node.outputs[0])
    why = _data_io(node, ctx, [])
    if why:
        return why
    acts = []
    for i, v in enumerate(node.inputs):
        if v is None:
            return f"{node.op_type}: missing input {i}"
        dt = ctx.dtype(v)
        if dt is not None and dt != ir.DataType.FLOAT:
            return f"{node.op_type}: input {i} {v.name!r} is {dt.name.lower()}; the DPU computes int8 from float32"
        if ctx.const(v) is None:
            shape = ctx.shape(v)
            if shape is None or any(d is None for d in shape):
                return f"{node.op_type}: input {i} {v.name!r} has a dynamic shape; the DPU needs static shapes"
            acts.append(shape)
    if not acts:
        return f"{node.op_type}: every operand is a constant (folded on the host)"
    for shape in acts:
        if tuple(shape) != tuple(out):
            ok = node.op_type == "Mul" and len(shape) == len(out) == 4 and shape[0] == out[0] and \
                shape[1] == out[1] and shape[2] == shape[3] == 1
            if not ok:
                return (f"{node.op_type}: operand of shape {list(shape)} broadcasts to {list(out)}; the DPU's "
                        f"elementwise engine needs equal shapes (or a per-channel [N,C,1,1] factor for Mul)")
    return None


def check_add(node: ir.Node, ctx: SupportContext) -> str | None:
    return _operands(node, ctx)


def check_mul(node: ir.Node, ctx: SupportContext) -> str | None:
    if len(node.inputs) != 2:
        return "Mul: needs two operands"
    return _operands(node, ctx)


def check_concat(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, list(range(len(node.inputs))))
    if why:
        return why
    rank = len(ctx.shape(node.outputs[0]))
    axis = int(_attr(node, "axis", 1))
    if axis % rank != 1:
        return f"Concat: axis {axis} is not the channel axis; the DPU concatenates channels"
    return None


def check_relu(node: ir.Node, ctx: SupportContext) -> str | None:
    return _data_io(node, ctx, [0])


def clip_bounds(node: ir.Node, ctx: SupportContext) -> tuple[float | None, float | None]:
    lo = _attr(node, "min")
    hi = _attr(node, "max")
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        c = ctx.const(node.inputs[1])
        lo = None if c is None else float(c)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = ctx.const(node.inputs[2])
        hi = None if c is None else float(c)
    return lo, hi


def check_clip(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    lo, hi = clip_bounds(node, ctx)
    if lo != 0.0 or hi != 6.0:
        return f"Clip: only ReLU6 (Clip 0..6) runs on the DPU; got min={lo}, max={hi}"
    return None


def check_leaky_relu(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    alpha = float(_attr(node, "alpha", 0.01))
    if abs(alpha - LEAKY_ALPHA) > 1e-6:
        return f"LeakyRelu: alpha {alpha:g} is not the DPU's fixed slope {LEAKY_ALPHA} (26/256)"
    return None


def check_hard_sigmoid(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    alpha, beta = float(_attr(node, "alpha", 0.2)), float(_attr(node, "beta", 0.5))
    if abs(alpha - 1 / 6) > 1e-6 or abs(beta - 0.5) > 1e-6:
        return f"HardSigmoid: alpha {alpha:g}, beta {beta:g}; the DPU implements only relu6(x+3)/6 (1/6, 0.5)"
    return None


def check_hard_swish(node: ir.Node, ctx: SupportContext) -> str | None:
    return _data_io(node, ctx, [0])


def check_gemm(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    if len(ctx.shape(node.inputs[0])) != 2:
        return "Gemm: input A must be 2-D"
    if int(_attr(node, "transA", 0)):
        return "Gemm: transA=1 is not supported by the DPU"
    if float(_attr(node, "alpha", 1.0)) != 1.0 or float(_attr(node, "beta", 1.0)) != 1.0:
        return "Gemm: alpha and beta must be 1"
    w = _const(node, ctx, 1)
    if w is None or w.ndim != 2:
        return "Gemm: B must be a 2-D constant (the weights)"
    f = w.shape[0] if int(_attr(node, "transB", 0)) else w.shape[1]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = _const(node, ctx, 2)
        if c is None or c.size != f or not (c.ndim == 1 or (c.ndim == 2 and c.shape[0] == 1)):
            return "Gemm: C must be a constant per-output bias ([F] or [1, F])"
    return None


def check_matmul(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    if len(ctx.shape(node.inputs[0])) != 2:
        return "MatMul: input A must be 2-D"
    w = _const(node, ctx, 1)
    if w is None or w.ndim != 2:
        return "MatMul: B must be a 2-D constant (the weights)"
    return None


def check_reshape(node: ir.Node, ctx: SupportContext) -> str | None:
    return _data_io(node, ctx, [0])


def check_resize(node: ir.Node, ctx: SupportContext) -> str | None:
    why = _data_io(node, ctx, [0])
    if why:
        return why
    mode = _attr(node, "mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "nearest":
        return f"Resize: mode {mode!r}; the DPU resizes with nearest only"
    ctm = _attr(node, "coordinate_transformation_mode", "half_pixel")
    if (ctm.decode() if isinstance(ctm, bytes) else ctm) == "tf_crop_and_resize":
        return "Resize: tf_crop_and_resize is not supported"
    for i in range(1, len(node.inputs)):
        if node.inputs[i] is not None and ctx.const(node.inputs[i]) is None:
            return f"Resize: input {i} must be a constant"
    x, y = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
    if len(x) != 4 or x[:2] != y[:2]:
        return "Resize: only spatial resizing of 4-D tensors (batch and channels unchanged)"
    for a, b in zip(x[2:], y[2:]):
        if b > a * RESIZE_FACTOR_MAX or a > b * RESIZE_FACTOR_MAX:
            return f"Resize: factor {b}/{a} exceeds the DPU's {RESIZE_FACTOR_MAX}x"
    return None


#: operator type -> support check
OPERATORS: dict[str, Check] = {
    "Conv": check_conv,
    "ConvTranspose": check_conv_transpose,
    "MaxPool": check_maxpool,
    "AveragePool": check_avgpool,
    "GlobalAveragePool": check_global_pool,
    "GlobalMaxPool": check_global_pool,
    "Add": check_add,
    "Sum": check_add,
    "Mul": check_mul,
    "Concat": check_concat,
    "Relu": check_relu,
    "Clip": check_clip,
    "LeakyRelu": check_leaky_relu,
    "HardSigmoid": check_hard_sigmoid,
    "HardSwish": check_hard_swish,
    "Gemm": check_gemm,
    "MatMul": check_matmul,
    "Reshape": check_reshape,
    "Flatten": check_reshape,
    "Resize": check_resize,
}

#: operators that carry the multiply-accumulate work; a region without one is not worth a DPU trip
MAC_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


def make_check(op_type: str) -> Check:
    fn = OPERATORS[op_type]

    def check(node: ir.Node, ctx: SupportContext) -> Any:
        return fn(node, ctx)

    check.__name__ = f"vitis_{op_type}"
    return check


def rule_needs_mac(region, ctx=None) -> str | None:
    """Drop a region without a MAC operator: the border quantise/dequantise costs more than it saves."""
    if not any(n.op_type in MAC_OPS for n in region.nodes):
        ops = ", ".join(sorted({n.op_type for n in region.nodes}))
        return f"no Conv/ConvTranspose/Gemm/MatMul in the region ({ops}): not worth a DPU round trip"
    return None


__all__ = ["MAC_OPS", "OPERATORS", "conv_pads", "clip_bounds", "make_check", "rule_needs_mac"]
