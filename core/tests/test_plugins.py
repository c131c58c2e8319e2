"""The plugin registry: discovery, fault isolation, and faults while compiling (in-process plugins)."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import byoc
import byoc.plugins
from byoc.errors import PluginError
from byoc.contract import Pattern, Rule, any_value, op
from byoc.plugins import PluginFault, build_registry
from byoc.contract import host_callable, region_model_bytes

SHAPE = [2, 4]


class Chip:
    """A working target that supports ``ops`` and runs regions on the host kernels."""

    def __init__(self, name, ops=("Relu", "Neg", "Tanh", "Add"), priority=0, api_version=byoc.HOOK_API_VERSION):
        self.name, self.ops, self.priority, self.api_version = name, ops, priority, api_version

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version="1.0", device="npu", priority=self.priority,
                             api_version=self.api_version, options={"level": 1}))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == self.name:
            for o in self.ops:
                register(o)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == self.name:
            return byoc.Artifact(self.name, "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == self.name:
            return host_callable(artifact.data)


def quiet_registry(plugins, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = build_registry(plugins, entry_points=False, **kwargs) if "entry_points" not in kwargs else \
            build_registry(plugins, **kwargs)
    return reg, [str(w.message) for w in caught]


def chain_model():
    """x -> Neg(n0) -> Relu(n1) -> Tanh(n2) -> y"""
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="n0"), helper.make_node("Relu", ["a"], ["b"], name="n1"),
             helper.make_node("Tanh", ["b"], ["y"], name="n2")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def assert_matches_host(cm):
    x = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(SHAPE)}
    # within float32 rounding: the targets' emulations run on the installed host executor's kernels
    np.testing.assert_allclose(cm.run(x)["y"], byoc.compile(chain_model(), targets=[], host="reference").run(x)["y"],
                               rtol=1e-6, atol=1e-7)


# -- registration ----------------------------------------------------------------------------


def test_targets_and_priority_order():
    reg, warned = quiet_registry([("a", Chip("alpha")), ("b", Chip("beta", priority=5))])
    assert not warned and not reg.faults
    assert [t.name for t in reg.ordered_targets()] == ["beta", "alpha"]
    assert reg.target("alpha").plugin == "a" and reg.target("beta").plugin == "b"
    assert set(reg.operators["alpha"]) == {("", o) for o in ("Relu", "Neg", "Tanh", "Add")}
    with pytest.raises(PluginError, match="unknown target 'gamma'; available targets: alpha, beta"):
        reg.target("gamma")


def test_duplicate_target_names_both_plugins():
    reg, warned = quiet_registry([("first", Chip("npu")), ("second", Chip("npu")), ("other", Chip("aux"))])
    assert list(reg.conflicts) == ["npu"] and sorted(reg.conflicts["npu"]) == ["first", "second"]
    assert "npu" not in reg.targets and "aux" in reg.targets
    [fault] = reg.faults
    assert fault.kind == "duplicate" and fault.plugin in ("first", "second")
    assert f"also registered by plugin '{({'first', 'second'} - {fault.plugin}).pop()}'" in fault.message
    assert any("'second'" in w and "'first'" in w for w in warned)  # the warning names both
    for call in (lambda: reg.target("npu"), lambda: byoc.compile(chain_model(), targets=["npu"], registry=reg)):
        with pytest.raises(PluginError, match="registered by several plugins") as err:
            call()
        assert "first" in str(err.value) and "second" in str(err.value)
    # default targets: the contested one is left out, the rest works
    cm = byoc.compile(chain_model(), registry=reg)
    assert {r.device for r in cm.records.values()} == {"aux"}


def test_api_version_mismatch_disables_target():
    reg, warned = quiet_registry([("old", Chip("oldchip", api_version=999)), ("new", Chip("newchip"))])
    assert list(reg.incompatible) == ["oldchip"] and list(reg.targets) == ["newchip"]
    [fault] = reg.faults
    assert fault.kind == "api-version" and fault.plugin == "old" and "999" in fault.message
    assert any("999" in w for w in warned)
    cm = byoc.compile(chain_model(), registry=reg)
    assert {r.device for r in cm.records.values()} == {"newchip"}
    with pytest.raises(PluginError, match="built for hook API version 999, byoc provides 2"):
        byoc.compile(chain_model(), targets=["oldchip"], registry=reg)


class RaisesInTargets:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        raise RuntimeError("driver not found")


class WrongTarget:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register({"name": "dict-chip"})


class BadRegistrations:
    """Targets fine; operators, patterns and rules registered wrongly."""

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("bad"))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == "bad":
            register("Relu")
            register(42)

    @byoc.hookimpl
    def byoc_register_patterns(self, target, register):
        if target == "bad":
            register(Pattern("neg_relu", op("Relu", op("Neg", any_value()))))  # missing "bad." prefix

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        if target == "bad":
            register(lambda region: None)  # not a Rule


@pytest.mark.parametrize("plugin,part", [(RaisesInTargets(), "RuntimeError: driver not found"),
                                         (WrongTarget(), "expects a byoc.Target, got dict")])
def test_register_targets_fault_keeps_others(plugin, part):
    reg, warned = quiet_registry([("broken", plugin), ("ok", Chip("okchip"))])
    [fault] = reg.faults
    assert (fault.plugin, fault.hook) == ("broken", "byoc_register_targets") and part in fault.message
    assert any("plugin 'broken'" in w and "byoc_register_targets" in w for w in warned)
    assert list(reg.targets) == ["okchip"]


def test_bad_registrations_are_faults_naming_hook_and_target():
    reg, _ = quiet_registry([("badplugin", BadRegistrations())])
    by_hook = {f.hook: f for f in reg.faults}
    assert set(by_hook) == {"byoc_register_operators", "byoc_register_patterns", "byoc_register_rules"}
    for f in by_hook.values():
        assert f.plugin == "badplugin" and "(target 'bad')" in f.message
    assert "must be named 'bad.<pattern>'" in by_hook["byoc_register_patterns"].message
    assert "expects a byoc.contract.Rule" in by_hook["byoc_register_rules"].message
    # what was registered before the fault stays
    assert set(reg.operators["bad"]) == {("", "Relu")}
    assert reg.patterns["bad"] == [] and reg.rules["bad"] == []


def test_signature_mismatch_is_a_fault():
    class Misspelled:
        @byoc.hookimpl
        def byoc_register_targets(self, register, extra):  # not in the spec
            pass

    reg, warned = quiet_registry([("typo", Misspelled()), ("ok", Chip("okchip"))])
    [fault] = reg.faults
    assert (fault.plugin, fault.hook) == ("typo", "register") and "extra" in fault.message
    assert list(reg.targets) == ["okchip"]


def test_call_first_skips_a_raising_plugin():
    class Raising:
        @byoc.hookimpl
        def byoc_register_targets(self, extend):
            extend("x")

        @byoc.hookimpl
        def byoc_cost(self, target, region, options):
            raise ValueError("no model of the chip")

    class Estimating:
        @byoc.hookimpl
        def byoc_register_targets(self, register):
            register(byoc.Target("x"))

        @byoc.hookimpl
        def byoc_cost(self, target, region, options):
            return 0.5

    # pluggy's order: the last registered runs first, so "raising" (extending x) is asked first
    reg, _ = quiet_registry([("est", Estimating()), ("raising", Raising())])
    assert reg.scopes["x"] == ["est", "raising"]
    plugin, result, faults = reg.call_first("byoc_cost", target="x", region=None, options={})
    assert (plugin, result) == ("est", 0.5)
    assert [(f.plugin, f.hook) for f in faults] == [("raising", "byoc_cost")]
    assert "ValueError: no model of the chip" in faults[0].message


def test_plugin_fault_text():
    f = PluginFault("p", "byoc_codegen", "raised X", "error", "byoc-p", "1.2")
    assert str(f) == "plugin 'p' (byoc-p 1.2), hook byoc_codegen: raised X"
    assert str(PluginFault("p", "h", "m")) == "plugin 'p', hook h: m"


# -- entry points (faked: no package is installed) ---------------------------------------------


@pytest.fixture
def fake_entry_points(monkeypatch):
    module = types.ModuleType("byoc_fake_ep_plugin")
    chip = Chip("epchip")
    for name in ("byoc_register_targets", "byoc_register_operators", "byoc_codegen", "byoc_runtime"):
        setattr(module, name, getattr(chip, name))
    monkeypatch.setitem(sys.modules, "byoc_fake_ep_plugin", module)
    eps = [md.EntryPoint("good", "byoc_fake_ep_plugin", "byoc"),
           md.EntryPoint("broken", "byoc_no_such_module_for_tests", "byoc")]
    monkeypatch.setattr(byoc.plugins, "_entry_points", lambda: eps)
    monkeypatch.delenv("BYOC_PLUGINS", raising=False)
    return eps


def test_entry_point_import_error_keeps_others(fake_entry_points):
    reg, warned = quiet_registry([], entry_points=True)
    [fault] = reg.faults
    assert (fault.plugin, fault.hook, fault.kind) == ("broken", "import", "import")
    assert "ModuleNotFoundError" in fault.message and "byoc_no_such_module_for_tests" in fault.message
    assert any("plugin 'broken'" in w and "failed to import" in w for w in warned)
    assert list(reg.targets) == ["epchip"] and reg.target("epchip").plugin == "good"


def test_byoc_plugins_env_restricts(fake_entry_points, monkeypatch):
    monkeypatch.setenv("BYOC_PLUGINS", "good")
    reg, warned = quiet_registry([], entry_points=True)
    assert not reg.faults and not warned and list(reg.targets) == ["epchip"]
    monkeypatch.setenv("BYOC_PLUGINS", "")
    reg, _ = quiet_registry([], entry_points=True)
    assert reg.targets == {} and reg.faults == []
    # in-process plugins are not subject to BYOC_PLUGINS
    reg, _ = quiet_registry([("inproc", Chip("inchip"))], entry_points=True)
    assert list(reg.targets) == ["inchip"]


def test_entry_points_off(fake_entry_points):
    reg, _ = quiet_registry([("inproc", Chip("inchip"))], entry_points=False)
    assert list(reg.targets) == ["inchip"] and not reg.faults


def test_global_registry_reload(fake_entry_points, monkeypatch):
    monkeypatch.setattr(byoc.plugins, "_registry", None)
    monkeypatch.setenv("BYOC_PLUGINS", "good")
    assert [t.name for t in byoc.list_targets()] == ["epchip"]
    first = byoc.plugins.get_registry()
    assert byoc.plugins.get_registry() is first
    monkeypatch.setenv("BYOC_PLUGINS", "")
    assert byoc.plugins.get_registry(reload=True).targets == {}
    cm = byoc.compile(chain_model())  # targets=None with nothing installed: all on the host
    assert {r.device for r in cm.records.values()} == {"host"}


# -- faults while compiling --------------------------------------------------------------------


class Faulty(Chip):
    """Priority 10 above a working ``Chip("next")``: what it loses goes to "next" or the host."""

    def __init__(self, mode):
        super().__init__("faulty", priority=10)
        self.mode = mode

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target != self.name:
            return

        def check(node, ctx):
            if self.mode == "check":
                raise KeyError("boom")
            return True

        for o in self.ops:
            register(o, check)

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        if target != self.name:
            return

        def rule(region, ctx):
            n = region.nodes
            if self.mode == "cycle":
                return [[n[0], n[-1]], n[1:-1]]  # {n0, n2} and {n1} depend on each other
            if self.mode == "foreign":
                return [n, [object()]]
            if self.mode == "rule-str":
                return "too small to pay off"
            return None

        register(Rule("shaper", rule))

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target != self.name:
            return None
        if self.mode == "codegen":
            raise RuntimeError("compiler crashed")
        if self.mode == "io":
            return byoc.Artifact(self.name, "onnx", b"", {"inputs": ["nope"], "outputs": ["y"]})
        return byoc.Artifact(self.name, "onnx", region_model_bytes(region.model))


def compile_faulty(mode, strict=False):
    reg, _ = quiet_registry([("faultyplugin", Faulty(mode)), ("nextplugin", Chip("next"))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = byoc.compile(chain_model(), targets=["faulty", "next"], registry=reg, strict=strict)
    return cm, [str(w.message) for w in caught]


@pytest.mark.parametrize("mode,hook,part", [
    ("check", "byoc_register_operators", "support check for Neg raised KeyError: 'boom' (node 'n0')"),
    ("cycle", "byoc_register_rules", "rule 'shaper' claims nodes that would form a cycle (node 'n0')"),
    ("foreign", "byoc_register_rules", "rule 'shaper' returned an invalid split"),
])
def test_fault_before_placement_goes_to_next_target(mode, hook, part):
    cm, warned = compile_faulty(mode)
    assert any(f.plugin == "faultyplugin" and f.hook == hook and part in f.message for f in cm.faults), cm.faults
    assert any("plugin 'faultyplugin'" in w and hook in w and part in w for w in warned), warned
    assert [cm.records[n].device for n in ("n0", "n1", "n2")] == ["next"] * 3
    if mode != "check":
        assert cm.records["n1"].rule.startswith("faulty:shaper")
    assert_matches_host(cm)
    with pytest.raises(PluginError, match="plugin 'faultyplugin'"):
        compile_faulty(mode, strict=True)


def test_rule_reason_is_recorded_without_a_fault():
    cm, warned = compile_faulty("rule-str")
    assert not cm.faults and not warned
    assert cm.records["n0"].rule == "faulty:shaper (too small to pay off)"
    assert cm.records["n0"].device == "next"


@pytest.mark.parametrize("mode,part", [("codegen", "raised RuntimeError: compiler crashed"),
                                       ("io", "inputs/outputs do not match")])
def test_codegen_fault_falls_back_to_host(mode, part):
    cm, warned = compile_faulty(mode)
    assert any(f.hook == "byoc_codegen" and part in f.message and "region 'faulty_0'" in f.message
               for f in cm.faults)
    assert any("byoc_codegen" in w and "faulty_0" in w for w in warned)
    for n in ("n0", "n1", "n2"):
        rec = cm.records[n]
        assert rec.device == "host" and rec.region is None and part in rec.fallback
    assert cm.regions == []
    assert_matches_host(cm)
    with pytest.raises(PluginError, match="hook byoc_codegen"):
        compile_faulty(mode, strict=True)
