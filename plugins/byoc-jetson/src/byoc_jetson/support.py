"""Which ONNX nodes the jetson target takes: TensorRT's ONNX parser support and its limits.

Modelled on the operator matrix of onnx-tensorrt (the parser TensorRT ships) and on the limits
of TensorRT's layers. Every check returns ``None`` to accept or a reason string to reject; the
reason lands in the placement report. (The options in ``ctx.options`` are already validated by
byoc against the declared ones.) The checks, in order:

1. tensor types (inputs first, outputs after the operator's own check): TensorRT computes in
   float32/float16, int32 and bool. There is **no int64 compute** (int64 and double tensors stay
   on the host); constant int64 inputs that only feed shapes, axes or indices (Reshape's shape,
   Slice's starts, Gather's indices) are fine;
2. **static shapes except the batch dimension**: every tensor's rank and every dimension but
   the first must be known at compile time (the engine is specialised to them);
3. the operator's own limits (below, one commented check per operator);
4. on the CPU emulation path, the host kernels must be able to emulate the node.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np
import onnx_ir as ir

from byoc.contract import SupportContext
from byoc_jetson.options import runtime_path

DT = ir.DataType
F = frozenset({DT.FLOAT, DT.FLOAT16})
FI = F | {DT.INT32}
FIB = FI | {DT.BOOL}
B = frozenset({DT.BOOL})
_TYPE_NAMES = {DT.FLOAT: "FP32", DT.FLOAT16: "FP16", DT.INT32: "INT32", DT.BOOL: "BOOL"}

#: the largest kernel/window volume TensorRT's convolution, deconvolution and pooling layers take
MAX_KERNEL_VOLUME = 100_000
#: ILRNLayer: odd window in [1, 15], alpha in [-1e20, 1e20], beta in [0.01, 1e5], bias k in [1e-5, 1e10]
LRN_WINDOW = (1, 15)

#: the multiply-accumulate operators: a region without one is not worth an engine
MAC_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})

Check = Callable[[ir.Node, SupportContext], "str | None"]


# -- helpers ----------------------------------------------------------------------------------


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    a = node.attributes.get(name)
    if a is None:
        return default
    value = a.value
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def _inp(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _is_const(v: ir.Value | None) -> bool:
    return v is not None and v.const_value is not None and not v.is_graph_input()


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _tname(v: ir.Value) -> str:
    return repr(v.name or "?")


def _need_const(node: ir.Node, i: int, what: str) -> str | None:
    """Input ``i`` (if present) must be an initializer/constant."""
    v = _inp(node, i)
    if v is not None and not _is_const(v):
        return f"{node.op_type}: {what} ({_tname(v)}) must be an initializer; TensorRT needs it at build time"
    return None


def _first(*reasons: str | None) -> str | None:
    for r in reasons:
        if r:
            return r
    return None


def _checked_values(node: ir.Node, outputs: bool) -> list[ir.Value]:
    """The non-constant inputs, or the outputs that are used (an unused optional output does not matter)."""
    if not outputs:
        return [v for v in node.inputs if v is not None and not _is_const(v)]
    return [v for i, v in enumerate(node.outputs) if i == 0 or v.uses() or v.is_graph_output()]


def _dtype_problem(node: ir.Node, allowed: frozenset, outputs: bool = False) -> str | None:
    for v in _checked_values(node, outputs):
        dt = v.dtype
        if dt is None:
            return f"{node.op_type}: the type of {_tname(v)} is unknown (TensorRT needs typed tensors)"
        if dt == DT.INT64:
            return (f"{node.op_type}: {_tname(v)} is INT64; TensorRT has no int64 compute "
                    "(it narrows int64 to int32 at best), so the node stays on the host")
        if dt == DT.DOUBLE:
            return f"{node.op_type}: {_tname(v)} is DOUBLE; TensorRT computes in FP32/FP16 only"
        if dt not in allowed:
            ok = "/".join(_TYPE_NAMES[t] for t in (DT.FLOAT, DT.FLOAT16, DT.INT32, DT.BOOL) if t in allowed)
            return f"{node.op_type}: {_tname(v)} is {dt.name}; TensorRT's {node.op_type} takes {ok}"
    return None


def _shape_problem(node: ir.Node, outputs: bool = False) -> str | None:
    for v in _checked_values(node, outputs):
        if v.shape is None:
            return (f"{node.op_type}: the shape of {_tname(v)} is unknown; TensorRT engines need static shapes "
                    "(only the batch dimension may be dynamic)")
        for axis, d in enumerate(v.shape):
            if axis > 0 and not isinstance(d, int):
                return (f"{node.op_type}: dimension {axis} of {_tname(v)} is dynamic ({d}); only the batch "
                        "dimension (0) may be dynamic in a TensorRT engine")
    return None


def _kernel_volume(node: ir.Node) -> tuple[list[int], int] | None:
    shape = attr(node, "kernel_shape")
    if shape is None and node.op_type in ("Conv", "ConvTranspose"):
        w = _inp(node, 1)
        if w is not None and w.shape is not None and all(isinstance(d, int) for d in w.shape):
            shape = list(w.shape)[2:]
    if shape is None:
        return None
    return list(shape), int(math.prod(shape))


# -- per-operator checks ----------------------------------------------------------------------
# Each takes (node, ctx) and returns None (accept) or the reason; generic checks ran before.


def check_conv(node: ir.Node, ctx: SupportContext) -> str | None:
    op_type = node.op_type
    rank = _rank(_inp(node, 0))
    # the ONNX parser takes 2-D and 3-D convolutions (4-D/5-D inputs) only
    if rank not in (4, 5):
        return (f"{op_type}: {rank - 2 if rank else '?'}-D convolution ({rank}-D input); TensorRT takes 2-D and "
                "3-D convolutions only (4-D or 5-D inputs)")
    # weights (and bias) become engine constants: they must be initializers
    reason = _first(_need_const(node, 1, "the weights W"), _need_const(node, 2, "the bias B"))
    if reason:
        return reason
    kv = _kernel_volume(node)
    # convolution/deconvolution kernels are limited in volume
    if kv is not None and kv[1] > MAX_KERNEL_VOLUME:
        return f"{op_type}: kernel {'x'.join(map(str, kv[0]))} exceeds TensorRT's kernel volume limit {MAX_KERNEL_VOLUME}"
    group = int(attr(node, "group", 1))
    x = _inp(node, 0)
    channels = x.shape[1] if x is not None and x.shape is not None else None
    # grouped convolution needs the channels to split evenly
    if isinstance(channels, int) and group > 1 and channels % group:
        return f"{op_type}: {channels} input channels do not split into {group} groups"
    return None


def check_pool(node: ir.Node, ctx: SupportContext) -> str | None:
    op_type = node.op_type
    rank = _rank(_inp(node, 0))
    # 2-D or 3-D pooling only (4-D/5-D inputs)
    if rank not in (4, 5):
        return f"{op_type}: {rank}-D input; TensorRT pools in 2-D or 3-D only (4-D or 5-D inputs)"
    # MaxPool's Indices output has no TensorRT equivalent
    if op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].name and (
        node.outputs[1].uses() or node.outputs[1].is_graph_output()
    ):
        return "MaxPool: the Indices output is not supported by TensorRT"
    # IPoolingLayer has no dilation
    dilations = attr(node, "dilations")
    if dilations and any(d != 1 for d in dilations):
        return f"{op_type}: dilations {dilations} are not supported by TensorRT pooling"
    kv = _kernel_volume(node)
    if kv is None:
        return f"{op_type}: kernel_shape is missing"
    kernel, volume = kv
    if volume > MAX_KERNEL_VOLUME:
        return f"{op_type}: window {'x'.join(map(str, kernel))} exceeds TensorRT's window volume limit {MAX_KERNEL_VOLUME}"
    pads = attr(node, "pads")
    n = len(kernel)
    # IPoolingLayer: the padding must be smaller than the window in every dimension
    if pads and any(pads[i] >= kernel[i] or pads[i + n] >= kernel[i] for i in range(n) if i + n < len(pads)):
        return f"{op_type}: pads {pads} are not smaller than the window {kernel} (TensorRT pooling limit)"
    return None


def check_global_pool(node: ir.Node, ctx: SupportContext) -> str | None:
    rank = _rank(_inp(node, 0))
    if rank is None or rank < 3:
        return f"{node.op_type}: {rank}-D input; expected at least 3-D (N, C, spatial...)"
    return None


def check_gemm(node: ir.Node, ctx: SupportContext) -> str | None:
    for i in (0, 1):
        r = _rank(_inp(node, i))
        if r != 2:
            return f"Gemm: input {i} is {r}-D; Gemm takes 2-D matrices"
    return None


def check_matmul(node: ir.Node, ctx: SupportContext) -> str | None:
    for i in (0, 1):
        r = _rank(_inp(node, i))
        if not r:
            return f"MatMul: input {i} is a scalar; MatMul needs at least 1-D inputs"
    return None


RESIZE_MODES = ("nearest", "linear")
RESIZE_COORDS = ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners")
RESIZE_NEAREST = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")


def check_resize(node: ir.Node, ctx: SupportContext) -> str | None:
    mode = attr(node, "mode", "nearest")
    # TensorRT's resize layer interpolates nearest or (multi-)linear: no cubic
    if mode not in RESIZE_MODES:
        return f"Resize: mode {mode!r} is not supported by TensorRT (supported: {', '.join(RESIZE_MODES)})"
    coord = attr(node, "coordinate_transformation_mode", "half_pixel")
    if coord not in RESIZE_COORDS:
        return (f"Resize: coordinate_transformation_mode {coord!r} is not supported by TensorRT "
                f"(supported: {', '.join(RESIZE_COORDS)})")
    nearest = attr(node, "nearest_mode", "round_prefer_floor")
    if mode == "nearest" and nearest not in RESIZE_NEAREST:
        return f"Resize: nearest_mode {nearest!r} is not supported by TensorRT"
    if int(attr(node, "antialias", 0)):
        return "Resize: antialias is not supported by TensorRT"
    if int(attr(node, "exclude_outside", 0)):
        return "Resize: exclude_outside=1 is not supported by TensorRT"
    if attr(node, "axes") is not None:
        return "Resize: the axes attribute is not supported by TensorRT; give scales/sizes for every axis"
    if attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return "Resize: keep_aspect_ratio_policy other than 'stretch' is not supported by TensorRT"
    reason = _first(_need_const(node, 1, "roi"), _need_const(node, 2, "scales"), _need_const(node, 3, "sizes"))
    if reason:
        return reason
    x, y = _inp(node, 0), node.outputs[0]
    # linear interpolation runs over at most the three innermost dimensions
    if mode == "linear" and x is not None and x.shape is not None and y.shape is not None:
        changed = [i for i, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b]
        if changed and changed[0] < len(x.shape) - 3:
            return "Resize: linear resize of more than the 3 innermost dimensions is not supported by TensorRT"
    return None


def check_reshape(node: ir.Node, ctx: SupportContext) -> str | None:
    return _need_const(node, 1, "the target shape")


def check_slice(node: ir.Node, ctx: SupportContext) -> str | None:
    return _first(*(_need_const(node, i, what) for i, what in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps"))))


def check_axes_input(node: ir.Node, ctx: SupportContext) -> str | None:
    # Squeeze/Unsqueeze/Reduce* (opset 13/18 take axes as an input): axes must be constants
    return _need_const(node, 1, "axes")


def check_split(node: ir.Node, ctx: SupportContext) -> str | None:
    return _need_const(node, 1, "split")


def check_pad(node: ir.Node, ctx: SupportContext) -> str | None:
    mode = attr(node, "mode", "constant")
    # TensorRT pads with a constant, by reflection or by edge replication (no wrap)
    if mode not in ("constant", "reflect", "edge"):
        return f"Pad: mode {mode!r} is not supported by TensorRT (supported: constant, reflect, edge)"
    return _first(_need_const(node, 1, "pads"), _need_const(node, 2, "constant_value"), _need_const(node, 3, "axes"))


def check_clip(node: ir.Node, ctx: SupportContext) -> str | None:
    return _first(_need_const(node, 1, "min"), _need_const(node, 2, "max"))


def check_batchnorm(node: ir.Node, ctx: SupportContext) -> str | None:
    # inference only: the statistics become a per-channel scale and shift
    if int(attr(node, "training_mode", 0)):
        return "BatchNormalization: training_mode=1 is not supported by TensorRT (inference only)"
    if any(v.name and (v.uses() or v.is_graph_output()) for v in node.outputs[1:]):
        return "BatchNormalization: the running mean/var outputs are not supported by TensorRT"
    rank = _rank(_inp(node, 0))
    if rank is None or rank < 2:
        return f"BatchNormalization: {rank}-D input; expected (N, C, ...)"
    return _first(*(_need_const(node, i, what) for i, what in ((1, "scale"), (2, "B"), (3, "mean"), (4, "var"))))


def check_instancenorm(node: ir.Node, ctx: SupportContext) -> str | None:
    rank = _rank(_inp(node, 0))
    if rank is None or not 3 <= rank <= 5:
        return f"InstanceNormalization: {rank}-D input; TensorRT takes 3-D to 5-D"
    return _first(_need_const(node, 1, "scale"), _need_const(node, 2, "B"))


def check_layernorm(node: ir.Node, ctx: SupportContext) -> str | None:
    if any(v.name and (v.uses() or v.is_graph_output()) for v in node.outputs[1:]):
        return "LayerNormalization: the Mean/InvStdDev outputs are not supported by TensorRT"
    return _first(_need_const(node, 1, "Scale"), _need_const(node, 2, "B"))


def check_lrn(node: ir.Node, ctx: SupportContext) -> str | None:
    size = int(attr(node, "size", 0))
    alpha, beta, bias = float(attr(node, "alpha", 1e-4)), float(attr(node, "beta", 0.75)), float(attr(node, "bias", 1.0))
    # ILRNLayer limits
    if not (LRN_WINDOW[0] <= size <= LRN_WINDOW[1]) or size % 2 == 0:
        return f"LRN: size {size} must be odd and in [{LRN_WINDOW[0]}, {LRN_WINDOW[1]}] for TensorRT"
    if not -1e20 <= alpha <= 1e20:
        return f"LRN: alpha {alpha} outside TensorRT's range [-1e20, 1e20]"
    if not 0.01 <= beta <= 1e5:
        return f"LRN: beta {beta} outside TensorRT's range [0.01, 1e5]"
    if not 1e-5 <= bias <= 1e10:
        return f"LRN: bias {bias} outside TensorRT's range [1e-5, 1e10]"
    return None


_CAST_TO = {int(DT.FLOAT), int(DT.FLOAT16), int(DT.INT32), int(DT.BOOL)}


def check_cast(node: ir.Node, ctx: SupportContext) -> str | None:
    to = attr(node, "to")
    if to is not None and int(to) not in _CAST_TO:
        name = DT(int(to)).name
        why = "TensorRT has no int64 compute" if int(to) == int(DT.INT64) else "not a TensorRT compute type"
        return f"Cast: to {name} is not supported ({why})"
    return None


def check_expand(node: ir.Node, ctx: SupportContext) -> str | None:
    return _need_const(node, 1, "the shape")


def check_tile(node: ir.Node, ctx: SupportContext) -> str | None:
    return _need_const(node, 1, "repeats")


def check_cumsum(node: ir.Node, ctx: SupportContext) -> str | None:
    return _need_const(node, 1, "axis")


def check_prelu(node: ir.Node, ctx: SupportContext) -> str | None:
    return _need_const(node, 1, "the slope")


# -- the operator table -----------------------------------------------------------------------

#: op_type -> (allowed tensor types, operator-specific check or None)
OPERATORS: dict[str, tuple[frozenset, Check | None]] = {
    # multiply-accumulate
    "Conv": (F, check_conv),
    "ConvTranspose": (F, check_conv),
    "Gemm": (F, check_gemm),
    "MatMul": (F, check_matmul),
    # pooling
    "MaxPool": (F, check_pool),
    "AveragePool": (F, check_pool),
    "GlobalAveragePool": (F, check_global_pool),
    "GlobalMaxPool": (F, check_global_pool),
    # normalisation
    "BatchNormalization": (F, check_batchnorm),
    "InstanceNormalization": (F, check_instancenorm),
    "LayerNormalization": (F, check_layernorm),
    "LRN": (F, check_lrn),
    "Softmax": (F, None),
    "LogSoftmax": (F, None),
    # activations
    "Relu": (F, None),
    "LeakyRelu": (F, None),
    "PRelu": (F, check_prelu),
    "Elu": (F, None),
    "Selu": (F, None),
    "Celu": (F, None),
    "Sigmoid": (F, None),
    "HardSigmoid": (F, None),
    "HardSwish": (F, None),
    "Tanh": (F, None),
    "Softplus": (F, None),
    "Softsign": (F, None),
    "ThresholdedRelu": (F, None),
    "Gelu": (F, None),
    "Clip": (F, check_clip),
    # unary math
    "Abs": (FI, None),
    "Neg": (FI, None),
    "Sign": (FI, None),
    "Exp": (F, None),
    "Log": (F, None),
    "Sqrt": (F, None),
    "Reciprocal": (F, None),
    "Ceil": (F, None),
    "Floor": (F, None),
    "Round": (F, None),
    "Erf": (F, None),
    "Sin": (F, None),
    "Cos": (F, None),
    "Tan": (F, None),
    "Asin": (F, None),
    "Acos": (F, None),
    "Atan": (F, None),
    "Sinh": (F, None),
    "Cosh": (F, None),
    "Asinh": (F, None),
    "Acosh": (F, None),
    "Atanh": (F, None),
    "Not": (B, None),
    "IsNaN": (F | B, None),
    # binary / variadic elementwise
    "Add": (FI, None),
    "Sub": (FI, None),
    "Mul": (FI, None),
    "Div": (FI, None),
    "Pow": (F, None),
    "Max": (FI, None),
    "Min": (FI, None),
    "Sum": (FI, None),
    "Mean": (FI, None),
    "And": (B, None),
    "Or": (B, None),
    "Xor": (B, None),
    "Equal": (FIB, None),
    "Greater": (FIB, None),
    "GreaterOrEqual": (FIB, None),
    "Less": (FIB, None),
    "LessOrEqual": (FIB, None),
    "Where": (FIB, None),
    # reductions (axes must be constants)
    **{op: (F, check_axes_input) for op in (
        "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
    "ArgMax": (F, None),  # output is INT64: rejected by the type check, listed for an honest reason
    "ArgMin": (F, None),
    "CumSum": (F, check_cumsum),
    # data movement
    "Concat": (FIB, None),
    "Flatten": (FIB, None),
    "Reshape": (FIB, check_reshape),
    "Transpose": (FIB, None),
    "Squeeze": (FIB, check_axes_input),
    "Unsqueeze": (FIB, check_axes_input),
    "Slice": (FIB, check_slice),
    "Split": (FIB, check_split),
    "Gather": (FIB, None),
    "GatherElements": (FIB, None),
    "Expand": (FIB, check_expand),
    "Tile": (FIB, check_tile),
    "Pad": (FI, check_pad),
    "DepthToSpace": (FI, None),
    "SpaceToDepth": (FI, None),
    "Identity": (FIB, None),
    "Dropout": (F, None),
    "Cast": (FIB, check_cast),
    "Resize": (F, check_resize),
    "Shape": (FIB, None),  # output is INT64: rejected by the type check (shape math stays on the host)
    "Size": (FIB, None),
}


#: operators TensorRT's ONNX parser refuses: registered so the report says so (rather than "unknown")
NOT_SUPPORTED = frozenset({
    "BitShift", "Compress", "ConcatFromSequence", "ConvInteger", "Det", "DynamicQuantizeLinear", "Hardmax",
    "MatMulInteger", "MaxRoiPool", "MaxUnpool", "MeanVarianceNormalization", "Mod", "Multinomial",
    "NegativeLogLikelihoodLoss", "NonZero", "OneHot", "QLinearConv", "QLinearMatMul", "RandomNormal",
    "RandomNormalLike", "RoiAlign", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
    "SequenceInsert", "SequenceLength", "Shrink", "SoftmaxCrossEntropyLoss", "SplitToSequence",
    "StringNormalizer", "TfIdfVectorizer", "Unique",
})


def host_kernel_available(op_type: str, domain: str = "") -> bool:
    from byoc.kernels import is_supported

    return bool(is_supported(op_type, domain))


def check_node(node: ir.Node, ctx: SupportContext) -> str | None:
    """The full verdict for one node: ``None`` when jetson takes it, else the reason."""
    options: Mapping[str, Any] = ctx.options or {}
    entry = OPERATORS.get(node.op_type) if (node.domain or "") in ("", "ai.onnx") else None
    if entry is None and node.op_type in NOT_SUPPORTED and (node.domain or "") in ("", "ai.onnx"):
        return f"{node.op_type}: not supported by TensorRT's ONNX parser"
    if entry is None:
        return f"{node.op_type}: not supported by TensorRT's ONNX parser"
    allowed, specific = entry
    # inputs first, then the operator's own limits, then what it produces
    reason = _first(_dtype_problem(node, allowed), _shape_problem(node))
    if reason:
        return reason
    if specific is not None:
        reason = specific(node, ctx)
        if reason:
            return reason
    reason = _first(_dtype_problem(node, allowed, outputs=True), _shape_problem(node, outputs=True))
    if reason:
        return reason
    if runtime_path(options) == "emulation" and not host_kernel_available(node.op_type, node.domain or ""):
        return (f"{node.op_type}: TensorRT supports it, but the CPU emulation (no TensorRT/GPU here) has no host "
                "kernel to run it")
    return None


def make_check(op_type: str) -> Check:
    """The check registered for ``op_type`` (the core calls it with ``(node, ctx)``)."""

    def check(node: ir.Node, ctx: SupportContext) -> str | None:
        return check_node(node, ctx)

    check.__name__ = f"check_{op_type}"
    check.__qualname__ = check.__name__
    return check


def is_mac(node: ir.Node) -> bool:
    return node.op_type in MAC_OPS and (node.domain or "") in ("", "ai.onnx")


def node_macs(node: ir.Node) -> int:
    """Multiply-accumulates of one MAC node from static shapes (0 when unknown or not a MAC)."""
    if not is_mac(node):
        return 0

    def dims(v):
        if v is None or v.shape is None:
            return None
        return [d if isinstance(d, int) else 1 for d in v.shape]

    out = dims(node.outputs[0]) if node.outputs else None
    if out is None:
        return 0
    if node.op_type in ("Conv", "ConvTranspose"):
        w = dims(_inp(node, 1))
        if w is None:
            return 0
        if node.op_type == "Conv":
            return int(np.prod(out, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
        x = dims(_inp(node, 0))
        return int(np.prod(x or [0], dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
    a = dims(_inp(node, 0))
    if a is None or not a:
        return 0
    k = a[0] if node.op_type == "Gemm" and int(attr(node, "transA", 0)) else a[-1]
    return int(np.prod(out, dtype=np.int64)) * int(k)


__all__ = ["MAC_OPS", "NOT_SUPPORTED", "OPERATORS", "check_node", "is_mac", "make_check", "node_macs"]
