"""Honest defaults (issue 13, acceptance 4): on a machine without TensorRT and a CUDA GPU,
``byoc.compile(model)`` does not select the emulated jetson target; ``targets=["jetson"]`` still
runs its emulation; ``byoc targets`` says which targets are available."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
import byoc.plugins

byoc_jetson = pytest.importorskip("byoc_jetson")
from byoc_jetson.options import tensorrt_available  # noqa: E402

pytestmark = pytest.mark.skipif(tensorrt_available(), reason="TensorRT and a CUDA GPU are usable here")


def conv_model():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def jetson_and_cpu(monkeypatch):
    monkeypatch.setenv("BYOC_PLUGINS", "jetson,cpu")
    monkeypatch.setattr(byoc.plugins, "_registry", None)  # rebuilt with the restriction; restored afterwards


def test_default_does_not_select_the_emulated_jetson(jetson_and_cpu):
    assert "jetson" in {t.name for t in byoc.list_targets()}  # installed, but ...
    cm = byoc.compile(conv_model())
    assert "jetson" not in cm.options["targets"]
    assert all(r.region.target != "jetson" for r in cm.regions)
    assert "not present" in cm.options["skipped_targets"]["jetson"]


def test_named_jetson_runs_its_emulation(jetson_and_cpu):
    m = conv_model()
    cm = byoc.compile(m, targets=["jetson"])
    assert [r.region.target for r in cm.regions] == ["jetson"]
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_allclose(cm.run(x)["y"], byoc.compile(m, targets=[]).run(x)["y"], rtol=1e-2, atol=1e-2)


def test_targets_command_shows_availability(jetson_and_cpu, capsys):
    from byoc.cli import main

    assert main(["targets", "--json"]) == 0
    doc = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert doc["jetson"]["available"] is False and doc["cpu"]["available"] is True
    assert main(["targets"]) == 0
    assert "not available here" in capsys.readouterr().out
