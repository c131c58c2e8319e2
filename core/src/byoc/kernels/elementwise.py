"""Elementwise kernels: arithmetic, math, comparison and logic, Where, Cast, BitCast, Identity, Dropout.

Plain numpy: each operator is a numpy ufunc (or a few) over the broadcast of its inputs, with
``np.errstate(all="ignore")`` so that IEEE special values come out quietly, as ONNX expects.

* float16 and bfloat16 are computed in float32 (:func:`compute_dtype`) and the result cast back.
* Integer arithmetic wraps around (two's complement). Integer ``Div`` truncates toward zero and
  ``Mod`` takes the sign of the divisor (``fmod=1``: of the dividend); a zero divisor gives 0.
* ``Pow`` with an integer base and exponent multiplies exactly (wrapping); a negative exponent
  is C's ``pow`` in float64, truncated. ``Max``/``Min`` propagate NaN.
* ``BitShift`` by an amount outside ``[0, width)`` gives 0 (a right shift of a negative signed
  value: -1); ``Where`` selects elements of any dtype as they are.
* Before opset 7, ``broadcast=1`` with ``axis`` aligns B's dimensions with A's at ``axis``.

An output that a broadcast makes larger than every input is checked against the budget before
numpy allocates it; every other output is the size of an input.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from byoc.kernels.registry import NodeSpec, kernel

Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]

_FLOAT32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a kernel computes in: float16 and bfloat16 are computed in float32."""
    return _FLOAT32 if dt.name in ("float16", "bfloat16") else dt


def _compute(x: np.ndarray) -> np.ndarray:
    """``x`` in its compute dtype (``x`` itself where that is its own)."""
    cd = compute_dtype(x.dtype)
    return x if cd == x.dtype else x.astype(cd)


def _back(y, dt: np.dtype) -> np.ndarray:
    """The result ``y`` (a ufunc gives a numpy scalar for 0-d inputs) as an array of ``dt``."""
    y = np.asarray(y)
    return y if y.dtype == dt else y.astype(dt)


def _broadcast(spec: NodeSpec, dtype: np.dtype, *arrays: np.ndarray) -> tuple[int, ...]:
    """The broadcast shape of ``arrays``; checked against the budget (as ``dtype``) where it is
    larger than every input."""
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        shapes = ", ".join(str(list(a.shape)) for a in arrays)
        raise spec.error(f"input shapes {shapes} do not broadcast") from None
    if math.prod(shape) > max(a.size for a in arrays):
        spec.check_alloc(shape, dtype)
    return shape


