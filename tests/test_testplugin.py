"""The test plugin ``testchip`` (byoc-testplugin), found through its entry point, and every hook it implements."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from itest_models import SHAPE, feeds, model, mul_add_chain, registry, require_test_plugins
from onnx import helper, numpy_helper

import byoc
from byoc.kernels import supported_ops

require_test_plugins()

import byoc_testplugin  # noqa: E402
from byoc_testplugin import plugin as testchip  # noqa: E402


@pytest.fixture
def reg(monkeypatch):
    reg, warned = registry(monkeypatch)
    assert not warned, warned
    assert not reg.faults, [str(f) for f in reg.faults]
    return reg


def host_run(m, x):
    return byoc.compile(m, targets=[]).run(x)


def test_entry_point_discovery(reg):
    target = reg.target("testchip")
    assert target.plugin == "testchip"
    assert target.distribution == "byoc-testplugin"
    assert target.version == byoc_testplugin.__version__
    assert target.device == "npu"
    assert target.defaults == {"max_kernel": 7, "tag": "testchip"}
    assert reg.distributions["testchip"] == ("byoc-testplugin", byoc_testplugin.__version__)
    # inert fault plugins register nothing
    assert sorted(reg.targets) == ["testchip"]
    assert set(reg.operators["testchip"]) == {("", op) for op in testchip.OPERATORS}
    assert [p.name for _, p in reg.patterns["testchip"]] == ["testchip.conv_bias_relu", "testchip.mul_add"]
    assert [r.name for _, r in reg.rules["testchip"]] == ["max_nodes", "needs_mac"]


def test_global_registry_and_list_targets(monkeypatch):
    import byoc.plugins

    monkeypatch.setattr(byoc.plugins, "_registry", None)  # the cached registry comes back afterwards
    monkeypatch.setenv("BYOC_PLUGINS", "testchip")
    monkeypatch.delenv("BYOC_FAULT", raising=False)
    assert [t.name for t in byoc.list_targets()] == ["testchip"]
    m = mul_add_chain(2)
    cm = byoc.compile(m)  # targets=None: every installed target
    assert {r.region.target for r in cm.regions} == {"testchip"}
    monkeypatch.setenv("BYOC_PLUGINS", "")
    assert byoc.plugins.get_registry(reload=True).targets == {}


def test_every_hook_end_to_end(reg):
    testchip.CALLS.clear()
    m = mul_add_chain(3)
    x = feeds(m)
    cm = byoc.compile(m, targets=["testchip"], registry=reg)
    assert not cm.faults
    # pre-partition: the pass stamped the model with its option and the node count
    assert cm.model.metadata_props["testchip.pre_partition"] == "testchip:9"
    # patterns + rules: one region, three mul_add composites, nothing dropped
    assert [r.region.name for r in cm.regions] == ["testchip_0"]
    recs = cm.records
    assert all(r.device == "testchip" and r.region == "testchip_0" and r.rule is None for r in recs.values())
    assert {n: recs[n].pattern for n in ("mul0", "add0", "tanh0")} == {
        "mul0": "testchip.mul_add", "add0": "testchip.mul_add", "tanh0": None}
    # codegen: the artifact is the region body, stamped by the post-partition pass
    art = cm.regions[0].artifact
    assert (art.target, art.format) == ("testchip", "onnx")
    body = onnx.ModelProto.FromString(art.data)
    assert {p.key: p.value for p in body.metadata_props}["testchip.region"] == "testchip_0"
    assert [n.name for n in body.graph.node] == [f"{k}{i}" for i in range(3) for k in ("mul", "add", "tanh")]
    assert art.metadata["op_types"] == ["Add", "Mul", "Tanh"]
    assert art.metadata["patterns"] == ["testchip.mul_add"]
    assert art.metadata["inputs"] == ["x"] and art.metadata["outputs"] == ["y"]
    # runtime: the engine ran once per call and matches the host bit for bit
    for _ in range(2):
        out = cm.run(x)
        np.testing.assert_allclose(out["y"], host_run(m, x)["y"], rtol=1e-6, atol=1e-7)
    assert testchip.CALLS["testchip_0"] == 2
    # the partitioned model holds one byoc::Region node
    assert [(n.domain, n.op_type, n.name) for n in cm.model.graph] == [("byoc", "Region", "testchip_0")]


def test_cost_hook(reg):
    cm = byoc.compile(mul_add_chain(2), targets=["testchip"], registry=reg)
    region = cm.regions[0].region
    plugin, cost, faults = reg.call_first("byoc_cost", target="testchip", region=region, options={})
    assert (plugin, faults) == ("testchip", [])
    assert cost == pytest.approx(5e-6 + 1e-6 * len(region.nodes))
    assert reg.call_first("byoc_cost", target="other", region=region, options={}) == (None, None, [])


def test_needs_mac_rule_drops_to_host(reg):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Tanh", ["a"], ["y"], name="t")]
    m = model(nodes)
    cm = byoc.compile(m, targets=["testchip"], registry=reg)
    assert cm.regions == []
    for name in ("r", "t"):
        rec = cm.records[name]
        assert rec.device == "host"
        assert rec.verdicts == {"testchip": None}
        assert rec.rule == "testchip:needs_mac (needs a MAC op (Conv, Gemm, MatMul or testchip.mul_add))"
    x = feeds(m)
    np.testing.assert_allclose(cm.run(x)["y"], host_run(m, x)["y"], rtol=1e-6, atol=1e-7)


def test_max_nodes_rule_splits(reg, monkeypatch):
    monkeypatch.setattr(testchip, "MAX_REGION_NODES", 7)
    m = mul_add_chain(6)  # 18 nodes
    cm = byoc.compile(m, targets=["testchip"], registry=reg)
    sizes = [len(r.region.nodes) for r in cm.regions]
    # pieces close at 7 nodes, but never inside a mul_add composite (mul2|add2 -> 8)
    assert sizes == [8, 7, 3]
    for cr in cm.regions:
        names = [n.name for n in cr.region.nodes]
        for i in range(6):
            assert (f"mul{i}" in names) == (f"add{i}" in names)
    x = feeds(m)
    np.testing.assert_allclose(cm.run(x)["y"], host_run(m, x)["y"], rtol=1e-6, atol=1e-7)
    placed = [n.name for cr in cm.regions for n in cr.region.nodes]
    assert sorted(placed) == sorted(cm.records)


def test_operator_checks_give_reasons(reg):
    nodes = [
        helper.make_node("Add", ["x", "row"], ["a"], name="bcast_add"),
        helper.make_node("Mul", ["a", "half"], ["b"], name="scalar_mul"),
        helper.make_node("Add", ["b", "shift"], ["c"], name="shift_add"),
        helper.make_node("Clip", ["c", "", "hi"], ["d"], name="clip_dyn"),
        helper.make_node("Softsign", ["d"], ["y"], name="softsign"),
    ]
    m = model(nodes, inputs=("x", "hi"), initializers=[
        numpy_helper.from_array(np.ones(SHAPE[-1], np.float32), "row"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.full(SHAPE, 0.1, np.float32), "shift"),
    ])
    m.graph.input[1].type.tensor_type.shape.ClearField("dim")  # scalar 'hi'
    cm = byoc.compile(m, targets=["testchip"], registry=reg, passes=[])
    v = {name: rec.verdicts["testchip"] for name, rec in cm.records.items()}
    assert v["bcast_add"] == "Add: broadcasting (2, 8) with (8,) is not supported"
    assert v["scalar_mul"] is None and v["shift_add"] is None
    assert v["clip_dyn"] == "Clip: min/max must be constants"
    assert v["softsign"] == "Softsign: operator not supported by testchip"
    assert cm.records["scalar_mul"].device == "testchip"
    assert cm.records["scalar_mul"].pattern == "testchip.mul_add"
    x = {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(SHAPE), "hi": np.array(0.7, np.float32)}
    np.testing.assert_allclose(cm.run(x)["y"], host_run(m, x)["y"], rtol=1e-6, atol=1e-7)


def test_compile_twice_identical_artifacts(reg):
    m = mul_add_chain(4)
    a = byoc.compile(m, targets=["testchip"], registry=reg)
    b = byoc.compile(m, targets=["testchip"], registry=reg)
    assert [(r.artifact.data, r.artifact.metadata, r.artifact.sha256) for r in a.regions] == [
        (r.artifact.data, r.artifact.metadata, r.artifact.sha256) for r in b.regions]


needs_conv = pytest.mark.skipif("Conv" not in supported_ops(), reason="no host Conv kernel yet")


def conv_model(k: int, relu: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(k)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, k, k)).astype(np.float32) * 0.1, "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], name="conv",
                              pads=[k // 2] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    graph = helper.make_graph(
        nodes, "conv",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 12, 12])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_conv
def test_conv_bias_relu_pattern(reg):
    m = conv_model(3)
    cm = byoc.compile(m, targets=["testchip"], registry=reg)
    assert {n: (r.device, r.pattern) for n, r in cm.records.items()} == {
        "conv": ("testchip", "testchip.conv_bias_relu"), "relu": ("testchip", "testchip.conv_bias_relu")}
    x = feeds(m)
    np.testing.assert_allclose(cm.run(x)["y"], host_run(m, x)["y"], rtol=1e-6, atol=1e-7)


@needs_conv
def test_conv_kernel_too_large(reg):
    m = conv_model(9)
    cm = byoc.compile(m, targets=["testchip"], registry=reg)
    assert cm.records["conv"].verdicts["testchip"] == "Conv: kernel 9x9 exceeds 7x7"
    assert cm.records["conv"].device == "host"
    # the option raises the limit
    cm = byoc.compile(m, targets=["testchip"], registry=reg, target_options={"testchip": {"max_kernel": 9}})
    assert cm.records["conv"].device == "testchip"
