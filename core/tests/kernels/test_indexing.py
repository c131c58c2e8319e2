"""GatherND and CumProd (byoc.kernels.indexing) against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc.errors import KernelError
from byoc.kernels.registry import NodeSpec, make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, run_reference, single_node_model

EXAMPLES = settings(max_examples=60)


@st.composite
def gather_nd_cases(draw):
    b = draw(st.integers(0, 2))
    data_shape = [draw(st.integers(1, 4)) for _ in range(b + draw(st.integers(1, 3)))]
    k = draw(st.integers(1, len(data_shape) - b))
    middle = [draw(st.integers(0 if b else 1, 3)) for _ in range(draw(st.integers(0, 2)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dims = np.array(data_shape[b:b + k])
    # every index in [-dim, dim): negative ones count from the end
    idx = rng.integers(-dims, dims, size=(*data_shape[:b], *middle, k))
    dtype = draw(st.sampled_from([np.float32, np.int64, np.bool_, np.float16]))
    data = rng.standard_normal(data_shape).astype(dtype)
    return data, idx.astype(draw(st.sampled_from([np.int64, np.int32]))), b


@EXAMPLES
@given(gather_nd_cases())
def test_gather_nd_matches_reference(case):
    data, idx, b = case
    model, feeds = single_node_model("GatherND", [data, idx.astype(np.int64)], {"batch_dims": b})
    expected = run_reference(model, feeds)
    assert_close(run_byoc(model, feeds), expected)
    # int32 indices (onnxruntime and the spec take int64 only; byoc takes any integer type)
    run = make_kernel(NodeSpec("GatherND", name="g", attrs={"batch_dims": b}, n_inputs=2))
    assert_close(run(data, idx), expected)


@pytest.mark.parametrize("bad", [3, -4])
def test_gather_nd_index_out_of_range_names_the_node(bad):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    model, feeds = single_node_model("GatherND", [data, np.array([[0, 1], [bad, 0]], np.int64)])
    with pytest.raises(KernelError, match=r"gathernd_0.*index out of range"):
        run_byoc(model, feeds)


def test_gather_nd_refuses_bad_shapes():
    run = make_kernel(NodeSpec("GatherND", name="g", attrs={"batch_dims": 1}, n_inputs=2))
    data = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(KernelError, match="batch dimensions"):
        run(data, np.zeros((3, 1), np.int64))
    with pytest.raises(KernelError, match="do not fit"):
        run(data, np.zeros((2, 3), np.int64))  # k = 3 > rank - batch_dims
    with pytest.raises(KernelError, match="integer"):
        run(data, np.zeros((2, 1), np.float32))


def test_gather_nd_empty_indices():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    model, feeds = single_node_model("GatherND", [data, np.zeros((0, 1), np.int64)])
    (got,) = run_byoc(model, feeds)
    assert got.shape == (0, 3)


@EXAMPLES
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), exclusive=st.integers(0, 1),
       reverse=st.integers(0, 1), dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64]),
       data=st.data())
def test_cumprod_matches_onnxruntime(shape, exclusive, reverse, dtype, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(len(shape))
    x = (rng.uniform(-2, 2, shape) if np.dtype(dtype).kind == "f" else rng.integers(-3, 4, shape)).astype(dtype)
    model, feeds = single_node_model("CumProd", [x, np.array(axis, np.int64)],
                                     {"exclusive": exclusive, "reverse": reverse}, opset=26)
    assert_close(run_byoc(model, feeds), run_onnxruntime(model, feeds), rtol=1e-5)
