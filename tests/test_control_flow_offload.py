"""Regions inside control flow, with a dynamic batch dimension (the test plugin's testchip).

An If whose branches hold Conv blocks, a Loop whose body holds a MatMul, batch size symbolic:
regions are offloaded inside both subgraphs, outputs match onnxruntime for batch 1, 3 and 8,
and the report shows where each node ran.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.testing.oracle import run_onnxruntime

from itest_models import registry, require_test_plugins


def _model():
    rng = np.random.default_rng(0)

    def w(name, *shape, scale=0.3):
        return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    then_branch = h.make_graph(
        [
            h.make_node("Conv", ["x", "tw1", "tb1"], ["t1"], pads=[1, 1, 1, 1], name="then_conv1"),
            h.make_node("Relu", ["t1"], ["t2"], name="then_relu1"),
            h.make_node("Conv", ["t2", "tw2"], ["t3"], pads=[1, 1, 1, 1], name="then_conv2"),
            h.make_node("Relu", ["t3"], ["then_out"], name="then_relu2"),
        ],
        "then", [], [h.make_tensor_value_info("then_out", T.FLOAT, ["N", 4, 8, 8])],
        [w("tw1", 4, 3, 3, 3), w("tb1", 4, scale=0.1), w("tw2", 4, 4, 3, 3)],
    )
    else_branch = h.make_graph(
        [
            h.make_node("Conv", ["x", "ew1"], ["e1"], name="else_conv"),
            h.make_node("Sigmoid", ["e1"], ["else_out"], name="else_sigmoid"),
        ],
        "else", [], [h.make_tensor_value_info("else_out", T.FLOAT, ["N", 4, 8, 8])],
        [w("ew1", 4, 3, 1, 1)],
    )
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            h.make_node("MatMul", ["v_in", "lw"], ["m"], name="body_matmul"),
            h.make_node("Tanh", ["m"], ["v_out"], name="body_tanh"),
        ],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, ["N", 16])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("v_out", T.FLOAT, ["N", 16])],
        [w("lw", 16, 16)],
    )
    nodes = [
        h.make_node("If", ["flag"], ["feat"], then_branch=then_branch, else_branch=else_branch, name="branch"),
        h.make_node("GlobalAveragePool", ["feat"], ["pooled"], name="gap"),
        h.make_node("Reshape", ["pooled", "shape4"], ["vec4"], name="flatten"),
        h.make_node("MatMul", ["vec4", "up"], ["v0"], name="expand"),
        h.make_node("Loop", ["trips", "", "v0"], ["v_final"], body=body, name="refine"),
        h.make_node("Gemm", ["v_final", "head_w", "head_b"], ["logits"], name="head"),
    ]
    graph = h.make_graph(
        nodes, "control_flow",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8]), h.make_tensor_value_info("flag", T.BOOL, [])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["N", 5])],
        [w("up", 4, 16), w("head_w", 16, 5), w("head_b", 5, scale=0.1),
         nh.from_array(np.array([-1, 4], np.int64), "shape4"), nh.from_array(np.array(3, np.int64), "trips")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.fixture
def testchip_registry(monkeypatch):
    require_test_plugins()
    reg, _ = registry(monkeypatch)
    return reg


def test_regions_inside_if_and_loop_with_dynamic_batch(testchip_registry):
    model = _model()
    compiled = byoc.compile(model, targets=["testchip"], registry=testchip_registry)
    records = compiled.records
    scopes = {rec.scope for rec in records.values() if rec.device == "testchip"}
    assert "branch/then_branch" in scopes and "branch/else_branch" in scopes, scopes
    assert "refine/body" in scopes, scopes
    assert records["then_conv1"].device == "testchip" and records["body_matmul"].device == "testchip"
    assert records["branch"].device == "host" and records["refine"].device == "host"
    # no region crosses a subgraph boundary
    for cr in compiled.regions:
        assert len({records[n.name].scope for n in cr.region.nodes}) == 1

    rng = np.random.default_rng(1)
    for batch in (1, 3, 8):
        for flag in (True, False):
            feeds = {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32), "flag": np.array(flag)}
            got = compiled.run(feeds)["logits"]
            want = run_onnxruntime(model, feeds)[0]
            assert got.shape == (batch, 5)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    report = compiled.report_data()
    rows = {row["name"]: row for row in report["nodes"]}
    assert rows["then_conv1"]["device"] == "testchip" and rows["then_conv1"]["scope"] == "branch/then_branch"
    assert rows["body_matmul"]["scope"] == "refine/body"
    json.dumps(report)
    text = compiled.report()
    assert "branch/then_branch" in text and "refine/body" in text
