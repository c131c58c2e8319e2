"""Registration, options, the device probe, support verdicts with OpenVINO's reasons."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.plugins import build_registry

import byoc_openvino.plugin as plugin
from byoc_openvino import engine
from byoc_openvino.options import cache_dir, compile_config, threads, usable_cache_dir, validate_options


def registry():
    return build_registry([("openvino", plugin)], entry_points=False)


def test_target_registered_with_its_options_and_probe():
    t = registry().targets["openvino"]
    assert t.is_available() == bool(engine.available_devices())
    assert "CPU" in engine.available_devices()
    names = {o.name: o for o in t.options}
    assert set(names) == {"device", "precision", "threads", "performance_hint", "cache_dir"}
    assert names["device"].machine_local and names["threads"].machine_local and names["cache_dir"].machine_local
    assert not names["precision"].machine_local


@pytest.mark.no_openvino
def test_importing_the_plugin_does_not_import_openvino():
    import subprocess
    import sys

    code = "import byoc_openvino.plugin, sys; print('openvino' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_option_values_are_refused_naming_target_and_option():
    with pytest.raises(byoc.OptionError, match="openvino.*precision"):
        validate_options({"precision": "int4"})
    with pytest.raises(byoc.OptionError, match="device"):
        validate_options({"device": "TPU"})
    with pytest.raises(byoc.OptionError, match="threads"):
        validate_options({"threads": 0})


def test_threads_default_from_env_then_cpu_count(monkeypatch):
    monkeypatch.setenv("BYOC_NUM_THREADS", "3")
    assert threads(validate_options()) == 3
    assert threads(validate_options({"threads": 5})) == 5
    monkeypatch.delenv("BYOC_NUM_THREADS")
    assert threads(validate_options()) == (os.cpu_count() or 1)
    cfg = compile_config(validate_options({"threads": 2}), "CPU")
    assert cfg["INFERENCE_NUM_THREADS"] == 2 and cfg["INFERENCE_PRECISION_HINT"] == "f32"
    assert cfg["ENABLE_CPU_PINNING"] is False


def test_cache_dir_must_belong_to_the_user_and_not_be_shared(tmp_path):
    good = tmp_path / "cache"
    assert usable_cache_dir({"cache_dir": str(good)}) == good  # made, 0700
    assert (good.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="group or others"):
        assert usable_cache_dir({"cache_dir": str(shared)}) is None
    assert cache_dir({"cache_dir": ""}) is None


def test_cache_dir_option_is_machine_local_in_bundles(tmp_path):
    # a bundle never chooses device, threads or cache_dir: the loading user's (or the defaults) apply
    from byoc.contract.options import bundle_options

    t = registry().targets["openvino"]
    opts = bundle_options(t, {"device": "GPU", "cache_dir": "/tmp/x", "precision": "f32"}, {"threads": 1})
    assert opts["device"] == "CPU" and opts["cache_dir"] is None and opts["threads"] == 1


def _model_with_unsupported():
    # OpenVINO's ONNX frontend has no Pad mode "wrap" (opset 19); byoc's host runs it. The Relu
    # before it is OpenVINO's.
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Pad", ["r", "p"], ["y"], mode="wrap", name="pad")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                          [helper.make_tensor("p", TensorProto.INT64, [4], [0, 1, 0, 1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def test_refusals_carry_openvinos_reason():
    cm = byoc.compile(_model_with_unsupported(), targets=["openvino"], registry=registry())
    rec = cm.records["pad"]
    assert rec.device == "host"
    reason = rec.verdicts["openvino"]
    assert isinstance(reason, str) and "Unsupported padding mode: [wrap]" in reason, reason
    assert cm.records["relu"].device == "openvino" and cm.records["relu"].verdicts["openvino"] is None
    assert "Unsupported padding mode" in cm.report()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(cm.run({"x": x})["y"], np.pad(np.maximum(x, 0), [(0, 0), (1, 1)], mode="wrap"))


def test_view_only_regions_stay_on_the_host():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
                          [helper.make_tensor("shape", TensorProto.INT64, [2], [3, 2])])
    cm = byoc.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), targets=["openvino"],
                      registry=registry())
    assert cm.records["reshape"].device == "host" and cm.records["reshape"].rule.startswith("openvino:has_compute")
