"""Random, valid instances of ONNX operators (and graphs of them) for conformance checks.

:func:`op_cases` is a Hypothesis strategy of :class:`OpCase` for one operator type: inputs of
consistent shapes and valid dtypes, and a valid attribute combination (kernel, stride, pad,
dilation, group, auto_pad; broadcasting shapes; axes; modes). Every instance is one the ONNX
specification allows and byoc's host kernels run, so a target that rejects it does so on
purpose (its support check names the reason) and a target that accepts it must compute it.

``op_cases(op, zero_dims=p)``: a share ``p`` of the instances has a 0 in some dimension where
ONNX allows one (batch, channels, K of a product, reduced axes, empty index lists).

:class:`GraphCase` is the common form the kit checks: ONNX nodes, graph inputs with their
values, initializers, outputs. :meth:`OpCase.graph` makes one; :mod:`byoc.testing.patterns`
makes one from a composite pattern.

Constraints (:class:`Slots`) let the pattern synthesiser ask for an instance whose input ``i``
has a given shape/dtype (it is fed by another node), is present or absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper, numpy_helper

from byoc.testing import strategies as bst

#: the opset every case is written in (byoc's canonical opset)
OPSET = 21

F32 = ("float32",)
F32_INT = ("float32", "int32", "int64")


# -- the case objects ----------------------------------------------------------------------------


def _json_value(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else str(f)
    return v


def _array_json(a: np.ndarray, limit: int = 64) -> dict[str, Any]:
    out: dict[str, Any] = {"dtype": str(a.dtype), "shape": list(a.shape)}
    if a.size <= limit:
        out["values"] = _json_value(a.tolist())
    return out


def _array_text(a: np.ndarray, limit: int = 16) -> str:
    head = f"{a.dtype}{list(a.shape)}"
    if a.size <= limit:
        vals = np.array2string(a.reshape(-1), separator=", ", max_line_width=10_000, threshold=limit)
        return f"{head} = {vals}"
    return head


@dataclass
class GraphCase:
    """A small model to check: ONNX nodes, fed graph inputs, initializers, outputs."""

    label: str
    nodes: list[onnx.NodeProto]
    feeds: dict[str, np.ndarray]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    opset: int = OPSET

    def model(self) -> onnx.ModelProto:
        """The model, with shapes inferred (``onnx.shape_inference``)."""
        graph = helper.make_graph(
            list(self.nodes),
            self.label.replace(".", "_"),
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
             for n, a in self.feeds.items()],
            [helper.make_value_info(o, onnx.TypeProto()) for o in self.outputs],
            [numpy_helper.from_array(np.asarray(a), n) for n, a in self.initializers.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)

    def node_text(self, node: onnx.NodeProto) -> str:
        attrs = {a.name: _json_value(helper.get_attribute_value(a)) for a in node.attribute}
        ins = []
        for name in node.input:
            if not name:
                ins.append("-")
            elif name in self.initializers:
                ins.append(f"{name}: const {_array_text(self.initializers[name])}")
            elif name in self.feeds:
                ins.append(f"{name}: {_array_text(self.feeds[name])}")
            else:
                ins.append(name)
        attr_text = ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()))
        return f"{node.op_type}({'; '.join(ins)}){' {' + attr_text + '}' if attr_text else ''} -> {', '.join(node.output)}"

    def describe(self) -> str:
        """A human-readable, reproducible description (shapes, attributes, small values)."""
        return "\n".join(self.node_text(n) for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "opset": self.opset,
            "nodes": [
                {"op_type": n.op_type, "name": n.name, "inputs": list(n.input), "outputs": list(n.output),
                 "attributes": {a.name: _json_value(helper.get_attribute_value(a)) for a in n.attribute}}
                for n in self.nodes
            ],
            "inputs": {k: _array_json(v) for k, v in self.feeds.items()},
            "initializers": {k: _array_json(v) for k, v in self.initializers.items()},
            "outputs": list(self.outputs),
        }


@dataclass
class OpCase:
    """One instance of one operator: an array (or ``None``) per input slot, attributes, constants."""

    op_type: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: input slots bound as initializers (the rest are graph inputs)
    const: frozenset[int] = frozenset()
    n_outputs: int = 1
    opset: int = OPSET

    def graph(self, prefix: str = "", node_name: str | None = None) -> GraphCase:
        """This case as a one-node :class:`GraphCase` (inputs ``in0..``, outputs ``out0..``)."""
        names, feeds, inits = [], {}, {}
        for i, arr in enumerate(self.inputs):
            if arr is None:
                names.append("")
                continue
            name = f"{prefix}in{i}"
            names.append(name)
            (inits if i in self.const else feeds)[name] = np.asarray(arr)
        while names and names[-1] == "":
            names.pop()
        outs = [f"{prefix}out{i}" for i in range(self.n_outputs)]
        node = helper.make_node(self.op_type, names, outs, name=node_name or f"{prefix}{self.op_type.lower()}_0",
                                **self.attrs)
        return GraphCase(self.op_type, [node], feeds, inits, outs, self.opset)

    def describe(self) -> str:
        return self.graph().describe()


# -- constraints from the pattern synthesiser --------------------------------------------------


@dataclass(frozen=True)
class Slots:
    """What a caller needs from an instance's input slots.

    ``fixed``: slot -> (shape, dtype name) of a value another node produces; ``present`` and
    ``absent``: optional slots that must (not) be given; ``zero``: a 0 in some dimension of the
    drawn (not fixed) shapes, where ONNX allows one. Generators honour what they can; the
    synthesiser rejects instances that do not satisfy the rest.
    """

    fixed: Mapping[int, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    present: frozenset[int] = frozenset()
    absent: frozenset[int] = frozenset()
    zero: bool = False

    def satisfied_by(self, case: OpCase) -> bool:
        for i, (shape, dtype) in self.fixed.items():
            arr = case.inputs[i] if i < len(case.inputs) else None
            if arr is None or tuple(arr.shape) != tuple(shape) or str(arr.dtype) != dtype:
                return False
        for i in self.present:
            if i >= len(case.inputs) or case.inputs[i] is None:
                return False
        return all(i >= len(case.inputs) or case.inputs[i] is None for i in self.absent)


NO_SLOTS = Slots()


def _shape(draw, slots: Slots, i: int, default: st.SearchStrategy) -> tuple[int, ...]:
    if i in slots.fixed:
        return tuple(slots.fixed[i][0])
    shape = tuple(draw(default))
    return _zero(draw, slots, shape or (1,)) if slots.zero else shape


def _zero(draw, slots: Slots, shape: Sequence[int], axes: Sequence[int] | None = None) -> tuple[int, ...]:
    """``shape`` with one of ``axes`` (default: all) set to 0 when ``slots.zero``."""
    return tuple(draw(bst.zero_side(shape, axes))) if slots.zero else tuple(shape)


def _dtype(draw, slots: Slots, i: int, choices: Sequence[str]) -> str:
    if i in slots.fixed:
        dt = slots.fixed[i][1]
        assume(dt in choices)
        return dt
    return draw(st.sampled_from(list(choices)))


def _opt(draw, slots: Slots, i: int) -> bool:
    """Whether optional slot ``i`` is given."""
    if i in slots.absent:
        return False
    if i in slots.present or i in slots.fixed:
        return True
    return draw(st.booleans())


def _t(draw, dtype: str, shape, lo: float = -4.0, hi: float = 4.0, grid: bool = False) -> np.ndarray:
    return draw(bst.seeded_tensors(dtype, tuple(shape), lo=lo, hi=hi, grid=grid))


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


Generator = Callable[..., OpCase]

#: op_type -> generator ``gen(draw, slots) -> OpCase``
GENERATORS: dict[str, Generator] = {}


def _register(*op_types: str):
    def deco(fn):
        for op in op_types:
            GENERATORS[op] = fn
        return fn
    return deco


# -- elementwise -------------------------------------------------------------------------------

#: op -> (value range, dtypes, grid values, attribute strategy)
_UNARY: dict[str, tuple[tuple[float, float], Sequence[str], bool, Callable[..., dict] | None]] = {}


def _unary(op: str, lo: float = -4.0, hi: float = 4.0, dtypes: Sequence[str] = F32, grid: bool = False,
           attrs: Callable[..., dict] | None = None) -> None:
    _UNARY[op] = ((lo, hi), dtypes, grid, attrs)


_FI = ("float32", "int32", "int64")
for _op in ("Relu", "Sigmoid", "Tanh", "Erf", "Softsign", "Softplus", "Asinh", "Atan", "HardSwish", "Mish"):
    _unary(_op)
_unary("Abs", dtypes=_FI)
_unary("Neg", dtypes=_FI)
_unary("Identity", dtypes=("float32", "int64", "bool"))
_unary("Exp")
_unary("Sin", -3, 3)
_unary("Cos", -3, 3)
_unary("Tan", -1.2, 1.2)
_unary("Sinh", -3, 3)
_unary("Cosh", -3, 3)
_unary("Asin", -0.95, 0.95)
_unary("Acos", -0.95, 0.95)
_unary("Atanh", -0.9, 0.9)
_unary("Acosh", 1.1, 4)
_unary("Log", 0.1, 4)
_unary("Sqrt", 0, 4)
# discontinuous: drawn from a grid exact in float16, never at a jump
for _op in ("Ceil", "Floor", "Round"):
    _unary(_op, grid=True)
_unary("Sign", dtypes=("float32", "int32", "int64"), grid=True)
_unary("LeakyRelu", attrs=lambda d: {"alpha": d(st.sampled_from([0.01, 0.1, 0.2, 0.5, 1.5]))})
_unary("Elu", attrs=lambda d: {"alpha": d(st.sampled_from([0.5, 1.0, 1.5]))})
_unary("Celu", attrs=lambda d: {"alpha": d(st.sampled_from([0.5, 1.0, 2.0]))})
_unary("Selu", attrs=lambda d: d(st.sampled_from([{}, {"alpha": 1.5, "gamma": 1.1}])))
# (1/6, 0.5) is PyTorch's hardsigmoid
_unary("HardSigmoid", attrs=lambda d: d(st.sampled_from([{"alpha": 0.2, "beta": 0.5}, {"alpha": 1 / 6, "beta": 0.5},
                                                         {"alpha": 0.5, "beta": 0.3}])))
_unary("ThresholdedRelu", grid=True, attrs=lambda d: {"alpha": d(st.sampled_from([0.0, 0.5, 1.0, 1.5]))})
_unary("Shrink", grid=True, attrs=lambda d: {"lambd": d(st.sampled_from([0.0, 0.5, 1.0])),
                                             "bias": d(st.sampled_from([0.0, 0.5, 1.5]))})
_unary("Gelu", attrs=lambda d: d(st.sampled_from([{}, {"approximate": "tanh"}])))


def _unary_gen(op: str) -> Generator:
    (lo, hi), dtypes, grid, attrs = _UNARY[op]

    def gen(draw, slots: Slots = NO_SLOTS) -> OpCase:
        dt = _dtype(draw, slots, 0, dtypes)
        shape = _shape(draw, slots, 0, bst.shapes(0, 4))
        x = _t(draw, dt, shape, lo, hi, grid=grid or dt not in bst.FLOATS)
        return OpCase(op, [x], attrs(draw) if attrs else {})

    return gen


for _op in _UNARY:
    GENERATORS[_op] = _unary_gen(_op)


@_register("Reciprocal")
def _reciprocal(draw, slots: Slots = NO_SLOTS) -> OpCase:
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    _dtype(draw, slots, 0, F32)
    mag = _t(draw, "float32", shape, 0.25, 4.0)
    sign = np.where(_t(draw, "bool", shape), -1.0, 1.0).astype(np.float32)
    return OpCase("Reciprocal", [mag * sign])


@_register("Not")
def _not(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, ("bool",))
    return OpCase("Not", [_t(draw, "bool", _shape(draw, slots, 0, bst.shapes(0, 4)))])


@_register("IsNaN")
def _isnan(draw, slots: Slots = NO_SLOTS) -> OpCase:
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    _dtype(draw, slots, 0, F32)
    special = st.sampled_from([np.nan, np.inf, -np.inf])
    elems = st.one_of(bst.elements("float32"), special)
    x = draw(bst.tensors("float32", shape, elements_strategy=elems))
    return OpCase("IsNaN", [x])


@_register("IsInf")
def _isinf(draw, slots: Slots = NO_SLOTS) -> OpCase:
    case = _isnan(draw, slots)
    attrs = draw(st.sampled_from([{}, {"detect_negative": 0}, {"detect_positive": 0}]))
    return replace(case, op_type="IsInf", attrs=attrs)


def _pair_shapes(draw, slots: Slots) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if 0 in slots.fixed and 1 in slots.fixed:
        return tuple(slots.fixed[0][0]), tuple(slots.fixed[1][0])
    if 1 in slots.fixed:
        b = tuple(slots.fixed[1][0])
        return draw(bst.broadcast_shape_to(b)), b
    a = _shape(draw, slots, 0, bst.shapes(0, 4))
    if draw(st.booleans()):
        return a, a  # equal shapes: what most accelerators' elementwise units take
    b = draw(bst.broadcast_shape_to(a))
    if 0 not in slots.fixed and draw(st.booleans()):
        a, b = b, a
    return a, b


def _pair_dtype(draw, slots: Slots, dtypes: Sequence[str]) -> str:
    fixed = {slots.fixed[i][1] for i in (0, 1) if i in slots.fixed}
    assume(len(fixed) <= 1 and fixed <= set(dtypes))
    return fixed.pop() if fixed else draw(st.sampled_from(list(dtypes)))


def _binary_gen(op: str, dtypes: Sequence[str], lo: float = -4.0, hi: float = 4.0, grid: bool = False,
                rhs: Callable[..., np.ndarray] | None = None, lhs_range: tuple[float, float] | None = None,
                attrs: Callable[..., dict] | None = None) -> Generator:
    def gen(draw, slots: Slots = NO_SLOTS) -> OpCase:
        dt = _pair_dtype(draw, slots, dtypes)
        a_shape, b_shape = _pair_shapes(draw, slots)
        g = grid or dt not in bst.FLOATS
        a = _t(draw, dt, a_shape, *(lhs_range or (lo, hi)), grid=g)
        b = rhs(draw, dt, b_shape) if rhs is not None else _t(draw, dt, b_shape, lo, hi, grid=g)
        const = frozenset({1}) if 1 not in slots.fixed and draw(st.integers(0, 3)) == 0 else frozenset()
        return OpCase(op, [a, b], attrs(draw) if attrs else {}, const=const)

    return gen


def _nonzero(draw, dt: str, shape) -> np.ndarray:
    if dt in bst.FLOATS:
        mag = _t(draw, dt, shape, 0.25, 4.0)
    else:
        mag = _t(draw, dt, shape, 1, 4)
    sign = np.where(_t(draw, "bool", shape), -1, 1).astype(mag.dtype)
    return mag * sign


for _op in ("Add", "Sub", "Mul"):
    GENERATORS[_op] = _binary_gen(_op, _FI)
GENERATORS["Div"] = _binary_gen("Div", F32, rhs=_nonzero)
GENERATORS["Pow"] = _binary_gen("Pow", F32, lo=-2.0, hi=2.0, lhs_range=(0.1, 3.0))
GENERATORS["Mod"] = _binary_gen("Mod", ("int32", "int64"), rhs=_nonzero)
for _op in ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"):
    GENERATORS[_op] = _binary_gen(_op, _FI, grid=True)
for _op in ("And", "Or", "Xor"):
    GENERATORS[_op] = _binary_gen(_op, ("bool",))
for _op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    GENERATORS[_op] = _binary_gen(_op, ("int32", "uint8", "int64"), lo=0, hi=200)
GENERATORS["BitShift"] = _binary_gen("BitShift", ("uint8", "uint32"), lo=0, hi=7,
                                     attrs=lambda d: {"direction": d(st.sampled_from(["LEFT", "RIGHT"]))})


@_register("BitwiseNot")
def _bitwise_not(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("int32", "uint8"))
    return OpCase("BitwiseNot", [_t(draw, dt, _shape(draw, slots, 0, bst.shapes(0, 4)), 0, 200)])


def _variadic_gen(op: str, dtypes: Sequence[str]) -> Generator:
    def gen(draw, slots: Slots = NO_SLOTS) -> OpCase:
        n = max(draw(st.integers(1, 3)), max(slots.fixed, default=-1) + 1)
        fixed = {slots.fixed[i][1] for i in slots.fixed}
        assume(len(fixed) <= 1 and fixed <= set(dtypes))
        dt = fixed.pop() if fixed else draw(st.sampled_from(list(dtypes)))
        base = next((tuple(slots.fixed[i][0]) for i in sorted(slots.fixed)), None)
        if base is None:
            base = _shape(draw, slots, 0, bst.shapes(0, 3))
        shapes_ = [tuple(slots.fixed[i][0]) if i in slots.fixed else draw(bst.broadcast_shape_to(base))
                   for i in range(n)]
        try:
            bst.broadcast(*shapes_)
        except ValueError:
            assume(False)
        return OpCase(op, [_t(draw, dt, s, grid=dt not in bst.FLOATS) for s in shapes_])

    return gen


GENERATORS["Sum"] = _variadic_gen("Sum", F32)
GENERATORS["Mean"] = _variadic_gen("Mean", F32)
GENERATORS["Max"] = _variadic_gen("Max", _FI)
GENERATORS["Min"] = _variadic_gen("Min", _FI)


@_register("Where")
def _where(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _pair_dtype(draw, Slots({i - 1: slots.fixed[i] for i in (1, 2) if i in slots.fixed}), ("float32", "int64"))
    base = _shape(draw, slots, 1, bst.shapes(0, 3))
    c_shape = draw(bst.broadcast_shape_to(base))
    y_shape = _shape(draw, slots, 2, bst.broadcast_shape_to(base))
    try:
        bst.broadcast(base, c_shape, y_shape)
    except ValueError:
        assume(False)
    cond = _t(draw, "bool", c_shape)
    return OpCase("Where", [cond, _t(draw, dt, base, grid=dt != "float32"), _t(draw, dt, y_shape, grid=dt != "float32")])


@_register("PRelu")
def _prelu(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _shape(draw, slots, 0, bst.shapes(1, 4))
    slope_shape = draw(bst.unidirectional_shape_to(x_shape))
    const = frozenset({1}) if draw(st.integers(0, 3)) else frozenset()
    return OpCase("PRelu", [_t(draw, "float32", x_shape), _t(draw, "float32", slope_shape, -1, 1)], const=const)


@_register("Clip")
def _clip(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int32"))
    x = _t(draw, dt, _shape(draw, slots, 0, bst.shapes(0, 4)), grid=dt != "float32")
    # ReLU6 (0, 6) first: the bounds accelerators fuse
    lo_v, hi_v = draw(st.sampled_from([(0.0, 6.0), (-1.0, 1.0), (0.0, 1.0), (-4.0, 0.5), (-0.5, 6.0)]))
    lo = np.asarray(lo_v, dtype=dt) if _opt(draw, slots, 1) else None
    hi = np.asarray(hi_v, dtype=dt) if _opt(draw, slots, 2) else None
    return OpCase("Clip", [x, lo, hi], const=frozenset({1, 2}))


_CAST_TO = {
    "float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16, "float64": onnx.TensorProto.DOUBLE,
    "int32": onnx.TensorProto.INT32, "int64": onnx.TensorProto.INT64, "int8": onnx.TensorProto.INT8,
    "uint8": onnx.TensorProto.UINT8, "bool": onnx.TensorProto.BOOL,
}


@_register("Cast")
def _cast(draw, slots: Slots = NO_SLOTS) -> OpCase:
    src = _dtype(draw, slots, 0, ("float32", "int32", "int64", "bool"))
    to = draw(st.sampled_from(sorted(_CAST_TO)))
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    if src == "float32" and to in bst.INTS:
        # whole numbers in range: casting a fraction or an out-of-range value is implementation-defined
        x = _t(draw, "int32", shape, 0, 100).astype(np.float32)
    elif src in bst.INTS and to in bst.INTS:
        x = _t(draw, src, shape, 0, 100)
    else:
        x = _t(draw, src, shape)
    return OpCase("Cast", [x], {"to": _CAST_TO[to]})


# -- softmax family ------------------------------------------------------------------------------


def _softmax_gen(op: str) -> Generator:
    def gen(draw, slots: Slots = NO_SLOTS) -> OpCase:
        _dtype(draw, slots, 0, F32)
        shape = _shape(draw, slots, 0, bst.shapes(1, 4))
        assume(len(shape) >= 1)
        x = _t(draw, "float32", shape, grid=op == "Hardmax")
        return OpCase(op, [x], {"axis": draw(bst.axis(len(shape)))})

    return gen


for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    GENERATORS[_op] = _softmax_gen(_op)


# -- reductions ------------------------------------------------------------------------------------

_REDUCE_RANGE = {"ReduceProd": (-1.5, 1.5), "ReduceLogSum": (0.1, 4.0)}
_REDUCE_INT = ("ReduceSum", "ReduceMax", "ReduceMin")


def _reduce_gen(op: str) -> Generator:
    def gen(draw, slots: Slots = NO_SLOTS) -> OpCase:
        dt = _dtype(draw, slots, 0, ("float32", "int32") if op in _REDUCE_INT else F32)
        shape = _shape(draw, slots, 0, bst.shapes(1, 4))
        assume(len(shape) >= 1)
        x = _t(draw, dt, shape, *_REDUCE_RANGE.get(op, (-4.0, 4.0)), grid=dt != "float32")
        attrs = {"keepdims": draw(st.integers(0, 1))}
        ax = None
        if _opt(draw, slots, 1):
            ax = _i64(draw(bst.axes(len(shape))))
        return OpCase(op, [x, ax], attrs, const=frozenset({1}))

    return gen


for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    GENERATORS[_op] = _reduce_gen(_op)


@_register("ArgMax", "ArgMin")
def _argmax(draw, slots: Slots = NO_SLOTS, op: str = "ArgMax") -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int32"))
    shape = _shape(draw, replace(slots, zero=False), 0, bst.shapes(1 + slots.zero, 4))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape))) if slots.zero else None
    if slots.zero:  # never along the axis: there is no index of a maximum of nothing
        shape = _zero(draw, slots, shape, [i for i in range(len(shape)) if i != ax % len(shape)])
    x = _t(draw, dt, shape, grid=True)
    attrs = {"axis": draw(bst.axis(len(shape))) if ax is None else ax, "keepdims": draw(st.integers(0, 1)),
             "select_last_index": draw(st.integers(0, 1))}
    return OpCase(op, [x], attrs)


GENERATORS["ArgMin"] = lambda draw, slots=NO_SLOTS: _argmax(draw, slots, "ArgMin")


@_register("CumSum")
def _cumsum(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int32", "int64"))
    shape = _shape(draw, slots, 0, bst.shapes(1, 4))
    assume(len(shape) >= 1)
    x = _t(draw, dt, shape, grid=dt != "float32")
    ax = np.asarray(draw(bst.axis(len(shape))), dtype=np.int64)
    attrs = {"exclusive": draw(st.integers(0, 1)), "reverse": draw(st.integers(0, 1))}
    return OpCase("CumSum", [x, ax], attrs, const=frozenset({1}))


@_register("TopK")
def _topk(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape)))
    # distinct values along the axis: the order of ties is not what is being tested
    n = int(np.prod(shape))
    perm = np.asarray(draw(st.permutations(list(range(n)))), dtype=np.float32)
    x = (perm / 8.0 - n / 16.0).reshape(shape)
    k = np.asarray([draw(st.integers(min(1, shape[ax]), shape[ax]))], dtype=np.int64)
    attrs = {"axis": ax, "largest": draw(st.integers(0, 1)), "sorted": 1}
    return OpCase("TopK", [x, k], attrs, const=frozenset({1}), n_outputs=2)


# -- matrix products --------------------------------------------------------------------------------


@_register("MatMul")
def _matmul(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    if 0 in slots.fixed:
        a_shape = tuple(slots.fixed[0][0])
        assume(len(a_shape) >= 1)
        k = a_shape[-1]
        batch_a = a_shape[:-2]
    else:
        k = draw(st.integers(1, 6))
        rank_a = draw(st.integers(1, 4))
        batch_a = tuple(draw(bst.shapes(max(0, rank_a - 2), max(0, rank_a - 2), max_side=3)))
        a_shape = _zero(draw, slots, batch_a + ((draw(st.integers(1, 5)),) if rank_a >= 2 else ()) + (k,))
        k, batch_a = a_shape[-1], a_shape[:-2]
    rank_b = draw(st.integers(1, 4))
    n = draw(st.integers(0 if slots.zero else 1, 5))
    if rank_b == 1:
        b_shape: tuple[int, ...] = (k,)
    else:
        batch_b = tuple(draw(bst.broadcast_shape_to(batch_a, max_side=3)))[-(rank_b - 2):] if rank_b > 2 else ()
        if rank_b > 2 and len(batch_b) < rank_b - 2:
            batch_b = (1,) * (rank_b - 2 - len(batch_b)) + batch_b
        b_shape = batch_b + (k, n)
    try:
        bst.broadcast(a_shape[:-2], b_shape[:-2])
    except ValueError:
        assume(False)
    const = frozenset({1}) if draw(st.integers(0, 2)) else frozenset()
    return OpCase("MatMul", [_t(draw, "float32", a_shape, -2, 2), _t(draw, "float32", b_shape, -2, 2)], const=const)


@_register("Gemm")
def _gemm(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    trans_a, trans_b = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    if 0 in slots.fixed:
        a_shape = tuple(slots.fixed[0][0])
        assume(len(a_shape) == 2)
        m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    else:
        m, k = _zero(draw, slots, (draw(st.integers(1, 5)), draw(st.integers(1, 6))))
        a_shape = (k, m) if trans_a else (m, k)
    n = draw(st.integers(0 if slots.zero else 1, 5))
    b_shape = (n, k) if trans_b else (k, n)
    c = None
    if _opt(draw, slots, 2):
        c = _t(draw, "float32", draw(st.sampled_from([(), (n,), (1, n), (m, 1), (m, n)])), -1, 1)
    attrs: dict[str, Any] = {"transA": trans_a, "transB": trans_b}
    if draw(st.booleans()):
        attrs["alpha"] = draw(st.sampled_from([0.5, 1.0, 2.0, -1.0]))
    if draw(st.booleans()):
        attrs["beta"] = draw(st.sampled_from([0.5, 1.0, -1.0]))
    const = frozenset({1, 2}) if draw(st.integers(0, 2)) else frozenset({2})
    return OpCase("Gemm", [_t(draw, "float32", a_shape, -2, 2), _t(draw, "float32", b_shape, -2, 2), c], attrs,
                  const=const)


# -- convolution ----------------------------------------------------------------------------------


def _nc_spatial(draw, slots: Slots, min_rank: int = 3, max_rank: int = 5, max_side: int = 7,
                zero_axes: Sequence[int] | None = (0, 1)) -> tuple[int, ...]:
    if 0 in slots.fixed:
        shape = tuple(slots.fixed[0][0])
        assume(min_rank <= len(shape) <= max_rank)
        return shape
    rank = draw(st.sampled_from([r for r in (4, 4, 4, 3, 5) if min_rank <= r <= max_rank]))
    n = draw(st.integers(1, 2))
    c = draw(st.integers(1, 4))
    spatial = tuple(draw(st.integers(1, max_side if rank < 5 else 4)) for _ in range(rank - 2))
    return _zero(draw, slots, (n, c) + spatial, zero_axes)


@_register("Conv")
def _conv(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots)
    c = x_shape[1]
    group = draw(st.sampled_from([g for g in range(1, max(c, 1) + 1) if c % g == 0]))
    m = group * draw(st.integers(1, 2 if group > 1 else 4))
    w = draw(bst.conv_attrs(x_shape[2:]))
    w.group = group
    w_shape = (m, c // group) + tuple(w.kernel)
    attrs = w.attrs(with_group=True)
    if w.dilations == [1] * len(w.dilations) and draw(st.booleans()):
        del attrs["dilations"]
    b = _t(draw, "float32", (m,), -1, 1) if _opt(draw, slots, 2) else None
    const = frozenset({1, 2}) if 1 not in slots.fixed and draw(st.integers(0, 5)) else frozenset({2})
    return OpCase("Conv", [_t(draw, "float32", x_shape, -2, 2), _t(draw, "float32", w_shape, -1, 1), b], attrs,
                  const=const)


@_register("ConvTranspose")
def _conv_transpose(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots, max_side=5)
    c = x_shape[1]
    group = draw(st.sampled_from([g for g in range(1, max(c, 1) + 1) if c % g == 0]))
    m_per = draw(st.integers(1, 2))
    n_sp = len(x_shape) - 2
    kernel = [draw(st.integers(1, 3)) for _ in range(n_sp)]
    strides = [draw(st.integers(1, 3)) for _ in range(n_sp)]
    dil = [draw(st.integers(1, 2)) for _ in range(n_sp)]
    pads_b, pads_e, out_pad = [], [], []
    for i in range(n_sp):
        eff = dil[i] * (kernel[i] - 1) + 1
        full = strides[i] * (x_shape[2 + i] - 1) + eff
        pb = draw(st.integers(0, min(2, (full - 1) // 2)))
        pe = draw(st.integers(0, min(2, full - 1 - pb - 0)))
        op_ = draw(st.integers(0, max(strides[i], dil[i]) - 1))
        pads_b.append(pb)
        pads_e.append(pe)
        out_pad.append(op_)
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "dilations": dil, "group": group,
                             "pads": pads_b + pads_e}
    if any(out_pad):
        attrs["output_padding"] = out_pad
    w_shape = (c, m_per) + tuple(kernel)
    b = _t(draw, "float32", (m_per * group,), -1, 1) if _opt(draw, slots, 2) else None
    return OpCase("ConvTranspose", [_t(draw, "float32", x_shape, -2, 2), _t(draw, "float32", w_shape, -1, 1), b],
                  attrs, const=frozenset({1, 2}))


# -- pooling --------------------------------------------------------------------------------------------


@_register("MaxPool", "AveragePool")
def _pool(draw, slots: Slots = NO_SLOTS, op: str = "MaxPool") -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots, zero_axes=(0,))  # onnxruntime pools only a zero batch
    w = draw(bst.pool_attrs(x_shape[2:], dilations=True))
    attrs = w.attrs(with_dilations=any(d != 1 for d in w.dilations) or draw(st.booleans()))
    attrs["kernel_shape"] = w.kernel  # required for pooling
    if op == "AveragePool" and draw(st.booleans()):
        attrs["count_include_pad"] = 1
    return OpCase(op, [_t(draw, "float32", x_shape)], attrs)


GENERATORS["AveragePool"] = lambda draw, slots=NO_SLOTS: _pool(draw, slots, "AveragePool")


@_register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(draw, slots: Slots = NO_SLOTS, op: str = "GlobalAveragePool") -> OpCase:
    _dtype(draw, slots, 0, F32)
    return OpCase(op, [_t(draw, "float32", _nc_spatial(draw, slots, zero_axes=(0,)))])


GENERATORS["GlobalMaxPool"] = lambda draw, slots=NO_SLOTS: _global_pool(draw, slots, "GlobalMaxPool")


# -- normalisation ----------------------------------------------------------------------------------------


@_register("BatchNormalization")
def _batchnorm(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots, min_rank=2, zero_axes=None)
    c = x_shape[1]
    params = [_t(draw, "float32", (c,), 0.25, 2.0), _t(draw, "float32", (c,), -1, 1), _t(draw, "float32", (c,), -1, 1),
              _t(draw, "float32", (c,), 0.25, 2.0)]
    attrs = {"epsilon": draw(st.sampled_from([1e-5, 1e-3]))}
    return OpCase("BatchNormalization", [_t(draw, "float32", x_shape)] + params, attrs,
                  const=frozenset({1, 2, 3, 4}))


@_register("InstanceNormalization")
def _instancenorm(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots, zero_axes=None)
    c = x_shape[1]
    return OpCase("InstanceNormalization",
                  [_t(draw, "float32", x_shape), _t(draw, "float32", (c,), 0.25, 2.0), _t(draw, "float32", (c,), -1, 1)],
                  {"epsilon": draw(st.sampled_from([1e-5, 1e-3]))}, const=frozenset({1, 2}))


@_register("LayerNormalization")
def _layernorm(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    shape = _shape(draw, replace(slots, zero=False), 0, bst.shapes(1 + slots.zero, 4))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape) - slots.zero))  # onnxruntime normalises no zero-size extent
    shape = _zero(draw, slots, shape, range(ax % len(shape)))
    norm_shape = shape[ax:] if ax >= 0 else shape[len(shape) + ax:]
    b = _t(draw, "float32", norm_shape, -1, 1) if _opt(draw, slots, 2) else None
    return OpCase("LayerNormalization", [_t(draw, "float32", shape), _t(draw, "float32", norm_shape, 0.25, 2.0), b],
                  {"axis": ax, "epsilon": draw(st.sampled_from([1e-5, 1e-3]))}, const=frozenset({1, 2}))


@_register("LRN")
def _lrn(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots, min_rank=4, max_rank=4, zero_axes=None)
    attrs = {"size": draw(st.sampled_from([1, 3, 5])), "alpha": draw(st.sampled_from([1e-4, 0.01, 0.5])),
             "beta": draw(st.sampled_from([0.5, 0.75])), "bias": draw(st.sampled_from([1.0, 2.0]))}
    return OpCase("LRN", [_t(draw, "float32", x_shape)], attrs)


# -- data movement ------------------------------------------------------------------------------------------

_MOVE = ("float32", "int64", "bool")


@_register("Concat")
def _concat(draw, slots: Slots = NO_SLOTS) -> OpCase:
    n = max(draw(st.integers(1, 3)), max(slots.fixed, default=-1) + 1)
    dts = {slots.fixed[i][1] for i in slots.fixed}
    assume(len(dts) <= 1)
    dt = dts.pop() if dts else draw(st.sampled_from(list(_MOVE)))
    base = next((tuple(slots.fixed[i][0]) for i in sorted(slots.fixed)), None) or _shape(draw, slots, 0,
                                                                                        bst.shapes(1, 4))
    assume(len(base) >= 1)
    ax = draw(bst.axis(len(base)))
    shapes_ = []
    for i in range(n):
        if i in slots.fixed:
            s = tuple(slots.fixed[i][0])
            assume(len(s) == len(base) and all(a == b for j, (a, b) in enumerate(zip(s, base)) if j != ax % len(base)))
        else:
            s = list(base)
            s[ax] = draw(st.integers(0 if slots.zero else 1, 4))
            s = tuple(s)
        shapes_.append(s)
    return OpCase("Concat", [_t(draw, dt, s, grid=dt != "float32") for s in shapes_], {"axis": ax})


@_register("Flatten")
def _flatten(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 4))
    assume(len(shape) >= 1)
    return OpCase("Flatten", [_t(draw, dt, shape)], {"axis": draw(st.integers(-len(shape), len(shape)))})


@_register("Reshape")
def _reshape(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    total = int(np.prod(shape))
    if total == 0:  # the sides rearranged; allowzero=1: a 0 is a side, not a copy of the input's
        return OpCase("Reshape", [_t(draw, dt, shape), _i64(draw(st.permutations(shape)))], {"allowzero": 1},
                      const=frozenset({1}))
    # split the element count into random factors
    new: list[int] = []
    rest = total
    for _ in range(draw(st.integers(0, 3))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divs))
        new.append(d)
        rest //= d
    new.append(rest)
    new = draw(st.permutations(new))
    new = list(new)
    if total > 0 and draw(st.booleans()):
        new[draw(st.integers(0, len(new) - 1))] = -1
    if shape and new and new[0] == shape[0] and draw(st.booleans()):
        new[0] = 0  # copy the input's first dimension
    return OpCase("Reshape", [_t(draw, dt, shape), _i64(new)], const=frozenset({1}))


@_register("Transpose")
def _transpose(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 5, max_side=4))
    attrs = {"perm": list(draw(bst.permutations(len(shape))))} if draw(st.integers(0, 4)) else {}
    return OpCase("Transpose", [_t(draw, dt, shape)], attrs)


@_register("Squeeze")
def _squeeze(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    if 0 in slots.fixed:
        shape = tuple(slots.fixed[0][0])
    else:
        shape = _zero(draw, slots, tuple(1 if draw(st.booleans()) else d for d in draw(bst.shapes(1, 5))))
    ones = [i for i, d in enumerate(shape) if d == 1]
    ax = None
    if ones and _opt(draw, slots, 1):
        picked = sorted(draw(st.lists(st.sampled_from(ones), min_size=1, unique=True)))
        ax = _i64([a - len(shape) if draw(st.booleans()) else a for a in picked])
    return OpCase("Squeeze", [_t(draw, dt, shape), ax], const=frozenset({1}))


@_register("Unsqueeze")
def _unsqueeze(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(0, 3))
    k = draw(st.integers(1, 2))
    out_rank = len(shape) + k
    picked = draw(st.lists(st.integers(0, out_rank - 1), min_size=k, max_size=k, unique=True))
    ax = _i64([a - out_rank if draw(st.booleans()) else a for a in picked])
    return OpCase("Unsqueeze", [_t(draw, dt, shape), ax], const=frozenset({1}))


@_register("Slice")
def _slice(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 4, max_side=6))
    assume(len(shape) >= 1)
    picked = draw(bst.axes(len(shape), negative=False))
    starts, ends, steps = [], [], []
    for a in picked:
        d = shape[a]
        step = draw(st.sampled_from([1, 1, 2, -1, -2]))
        s = draw(st.integers(-d - 1, d + 1))
        e = draw(st.integers(-d - 2, d + 2))
        starts.append(s)
        ends.append(e)
        steps.append(step)
    use_axes = _opt(draw, slots, 3)
    use_steps = use_axes and _opt(draw, slots, 4)
    if not use_axes:
        picked_full = list(range(len(picked)))
        assume(picked == picked_full)
    if not use_steps:
        steps = [1] * len(picked)
    ax = _i64([a - len(shape) if draw(st.booleans()) else a for a in picked]) if use_axes else None
    return OpCase("Slice", [_t(draw, dt, shape), _i64(starts), _i64(ends), ax, _i64(steps) if use_steps else None],
                  const=frozenset({1, 2, 3, 4}))


@_register("Split")
def _split(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 4, max_side=6))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape)))
    d = shape[ax]
    if _opt(draw, slots, 1):
        cuts = sorted(draw(st.lists(st.integers(0, d), max_size=2)))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
        return OpCase("Split", [_t(draw, dt, shape), _i64(sizes)], {"axis": ax}, const=frozenset({1}),
                      n_outputs=len(sizes))
    n = draw(st.integers(1, max(1, min(3, d))))
    return OpCase("Split", [_t(draw, dt, shape)], {"axis": ax, "num_outputs": n}, n_outputs=n)


@_register("Gather")
def _gather(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape)))
    d = shape[ax]
    idx_shape = draw(bst.shapes(0, 2, max_side=3, zero_dims=d == 0))  # nothing to index: no indices
    idx = draw(hnp.arrays(np.int64, idx_shape, elements=st.integers(-d, d - 1) if d else st.just(0)))
    const = frozenset({1}) if draw(st.integers(0, 2)) else frozenset()
    return OpCase("Gather", [_t(draw, dt, shape), idx], {"axis": ax}, const=const)


@_register("GatherElements")
def _gather_elements(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape)))
    d = shape[ax]
    idx_shape = tuple((draw(st.integers(1, 4)) if d else 0) if i == ax % len(shape) else draw(st.integers(min(1, s), s))
                      for i, s in enumerate(shape))
    idx = draw(hnp.arrays(np.int64, idx_shape, elements=st.integers(-d, d - 1) if d else st.just(0)))
    return OpCase("GatherElements", [_t(draw, dt, shape), idx], {"axis": ax}, const=frozenset({1}))


@_register("Expand")
def _expand(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(0, 3))
    target = draw(bst.broadcast_shape_to(shape))
    return OpCase("Expand", [_t(draw, dt, shape), _i64(target)], const=frozenset({1}))


@_register("Tile")
def _tile(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    reps = _i64([draw(st.integers(1, 3)) for _ in shape])
    return OpCase("Tile", [_t(draw, dt, shape), reps], const=frozenset({1}))


@_register("Pad")
def _pad(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int32"))
    shape = _shape(draw, slots, 0, bst.shapes(1, 4, max_side=5))
    assume(len(shape) >= 1)
    # onnxruntime cannot wrap a zero-size input ("Unexpected mode"), although ONNX allows it
    mode = draw(st.sampled_from(["constant", "constant", "reflect", "edge"] + ["wrap"] * (not slots.zero)))
    use_axes = _opt(draw, slots, 3)
    picked = draw(bst.axes(len(shape), negative=False)) if use_axes else list(range(len(shape)))
    begins, ends = [], []
    for a in picked:
        d = shape[a]
        # reflect needs pads < dim; a negative pad crops (constant mode only)
        hi = d - 1 if mode == "reflect" else 2 if d or mode == "constant" else 0
        lo = -1 if mode == "constant" and d > 1 else 0
        begins.append(draw(st.integers(lo, max(lo, hi))))
        ends.append(draw(st.integers(lo, max(lo, hi))))
    if mode == "reflect":
        assume(all(shape[a] > 1 or (b == 0 and e == 0) for a, b, e in zip(picked, begins, ends)))
    value = np.asarray(draw(st.sampled_from([0.0, 1.5, -2.0])), dtype=dt) if mode == "constant" and _opt(draw, slots, 2) \
        else None
    ax = _i64([a - len(shape) if draw(st.booleans()) else a for a in picked]) if use_axes else None
    return OpCase("Pad", [_t(draw, dt, shape, grid=dt != "float32"), _i64(begins + ends), value, ax], {"mode": mode},
                  const=frozenset({1, 2, 3}))


@_register("DepthToSpace")
def _depth_to_space(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    b = draw(st.integers(1, 3))
    if 0 in slots.fixed:
        shape = tuple(slots.fixed[0][0])
        assume(len(shape) == 4 and shape[1] % (b * b) == 0)
    else:
        shape = (draw(st.integers(1, 2)), b * b * draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    return OpCase("DepthToSpace", [_t(draw, "float32", shape)],
                  {"blocksize": b, "mode": draw(st.sampled_from(["DCR", "CRD"]))})


@_register("SpaceToDepth")
def _space_to_depth(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    b = draw(st.integers(1, 3))
    if 0 in slots.fixed:
        shape = tuple(slots.fixed[0][0])
        assume(len(shape) == 4 and shape[2] % b == 0 and shape[3] % b == 0)
    else:
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), b * draw(st.integers(1, 3)), b * draw(st.integers(1, 3)))
    return OpCase("SpaceToDepth", [_t(draw, "float32", shape)], {"blocksize": b})


@_register("Dropout")
def _dropout(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    ratio = np.asarray(draw(st.sampled_from([0.0, 0.5])), dtype=np.float32) if _opt(draw, slots, 1) else None
    return OpCase("Dropout", [_t(draw, "float32", _shape(draw, slots, 0, bst.shapes(0, 4))), ratio],
                  const=frozenset({1}))


@_register("Shape")
def _shape_op(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    attrs = {}
    if shape and draw(st.booleans()):
        attrs["start"] = draw(st.integers(-len(shape), len(shape)))
    if shape and draw(st.booleans()):
        attrs["end"] = draw(st.integers(-len(shape), len(shape)))
    return OpCase("Shape", [_t(draw, dt, shape)], attrs)


@_register("Size")
def _size(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, _MOVE)
    return OpCase("Size", [_t(draw, dt, _shape(draw, slots, 0, bst.shapes(0, 4)))])


@_register("Resize")
def _resize(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    x_shape = _nc_spatial(draw, slots, min_rank=4, max_rank=4, max_side=5, zero_axes=None)
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    coord = draw(st.sampled_from(["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]))
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": coord}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if draw(st.booleans()):
        scales = np.asarray([1.0, 1.0] + [draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])) for _ in range(2)],
                            dtype=np.float32)
        assume(all(int(np.floor(d * s)) >= min(d, 1) for d, s in zip(x_shape, scales)))
        return OpCase("Resize", [_t(draw, "float32", x_shape), None, scales], attrs, const=frozenset({1, 2}))
    sizes = _i64(list(x_shape[:2]) + [draw(st.integers(1, 8)) if d else 0 for d in x_shape[2:]])  # 0 stays 0
    return OpCase("Resize", [_t(draw, "float32", x_shape), None, None, sizes], attrs, const=frozenset({1, 2, 3}))


@_register("Trilu")
def _trilu(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int64"))
    shape = _shape(draw, slots, 0, bst.shapes(2, 4))
    assume(len(shape) >= 2)
    k = np.asarray(draw(st.integers(-3, 3)), dtype=np.int64) if _opt(draw, slots, 1) else None
    return OpCase("Trilu", [_t(draw, dt, shape), k], {"upper": draw(st.integers(0, 1))}, const=frozenset({1}))


#: (equation, operand dims as letters); every letter gets one random size
_EINSUM = ("ij,jk->ik", "bij,bjk->bik", "ij->ji", "ij->i", "i,i->", "ij,ij->ij", "bhqd,bhkd->bhqk", "ii->i",
           "ij,k->ijk")


@_register("Einsum")
def _einsum(draw, slots: Slots = NO_SLOTS) -> OpCase:
    eq = draw(st.sampled_from(_EINSUM))
    lhs = eq.split("->")[0].split(",")
    letters = sorted(set("".join(lhs)))
    sizes = dict(zip(letters, _zero(draw, slots, [draw(st.integers(1, 4)) for _ in letters])))
    if 0 in slots.fixed:
        fixed = tuple(slots.fixed[0][0])
        assume(len(fixed) == len(lhs[0]))
        given: dict[str, int] = {}
        for c, d in zip(lhs[0], fixed):
            assume(given.setdefault(c, d) == d)  # "ii": a square operand
        sizes.update(given)
    _dtype(draw, slots, 0, F32)
    arrays = [_t(draw, "float32", tuple(sizes[c] for c in term), -2, 2) for term in lhs]
    return OpCase("Einsum", arrays, {"equation": eq})


@_register("CastLike")
def _cast_like(draw, slots: Slots = NO_SLOTS) -> OpCase:
    case = _cast(draw, slots)
    to = case.attrs["to"]
    like = np.zeros((), dtype=helper.tensor_dtype_to_np_dtype(to))
    return OpCase("CastLike", [case.inputs[0], like], const=frozenset({1}))


def _unique_rows(rng: np.random.Generator, count: int, dims: Sequence[int]) -> np.ndarray:
    """``count`` distinct index tuples into ``dims`` (count <= prod(dims))."""
    flat = rng.permutation(int(np.prod(dims)))[:count]
    return np.stack(np.unravel_index(flat, tuple(dims)), axis=-1).astype(np.int64)


@_register("ScatterElements")
def _scatter_elements(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int64"))
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    assume(len(shape) >= 1)
    ax = draw(bst.axis(len(shape)))
    a = ax % len(shape)
    k = draw(st.integers(min(1, shape[a]), shape[a]))
    idx_shape = tuple(k if i == a else draw(st.integers(min(1, d), d)) for i, d in enumerate(shape))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # distinct targets along the axis: the order of duplicate writes is not what is tested
    perm = np.argsort(rng.random(idx_shape[:a] + (shape[a],) + idx_shape[a + 1:]), axis=a)
    idx = np.take(perm, np.arange(k), axis=a).astype(np.int64)
    idx = np.where(rng.random(idx.shape) < 0.3, idx - shape[a], idx)  # some negative indices
    reduction = draw(st.sampled_from(["none", "none", "add", "mul", "max", "min"]))
    attrs = {"axis": ax} if reduction == "none" else {"axis": ax, "reduction": reduction}
    return OpCase("ScatterElements", [_t(draw, dt, shape), idx, _t(draw, dt, idx_shape)], attrs,
                  const=frozenset({1}))


@_register("ScatterND")
def _scatter_nd(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int64"))
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    assume(len(shape) >= 1)
    q = draw(st.integers(1, len(shape)))
    n = draw(st.integers(min(1, int(np.prod(shape[:q]))), int(np.prod(shape[:q]))))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    idx = _unique_rows(rng, n, shape[:q])
    updates = _t(draw, dt, (n,) + tuple(shape[q:]))
    return OpCase("ScatterND", [_t(draw, dt, shape), idx, updates], const=frozenset({1}))


@_register("NonZero")
def _nonzero_op(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int32", "bool"))
    shape = _shape(draw, slots, 0, bst.shapes(1, 3))
    x = _t(draw, dt, shape, -1, 1, grid=dt == "float32")
    if dt == "float32":
        x = np.where(np.abs(x) < 0.5, 0.0, x).astype(np.float32)
    return OpCase("NonZero", [x])


@_register("Range")
def _range(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("float32", "int64", "int32"))
    start = draw(st.integers(-5, 5))
    delta = draw(st.sampled_from([1, 2, 3, -1, -2]))
    limit = start + delta * draw(st.integers(0, 8)) + (draw(st.integers(0, abs(delta) - 1)) if abs(delta) > 1 else 0)
    if slots.zero:  # no element: the limit at or behind the start
        limit = start - delta * draw(st.integers(0, 3))
    vals = [np.asarray(v, dtype=dt) for v in (start, limit, delta)]
    if dt == "float32":
        vals = [np.asarray(float(v) * 0.5, dtype=dt) for v in vals]
    return OpCase("Range", vals)


# -- quantisation ----------------------------------------------------------------------------------------------


@_register("QuantizeLinear")
def _quantize(draw, slots: Slots = NO_SLOTS) -> OpCase:
    _dtype(draw, slots, 0, F32)
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    zp_dt = draw(st.sampled_from(["int8", "uint8"]))
    scale = np.asarray(draw(st.sampled_from([0.5 ** k for k in range(1, 7)])), dtype=np.float32)
    zp = np.asarray(draw(st.integers(-10, 10) if zp_dt == "int8" else st.integers(100, 150)), dtype=zp_dt)
    return OpCase("QuantizeLinear", [_t(draw, "float32", shape), scale, zp], const=frozenset({1, 2}))


@_register("DequantizeLinear")
def _dequantize(draw, slots: Slots = NO_SLOTS) -> OpCase:
    dt = _dtype(draw, slots, 0, ("int8", "uint8"))
    shape = _shape(draw, slots, 0, bst.shapes(0, 4))
    scale = np.asarray(draw(st.sampled_from([0.5 ** k for k in range(1, 7)])), dtype=np.float32)
    zp = np.asarray(draw(st.integers(-10, 10) if dt == "int8" else st.integers(100, 150)), dtype=dt)
    return OpCase("DequantizeLinear", [_t(draw, dt, shape, 0 if dt == "uint8" else -128, 255 if dt == "uint8" else 127),
                                       scale, zp], const=frozenset({1, 2}))


# -- public entry points -----------------------------------------------------------------------------------------


def supported_op_types() -> list[str]:
    """Operator types the catalogue can generate instances of."""
    return sorted(GENERATORS)


def op_cases(op_type: str, slots: Slots = NO_SLOTS, *, zero_dims: float = 0.0) -> st.SearchStrategy[OpCase] | None:
    """A strategy of valid :class:`OpCase` instances of ``op_type`` (``None``: no generator).

    Instances satisfy ``slots`` (fixed input shapes/dtypes, present/absent optional inputs).
    ``zero_dims``: the share of instances (about; 1.0: all) drawn with ``Slots.zero``, a 0 in some
    dimension where ONNX allows one (batch, channels, K of a product, reduced axes, ...).
    """
    gen = GENERATORS.get(op_type)
    if gen is None:
        return None

    @st.composite
    def cases(draw) -> OpCase:
        zero = zero_dims >= 1 or zero_dims > 0 and draw(st.integers(0, 99)) >= 100 * (1 - zero_dims)
        case = gen(draw, replace(slots, zero=True) if zero else slots)
        if slots is not NO_SLOTS:
            assume(slots.satisfied_by(case))
        return case

    return cases()


def graph_cases(op_type: str) -> st.SearchStrategy[GraphCase] | None:
    """:func:`op_cases` as one-node :class:`GraphCase` objects."""
    s = op_cases(op_type)
    return None if s is None else s.map(lambda c: c.graph())


__all__ = [
    "GENERATORS",
    "GraphCase",
    "OPSET",
    "OpCase",
    "Slots",
    "graph_cases",
    "op_cases",
    "supported_op_types",
]
