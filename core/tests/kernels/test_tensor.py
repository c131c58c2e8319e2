"""Data-movement and shape kernels (byoc.kernels.tensor) against onnx.reference and onnxruntime.

Property tests draw random shapes and attributes per operator family and compare the whole
byoc pipeline (``byoc.compile(...).run``) with ``onnx.reference``; attribute forms of older
opsets (which byoc's frontend converts up to opset 21) are checked by building the kernel
directly from a :class:`NodeSpec` at that opset.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import byoc
from byoc.errors import KernelError, ResourceLimitError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

I64 = np.int64
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
EXAMPLES = settings(max_examples=40)


def check(op, inputs, attrs=None, *, n_outputs=1, opset=21, const_inputs=(), oracle=run_reference, passes=None,
          **tol):
    """Run one node through byoc and an oracle; also check byoc left its inputs untouched."""
    model, feeds = single_node_model(op, inputs, attrs, n_outputs=n_outputs, opset=opset, const_inputs=const_inputs)
    before = {k: v.copy() for k, v in feeds.items()}
    expected = oracle(model, feeds)
    complete_outputs(model, expected)
    got = run_byoc(model, feeds, passes=passes)
    assert_close(got, expected, **tol)
    for k, v in before.items():
        np.testing.assert_array_equal(feeds[k], v, err_msg=f"input {k} was modified")
    return got


def complete_outputs(model, expected):
    """Give graph outputs that shape inference left without a shape their rank (the checker needs one)."""
    for out, arr in zip(model.graph.output, expected):
        tt = out.type.tensor_type
        if not tt.elem_type:
            tt.elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype)
        if not tt.HasField("shape"):
            tt.shape.SetInParent()
            for _ in range(np.ndim(arr)):
                tt.shape.dim.add()


def direct(op, inputs, attrs=None, *, n_outputs=1, opset=21):
    """Build the kernel straight from a NodeSpec at ``opset`` (no opset conversion) and run it."""
    spec = NodeSpec(op_type=op, name=f"{op.lower()}_0", opset=opset, attrs=dict(attrs or {}),
                    n_inputs=len(inputs), n_outputs=n_outputs,
                    input_shapes=[None if a is None else a.shape for a in inputs],
                    input_dtypes=[None if a is None else a.dtype for a in inputs])
    return list(make_kernel(spec)(*inputs))


def check_direct(op, inputs, attrs=None, *, n_outputs=1, opset=21, oracle=run_reference):
    model, feeds = single_node_model(op, inputs, attrs, n_outputs=n_outputs, opset=opset)
    assert_close(direct(op, inputs, attrs, n_outputs=n_outputs, opset=opset), oracle(model, feeds))


def arrays(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(-100, 100, size=shape).astype(dtype)


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)
dtypes = st.sampled_from([np.float32, np.float32, np.int64, np.float16, np.int8, np.bool_, np.float64])
seeds = st.integers(0, 2**16)


# ---------------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze, Transpose


def _factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@EXAMPLES
@given(data=st.data(), shape=shapes, dtype=dtypes, seed=seeds, const=st.booleans())
def test_reshape_property(data, shape, dtype, seed, const):
    rank = data.draw(st.integers(1, 5))
    target = [1] * rank
    for f in _factors(math.prod(shape)):
        target[data.draw(st.integers(0, rank - 1))] *= f
    # 0 copies the input dimension at that position; -1 is inferred
    for i in range(min(rank, len(shape))):
        if target[i] == shape[i] and data.draw(st.booleans()):
            target[i] = 0
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, rank - 1))] = -1
    check("Reshape", [arrays(shape, dtype, seed), np.array(target, I64)], const_inputs=(1,) if const else ())


def test_reshape_allowzero_and_view():
    x = arrays((2, 0, 3))
    check("Reshape", [x, np.array([0, 3, 2], I64)], {"allowzero": 1})
    check("Reshape", [x, np.array([3, 0], I64)], {"allowzero": 1})
    check("Reshape", [x, np.array([0, 0, 3, 1], I64)])  # 0 copies the input dimension: (2, 0, 3, 1)
    y = arrays((4, 6))
    (out,) = direct("Reshape", [y, np.array([3, -1], I64)])
    assert out.shape == (3, 8) and np.shares_memory(out, y)  # a view, no copy
    with pytest.raises(KernelError, match="reshape_0"):
        direct("Reshape", [y, np.array([5, -1], I64)])
    with pytest.raises(KernelError, match="more than one -1"):
        direct("Reshape", [y, np.array([-1, -1], I64)])


@EXAMPLES
@given(data=st.data(), shape=shapes, dtype=dtypes, seed=seeds)
def test_flatten_transpose_property(data, shape, dtype, seed):
    x = arrays(shape, dtype, seed)
    r = len(shape)
    check("Flatten", [x], {"axis": data.draw(st.integers(-r, r))})
    perm = data.draw(st.none() | st.permutations(range(r)))
    check("Transpose", [x], {} if perm is None else {"perm": list(perm)})


@EXAMPLES
@given(data=st.data(), shape=st.lists(st.integers(1, 3), min_size=0, max_size=4).map(tuple), seed=seeds,
       const=st.booleans())
def test_squeeze_unsqueeze_property(data, shape, seed, const):
    x = arrays(shape, np.float32, seed)
    r = len(shape)
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = data.draw(st.none() | st.lists(st.sampled_from(ones), unique=True) if ones else st.none())
    if axes is None:
        check("Squeeze", [x])
    else:
        axes = [a - r if data.draw(st.booleans()) else a for a in axes]
        check("Squeeze", [x, np.array(axes, I64)], const_inputs=(1,) if const else ())
    k = data.draw(st.integers(1, 3))
    uaxes = data.draw(st.lists(st.integers(0, r + k - 1), min_size=k, max_size=k, unique=True))
    uaxes = [a - (r + k) if data.draw(st.booleans()) else a for a in uaxes]
    check("Unsqueeze", [x, np.array(uaxes, I64)], const_inputs=(1,) if const else ())


def test_squeeze_unsqueeze_opset11_attributes():
    x = arrays((1, 3, 1, 2))
    check_direct("Squeeze", [x], {"axes": [0, -2]}, opset=11)
    check_direct("Unsqueeze", [x], {"axes": [0, 5]}, opset=11)
    check("Squeeze", [x], {"axes": [2]}, opset=11)  # converted up to opset 21 by the frontend
    with pytest.raises(KernelError, match="cannot squeeze axis 1"):
        direct("Squeeze", [x, np.array([1], I64)])


# ---------------------------------------------------------------------------------------------
# Concat, Split


@EXAMPLES
@given(data=st.data(), shape=shapes, dtype=dtypes, seed=seeds)
def test_concat_property(data, shape, dtype, seed):
    r = len(shape)
    axis = data.draw(st.integers(-r, r - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    xs = []
    for i, n in enumerate(sizes):
        s = list(shape)
        s[axis] = n
        xs.append(arrays(tuple(s), dtype, seed + i))
    check("Concat", xs, {"axis": axis})


@EXAMPLES
@given(data=st.data(), shape=shapes, seed=seeds, const=st.booleans())
def test_split_property(data, shape, seed, const):
    r = len(shape)
    axis = data.draw(st.integers(-r, r - 1))
    dim = shape[axis]
    x = arrays(shape, np.float32, seed)
    how = data.draw(st.sampled_from(["split", "num_outputs", "equal"]))
    if how == "split":
        n = data.draw(st.integers(1, 4))
        cuts = sorted(data.draw(st.lists(st.integers(0, dim), min_size=n - 1, max_size=n - 1)))
        split = np.diff([0, *cuts, dim]).astype(I64)
        check("Split", [x, split], {"axis": axis}, n_outputs=n, const_inputs=(1,) if const else ())
    elif how == "num_outputs":
        # opset 18: chunks of ceil(dim / n), the last one smaller
        n = data.draw(st.integers(1, dim))
        if dim - math.ceil(dim / n) * (n - 1) < 0:
            n = dim
        check("Split", [x], {"axis": axis, "num_outputs": n}, n_outputs=n)
    else:
        divisors = [d for d in range(1, dim + 1) if dim % d == 0]
        n = data.draw(st.sampled_from(divisors))
        check("Split", [x], {"axis": axis}, n_outputs=n, opset=13)


def test_split_versions():
    x = arrays((7, 4))
    # opset 18: num_outputs with an uneven last chunk: 7 -> 3, 3, 1
    got = check("Split", [x], {"num_outputs": 3}, n_outputs=3)
    assert [g.shape[0] for g in got] == [3, 3, 1]
    # opset 11: split is an attribute
    check_direct("Split", [x], {"axis": 0, "split": [2, 5]}, n_outputs=2, opset=11)
    check_direct("Split", [x], {"axis": 1}, n_outputs=2, opset=11)
    # opset 13: split is an input
    check("Split", [x, np.array([1, 3], I64)], {"axis": 1}, n_outputs=2, opset=13)
    with pytest.raises(KernelError, match="split"):
        direct("Split", [x, np.array([1, 2], I64)], {"axis": 0}, n_outputs=2)


# ---------------------------------------------------------------------------------------------
# Slice

bounds = st.integers(-8, 8) | st.sampled_from([INT64_MAX, INT64_MIN, INT64_MIN + 1, INT64_MAX - 1])


@EXAMPLES
@given(data=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple), seed=seeds,
       const=st.booleans())
def test_slice_property(data, shape, seed, const):
    r = len(shape)
    x = arrays(shape, np.float32, seed)
    axes = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
    k = len(axes)
    starts = np.array(data.draw(st.lists(bounds, min_size=k, max_size=k)), I64)
    ends = np.array(data.draw(st.lists(bounds, min_size=k, max_size=k)), I64)
    steps = np.array(data.draw(st.lists(st.integers(-3, 3).filter(bool), min_size=k, max_size=k)), I64)
    axes = np.array([a - r if data.draw(st.booleans()) else a for a in axes], I64)
    form = data.draw(st.sampled_from(["all", "no_steps", "no_axes"]))
    if form == "no_axes":
        k = data.draw(st.integers(1, r))
        inputs = [x, starts[:k], ends[:k]] if len(starts) >= k else [x, starts, ends]
    elif form == "no_steps":
        inputs = [x, starts, ends, axes]
    else:
        inputs = [x, starts, ends, axes, steps]
    # onnx.reference slices with numpy, which empties a backward slice whose start is below -dim;
    # the spec (and onnxruntime) clamp that start to 0 first. onnxruntime in turn reads an end of
    # INT64_MAX on a backward slice as "to the front" (the spec clamps it to dim - 1).
    backward = [(s, e, a) for s, e, a, st in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist())
                if st < 0] if len(inputs) == 5 else []
    ref_wrong = any(s < -shape[a] for s, _, a in backward)
    ort_wrong = any(e == INT64_MAX for _, e, _ in backward)
    assume(not (ref_wrong and ort_wrong))
    check("Slice", inputs, const_inputs=tuple(range(1, len(inputs))) if const else (),
          oracle=run_onnxruntime if ref_wrong else run_reference)


def test_slice_regressions():
    x = arrays((5, 6))
    check("Slice", [x, np.array([INT64_MAX], I64), np.array([INT64_MIN], I64), np.array([1], I64),
                    np.array([-1], I64)])  # full reversal
    check("Slice", [x, np.array([-1, 4], I64), np.array([-100, 0], I64), np.array([0, 1], I64),
                    np.array([-2, -3], I64)])
    check("Slice", [x, np.array([10], I64), np.array([20], I64)])  # empty
    # a backward slice starting below -dim starts at 0 (spec, onnxruntime; onnx.reference returns nothing)
    got = check("Slice", [x, np.array([-9, INT64_MIN], I64), np.array([INT64_MIN, -7], I64), np.array([0, 1], I64),
                          np.array([-1, -1], I64)], oracle=run_onnxruntime)
    assert got[0].shape == (1, 1)
    check_direct("Slice", [x], {"starts": [1, -3], "ends": [4, 1000], "axes": [1, 0]}, opset=9)
    check_direct("Slice", [x], {"starts": [1], "ends": [-1]}, opset=1)
    with pytest.raises(KernelError, match="steps must not be 0"):
        direct("Slice", [x, np.array([0], I64), np.array([3], I64), np.array([0], I64), np.array([0], I64)])


# ---------------------------------------------------------------------------------------------
# Gather, GatherElements


@EXAMPLES
@given(data=st.data(), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), dtype=dtypes,
       seed=seeds, idx_dtype=st.sampled_from([np.int64, np.int32]))
def test_gather_property(data, shape, dtype, seed, idx_dtype):
    r = len(shape)
    axis = data.draw(st.integers(-r, r - 1))
    n = shape[axis]
    ishape = data.draw(st.lists(st.integers(0, 3), max_size=2).map(tuple))
    rng = np.random.default_rng(seed)
    indices = rng.integers(-n, n, size=ishape).astype(idx_dtype)  # negative indices count from the end
    check("Gather", [arrays(shape, dtype, seed), indices], {"axis": axis})
    # GatherElements: same shape as data except along axis, axis >= 0 (the reference's restrictions)
    axis = axis % r
    eshape = list(shape)
    eshape[axis] = data.draw(st.integers(1, 4))
    eidx = rng.integers(-n, n, size=eshape).astype(idx_dtype)
    check("GatherElements", [arrays(shape, dtype, seed), eidx], {"axis": axis})


def test_gather_regressions():
    x = arrays((4, 3))
    check("Gather", [x, np.array(-1, I64)], {"axis": 0})  # scalar index drops the axis
    check("Gather", [x, np.array([[0, -3], [2, 2]], I64)], {"axis": 1})
    with pytest.raises(KernelError, match="out of range"):
        direct("Gather", [x, np.array([4], I64)])
    # indices smaller than data along a non-gathered axis (onnxruntime allows it)
    check("GatherElements", [x, np.array([[1, 0], [-1, 2]], I64)], {"axis": 0}, oracle=run_onnxruntime)
    with pytest.raises(KernelError, match="out of range"):
        direct("GatherElements", [x, np.array([[5, 0, 0]], I64)], {"axis": 0})


# ---------------------------------------------------------------------------------------------
# Shape, Size, Constant, ConstantOfShape, Expand, Tile, Range


@EXAMPLES
@given(shape=st.lists(st.integers(0, 4), max_size=4).map(tuple), start=st.none() | st.integers(-6, 6),
       end=st.none() | st.integers(-6, 6))
def test_shape_size_property(shape, start, end):
    x = np.zeros(shape, np.float32)
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    # passes=[]: keep the nodes (with a static input shape, constant folding would fold them)
    model, feeds = single_node_model("Shape", [x], attrs)
    # onnx.reference does not clamp an end below -rank to 0 (the spec and onnxruntime do)
    oracle = run_onnxruntime if end is not None and end < -len(shape) else run_reference
    assert_close(run_byoc(model, feeds, passes=[]), oracle(model, feeds))
    assert_close(direct("Shape", [x], attrs, opset=15), oracle(model, feeds))
    model, feeds = single_node_model("Size", [x])
    assert_close(run_byoc(model, feeds, passes=[]), run_reference(model, feeds))


@pytest.mark.parametrize(
    "attrs",
    [
        {"value_float": 1.5},
        {"value_floats": [1.0, -2.0]},
        {"value_int": 7},
        {"value_ints": [1, 2, 3]},
        {"value": onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
        {"value": onnx.numpy_helper.from_array(np.array([True, False]))},
    ],
    ids=lambda a: next(iter(a)),
)
def test_constant(attrs):
    check("Constant", [], attrs, passes=[])  # the kernel runs at run time
    check("Constant", [], attrs)  # folded at compile time


def test_constant_strings():
    (s,) = direct("Constant", [], {"value_string": "abc"})
    assert s.shape == () and s.item() == "abc"
    (ss,) = direct("Constant", [], {"value_strings": ["a", "bc"]})
    assert ss.tolist() == ["a", "bc"]


@EXAMPLES
@given(data=st.data(), full=st.lists(st.integers(0, 3), max_size=4).map(tuple), dtype=dtypes, seed=seeds,
       const=st.booleans())
def test_expand_constant_of_shape_property(data, full, dtype, seed, const):
    def reduce(shape):
        k = data.draw(st.integers(0, len(shape)))
        return tuple(1 if data.draw(st.booleans()) else d for d in shape[k:])

    x = arrays(reduce(full), dtype, seed)
    shape = np.array(reduce(full), I64)
    check("Expand", [x, shape], const_inputs=(1,) if const else ())
    value = arrays((1,), dtype, seed + 1)
    check("ConstantOfShape", [np.array(full, I64)], {"value": onnx.numpy_helper.from_array(value)},
          const_inputs=(0,) if const else ())


def test_scalar_output_of_folded_node():
    # constant folding runs the kernel at compile time; a 0-d result must stay 0-d
    check("ConstantOfShape", [np.array([], I64)], const_inputs=(0,))
    check("Expand", [np.array(3.0, np.float32), np.array([], I64)], const_inputs=(1,))


def test_constant_of_shape_default_is_float_zero():
    got = check("ConstantOfShape", [np.array([2, 3], I64)])
    assert got[0].dtype == np.float32
    check("ConstantOfShape", [np.array([], I64)])  # a scalar


@EXAMPLES
@given(data=st.data(), shape=st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple), dtype=dtypes,
       seed=seeds)
def test_tile_property(data, shape, dtype, seed):
    reps = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape))), I64)
    check("Tile", [arrays(shape, dtype, seed), reps])


@EXAMPLES
@given(dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.int16]),
       start=st.integers(-20, 20), limit=st.integers(-20, 20), delta=st.integers(-6, 6).filter(bool),
       frac=st.sampled_from([1, 2, 4, 10, 3]))
def test_range_property(dtype, start, limit, delta, frac):
    if np.dtype(dtype).kind == "f":
        start, limit, delta = start / frac, limit / frac, delta / frac
    check("Range", [np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)])


def test_range_errors():
    with pytest.raises(KernelError, match="delta"):
        direct("Range", [np.array(0, I64), np.array(5, I64), np.array(0, I64)])


# ---------------------------------------------------------------------------------------------
# Pad


@EXAMPLES
@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), dtype=dtypes,
       seed=seeds, mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]), const=st.booleans())
def test_pad_property(data, shape, dtype, seed, mode, const):
    r = len(shape)
    x = arrays(shape, dtype, seed)
    use_axes = data.draw(st.booleans())
    axes = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True)) if use_axes else None
    k = len(axes) if use_axes else r
    pads = np.array(data.draw(st.lists(st.integers(0, 5), min_size=2 * k, max_size=2 * k)), I64)
    value = arrays((), dtype, seed + 1) if mode == "constant" and data.draw(st.booleans()) else None
    inputs = [x, pads, value]
    if use_axes:
        inputs.append(np.array([a - r if data.draw(st.booleans()) else a for a in axes], I64))
    check("Pad", inputs, {"mode": mode}, const_inputs=(1, 2, 3) if const else ())


@EXAMPLES
@given(data=st.data(), shape=st.lists(st.integers(2, 6), min_size=1, max_size=3).map(tuple), seed=seeds,
       mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]))
def test_pad_negative_property(data, shape, seed, mode):
    # negative pads crop; onnx.reference cannot (np.pad), so onnxruntime is the oracle
    r = len(shape)
    pads = []
    for i in range(2 * r):
        dim = shape[i % r]
        pads.append(data.draw(st.integers(-((dim - 1) // 2), 3)))  # keep at least one element
    if mode == "reflect":  # onnxruntime limits reflect pads to the cropped length - 1
        for i in range(r):
            kept = shape[i] - max(0, -pads[i]) - max(0, -pads[i + r])
            pads[i] = min(pads[i], kept - 1)
            pads[i + r] = min(pads[i + r], kept - 1)
    check("Pad", [arrays(shape, np.float32, seed), np.array(pads, I64)], {"mode": mode}, oracle=run_onnxruntime)


def test_pad_versions():
    x = arrays((3, 4))
    # opset 2: pads and value are attributes
    check_direct("Pad", [x], {"pads": [1, 0, 2, 3], "mode": "constant", "value": 2.5}, opset=2)
    check_direct("Pad", [x], {"pads": [2, 1, 0, 3], "mode": "reflect"}, opset=2)
    # opset 11: constant_value input, no axes
    check("Pad", [x, np.array([1, 1, 1, 1], I64), np.array(-1.0, np.float32)], opset=11)
    check("Pad", [arrays((2, 3), np.int32), np.array([0, 1, 2, 0], I64)], {"mode": "edge"}, opset=13)
    # opset 19: wrap
    check("Pad", [x, np.array([3, 5, 2, 6], I64)], {"mode": "wrap"}, opset=19)
    with pytest.raises(KernelError, match="mode"):
        direct("Pad", [x, np.array([1, 1, 1, 1], I64)], {"mode": "wrap"}, opset=18)
    # reflect of a length-1 axis repeats the element, as np.pad does
    check("Pad", [arrays((1, 3)), np.array([2, 0, 1, 0], I64)], {"mode": "reflect"})


# ---------------------------------------------------------------------------------------------
# resource budget: value-sized outputs are checked before they are allocated


def test_constant_of_shape_8gb_refused_before_allocation():
    # 2 * 1024**3 float32 = 8 GiB asked for by a model of about a hundred bytes
    model, feeds = single_node_model("ConstantOfShape", [np.array([2, 1024, 1024, 1024], I64)])
    assert len(model.SerializeToString()) < 200
    compiled = byoc.compile(model, targets=[])
    tracemalloc.start()
    try:
        with pytest.raises(ResourceLimitError, match=r"constantofshape_0.*exceeds the budget"):
            compiled.run(feeds)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated before the refusal"


def test_constant_of_shape_8gb_constant_shape_refused_at_compile_time():
    # with the shape a constant, constant folding runs the kernel, which refuses under the budget
    model, _ = single_node_model("ConstantOfShape", [np.array([2, 1024, 1024, 1024], I64)], const_inputs=(0,))
    with pytest.raises(ResourceLimitError):
        byoc.compile(model, targets=[]).run({})


def test_constant_of_shape_tiny_budget():
    budget = byoc.Budget(max_tensor_bytes=1000)
    model, feeds = single_node_model("ConstantOfShape", [np.array([10, 30], I64)])  # 1200 bytes
    compiled = byoc.compile(model, targets=[], budget=budget)
    with pytest.raises(ResourceLimitError, match="max_tensor_bytes"):
        compiled.run(feeds)
    ok = compiled.run({"in0": np.array([10, 20], I64)})  # 800 bytes fit
    assert ok["out0"].shape == (10, 20)


@pytest.mark.parametrize(
    "op, inputs, attrs",
    [
        ("Expand", [np.ones((1, 4), np.float32), np.array([1000, 4], I64)], {}),
        ("Tile", [np.ones((2, 2), np.float32), np.array([20, 10], I64)], {}),
        ("Range", [np.array(0, I64), np.array(1000, I64), np.array(1, I64)], {}),
        ("Pad", [np.ones((2, 2), np.float32), np.array([0, 0, 300, 0], I64)], {"mode": "edge"}),
        ("ConstantOfShape", [np.array([1 << 62, 4], I64)], {}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_value_sized_ops_respect_budget(op, inputs, attrs):
    budget = byoc.Budget(max_tensor_bytes=2048)
    model, feeds = single_node_model(op, inputs, attrs)
    compiled = byoc.compile(model, targets=[], budget=budget)
    with pytest.raises(ResourceLimitError, match=f"{op.lower()}_0"):
        compiled.run(feeds)


def test_negative_shape_is_a_kernel_error():
    with pytest.raises(KernelError, match="negative"):
        direct("ConstantOfShape", [np.array([2, -1], I64)])
    with pytest.raises(KernelError, match="negative"):
        direct("Tile", [np.ones((2,), np.float32), np.array([-1], I64)])


def test_pad_strings_and_complex128():
    # dtypes without a same-size unsigned int take the numpy path of gather_nd
    x = np.array([["a", "b"], ["c", "d"]], dtype=object)
    (got,) = direct("Pad", [x, np.array([1, 0, 0, 1], I64), np.array("z", dtype=object)])
    assert got.tolist() == [["z", "z", "z"], ["a", "b", "z"], ["c", "d", "z"]]
    (got,) = direct("Pad", [x, np.array([0, 1, 0, 2], I64)], {"mode": "reflect"})
    assert got.tolist() == [["b", "a", "b", "a", "b"], ["d", "c", "d", "c", "d"]]
    z = (np.arange(8) + 1j).reshape(2, 4)
    (got,) = direct("Pad", [z, np.array([0, 1, 0, 1], I64)], {"mode": "wrap"}, opset=19)
    np.testing.assert_array_equal(got, np.pad(z, [(0, 0), (1, 1)], mode="wrap"))
