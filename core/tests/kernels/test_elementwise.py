"""Elementwise kernels (arithmetic, math, comparison, logic, Where, Cast, BitCast, Identity, Dropout)
against onnx.reference, through byoc.compile, and against explicit expectations where
onnx.reference has none (integer division by zero, shifts out of range, negative integer powers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int32, np.int64]


def rand(rng: np.random.Generator, shape, dtype, low=-5.0, high=5.0, nonzero=False) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = max(int(low), np.iinfo(dtype).min)
        v = rng.integers(lo, int(high) + 1, size=shape).astype(dtype)
    else:
        v = rng.uniform(low, high, size=shape).astype(dtype)
    if nonzero:
        v = np.where(v == 0, dtype.type(1), v).astype(dtype)
    return np.asarray(v)


def tol(dtype) -> dict:
    # float16 results are rounded to 11 significant bits, by onnx.reference as well as by byoc;
    # the two may differ by one unit in the last place where intermediate rounding differs
    if np.dtype(dtype) == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    return {}


def check(op, inputs, attrs=None, n_outputs=1, opset=None, **tolerance):
    kw = {} if opset is None else {"opset": opset}
    model, feeds = single_node_model(op, inputs, attrs, n_outputs=n_outputs, **kw)
    assert_close(run_byoc(model, feeds), run_reference(model, feeds), **tolerance)


def two_shapes():
    return hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=1, max_side=5)


# -------------------------------------------------------------------------------------------------
# binary arithmetic


@SETTINGS
@given(
    op=st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min"]),
    dtype=st.sampled_from(FLOATS + INTS),
    shapes=two_shapes(),
    swap=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_binary_arithmetic_matches_reference(op, dtype, shapes, swap, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    if swap:
        sa, sb = sb, sa
    a = rand(rng, sa, dtype, -50, 50)
    b = rand(rng, sb, dtype, -50, 50, nonzero=(op == "Div"))
    check(op, [a, b], **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_div_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 0, 6, -6, 1, -1], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, 3, -3, 5, 5], dtype=np.int64)
    if np.dtype(dtype).kind == "u":
        a, b = np.abs(a), np.abs(b)
    a, b = a.astype(dtype), b.astype(dtype)
    model, feeds = single_node_model("Div", [a, b])
    got = run_byoc(model, feeds)[0]
    expected = (np.trunc(a.astype(np.float64) / b.astype(np.float64))).astype(dtype)
    np.testing.assert_array_equal(got, expected)
    assert_close([got], run_reference(model, feeds))


def test_int64_shape_arithmetic_is_exact():
    big = np.array([2**62 + 1, -(2**62) - 3, 2**40], dtype=np.int64)
    one = np.array([1], dtype=np.int64)
    for op, fn in [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)]:
        model, feeds = single_node_model(op, [big, one])
        np.testing.assert_array_equal(run_byoc(model, feeds)[0], fn(big, one))
    model, feeds = single_node_model("Div", [big, np.array([3], np.int64)])
    np.testing.assert_array_equal(run_byoc(model, feeds)[0], np.array([(2**62 + 1) // 3, -((2**62 + 3) // 3), 2**40 // 3]))


INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def wrap(values, dtype) -> np.ndarray:
    """Python integers reduced to ``dtype``'s range as two's-complement arithmetic does."""
    info = np.iinfo(dtype)
    span = 1 << info.bits
    return np.array([(int(v) - int(info.min)) % span + int(info.min) for v in values], dtype=dtype)


@st.composite
def int_operands(draw, dtypes=INT_DTYPES, shapes=None):
    """Two broadcastable integer arrays of one dtype, with zeros, negatives and the extremes."""
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    info = np.iinfo(dtype)
    shapes = shapes if shapes is not None else hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4)
    sa, sb = draw(shapes).input_shapes
    special = st.sampled_from([0, 1, -1, int(info.min), int(info.max), 2, -2]).filter(lambda v: info.min <= v <= info.max)
    values = st.one_of(special, st.integers(int(info.min), int(info.max)))
    return (draw(hnp.arrays(dtype, sa, elements=values)), draw(hnp.arrays(dtype, sb, elements=values)))


def _trunc_div(x: int, y: int) -> int:
    if y == 0:
        return 0
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


INT_EXPECTED = {
    # Div truncates toward zero; Mod takes the divisor's sign, fmod the dividend's; x op 0 is 0
    ("Div", 0): _trunc_div,
    ("Mod", 0): lambda x, y: x % y if y else 0,
    ("Mod", 1): lambda x, y: x - _trunc_div(x, y) * y if y else 0,
}


@SETTINGS
@given(operands=int_operands(), op=st.sampled_from(sorted(INT_EXPECTED)))
def test_integer_div_and_mod_with_zero_and_negative_operands(operands, op):
    a, b = operands
    name, fmod = op
    run = make_kernel(NodeSpec(name, n_inputs=2, attrs={"fmod": fmod} if name == "Mod" else {}))
    got = run(a, b)[0]
    x, y = np.broadcast_arrays(a, b)
    f = INT_EXPECTED[op]
    expected = wrap([f(int(u), int(v)) for u, v in zip(x.reshape(-1), y.reshape(-1))], a.dtype).reshape(x.shape)
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, expected)


@SETTINGS
@given(
    operands=int_operands(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=4)),
    direction=st.sampled_from(["LEFT", "RIGHT"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_bitshift_by_any_amount(operands, direction, seed):
    x, _ = operands
    bits = np.iinfo(x.dtype).bits
    lo = -3 if x.dtype.kind == "i" else 0
    y = np.random.default_rng(seed).integers(lo, bits + 4, size=x.shape).astype(x.dtype)
    got = make_kernel(NodeSpec("BitShift", n_inputs=2, attrs={"direction": direction}))(x, y)[0]
    expected = []
    for u, v in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist()):
        if 0 <= v < bits:
            expected.append(u << v if direction == "LEFT" else u >> v)  # Python's >> is arithmetic
        else:  # shifted out entirely: only the sign of a right-shifted negative value is left
            expected.append(-1 if (direction == "RIGHT" and u < 0) else 0)
    np.testing.assert_array_equal(got, wrap(expected, x.dtype).reshape(x.shape))


@SETTINGS
@given(
    base=hnp.arrays(st.sampled_from([np.int32, np.int64]), hnp.array_shapes(max_dims=2, max_side=5),
                    elements=st.integers(-6, 6)),
    exp_dtype=st.sampled_from([np.int32, np.int64, np.uint8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_integer_pow_wraps_and_truncates_negative_exponents(base, exp_dtype, seed):
    lo = -3 if np.dtype(exp_dtype).kind == "i" else 0
    e = np.random.default_rng(seed).integers(lo, 70, size=base.shape).astype(exp_dtype)
    x = np.where((base == 0) & (e < 0), 1, base).astype(base.dtype)  # 0 ** -k: C's pow gives inf
    got = make_kernel(NodeSpec("Pow", n_inputs=2))(x, e)[0]
    expected = [u**v if v >= 0 else int(float(u) ** float(v)) for u, v in zip(x.reshape(-1).tolist(), e.reshape(-1).tolist())]
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, wrap(expected, x.dtype).reshape(x.shape))


@SETTINGS
@given(
    base_dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.int64]),
    exp_dtype=st.sampled_from([np.float32, np.int32, np.int64]),
    shapes=two_shapes(),
    seed=st.integers(0, 2**32 - 1),
)
def test_pow_matches_reference(base_dtype, exp_dtype, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    if np.dtype(base_dtype).kind == "f":
        x = rand(rng, sa, base_dtype, 0.1, 3.0)
    else:
        x = rand(rng, sa, base_dtype, -4, 4)
    y = rand(rng, sb, exp_dtype, 0, 4)
    check("Pow", [x, y], **tol(base_dtype))


@pytest.mark.parametrize("e", [2.0, 0.5, 1.0, 3.0, -1.0])
def test_pow_scalar_exponents(e):
    x = np.random.default_rng(0).uniform(0.1, 4, size=(3, 7)).astype(np.float32)
    check("Pow", [x, np.array(e, dtype=np.float32)])


@SETTINGS
@given(
    op=st.sampled_from(["Sum", "Mean", "Max", "Min"]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64]),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=4, min_dims=0, max_dims=3, max_side=4),
    n=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_variadic_matches_reference(op, dtype, shapes, n, seed):
    if op == "Mean" and np.dtype(dtype).kind != "f":
        dtype = np.float32  # Mean is defined for floats only
    rng = np.random.default_rng(seed)
    inputs = [rand(rng, s, dtype, -20, 20) for s in shapes.input_shapes[:n]]
    if op == "Mean":
        # onnx.reference's Mean adds in place into the first input, so it cannot broadcast it
        # (and onnxruntime has float32 only): numpy is the oracle
        model, feeds = single_node_model(op, inputs)
        expected = (sum(np.broadcast_arrays(*inputs)) / len(inputs)).astype(dtype)
        assert_close(run_byoc(model, feeds), [np.asarray(expected)])
    else:
        check(op, inputs)


def test_max_min_propagate_nan():
    a = np.array([1.0, np.nan, 3.0, np.nan], np.float32)
    b = np.array([np.nan, 2.0, 1.0, np.nan], np.float32)
    check("Max", [a, b])
    check("Min", [a, b])


# -------------------------------------------------------------------------------------------------
# comparison and logic


@SETTINGS
@given(
    op=st.sampled_from(["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]),
    dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]),
    shapes=two_shapes(),
    seed=st.integers(0, 2**32 - 1),
)
def test_comparisons_match_reference(op, dtype, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    # few distinct values so that ties occur
    a = rand(rng, sa, dtype, 0, 3).round().astype(dtype)
    b = rand(rng, sb, dtype, 0, 3).round().astype(dtype)
    check(op, [a, b])


@SETTINGS
@given(op=st.sampled_from(["And", "Or", "Xor", "Equal"]), shapes=two_shapes(), seed=st.integers(0, 2**32 - 1))
def test_logic_matches_reference(op, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    check(op, [rand(rng, sa, np.bool_), rand(rng, sb, np.bool_)])


def test_not():
    x = np.array([[True, False], [False, True]])
    check("Not", [x])


@SETTINGS
@given(
    dtype=st.sampled_from([np.float32, np.float16, np.int64, np.int8, np.bool_, np.float64]),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4, max_side=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_where_matches_reference(dtype, shapes, seed):
    rng = np.random.default_rng(seed)
    sc, sx, sy = shapes.input_shapes
    check("Where", [rand(rng, sc, np.bool_), rand(rng, sx, dtype), rand(rng, sy, dtype)])


# -------------------------------------------------------------------------------------------------
# unary math

UNARY_DOMAINS = {
    "Sqrt": (0.0, 10.0),
    "Exp": (-10.0, 10.0),
    "Log": (0.01, 10.0),
    "Abs": (-5.0, 5.0),
    "Neg": (-5.0, 5.0),
    "Reciprocal": (0.1, 5.0),
    "Floor": (-5.0, 5.0),
    "Ceil": (-5.0, 5.0),
    "Round": (-5.0, 5.0),
    "Sign": (-3.0, 3.0),
    "Sin": (-5.0, 5.0),
    "Cos": (-5.0, 5.0),
    "Tan": (-1.4, 1.4),
    "Asin": (-1.0, 1.0),
    "Acos": (-1.0, 1.0),
    "Atan": (-5.0, 5.0),
    "Sinh": (-3.0, 3.0),
    "Cosh": (-3.0, 3.0),
    "Asinh": (-5.0, 5.0),
    "Acosh": (1.0, 5.0),
    "Atanh": (-0.99, 0.99),
}


@SETTINGS
@given(
    op=st.sampled_from(sorted(UNARY_DOMAINS)),
    dtype=st.sampled_from(FLOATS),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_unary_math_matches_reference(op, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    lo, hi = UNARY_DOMAINS[op]
    x = rand(rng, shape, dtype, lo, hi)
    if op in ("Round", "Floor", "Ceil"):
        x[...] = np.round(x * 2) / 2  # exact halves: ties must round to even
    check(op, [x], **tol(dtype))


@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_unary(op, dtype):
    x = np.array([-7, -1, 0, 1, 9], dtype=dtype)
    check(op, [x])


def test_special_values():
    x = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1.0], np.float32)
    for op in ["Sqrt", "Log", "Exp", "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "IsNaN"]:
        check(op, [x])
    check("IsInf", [x], {"detect_negative": 0})
    check("IsInf", [x], {"detect_positive": 0})


def test_mod_and_bitwise():
    a = np.array([7, -7, 7, -7, 5, 0], np.int64)
    b = np.array([3, 3, -3, -3, 5, 2], np.int64)
    check("Mod", [a, b])
    check("Mod", [a, b], {"fmod": 1})
    fa = np.array([7.5, -7.5, 7.5, -7.5], np.float32)
    fb = np.array([2.0, 2.0, -2.0, -2.0], np.float32)
    check("Mod", [fa, fb], {"fmod": 1})
    u = np.array([1, 2, 255, 16], np.uint8)
    s = np.array([1, 3, 1, 9], np.uint8)
    check("BitShift", [u, s], {"direction": "LEFT"})
    check("BitShift", [u, s], {"direction": "RIGHT"})
    # signed types (opset 28): arithmetic right shift; shifts outside [0, width) saturate
    i8 = np.array([-128, -5, 5, 127, -1, 3], np.int8)
    n8 = np.array([1, 2, 7, 8, -1, 1], np.int8)
    check("BitShift", [i8, n8], {"direction": "LEFT"}, opset=28)
    check("BitShift", [i8, n8], {"direction": "RIGHT"}, opset=28)
    check("BitwiseAnd", [a, b])
    check("BitwiseXor", [a, b])
    check("BitwiseNot", [a])


# -------------------------------------------------------------------------------------------------
# Cast, Identity, Dropout

CAST_TARGETS = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
]


@SETTINGS
@given(
    src=st.sampled_from(CAST_TARGETS),
    dst=st.sampled_from(CAST_TARGETS),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_cast_matches_reference(src, dst, shape, seed):
    from onnx import helper

    rng = np.random.default_rng(seed)
    # values inside every target's range (float -> int truncates toward zero)
    x = rand(rng, shape, src, 0 if np.dtype(src).kind == "u" else -100, 100)
    if np.dtype(dst).kind == "u" and np.dtype(src).kind in "if":
        x = np.abs(x)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    check("Cast", [x], {"to": to})


def test_cast_float_to_int_truncates():
    x = np.array([1.7, -1.7, 2.5, -2.5, 0.2], np.float32)
    model, feeds = single_node_model("Cast", [x], {"to": 7})
    np.testing.assert_array_equal(run_byoc(model, feeds)[0], np.array([1, -1, 2, -2, 0], np.int64))


def test_cast_like_and_float8_saturate():
    from onnx import TensorProto

    x = np.array([1.0, 1000.0, -1e6, np.inf, 0.3], np.float32)
    check("Cast", [x], {"to": TensorProto.FLOAT8E4M3FN})
    check("Cast", [x], {"to": TensorProto.FLOAT8E4M3FN, "saturate": 0}, opset=21)
    check("CastLike", [x, np.array([1], np.float16)])


@pytest.mark.parametrize("src,to", [(np.float32, 6), (np.int64, 11), (np.float16, 4), (np.uint8, 3)])
def test_bitcast_matches_reference(src, to):
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(src)
    check("BitCast", [x], {"to": to}, opset=26)
    check("BitCast", [x[:, ::2]], {"to": to}, opset=26)  # a strided view


def test_bitcast_refuses_other_widths():
    run = make_kernel(NodeSpec("BitCast", name="bc", attrs={"to": 7}, opset=26))  # float32 -> int64
    with pytest.raises(KernelError, match="bc.*bit widths"):
        run(np.zeros(2, np.float32))


def test_identity_and_dropout():
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    check("Identity", [x])
    check("Dropout", [x], n_outputs=2)
    check("Dropout", [x, np.array(0.3, np.float32)], n_outputs=2)


def test_dropout_training_mode_masks_and_scales():
    run = make_kernel(NodeSpec("Dropout", n_inputs=3, n_outputs=2, attrs={"seed": 3}))
    x = np.ones((64, 64), np.float32)
    out, mask = run(x, np.array(0.25, np.float32), np.array(True))
    assert mask.dtype == np.bool_
    np.testing.assert_allclose(out[mask], 1 / 0.75, rtol=1e-6)
    assert np.all(out[~mask] == 0)
    assert 0.6 < mask.mean() < 0.9


# -------------------------------------------------------------------------------------------------
# errors, budget, legacy broadcast, odd inputs


def test_readonly_and_noncontiguous_inputs():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    b = np.full(6, 2.0, np.float32)
    b.flags.writeable = False
    run = make_kernel(NodeSpec("Sub", n_inputs=2))
    np.testing.assert_array_equal(run(a.T, b[:4])[0], a.T - b[:4])
    np.testing.assert_array_equal(run(a, b)[0], a - b)
    big = np.ones(1 << 17, np.float32)
    big.flags.writeable = False
    np.testing.assert_array_equal(run(big, big)[0], np.zeros(1 << 17, np.float32))


def test_errors_name_the_node():
    run = make_kernel(NodeSpec("Add", name="add_7", n_inputs=2))
    with pytest.raises(KernelError, match="add_7.*do not broadcast"):
        run(np.ones((2, 3), np.float32), np.ones((4,), np.float32))
    with pytest.raises(KernelError, match="add_7.*element type"):
        run(np.ones(3, np.float32), np.ones(3, np.float64))
    with pytest.raises(KernelError, match="Sqrt.*element type"):
        make_kernel(NodeSpec("Sqrt"))(np.ones(3, np.int32))
    with pytest.raises(KernelError, match="direction"):
        make_kernel(NodeSpec("BitShift", attrs={"direction": "UP"}, n_inputs=2))


def test_broadcast_output_is_checked_against_the_budget():
    from byoc.budget import Budget
    from byoc.errors import ResourceLimitError

    spec = NodeSpec("Add", name="outer", n_inputs=2, budget=Budget(max_tensor_bytes=1 << 20))
    run = make_kernel(spec)
    col = np.ones((1000, 1), np.float32)
    row = np.ones((1, 1000), np.float32)
    with pytest.raises(ResourceLimitError, match="outer"):
        run(col, row)
    assert run(col, row[:, :100])[0].shape == (1000, 100)


@SETTINGS
@given(
    sa=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    sb=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    op=st.sampled_from(["Add", "Mul", "Less", "Max", "Where"]),
    limit=st.sampled_from([64, 256, 4096]),
)
def test_any_two_shapes_broadcast_or_are_refused_by_name(sa, sb, op, limit):
    """numpy's broadcast where the shapes allow it (a larger output within the budget), else a
    KernelError naming the node."""
    from byoc.budget import Budget
    from byoc.errors import ResourceLimitError

    n = 3 if op == "Where" else 2
    run = make_kernel(NodeSpec(op, name="bc", n_inputs=n, budget=Budget(max_tensor_bytes=limit)))
    a, b = np.arange(int(np.prod(sa)), dtype=np.float32).reshape(sa), np.ones(sb, np.float32)
    args = (np.ones((), np.bool_), a, b) if op == "Where" else (a, b)
    try:
        out_shape = np.broadcast_shapes(sa, sb)
    except ValueError:
        with pytest.raises(KernelError, match="bc.*do not broadcast"):
            run(*args)
        return
    out_bytes = int(np.prod(out_shape)) * (1 if op == "Less" else 4)
    if int(np.prod(out_shape)) > max(a.size, b.size) and out_bytes > limit:
        with pytest.raises(ResourceLimitError, match="bc"):
            run(*args)
        return
    expected = {"Add": np.add, "Mul": np.multiply, "Less": np.less, "Max": np.maximum,
                "Where": lambda x, y: np.where(True, x, y)}[op](a, b)
    got = run(*args)[0]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_legacy_broadcast_attribute():
    # opset < 7: B's dimensions align with A's starting at `axis`
    a = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = np.arange(3, dtype=np.float32)
    run = make_kernel(NodeSpec("Add", opset=6, attrs={"broadcast": 1, "axis": 1}, n_inputs=2))
    np.testing.assert_allclose(run(a, b)[0], a + b.reshape(3, 1, 1))


def test_float16_and_empty_tensors():
    h = np.array([[1.5, -2.25], [3.0, 65000.0]], np.float16)
    check("Add", [h, h])  # 130000 overflows float16 to inf, as in the reference
    e = np.zeros((0, 3), np.float32)
    check("Mul", [e, np.ones(3, np.float32)])


def test_strings_equal_where_and_byte_order():
    a = np.array(["a", "bc", ""], dtype=object)
    b = np.array(["a", "b", ""], dtype=object)
    model, feeds = single_node_model("Equal", [a, b], opset=21)
    np.testing.assert_array_equal(run_byoc(model, feeds)[0], [True, False, True])
    run = make_kernel(NodeSpec("Where", n_inputs=3))
    np.testing.assert_array_equal(run(np.array([True, False, True]), a, b)[0], np.array(["a", "b", ""], dtype=object))
    big_endian = np.arange(6, dtype=">f4")
    np.testing.assert_array_equal(make_kernel(NodeSpec("Neg"))(big_endian)[0], -np.arange(6, dtype=np.float32))
