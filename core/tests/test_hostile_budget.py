"""Class 2 of the hardening issue: every allocation sized from model data or feeds is checked first.

* structure: kernel modules allocate only through the budgeted allocator (an AST scan);
* the allocator's size arithmetic matches numpy's (hypothesis), so a refusal is never wrong;
* Pad, Loop/Scan accumulation, folded constants and feeds, each with several cases.

The memory side (refusals past the budget cost no memory) is ``test_budget_memory.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
import byoc.kernels
from byoc.budget import Budget, einsum_shape
from byoc.errors import ByocError, ResourceLimitError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.allocations import direct_allocations

from budget_cases import _loop_doubles, _scan_accumulates, _single

KERNELS = Path(byoc.kernels.__file__).parent

# (module, function): why a direct numpy allocation there is bounded without a check of its own
ALLOWED = {
    ("indexing.py", "make_trilu.run"): "the size of its input, checked just before",
    ("quant.py", "broadcast_param"): "checked just before (blocks * block_size)",
    ("resize.py", "_source_coords"): "one coordinate per output position; axis_taps checks first",
    ("resize.py", "axis_taps"): "the tap table; checked at the top of axis_taps",
}


def test_kernel_modules_allocate_only_through_the_budgeted_allocator():
    offenders = []
    used = set()
    for path in sorted(KERNELS.glob("*.py")):
        for scope, line, call in direct_allocations(path):
            if (path.name, scope) in ALLOWED:
                used.add((path.name, scope))
                continue
            offenders.append(f"{path.name}:{line} in {scope or '<module>'}: np.{call}")
    assert not offenders, ("kernel code calls numpy allocators directly; use spec.alloc (byoc.budget.Alloc), "
                           "which checks the budget first:\n" + "\n".join(offenders))
    assert used == set(ALLOWED), f"stale allow-list entries: {sorted(set(ALLOWED) - used)}"


def test_the_scan_sees_a_direct_allocation(tmp_path):
    src = tmp_path / "k.py"
    src.write_text("import numpy as np\n\ndef make(spec):\n    def run(x):\n        return np.tile(x, 9)\n"
                   "    return run\n\n@_jit\ndef inner(n):\n    return np.empty(n)\n")
    assert direct_allocations(src) == [("make.run", 5, "tile")]


# -------------------------------------------------------------------------------------------------
# the allocator's arithmetic agrees with numpy's

SMALL = 4096  # bytes
small_dims = st.lists(st.integers(0, 6), min_size=0, max_size=3)


def _alloc(limit: int = SMALL):
    return Budget(max_tensor_bytes=limit).guard("node 't' (Test)")


def _agrees(make, expected: np.ndarray, limit: int = SMALL):
    """``make(alloc)`` either equals ``expected`` or is refused exactly when ``expected`` is over the limit."""
    if expected.nbytes > limit:
        with pytest.raises(ResourceLimitError, match="node 't'"):
            make(_alloc(limit))
    else:
        got = make(_alloc(limit))
        np.testing.assert_array_equal(got, expected)
        assert got.shape == expected.shape and got.dtype == expected.dtype


@given(shape=small_dims.filter(lambda s: len(s) >= 1), n=st.integers(1, 5), axis=st.integers(0, 2),
       limit=st.sampled_from([0, 64, 512, SMALL]))
def test_concatenate_and_stack_agree_with_numpy(shape, n, axis, limit):
    axis = axis % len(shape)
    xs = [np.full(shape, k, np.float32) for k in range(n)]
    _agrees(lambda a: a.concatenate(xs, axis), np.concatenate(xs, axis), limit)
    _agrees(lambda a: a.stack(xs, axis), np.stack(xs, axis), limit)


@given(data_shape=small_dims.filter(lambda s: len(s) >= 1 and s[0] > 0), idx_shape=small_dims,
       reps=st.lists(st.integers(0, 5), min_size=0, max_size=4), limit=st.sampled_from([0, 64, 512, SMALL]))
def test_take_and_tile_agree_with_numpy(data_shape, idx_shape, reps, limit):
    data = np.arange(int(np.prod(data_shape)), dtype=np.int64).reshape(data_shape)
    idx = np.zeros(idx_shape, np.int64)
    _agrees(lambda a: a.take(data, idx, 0), np.take(data, idx, 0), limit)
    _agrees(lambda a: a.tile(data, reps), np.tile(data, reps), limit)


@given(x=st.lists(st.booleans(), max_size=64), limit=st.sampled_from([0, 64, 256, 1024]))
def test_nonzero_is_refused_when_its_index_arrays_are_over_the_budget(x, limit):
    arr = np.array(x, dtype=np.bool_).reshape(-1)
    expected = np.array(np.nonzero(arr), dtype=np.int64)
    if 2 * expected.nbytes > limit:
        with pytest.raises(ResourceLimitError):
            _alloc(limit).nonzero(arr)
    else:
        np.testing.assert_array_equal(_alloc(limit).nonzero(arr), expected)


_letters = "abcd"


@st.composite
def einsum_problems(draw):
    n_ops = draw(st.integers(1, 3))
    sizes = {c: draw(st.integers(1, 4)) for c in _letters}
    terms = [draw(st.lists(st.sampled_from(_letters), min_size=0, max_size=3, unique=True)) for _ in range(n_ops)]
    used = sorted({c for t in terms for c in t})
    explicit = draw(st.booleans())
    out = draw(st.lists(st.sampled_from(used), unique=True)) if (explicit and used) else None
    eq = ",".join("".join(t) for t in terms) + ("->" + "".join(out) if out is not None else "")
    ops = [np.ones([sizes[c] for c in t], np.float32) for t in terms]
    return eq, ops


@given(einsum_problems())
def test_einsum_shape_matches_numpy(problem):
    eq, ops = problem
    assert einsum_shape(eq, [o.shape for o in ops]) == np.einsum(eq, *ops).shape


@pytest.mark.parametrize("eq,shapes,expected", [
    ("...ij,...jk->...ik", [(2, 3, 4), (3, 4, 5)], None),  # batch 2 vs 3 does not broadcast
    ("...ij,...jk->...ik", [(1, 3, 4), (7, 4, 5)], (7, 3, 5)),
    ("i...,i->...", [(3, 5, 6), (3,)], (5, 6)),
    ("ii->i", [(4, 4)], (4,)),
    ("ij", [(2, 3)], (2, 3)),
    ("ba", [(2, 3)], (3, 2)),
])
def test_einsum_shape_with_ellipsis_and_repeats(eq, shapes, expected):
    assert einsum_shape(eq, shapes) == expected


# -------------------------------------------------------------------------------------------------
# Pad: the output size is known from the pads; index maps are built only after the check


def _pad_kernel(mode: str, limit: int):
    spec = NodeSpec("Pad", name="pad", opset=19, attrs={"mode": mode}, n_inputs=4,
                    budget=Budget(max_tensor_bytes=limit))
    return make_kernel(spec)


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       pads=st.lists(st.integers(0, 5), min_size=6, max_size=6),
       mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]),
       limit=st.sampled_from([16, 256, SMALL, 1 << 16]))
def test_pad_matches_numpy_or_is_refused(shape, pads, mode, limit):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1
    r = len(shape)
    p = pads[:r] + pads[3:3 + r]
    expected = np.pad(x, list(zip(p[:r], p[r:])), mode=mode)
    run = _pad_kernel(mode, limit)
    if expected.nbytes > limit:
        with pytest.raises(ResourceLimitError, match="node 'pad'"):
            run(x, np.array(p, np.int64))
        return
    # the int64 index maps (and their temporaries) count too: at most 10x a float32 output
    try:
        got = run(x, np.array(p, np.int64))[0]
    except ResourceLimitError as exc:
        assert limit < 16 * expected.nbytes and "index map" in str(exc)
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1 << 26] * 4, [0, 0, 0, 1 << 40], [1 << 62, 0, 0, 0]])
def test_absurd_pads_are_refused_before_any_index_map(mode, pads):
    with pytest.raises(ResourceLimitError, match="node 'pad'"):
        _pad_kernel(mode, 1 << 20)(np.ones((1, 1), np.float32), np.array(pads, np.int64))


def test_huge_pads_on_an_empty_tensor_give_an_empty_tensor():
    out = _pad_kernel("constant", 1 << 20)(np.ones((0, 1), np.float32), np.array([0, 0, 0, 1 << 40], np.int64))[0]
    assert out.shape == (0, (1 << 40) + 1)


def test_resize_to_an_empty_tensor_builds_no_tap_table():
    spec = NodeSpec("Resize", name="r", opset=19, attrs={"mode": "linear"}, n_inputs=4,
                    budget=Budget(max_tensor_bytes=1 << 20))
    out = make_kernel(spec)(np.ones((1, 2), np.float32), None, None, np.array([0, 1 << 40], np.int64))[0]
    assert out.shape == (0, 1 << 40)


def test_resize_tap_table_is_checked_for_an_extreme_antialias_downscale():
    spec = NodeSpec("Resize", name="r", opset=19, attrs={"mode": "cubic", "antialias": 1}, n_inputs=4,
                    budget=Budget(max_tensor_bytes=1 << 20))
    with pytest.raises(ResourceLimitError, match="tap table"):
        make_kernel(spec)(np.ones((1, 1 << 16), np.float32), None, np.array([1, 1e-3], np.float32), None)


# -------------------------------------------------------------------------------------------------
# Loop and Scan: accumulation is checked as it happens


def _budget(limit: int = 1 << 20) -> Budget:
    return Budget(max_tensor_bytes=limit, max_total_bytes=4 * limit)


def test_loop_carried_value_that_doubles_is_refused():
    compiled = byoc.compile(_loop_doubles(), targets=[], budget=_budget())
    with pytest.raises(ResourceLimitError, match="node 'double'"):
        compiled.run({"x0": np.ones(1024, np.float32)})


def test_loop_carried_value_within_budget_runs():
    model = _loop_doubles()
    model.graph.initializer[1].CopyFrom(nh.from_array(np.array(3, np.int64), "M"))
    out = byoc.compile(model, targets=[], budget=_budget()).run({"x0": np.ones(1024, np.float32)})
    assert next(iter(out.values())).shape == (8192,)


@pytest.mark.parametrize("limit", [1 << 16, 1 << 18, 1 << 20])
def test_scan_outputs_are_checked_as_they_accumulate(limit):
    compiled = byoc.compile(_scan_accumulates(), targets=[], budget=_budget(limit))
    with pytest.raises(ResourceLimitError, match=r"node 'scan'.*scan output 0 after \d+ iterations"):
        compiled.run({"xs": np.ones((8192, 1), np.float32)})


def test_loop_scan_output_refused_after_as_many_iterations_as_fit():
    from budget_cases import _loop_scan_accumulates

    compiled = byoc.compile(_loop_scan_accumulates(), targets=[], budget=_budget(1 << 20))
    # 64 KiB per iteration: the 17th crosses 1 MiB
    with pytest.raises(ResourceLimitError, match="after 17 iterations"):
        compiled.run({"M": np.array(1000, np.int64)})
    out = compiled.run({"M": np.array(16, np.int64)})
    assert next(iter(out.values())).shape == (16, 16384)


# -------------------------------------------------------------------------------------------------
# constant folding counts against max_total_bytes


def _fills(sizes: list[int], extra: list | None = None) -> onnx.ModelProto:
    nodes, outs, inits = [], [], []
    for k, n in enumerate(sizes):
        inits.append(nh.from_array(np.array([n], np.int64), f"s{k}"))
        nodes.append(h.make_node("ConstantOfShape", [f"s{k}"], [f"c{k}"], name=f"fill{k}",
                                 value=nh.from_array(np.ones(1, np.float32))))
        outs.append(h.make_tensor_value_info(f"c{k}", T.FLOAT, None))
    graph = h.make_graph(nodes + (extra or []), "fills", [], outs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("n_fills,refused", [(3, False), (4, False), (5, True), (9, True)])
def test_folded_constants_count_against_max_total_bytes(n_fills, refused):
    # 1 MiB per tensor, 4 MiB in all; each fill is 1 MiB minus a little
    budget = Budget(max_tensor_bytes=1 << 20, max_total_bytes=4 << 20)
    model = _fills([(1 << 18) - 64] * n_fills)
    if refused:
        with pytest.raises(ResourceLimitError, match=r"node 'fill\d' \(ConstantOfShape\).*max_total_bytes"):
            byoc.compile(model, targets=[], budget=budget)
    else:
        out = byoc.compile(model, targets=[], budget=budget).run({})
        assert len(out) == n_fills


def test_folds_that_replace_their_input_do_not_count_twice():
    # a chain of Transposes over a 3 MiB initializer: each fold frees the constant it consumed
    w = np.ones((768, 1024), np.float32)
    nodes = [h.make_node("Transpose", ["w" if k == 0 else f"t{k - 1}"], [f"t{k}"], name=f"tr{k}") for k in range(6)]
    graph = h.make_graph(nodes, "chain", [], [h.make_tensor_value_info("t5", T.FLOAT, None)], [nh.from_array(w, "w")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    out = byoc.compile(model, targets=[], budget=Budget(max_tensor_bytes=4 << 20, max_total_bytes=7 << 20)).run({})
    assert out["t5"].shape == (768, 1024)


# -------------------------------------------------------------------------------------------------
# feeds: the logical size counts


def _relu(shape):
    """Relu of an input declared with symbolic dims (a declared shape past the budget is refused
    when the model loads; these tests are about the feed)."""
    model = _single("Relu", {"x": np.ones(shape, np.float32)})
    dims = [f"d{i}" for i in range(len(shape))]
    model.graph.input[0].CopyFrom(h.make_tensor_value_info("x", T.FLOAT, dims))
    return model


def test_declared_input_past_the_budget_is_refused_when_loading():
    with pytest.raises(ResourceLimitError, match="input 'x'"):
        byoc.compile(_single("Relu", {"x": np.ones((4096, 4096), np.float32)}), targets=[], budget=_budget(16 << 20))


@pytest.mark.parametrize("shape", [(4096, 4096), (1 << 20, 64), (2, 1 << 23)])
def test_zero_stride_feed_past_the_budget_is_refused_at_the_input_check(shape):
    compiled = byoc.compile(_relu(shape), targets=[], budget=_budget(16 << 20))
    with pytest.raises(ResourceLimitError, match="input 'x'"):
        compiled.run({"x": np.broadcast_to(np.ones(1, np.float32), shape)})


def test_zero_stride_feed_within_the_budget_runs():
    compiled = byoc.compile(_relu((64, 64)), targets=[], budget=_budget(1 << 20))
    out = compiled.run({"x": np.broadcast_to(np.float32(-1), (64, 64))})
    assert not out["y0"].any()


def test_refusals_are_byoc_errors():
    assert issubclass(ResourceLimitError, ByocError)


def test_the_allocator_takes_any_number_of_arrays_and_negative_axes():
    xs = [np.full((2, 3), k, np.float32) for k in range(100)]
    np.testing.assert_array_equal(_alloc(1 << 20).concatenate(xs, -1), np.concatenate(xs, -1))
    np.testing.assert_array_equal(_alloc(1 << 20).stack(xs, -1), np.stack(xs, -1))
    data = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(_alloc(1 << 20).take(data, np.array([[0, 3]]), -1), np.take(data, [[0, 3]], -1))
    with pytest.raises(ResourceLimitError):
        _alloc(64).take(data, np.zeros(100, np.int64), -1)
