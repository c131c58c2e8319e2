"""byoc-cpu as the host executor: on the conformance kit's random operator instances, a model run by
byoc-cpu's host kernels (``targets=[]``) gives the reference kernels' results (``host="reference"``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import byoc
from byoc.plugins import host_executor
from byoc.testing.cases import graph_cases
from cpu_helpers import REGISTRY

#: the operators byoc-cpu's executor runs with its own kernels, and some whose range work its pool splits
OPS = ["Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool", "Add", "Relu",
       "Softmax", "ReduceSum", "BatchNormalization"]


def test_byoc_cpu_is_the_host_executor_where_installed():
    executor = host_executor(None, REGISTRY)
    assert executor is not None and executor.name == "cpu" and executor.plugin == "cpu"
    assert host_executor("reference", REGISTRY) is None


@pytest.mark.parametrize("op", OPS)
def test_host_executor_matches_the_reference(op):
    strategy = graph_cases(op)
    if strategy is None:
        pytest.skip(f"the kit has no instances of {op}")

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def check(case):
        model = case.model()
        tuned = byoc.compile(model, wait=True, targets=[], registry=REGISTRY)
        plain = byoc.compile(model, wait=True, targets=[], registry=REGISTRY, host="reference")
        assert tuned._plan.executor is not None and plain._plan.executor is None
        got, want = tuned.run(case.feeds), plain.run(case.feeds)
        for name in want:
            w, g = np.asarray(want[name]), np.asarray(got[name])
            assert g.shape == w.shape and g.dtype == w.dtype, name
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=case.describe())
            else:
                np.testing.assert_array_equal(g, w, err_msg=case.describe())

    check()


def test_nodes_byoc_cpu_declines_run_on_the_reference():
    # GatherND (the attention-mask lookup of transformers' exports) has no byoc-cpu kernel; the
    # Relu before it has one
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GatherND", ["r", "i"], ["y"], batch_dims=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
              helper.make_tensor_value_info("i", TensorProto.INT64, [2, 5, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    i = np.array([[[0], [2], [-1], [1], [0]], [[1], [1], [0], [2], [-3]]], np.int64)
    compiled = byoc.compile(model, targets=[], registry=REGISTRY)
    assert compiled._plan.executor is not None
    want = np.maximum(x, 0)[np.arange(2)[:, None], i[..., 0]]
    np.testing.assert_array_equal(compiled.run({"x": x, "i": i})["y"], want)