def _legacy_broadcast(spec: NodeSpec) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """Before opset 7, ``broadcast=1`` with ``axis`` aligned B's dimensions at ``axis`` of A."""
    if spec.opset >= 7 or not spec.attr("broadcast", 0):
        return None
    axis = spec.attr("axis")

    def align(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if axis is None or b.ndim == 0:
            return b
        ax = axis + a.ndim if axis < 0 else axis
        tail = a.ndim - ax - b.ndim
        if ax < 0 or tail < 0:
            raise spec.error(f"legacy broadcast: B of shape {list(b.shape)} does not fit A at axis {axis}")
        return b.reshape(b.shape + (1,) * tail)

    return align


def _binary(spec: NodeSpec, kinds: str, fn: Binary, out_bool: bool = False):
    """The run function of a binary operator: ``fn`` on inputs of one dtype whose compute dtype's
    kind is in ``kinds``; the result in the inputs' dtype (``out_bool``: bool)."""
    align = _legacy_broadcast(spec)

    def run(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype:
            raise spec.error(f"inputs must share one element type, got {a.dtype} and {b.dtype}")
        cd = compute_dtype(a.dtype)
        if cd.kind not in kinds:
            raise spec.error(f"element type {a.dtype} is not supported")
        if align is not None:
            b = align(a, b)
        _broadcast(spec, _BOOL if out_bool else cd, a, b)
        with np.errstate(all="ignore"):
            return (_back(fn(_compute(a), _compute(b)), _BOOL if out_bool else a.dtype),)

    return run


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.true_divide(a, b)
    q = np.floor_divide(a, b)  # numpy: x // 0 is 0
    if a.dtype.kind == "i":
        q = q + ((q < 0) & (q * b != a))  # floor -> toward zero
    return q


_BINARY: dict[str, tuple[str, Binary]] = {
    "Add": ("iuf", np.add),
    "Sub": ("iuf", np.subtract),
    "Mul": ("iuf", np.multiply),
    "Div": ("iuf", _div),
    "BitwiseAnd": ("iub", np.bitwise_and),
    "BitwiseOr": ("iub", np.bitwise_or),
    "BitwiseXor": ("iub", np.bitwise_xor),
}

_PREDICATES: dict[str, tuple[str, Binary]] = {
    "Less": ("iuf", np.less),
    "Greater": ("iuf", np.greater),
    "LessOrEqual": ("iuf", np.less_equal),
    "GreaterOrEqual": ("iuf", np.greater_equal),
    "And": ("b", np.logical_and),
    "Or": ("b", np.logical_or),
    "Xor": ("b", np.logical_xor),
}


def _register_binary(op: str, kinds: str, fn: Binary, out_bool: bool) -> None:
    @kernel(op)
    def make(spec: NodeSpec):
        return _binary(spec, kinds, fn, out_bool)

    make.__name__ = f"make_{op.lower()}"


for _op, (_kinds, _fn) in _BINARY.items():
    _register_binary(_op, _kinds, _fn, False)
for _op, (_kinds, _fn) in _PREDICATES.items():
    _register_binary(_op, _kinds, _fn, True)


@kernel("Equal")
def make_equal(spec: NodeSpec):
    numeric = _binary(spec, "iufb", np.equal, out_bool=True)

    def run(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "OUS":  # strings (opset 19): a comparison of python objects
            _broadcast(spec, _BOOL, a, b)
            return (_back(np.equal(a.astype(object), b.astype(object)), _BOOL),)
        return numeric(a, b)

    return run


@kernel("BitShift")
def make_bitshift(spec: NodeSpec):
    direction = spec.attr("direction", "")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("LEFT", "RIGHT"):
        raise spec.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    # numpy's shifts give 0 (a right shift of a negative value: -1) outside [0, width), as onnx
    return _binary(spec, "iu", np.left_shift if direction == "LEFT" else np.right_shift)


@kernel("Mod")
def make_mod(spec: NodeSpec):
    # np.remainder: the divisor's sign; np.fmod: the dividend's; for integers x % 0 is 0
    return _binary(spec, "iuf", np.fmod if int(spec.attr("fmod", 0)) else np.remainder)


@kernel("PRelu")
def make_prelu(spec: NodeSpec):
    def run(x, slope):
        x, slope = np.asarray(x), np.asarray(slope)
        if x.dtype != slope.dtype:
            raise spec.error(f"X and slope must share one element type, got {x.dtype} and {slope.dtype}")
        if compute_dtype(x.dtype).kind not in "iuf":
            raise spec.error(f"element type {x.dtype} is not supported")
        if _broadcast(spec, x.dtype, x, slope) != x.shape:
            raise spec.error(f"slope of shape {list(slope.shape)} does not broadcast to X {list(x.shape)}")
        xc = _compute(x)
        with np.errstate(all="ignore"):
            return (_back(np.where(xc >= 0, xc, xc * _compute(slope)), x.dtype),)

    return run


def _int_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x ** y`` for a signed integer ``x``: exact (wrapping) by numpy's repeated squaring in
    int64; a negative exponent as C's ``pow`` in float64, truncated toward zero."""
    e = y.astype(np.int64, copy=False)
    out = np.power(x.astype(np.int64, copy=False), np.maximum(e, 0))
    neg = e < 0
    if np.any(neg):
        out = np.where(neg, np.power(x.astype(np.float64), e.astype(np.float64)).astype(np.int64), out)
    return out


@kernel("Pow")
def make_pow(spec: NodeSpec):
    def run(x, y):
        x, y = np.asarray(x), np.asarray(y)
        xd, yd = compute_dtype(x.dtype), compute_dtype(y.dtype)
        if xd.kind not in "if" or yd.kind not in "iuf":
            raise spec.error(f"element types {x.dtype} and {y.dtype} are not supported")
        _broadcast(spec, xd, x, y)
        with np.errstate(all="ignore"):
            if xd.kind == "f":  # in the base's (compute) type, as onnx casts the result to it
                out = np.power(_compute(x), y.astype(xd, copy=False))
            elif yd.kind == "f":
                out = np.power(x.astype(np.float64), y.astype(np.float64))
            else:
                out = _int_pow(x, y)
            return (_back(out, x.dtype),)

    return run


def _variadic(spec: NodeSpec, kinds: str, fn: Binary, mean: bool = False):
    """Sum/Mean/Max/Min: ``fn`` folded over the inputs, broadcasting them all together."""

    def run(*inputs):
        arrays = [np.asarray(a) for a in inputs if a is not None]
        if not arrays:
            raise spec.error("needs at least one input")
        dt = arrays[0].dtype
        if any(a.dtype != dt for a in arrays):
            raise spec.error(f"inputs must share one element type, got {', '.join(str(a.dtype) for a in arrays)}")
        cd = compute_dtype(dt)
        if cd.kind not in kinds:
            raise spec.error(f"element type {dt} is not supported")
        _broadcast(spec, cd, *arrays)
        acc = _compute(arrays[0])
        with np.errstate(all="ignore"):
            for a in arrays[1:]:
                acc = fn(acc, _compute(a))
            if mean:
                acc = np.true_divide(acc, cd.type(len(arrays)))
        return (arrays[0].copy() if acc is arrays[0] else _back(acc, dt),)

    return run


@kernel("Sum")
def make_sum(spec: NodeSpec):
    return _variadic(spec, "iuf", np.add)


@kernel("Mean")
def make_mean(spec: NodeSpec):
    return _variadic(spec, "f", np.add, mean=True)


@kernel("Max")
def make_max(spec: NodeSpec):
    return _variadic(spec, "iuf", np.maximum)  # NaN-propagating


@kernel("Min")
def make_min(spec: NodeSpec):
    return _variadic(spec, "iuf", np.minimum)


@kernel("Where")
def make_where(spec: NodeSpec):
    def run(cond, x, y):
        cond, x, y = np.asarray(cond), np.asarray(x), np.asarray(y)
        if cond.dtype != np.bool_:
            raise spec.error(f"condition must be bool, got {cond.dtype}")
        if x.dtype != y.dtype:
            raise spec.error(f"X and Y must share one element type, got {x.dtype} and {y.dtype}")
        _broadcast(spec, x.dtype, cond, x, y)
        return (np.where(cond, x, y),)  # a selection: every dtype, its elements as they are

    return run


# unary operators: (kinds of the compute dtype, numpy function); a bool result stays bool
_UNARY: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "Sqrt": ("f", np.sqrt),
    "Exp": ("f", np.exp),
    "Log": ("f", np.log),
    "Floor": ("f", np.floor),
    "Ceil": ("f", np.ceil),
    "Round": ("f", np.rint),  # half to even
    "Sin": ("f", np.sin),
    "Cos": ("f", np.cos),
    "Tan": ("f", np.tan),
    "Asin": ("f", np.arcsin),
    "Acos": ("f", np.arccos),
    "Atan": ("f", np.arctan),
    "Sinh": ("f", np.sinh),
    "Cosh": ("f", np.cosh),
    "Asinh": ("f", np.arcsinh),
    "Acosh": ("f", np.arccosh),
    "Atanh": ("f", np.arctanh),
    "Reciprocal": ("f", np.reciprocal),
    "Abs": ("iuf", np.abs),
    "Neg": ("if", np.negative),
    "Sign": ("iuf", np.sign),
    "IsNaN": ("f", np.isnan),
    "Not": ("b", np.logical_not),
    "BitwiseNot": ("iu", np.invert),
}


def _unary(spec: NodeSpec, kinds: str, fn: Callable[[np.ndarray], np.ndarray]):
    def run(x):
        x = np.asarray(x)
        if compute_dtype(x.dtype).kind not in kinds:
            raise spec.error(f"element type {x.dtype} is not supported")
        with np.errstate(all="ignore"):
            out = np.asarray(fn(_compute(x)))
        return (out if out.dtype == np.bool_ else _back(out, x.dtype),)

    return run


def _register_unary(op: str, kinds: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    @kernel(op)
    def make(spec: NodeSpec):
        return _unary(spec, kinds, fn)

    make.__name__ = f"make_{op.lower()}"


for _op, (_kinds, _ufn) in _UNARY.items():
    _register_unary(_op, _kinds, _ufn)


@kernel("IsInf")
def make_isinf(spec: NodeSpec):
    pos = bool(spec.attr("detect_positive", 1))
    neg = bool(spec.attr("detect_negative", 1))

    def isinf(x: np.ndarray) -> np.ndarray:
        return (np.isposinf(x) & pos) | (np.isneginf(x) & neg)

    floats = _unary(spec, "f", isinf)

    def run(x):
        x = np.asarray(x)
        if x.dtype.kind in "iu":
            return (spec.alloc.zeros(x.shape, np.bool_),)
        return floats(x)

    return run


# data conversion and pass-through

_FLOAT8_MAX = {
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
}


def _cast(spec: NodeSpec, x: np.ndarray, to: np.dtype, saturate: bool) -> np.ndarray:
    if x.dtype == to:
        return x
    if to.kind in "OUS":
        if x.dtype.kind in "OUS":
            return x.astype(object)
        return np.array([str(v) for v in x.reshape(-1).tolist()], dtype=object).reshape(x.shape)
    if x.dtype.kind in "OUS":
        try:
            return x.astype(np.float64).astype(to) if to.kind != "b" else x.astype(to)
        except ValueError as exc:
            raise spec.error(f"cannot parse strings as {to}: {exc}") from None
    with np.errstate(invalid="ignore", over="ignore"):
        if saturate and to.name in _FLOAT8_MAX and x.dtype.kind == "f":
            m = _FLOAT8_MAX[to.name]
            # clip keeps NaN; +-inf saturate too (ONNX's saturate table)
            return np.clip(x.astype(np.float32, copy=False), -m, m).astype(to)
        return x.astype(to)


def _onnx_dtype(spec: NodeSpec, code) -> np.dtype:
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))
    except (KeyError, TypeError, ValueError):
        raise spec.error(f"unsupported target type {code}") from None


@kernel("Cast")
def make_cast(spec: NodeSpec):
    if spec.attr("to") is None:
        raise spec.error("attribute 'to' is required")
    to = _onnx_dtype(spec, spec.attr("to"))
    saturate = bool(spec.attr("saturate", 1))
    round_mode = spec.attr("round_mode", "up")
    if isinstance(round_mode, bytes):
        round_mode = round_mode.decode()
    if round_mode not in ("up", "down", "nearest"):
        raise spec.error(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")

    def run(x):
        x = np.asarray(x)
        spec.check_alloc(x.shape, to if to.itemsize >= x.dtype.itemsize else x.dtype)  # bool -> float64: 8x
        if to.name == "float8_e8m0fnu" and x.dtype != to and x.dtype.kind == "f":
            # powers of two with a rounding mode (opset 24): onnx's own converter
            from onnx.numpy_helper import to_float8e8m0

            return (np.asarray(to_float8e8m0(x, saturate, round_mode)).astype(to),)
        return (_cast(spec, x, to, saturate),)

    return run


@kernel("CastLike")
def make_castlike(spec: NodeSpec):
    saturate = bool(spec.attr("saturate", 1))

    def run(x, like):
        x, to = np.asarray(x), np.asarray(like).dtype
        spec.check_alloc(x.shape, to)
        return (_cast(spec, x, to, saturate),)

    return run


#: types of less than a byte (numpy holds one value per byte): BitCast refuses them
_SUB_BYTE = {"int4", "uint4", "int2", "uint2", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"}


@kernel("BitCast")
def make_bitcast(spec: NodeSpec):
    to = _onnx_dtype(spec, spec.attr("to"))

    def run(x):
        x = np.asarray(x)
        kinds, names = {x.dtype.kind, to.kind}, {x.dtype.name, to.name}
        if x.dtype.itemsize != to.itemsize or kinds & {"O", "S", "U"} or names & _SUB_BYTE:
            raise spec.error(f"cannot reinterpret {x.dtype} as {to}: the bit widths differ or one is a string")
        return ((x if x.flags.c_contiguous else x.copy()).view(to),)

    return run


@kernel("Identity")
def make_identity(spec: NodeSpec):
    def run(x):
        return (x,)

    return run


@kernel("Dropout")
def make_dropout(spec: NodeSpec):
    seed = spec.attr("seed")
    attr_ratio = float(spec.attr("ratio", 0.5))
    want_mask = spec.n_outputs > 1
    legacy_mask = spec.opset < 10  # before opset 10 the mask had the data's type

    def mask_of(x: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        if keep is None:
            keep = spec.alloc.ones(x.shape, np.bool_)
        return keep.astype(x.dtype) if legacy_mask else keep

    def run(x, ratio=None, training_mode=None):
        x = np.asarray(x)
        training = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
        r = attr_ratio if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        if not training or r == 0.0:
            return (x, mask_of(x)) if want_mask else (x,)
        if not 0.0 <= r < 1.0:
            raise spec.error(f"ratio must be in [0, 1), got {r}")
        rng = np.random.default_rng(None if seed is None else int(seed))
        spec.check_alloc(x.shape, np.float64)  # the random draws
        keep = rng.random(x.shape) >= r
        xc = _compute(x)
        with np.errstate(all="ignore"):
            out = _back(np.where(keep, xc * xc.dtype.type(1.0 / (1.0 - r)), xc.dtype.type(0)), x.dtype)
        return (out, mask_of(x, keep)) if want_mask else (out,)

    return run
