"""Typed options of the three vendor plugins: user and bundle options are validated by the core."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.contract.options import bundle_options
from byoc.plugins import get_registry


def conv_model():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def target(name):
    reg = get_registry()
    if name not in reg.targets:
        pytest.skip(f"target {name!r} is not installed")
    return reg.targets[name]


BAD = [
    ("cpu", "conv_strategy", "bogus", "one of 'auto', 'im2col', 'shift', 'direct'"),
    ("cpu", "threads", 0, "an integer >= 1 or None"),
    ("cpu", "fuse", "yes", "True or False"),
    ("jetson", "precision", "fp8", "one of 'fp32', 'fp16'"),
    ("jetson", "workspace", 1, "an integer >= 1048576"),
    ("jetson", "max_regions", 0, "an integer >= 1 or None"),
    ("vitis", "engine", "fpga", "one of 'numba', 'reference'"),
    ("vitis", "grouped_conv", "no", "True or False"),
]


@pytest.mark.parametrize("name,key,value,allowed", BAD)
def test_user_option_errors(name, key, value, allowed):
    target(name)
    kwargs = {"calibration": [{"x": np.ones((1, 3, 6, 6), np.float32)}]} if name == "vitis" else {}
    with pytest.raises(byoc.OptionError) as exc:
        byoc.compile(conv_model(), targets=[name], target_options={name: {key: value}}, **kwargs)
    msg = str(exc.value)
    assert f"'{name}'" in msg and repr(key) in msg and repr(value) in msg and allowed in msg, msg


@pytest.mark.parametrize("name", ["cpu", "jetson", "vitis"])
def test_unknown_user_option(name):
    target(name)
    kwargs = {"calibration": [{"x": np.ones((1, 3, 6, 6), np.float32)}]} if name == "vitis" else {}
    with pytest.raises(byoc.OptionError, match=f"target '{name}' has no option 'bogus_key'"):
        byoc.compile(conv_model(), targets=[name], target_options={name: {"bogus_key": 1}}, **kwargs)


@pytest.mark.parametrize("name,key,value,allowed", [b for b in BAD if b[1] != "threads"])
def test_bundle_option_errors(name, key, value, allowed):
    """What the bundle loader applies to a bundle's options (see test_bundle_options_end_to_end);
    machine-local options (cpu's threads) are dropped from a bundle instead."""
    t = target(name)
    with pytest.raises(byoc.OptionError) as exc:
        bundle_options(t, {key: value}, None, origin="m.byoc")
    msg = str(exc.value)
    assert f"'{name}'" in msg and repr(key) in msg and repr(value) in msg and allowed in msg and "m.byoc" in msg


@pytest.mark.parametrize("name,local", [("cpu", "cache_dir"), ("cpu", "threads"), ("jetson", "cache_dir")])
def test_machine_local_options_never_come_from_a_bundle(name, local):
    t = target(name)
    assert t.option(local).machine_local
    value = 3 if local == "threads" else "/tmp/chosen-by-the-bundle"
    assert bundle_options(t, {local: value}, None)[local] == t.defaults[local]
    assert bundle_options(t, {local: value}, {local: value})[local] == value


@pytest.mark.parametrize("name", ["cpu", "jetson"])
def test_bundle_options_end_to_end(name, tmp_path):
    target(name)
    model = conv_model()
    cm = byoc.compile(model, targets=[name])
    assert any(r.device == name for r in cm.records.values())
    key, value = {"cpu": ("conv_strategy", "bogus"), "jetson": ("precision", "fp8")}[name]
    cm.options["target_options"][name][key] = value  # as a tampered or foreign bundle would carry it
    path = tmp_path / "m.byoc"
    cm.save(path)
    with pytest.raises(byoc.OptionError, match=f"option '{key}' = '{value}'"):
        byoc.load(path)
    cm.options["target_options"][name][key] = target(name).defaults[key]
    cm.options["target_options"][name]["cache_dir"] = str(tmp_path / "not-here")
    cm.save(path)
    loaded = byoc.load(path)
    x = {"x": np.ones((1, 3, 6, 6), np.float32)}
    np.testing.assert_array_equal(loaded.run(x)["y"], cm.run(x)["y"])
    assert not (tmp_path / "not-here").exists()  # the bundle's cache folder was not used
