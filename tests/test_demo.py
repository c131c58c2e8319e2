"""``examples/demo.py``: each target alone then the default, PASS/FAIL against each target's declared
tolerance, calibration samples for int8 targets, and a non-zero exit status on any FAIL."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")
pytest.importorskip("byoc_vitis")
pytest.importorskip("byoc_cpu")
DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def _demo():
    import sys

    spec = importlib.util.spec_from_file_location("byoc_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules["byoc_demo"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def small(tmp_path, monkeypatch):
    import byoc.plugins

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    path = tmp_path / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    monkeypatch.setenv("BYOC_PLUGINS", "cpu,vitis")
    monkeypatch.setattr(byoc.plugins, "_registry", None)  # rebuilt with the restriction; restored afterwards
    return path


def test_demo_passes_each_target_then_the_default(small, capsys):
    assert _demo().main(["--model", str(small), "--runs", "1", "--calibration-samples", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "== vitis: PASS" in out and "== cpu: PASS" in out and "== default (available: cpu): PASS" in out
    assert "device absent: runs only when named" in out  # vitis: an emulation, not in the default
    assert "3 of 3 passed" in out and "x output range (of vitis)" in out


def test_demo_fails_when_a_target_misses_its_tolerance(small, monkeypatch, capsys):
    import byoc_vitis.plugin

    monkeypatch.setattr(byoc_vitis.plugin, "RTOL", 1e-9)
    monkeypatch.setattr(byoc_vitis.plugin, "ATOL", 1e-9)
    assert _demo().main(["--model", str(small), "--runs", "1", "--calibration-samples", "2", "-t", "vitis",
                         "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "== vitis: FAIL" in out and "FAILED: vitis" in out and "out of tolerance" in out


def test_demo_takes_int_inputs_and_symbolic_dims_and_never_passes_an_unused_target(tmp_path, monkeypatch, capsys):
    import byoc.plugins

    emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "emb")
    graph = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["e"]),
                               helper.make_node("ReduceMean", ["e"], ["y"], axes=[1], keepdims=0)], "ids",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [emb])
    path = tmp_path / "ids.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    monkeypatch.setenv("BYOC_PLUGINS", "cpu")
    monkeypatch.setattr(byoc.plugins, "_registry", None)
    assert _demo().main(["--model", str(path), "--shape", "seq=12", "--runs", "1", "-t", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "ids int64 [1, 12] (taken as 1: ids[0]" in out
    assert "== cpu: UNUSED" in out and "cpu took no node" in out and "ran nothing: cpu" in out
