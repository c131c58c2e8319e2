"""What the ``cpu`` code generator can do with each operator, decided in one place.

:func:`analyze` looks at one node, given functions that return its inputs' static shapes and
constant values, and either returns an :class:`OpInfo` (the node's category, output shapes and
the parameters the lowering needs) or raises :class:`Unsupported` with the reason. The support
checks (:mod:`byoc_cpu.support`) call it on the whole model's nodes, the lowering
(:mod:`byoc_cpu.lower`) on the region body's, so what the partitioner places on ``cpu`` is
exactly what the code generator can compile.

Categories:

``anchor``  Conv, Gemm, MatMul: a BLAS GEMM whose output an elementwise epilogue may follow.
``ew``      elementwise and broadcasting operators: fused into an anchor's epilogue or into one
            loop with their neighbours.
``alias``   Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: a new shape for the same
            buffer, no code at all.
``other``   pooling, Concat, Transpose, Softmax, LRN: one kernel each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from byoc.contract.geometry import auto_pad_mode, window_geometry

FLOAT = ir.DataType.FLOAT

#: unary elementwise ONNX operator -> instruction name (see :mod:`byoc_cpu.emit`)
UNARY = {
    "Relu": "relu", "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Tanh": "tanh",
    "Sigmoid": "sigmoid", "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Reciprocal": "recip",
    "Softplus": "softplus", "Softsign": "softsign", "HardSwish": "hardswish", "LeakyRelu": "leaky",
    "HardSigmoid": "hsig", "Elu": "elu", "Selu": "selu", "Gelu": "gelu", "Clip": "clip",
}
#: binary (or variadic) elementwise operators -> instruction name
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min", "Pow": "pow",
          "PRelu": "prelu", "Sum": "add", "Mean": "add"}
ALIAS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
ANCHOR = {"Conv", "Gemm", "MatMul"}
OTHER = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Concat", "Transpose", "Softmax",
         "LogSoftmax", "LRN"}
#: every operator the target may be offered
OPERATORS = tuple(sorted(set(UNARY) | set(BINARY) | ALIAS | ANCHOR | OTHER | {"BatchNormalization"}))

#: at most this many inputs of a variadic elementwise node (Sum/Mean/Max/Min), and at most this many
#: distinct buffers read by one fused loop: a generated kernel takes two arguments per buffer and
#: Numba's compile time grows much faster than linearly in them (a 300-input Sum took ~47 s); a
#: wider node is declined (the host takes it, linear in its fan-in) and fusion stops at the limit
MAX_FUSED_OPERANDS = 32
#: at most this many nodes in one fused loop (each may add an output buffer)
MAX_FUSED_MEMBERS = 64

#: elementwise operators that end a Conv/Gemm as its activation (the pattern tails)
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "HardSwish", "Sigmoid", "HardSigmoid", "Tanh", "Elu", "Gelu")


class Unsupported(Exception):
    """The node cannot go to ``cpu``; the message is the reason shown in the placement report."""


@dataclass
class OpInfo:
    kind: str  # "anchor" | "ew" | "alias" | "other"
    out_shapes: list[tuple[int, ...]]
    params: dict[str, Any] = field(default_factory=dict)


Shape = tuple[int, ...]
ShapeOf = Callable[[ir.Value | None], "Shape | None"]
ConstOf = Callable[[ir.Value | None], "np.ndarray | None"]


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    a = node.attributes.get(name)
    if a is None:
        return default
    v = a.value
    if isinstance(v, (list, tuple)) or (hasattr(v, "__iter__") and not isinstance(v, (str, bytes))):
        return [x for x in v]
    return v


def _ints(node: ir.Node, name: str, n: int, default: int) -> list[int]:
    v = _attr(node, name)
    if v is None:
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise Unsupported(f"{node.op_type}: attribute {name} has {len(v)} values, expected {n}")
    return v


def broadcast(shapes: list[Shape], op: str) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise Unsupported(f"{op}: shapes {[list(s) for s in shapes]} do not broadcast") from None


class _Attrs:
    """A node as :mod:`byoc.contract.geometry` reads it: its attributes; refusals are Unsupported."""

    def __init__(self, node: ir.Node):
        self.node = node

    def attr(self, name: str, default: Any = None) -> Any:
        return _attr(self.node, name, default)

    def error(self, message: str) -> "Unsupported":
        return Unsupported(f"{self.node.op_type}: {message}")


def window(node: ir.Node, in_sp: list[int], kernel: list[int], strides: list[int], dil: list[int],
           ceil_mode: bool = False) -> tuple[list[int], list[int], list[int]]:
    """Output size and begin/end pads of a 2-D sliding window, per ONNX (auto_pad included)."""
    attrs = _Attrs(node)
    pads = _ints(node, "pads", 4, 0)
    if min(pads) < 0:
        raise Unsupported(f"{node.op_type}: negative padding {pads}")
    out, pb, pe = window_geometry(attrs, in_sp, kernel, strides, dil, pads, auto_pad_mode(attrs), ceil_mode)
    if min(out) <= 0:
        raise Unsupported(f"{node.op_type}: empty output")
    return out, pb, pe


def analyze(node: ir.Node, shape_of: ShapeOf, const_of: ConstOf, opset: int,
            dtype_of: Callable[[ir.Value], Any] | None = None) -> OpInfo:
    """Classify ``node`` and compute its output shapes; :class:`Unsupported` says why not.

    ``shape_of``/``const_of``/``dtype_of`` give a value's static shape (``None`` entries for
    unknown dimensions), constant value and element type, or ``None`` when unknown.
    """
    dtype_of = dtype_of or (lambda v: v.dtype)
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        raise Unsupported(f"{op}: domain {node.domain!r} is not ONNX")
    if op not in OPERATORS:
        raise Unsupported(f"{op}: no cpu code generator for this operator")
    # every tensor the generated code touches is float32 with a static shape and elements (the
    # exceptions are the constant int64 shape/axes operands of Reshape, Squeeze, Unsqueeze and Clip's bounds)
    data_inputs = _data_inputs(node)
    is_data = set(data_inputs)
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        if i in is_data:
            if dtype_of(v) != FLOAT:
                raise Unsupported(f"{op}: input {v.name!r} is {dtype_of(v)}, the cpu target computes float32 only")
            s = shape_of(v)
            if s is None or any(d is None for d in s):
                raise Unsupported(f"{op}: input {v.name!r} has no static shape")
            if 0 in s:
                raise Unsupported(f"{op}: input {v.name!r} is empty ({list(s)}): the host runs zero-size tensors")
    shapes = [shape_of(node.inputs[i]) for i in data_inputs]
    for v in node.outputs[1:]:
        if v.uses() or v.is_graph_output():
            raise Unsupported(f"{op}: only the first output may be used")
    info = _ANALYZERS[_family(op)](node, shapes, const_of, opset)
    for s in info.out_shapes:
        if any(d <= 0 for d in s):
            raise Unsupported(f"{op}: empty output {list(s)}")
    return info


def _data_inputs(node: ir.Node) -> list[int]:
    op = node.op_type
    if op in ("Reshape", "Squeeze", "Unsqueeze", "Dropout"):
        return [0]
    if op == "Clip":
        return [0]
    return [i for i, v in enumerate(node.inputs) if v is not None]


def _family(op: str) -> str:
    if op in UNARY:
        return "unary"
    if op in BINARY:
        return "binary"
    if op in ALIAS:
        return "alias"
    return op


# -- anchors ------------------------------------------------------------------------------


def _conv(node, shapes, const_of, opset) -> OpInfo:
    x, w = shapes[0], shapes[1]
    if len(x) not in (3, 4):
        raise Unsupported("Conv: only 1-D and 2-D convolutions")
    wc = const_of(node.inputs[1])
    if wc is None:
        raise Unsupported("Conv: the weight must be a constant (it is packed at compile time)")
    bias = const_of(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    if len(node.inputs) > 2 and node.inputs[2] is not None and bias is None:
        raise Unsupported("Conv: the bias must be a constant")
    if len(x) == 3:  # (N, C, L) as (N, C, 1, L)
        x, w = (x[0], x[1], 1, x[2]), (w[0], w[1], 1, w[2])
        node_1d = True
    else:
        node_1d = False
    group = int(_attr(node, "group", 1))
    n, c, h, wd = x
    m, cg, kh, kw = w
    if group < 1 or c != cg * group or m % group:
        raise Unsupported(f"Conv: channels do not match (X {list(x)}, W {list(w)}, group {group})")
    nd = 1 if node_1d else 2
    strides = _ints(node, "strides", nd, 1)
    dil = _ints(node, "dilations", nd, 1)
    if node_1d:
        strides, dil = [1] + strides, [1] + dil
        pads = _ints(node, "pads", 2, 0)
        auto_pad = _attr(node, "auto_pad", "NOTSET")
        if (auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)) not in ("NOTSET", ""):
            raise Unsupported("Conv: auto_pad on 1-D convolutions")
        span = wd + pads[0] + pads[1] - ((kw - 1) * dil[1] + 1)
        if span < 0:
            raise Unsupported("Conv: the kernel is larger than the padded input")
        out_sp, pb, pe = [1, span // strides[1] + 1], [0, pads[0]], [0, pads[1]]
    else:
        out_sp, pb, pe = window(node, [h, wd], [kh, kw], strides, dil)
    ks = _attr(node, "kernel_shape")
    if ks is not None and [int(k) for k in ks] != ([kw] if node_1d else [kh, kw]):
        raise Unsupported("Conv: kernel_shape differs from the weight shape")
    if min(strides + dil) < 1:
        raise Unsupported("Conv: strides and dilations must be >= 1")
    oh, ow = out_sp
    out = (n, m, ow) if node_1d else (n, m, oh, ow)
    return OpInfo("anchor", [out], dict(
        n=n, c=c, h=h, w=wd, m=m, cg=cg, kh=kh, kw=kw, sh=strides[0], sw=strides[1], dh=dil[0], dw=dil[1],
        pt=pb[0], pl=pb[1], pb=pe[0], pr=pe[1], oh=oh, ow=ow, group=group, weight=wc, bias=bias))


def _gemm(node, shapes, const_of, opset) -> OpInfo:
    a, b = shapes[0], shapes[1]
    if len(a) != 2 or len(b) != 2:
        raise Unsupported("Gemm: A and B must be 2-D")
    ta, tb = bool(_attr(node, "transA", 0)), bool(_attr(node, "transB", 0))
    m, k = (a[1], a[0]) if ta else a
    k2, n = (b[1], b[0]) if tb else b
    if k != k2:
        raise Unsupported(f"Gemm: inner dimensions differ ({list(a)} x {list(b)})")
    alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
    c = None
    if len(node.inputs) > 2 and node.inputs[2] is not None and beta != 0.0:
        broadcast([shapes[2], (m, n)], "Gemm")
        if broadcast([shapes[2], (m, n)], "Gemm") != (m, n):
            raise Unsupported("Gemm: C does not broadcast to the output")
        c = node.inputs[2]
    return OpInfo("anchor", [(m, n)], dict(m=m, n=n, k=k, ta=ta, tb=tb, alpha=alpha, beta=beta, c=c,
                                          b_const=const_of(node.inputs[1])))


def _matmul(node, shapes, const_of, opset) -> OpInfo:
    a, b = shapes[0], shapes[1]
    if len(a) < 2 or len(b) < 2:
        raise Unsupported("MatMul: 1-D operands are not supported")
    if a[-1] != b[-2]:
        raise Unsupported(f"MatMul: inner dimensions differ ({list(a)} x {list(b)})")
    bc = const_of(node.inputs[1])
    if len(b) == 2:
        batch = a[:-2]
    elif a[:-2] == b[:-2]:
        batch = a[:-2]
    else:
        raise Unsupported("MatMul: batch dimensions must be equal (or B 2-D)")
    out = tuple(batch) + (a[-2], b[-1])
    return OpInfo("anchor", [out], dict(batch=int(np.prod(batch, dtype=np.int64)), m=a[-2], k=a[-1], n=b[-1],
                                        b2d=len(b) == 2, b_const=bc))


# -- elementwise --------------------------------------------------------------------------


def _scalar(v, what: str) -> float | None:
    if v is None:
        return None
    if v.size != 1:
        raise Unsupported(f"{what} must be a scalar")
    return float(np.asarray(v).reshape(-1)[0])


def _unary(node, shapes, const_of, opset) -> OpInfo:
    op = node.op_type
    params: dict[str, Any] = {}
    if op == "LeakyRelu":
        params["alpha"] = float(_attr(node, "alpha", 0.01))
    elif op == "HardSigmoid":
        params["alpha"], params["beta"] = float(_attr(node, "alpha", 0.2)), float(_attr(node, "beta", 0.5))
    elif op == "Elu":
        params["alpha"] = float(_attr(node, "alpha", 1.0))
    elif op == "Selu":
        params["alpha"] = float(_attr(node, "alpha", 1.6732632423543772848170429916717))
        params["gamma"] = float(_attr(node, "gamma", 1.0507009873554804934193349852946))
    elif op == "Gelu":
        approx = _attr(node, "approximate", "none")
        approx = approx.decode() if isinstance(approx, bytes) else str(approx)
        if approx not in ("none", "tanh"):
            raise Unsupported(f"Gelu: approximate={approx!r}")
        params["tanh"] = approx == "tanh"
    elif op == "Clip":
        if opset < 11:
            lo, hi = _attr(node, "min"), _attr(node, "max")
        else:
            lo = hi = None
            for i, name in ((1, "min"), (2, "max")):
                if len(node.inputs) > i and node.inputs[i] is not None:
                    c = const_of(node.inputs[i])
                    if c is None:
                        raise Unsupported(f"Clip: {name} must be a constant")
                    if i == 1:
                        lo = _scalar(c, "Clip min")
                    else:
                        hi = _scalar(c, "Clip max")
        params["lo"] = None if lo is None else float(lo)
        params["hi"] = None if hi is None else float(hi)
    return OpInfo("ew", [shapes[0]], params)


def _binary(node, shapes, const_of, opset) -> OpInfo:
    op = node.op_type
    if op in ("Sum", "Mean", "Max", "Min"):
        if len(shapes) < 1:
            raise Unsupported(f"{op}: no inputs")
        if len(shapes) > MAX_FUSED_OPERANDS:
            raise Unsupported(f"{op}: {len(shapes)} inputs, more than the {MAX_FUSED_OPERANDS} one generated loop "
                              "takes (the host runs it)")
    elif len(shapes) != 2:
        raise Unsupported(f"{op}: expected 2 inputs")
    out = broadcast(shapes, op)
    if op == "PRelu" and broadcast([shapes[1], shapes[0]], op) != tuple(shapes[0]):
        raise Unsupported("PRelu: the slope must broadcast to X")
    return OpInfo("ew", [out], {})


def _batchnorm(node, shapes, const_of, opset) -> OpInfo:
    if len(node.inputs) != 5 or len(node.outputs) > 1 and any(v.uses() for v in node.outputs[1:]):
        raise Unsupported("BatchNormalization: inference form only (one output)")
    if int(_attr(node, "training_mode", 0)):
        raise Unsupported("BatchNormalization: training_mode")
    x = shapes[0]
    if len(x) < 2:
        raise Unsupported("BatchNormalization: input rank < 2")
    consts = [const_of(v) for v in node.inputs[1:]]
    if any(c is None for c in consts):
        raise Unsupported("BatchNormalization: scale, bias, mean and variance must be constants")
    if any(c.shape != (x[1],) for c in consts):
        raise Unsupported("BatchNormalization: parameters must have shape [C]")
    scale, bias, mean, var = (c.astype(np.float64) for c in consts)
    eps = float(_attr(node, "epsilon", 1e-5))
    s = scale / np.sqrt(var + eps)
    t = bias - mean * s
    return OpInfo("ew", [x], dict(scale=s.astype(np.float32), shift=t.astype(np.float32)))


# -- aliases ------------------------------------------------------------------------------


def _alias(node, shapes, const_of, opset) -> OpInfo:
    op = node.op_type
    x = shapes[0]
    size = int(np.prod(x, dtype=np.int64))
    if op in ("Identity", "Dropout"):
        if op == "Dropout" and (len(node.inputs) > 2 and node.inputs[2] is not None):
            t = const_of(node.inputs[2])
            if t is None or bool(np.asarray(t).reshape(-1)[0]):
                raise Unsupported("Dropout: training mode")
        return OpInfo("alias", [x])
    if op == "Flatten":
        axis = int(_attr(node, "axis", 1))
        axis = axis + len(x) if axis < 0 else axis
        if not 0 <= axis <= len(x):
            raise Unsupported("Flatten: axis out of range")
        outer = int(np.prod(x[:axis], dtype=np.int64))
        return OpInfo("alias", [(outer, size // outer if outer else 0)])
    if op == "Reshape":
        shape = const_of(node.inputs[1]) if len(node.inputs) > 1 else None
        if shape is None:
            raise Unsupported("Reshape: the shape must be a constant")
        allowzero = int(_attr(node, "allowzero", 0))
        dims = [int(d) for d in np.asarray(shape).reshape(-1)]
        out = []
        for i, d in enumerate(dims):
            if d == 0 and not allowzero:
                if i >= len(x):
                    raise Unsupported("Reshape: 0 refers past the input rank")
                d = x[i]
            out.append(d)
        if out.count(-1) > 1:
            raise Unsupported("Reshape: more than one -1")
        if -1 in out:
            known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
            if known == 0 or size % known:
                raise Unsupported("Reshape: cannot infer the -1 dimension")
            out[out.index(-1)] = size // known
        if int(np.prod(out, dtype=np.int64)) != size or any(d < 0 for d in out):
            raise Unsupported(f"Reshape: {list(x)} cannot become {dims}")
        return OpInfo("alias", [tuple(out)])
    # Squeeze / Unsqueeze: axes from the attribute (opset < 13) or a constant input
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes_c = const_of(node.inputs[1])
        if axes_c is None:
            raise Unsupported(f"{op}: axes must be a constant")
        axes = [int(a) for a in np.asarray(axes_c).reshape(-1)]
    else:
        axes = _attr(node, "axes")
        axes = None if axes is None else [int(a) for a in axes]
    if op == "Squeeze":
        if axes is None:
            out = tuple(d for d in x if d != 1)
        else:
            axes = sorted(a + len(x) if a < 0 else a for a in axes)
            if any(not 0 <= a < len(x) or x[a] != 1 for a in axes):
                raise Unsupported("Squeeze: axes must name dimensions of size 1")
            out = tuple(d for i, d in enumerate(x) if i not in axes)
        return OpInfo("alias", [out])
    if axes is None:
        raise Unsupported("Unsqueeze: axes missing")
    rank = len(x) + len(axes)
    axes = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < rank for a in axes):
        raise Unsupported("Unsqueeze: bad axes")
    it = iter(x)
    out = tuple(1 if i in axes else next(it) for i in range(rank))
    return OpInfo("alias", [out])


# -- others -------------------------------------------------------------------------------


def _pool(node, shapes, const_of, opset) -> OpInfo:
    op = node.op_type
    x = shapes[0]
    if len(x) != 4:
        raise Unsupported(f"{op}: only 2-D pooling (4-D input)")
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        raise Unsupported("MaxPool: the Indices output is not supported")
    if op == "MaxPool" and int(_attr(node, "storage_order", 0)):
        raise Unsupported("MaxPool: storage_order=1")
    k = _ints(node, "kernel_shape", 2, 0)
    if min(k) < 1:
        raise Unsupported(f"{op}: kernel_shape missing")
    strides = _ints(node, "strides", 2, 1)
    dil = _ints(node, "dilations", 2, 1)
    if op == "AveragePool" and dil != [1, 1]:
        raise Unsupported("AveragePool: dilations")
    ceil_mode = bool(_attr(node, "ceil_mode", 0))
    out_sp, pb, pe = window(node, list(x[2:]), k, strides, dil, ceil_mode)
    return OpInfo("other", [(x[0], x[1], out_sp[0], out_sp[1])], dict(
        kh=k[0], kw=k[1], sh=strides[0], sw=strides[1], dh=dil[0], dw=dil[1], pt=pb[0], pl=pb[1], pb=pe[0],
        pr=pe[1], oh=out_sp[0], ow=out_sp[1], include_pad=bool(_attr(node, "count_include_pad", 0))))


def _global_pool(node, shapes, const_of, opset) -> OpInfo:
    x = shapes[0]
    if len(x) < 3:
        raise Unsupported(f"{node.op_type}: input rank < 3")
    return OpInfo("other", [tuple(x[:2]) + (1,) * (len(x) - 2)])


def _concat(node, shapes, const_of, opset) -> OpInfo:
    axis = int(_attr(node, "axis", 0))
    rank = len(shapes[0])
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(len(s) != rank for s in shapes):
        raise Unsupported("Concat: bad axis or ranks")
    for s in shapes:
        if s[:axis] != shapes[0][:axis] or s[axis + 1:] != shapes[0][axis + 1:]:
            raise Unsupported("Concat: shapes differ off the axis")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return OpInfo("other", [tuple(out)], dict(axis=axis))


def _transpose(node, shapes, const_of, opset) -> OpInfo:
    x = shapes[0]
    perm = _attr(node, "perm")
    perm = list(range(len(x)))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(len(x))):
        raise Unsupported("Transpose: perm is not a permutation")
    return OpInfo("other", [tuple(x[p] for p in perm)], dict(perm=perm))


def _softmax(node, shapes, const_of, opset) -> OpInfo:
    x = shapes[0]
    axis = int(_attr(node, "axis", -1 if opset >= 13 else 1))
    axis = axis + len(x) if axis < 0 else axis
    if not 0 <= axis < len(x):
        raise Unsupported(f"{node.op_type}: axis out of range")
    if opset >= 13:
        if axis != len(x) - 1:
            raise Unsupported(f"{node.op_type}: only the last axis")
        cols = x[-1]
    else:  # opset < 13: the input is coerced to 2-D at axis
        cols = int(np.prod(x[axis:], dtype=np.int64))
    rows = int(np.prod(x, dtype=np.int64)) // cols
    return OpInfo("other", [x], dict(rows=rows, cols=cols, log=node.op_type == "LogSoftmax"))


def _lrn(node, shapes, const_of, opset) -> OpInfo:
    x = shapes[0]
    if len(x) < 3:
        raise Unsupported("LRN: input rank < 3")
    size = int(_attr(node, "size", 0))
    if size < 1:
        raise Unsupported("LRN: size must be >= 1")
    return OpInfo("other", [x], dict(size=size, alpha=float(_attr(node, "alpha", 1e-4)),
                                     beta=float(_attr(node, "beta", 0.75)), bias=float(_attr(node, "bias", 1.0))))


_ANALYZERS = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "unary": _unary, "binary": _binary,
    "BatchNormalization": _batchnorm, "alias": _alias, "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool, "Concat": _concat,
    "Transpose": _transpose, "Softmax": _softmax, "LogSoftmax": _softmax, "LRN": _lrn,
}


def macs(node: ir.Node, info: OpInfo) -> int:
    """Multiply-accumulates of an anchor (for the cost hook and the region rule)."""
    p = info.params
    if node.op_type == "Conv":
        return p["n"] * p["m"] * p["oh"] * p["ow"] * p["cg"] * p["kh"] * p["kw"]
    if node.op_type == "Gemm":
        return p["m"] * p["n"] * p["k"]
    if node.op_type == "MatMul":
        return p["batch"] * p["m"] * p["n"] * p["k"]
    return 0

