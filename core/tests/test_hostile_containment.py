"""Issue 18, classes 3-5: hostile plugins are contained.

A pass or code generator that edits what it was given and then fails leaves no trace (class 4);
region outputs are checked against their declared dtype and shape (class 4); a STRING input holds
only str (class 4); plugin runtimes get read-only feeds (class 5); ``sys.exit()`` or another
``BaseException`` from a plugin, and artifacts whose attributes raise, become plugin faults or a
:class:`PluginError` (class 3), while ``KeyboardInterrupt`` goes through.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import byoc
from byoc.errors import InputError, PluginError
from test_plugins import SHAPE, Chip, chain_model, quiet_registry

X = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(SHAPE)}


def host():
    return byoc.compile(chain_model(), targets=[]).run(X)["y"]


class Stop(BaseException):
    """Not an Exception: only a catch-all would see it."""


def _raise(kind):
    if kind == "exit":
        sys.exit(3)
    if kind == "base":
        raise Stop("custom BaseException")
    raise RuntimeError("plain failure")


KINDS = ["exit", "base", "error"]


def compile_with(plugin, **kwargs):
    reg, _ = quiet_registry([("hostile", plugin)])
    return byoc.compile(chain_model(), targets=[plugin.name], registry=reg, **kwargs)


# -- class 4: a pre-partition pass that rewrites, then raises --------------------------------

def _swap_op(model):
    for node in model.graph:
        if node.op_type == "Neg":
            node.op_type = "Relu"


def _drop_node(model):
    graph = model.graph
    tanh = next(n for n in graph if n.op_type == "Tanh")
    graph.outputs[0] = tanh.inputs[0]
    graph.remove(tanh, safe=False)


def _rename_output(model):
    model.graph.outputs[0].name = "renamed"


class RewritesThenRaises(Chip):
    def __init__(self, edit, kind):
        super().__init__("rw")
        self.edit, self.kind = edit, kind

    @byoc.hookimpl
    def byoc_pre_partition(self, model, options):
        self.edit(model)
        _raise(self.kind)


@pytest.mark.parametrize("edit", [_swap_op, _drop_node, _rename_output])
@pytest.mark.parametrize("kind", KINDS)
def test_pre_partition_rewrite_is_rolled_back(edit, kind):
    cm = compile_with(RewritesThenRaises(edit, kind))
    np.testing.assert_array_equal(cm.run(X)["y"], host())
    faults = [f for f in cm.faults if f.hook == "byoc_pre_partition"]
    assert faults and faults[0].plugin == "hostile" and "rolled back" in faults[0].message


class RewritesFine(Chip):
    @byoc.hookimpl
    def byoc_pre_partition(self, model, options):
        model.metadata_props["seen"] = "yes"


def test_pre_partition_rewrite_is_kept_when_it_succeeds():
    cm = compile_with(RewritesFine("ok"))
    assert cm.model.metadata_props.get("seen") == "yes"


# -- class 4: a code generator that edits the region, then raises -----------------------------

def _edit_nodes(region):
    for node in region.nodes:
        if node.op_type in ("Neg", "Tanh"):
            node.op_type = "Relu"


def _clear_nodes(region):
    region.nodes.clear()
    region.inputs.clear()


def _edit_body(region):
    for node in region.model.graph:
        node.op_type = "Relu"


class CodegenEditsThenRaises(Chip):
    def __init__(self, edit, kind):
        super().__init__("cg")
        self.edit, self.kind = edit, kind

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        self.edit(region)
        _raise(self.kind)


@pytest.mark.parametrize("edit", [_edit_nodes, _clear_nodes, _edit_body])
@pytest.mark.parametrize("kind", KINDS)
def test_codegen_edit_does_not_reach_the_host_fallback(edit, kind):
    cm = compile_with(CodegenEditsThenRaises(edit, kind))
    assert all(r.device == "host" for r in cm.records.values())
    np.testing.assert_array_equal(cm.run(X)["y"], host())
    assert any(f.hook == "byoc_codegen" and f.plugin == "hostile" for f in cm.faults)


# -- class 4: every region output is checked -------------------------------------------------

class BadOutputs(Chip):
    def __init__(self, make):
        super().__init__("out")
        self.make = make

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        return lambda *args: self.make(args)


BAD_OUTPUTS = [
    (lambda a: [np.zeros(3, np.float64)], "is float64, declared float32"),
    (lambda a: [np.zeros(3, np.float32)], "has shape [3], declared [2, 4]"),
    (lambda a: [np.zeros((4, 2), np.float32)], "has shape [4, 2], declared [2, 4]"),
    (lambda a: [np.zeros((2, 4, 1), np.float32)], "has shape [2, 4, 1]"),
    (lambda a: ["a string"], "is str, expected a numpy array"),
    (lambda a: [[[0.0] * 4] * 2], "is list, expected a numpy array"),
    (lambda a: [], "expected a sequence of 1 arrays"),
    (lambda a: np.zeros((2, 4), np.float32), "returned ndarray"),
]


@pytest.mark.parametrize("make,match", BAD_OUTPUTS)
def test_region_outputs_are_checked(make, match):
    cm = compile_with(BadOutputs(make))
    assert any(r.device == "out" for r in cm.records.values())
    with pytest.raises(PluginError) as info:
        cm.run(X)
    msg = str(info.value)
    assert match in msg and "'hostile'" in msg and "region 'out_" in msg


def test_right_outputs_pass():
    cm = compile_with(BadOutputs(lambda a: [np.tanh(np.maximum(-a[0], 0))]))
    np.testing.assert_allclose(cm.run(X)["y"], host(), rtol=1e-6)


# -- class 3: BaseException / sys.exit() in a runtime or hook; artifacts that raise -----------

@pytest.mark.parametrize("kind", KINDS)
def test_runtime_base_exception_becomes_plugin_error(kind):
    cm = compile_with(BadOutputs(lambda a: _raise(kind)))
    with pytest.raises(PluginError, match="'hostile'"):
        cm.run(X)


def test_keyboard_interrupt_goes_through():
    def interrupt(a):
        raise KeyboardInterrupt

    cm = compile_with(BadOutputs(interrupt))
    with pytest.raises(KeyboardInterrupt):
        cm.run(X)


class ExitsIn(Chip):
    def __init__(self, hook, kind):
        super().__init__("ex")
        self.hook, self.kind = hook, kind

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if self.hook == "operators":
            _raise(self.kind)
        Chip.byoc_register_operators(self, target, register)

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        def rule(region, ctx):
            _raise(self.kind)
        if self.hook == "rules":
            register(byoc.contract.Rule("exit", rule))

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if self.hook == "codegen":
            _raise(self.kind)
        return Chip.byoc_codegen(self, target, region, options)

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if self.hook == "runtime":
            _raise(self.kind)
        return Chip.byoc_runtime(self, target, artifact, options)


@pytest.mark.parametrize("hook", ["operators", "rules", "codegen", "runtime"])
@pytest.mark.parametrize("kind", ["exit", "base"])
def test_base_exception_in_a_hook_is_a_fault(hook, kind):
    plugin = ExitsIn(hook, kind)
    reg, _ = quiet_registry([("hostile", plugin)])
    cm = byoc.compile(chain_model(), targets=[plugin.name], registry=reg)
    np.testing.assert_array_equal(cm.run(X)["y"], host())
    assert any(f.plugin == "hostile" for f in list(cm.faults) + list(reg.faults)), (cm.faults, reg.faults)
    if hook != "operators":  # registration faults are the registry's (reported when it is built)
        with pytest.raises(PluginError, match="'hostile'"):
            compile_with(ExitsIn(hook, kind), strict=True)


class RaisingArtifact(byoc.Artifact):
    def __init__(self, attr):
        object.__setattr__(self, "_attr", attr)

    def __getattribute__(self, name):
        if name == object.__getattribute__(self, "_attr"):
            if name == "metadata":
                sys.exit(4)
            raise RuntimeError(f"{name} is broken")
        return object.__getattribute__(self, name)


class ReturnsRaisingArtifact(Chip):
    def __init__(self, attr):
        super().__init__("art")
        self.attr = attr

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        art = Chip.byoc_codegen(self, target, region, options)
        bad = RaisingArtifact(self.attr)
        for k in ("target", "format", "data", "metadata"):
            if k != self.attr:
                object.__setattr__(bad, k, getattr(art, k))
        return bad


@pytest.mark.parametrize("attr", ["data", "metadata", "format"])
def test_artifact_whose_attributes_raise_is_a_fault(attr):
    cm = compile_with(ReturnsRaisingArtifact(attr))
    np.testing.assert_array_equal(cm.run(X)["y"], host())
    assert any(f.hook == "byoc_codegen" and f.plugin == "hostile" for f in cm.faults), cm.faults


# -- class 5: feeds are read-only for plugin runtimes -----------------------------------------

class WritesInput(Chip):
    def __init__(self, how):
        super().__init__("wr")
        self.how = how

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        def run(x):
            if self.how == "setitem":
                x[...] = 99.0
            elif self.how == "inplace":
                np.negative(x, out=x)
            elif self.how == "flags":
                x.flags.writeable = True
                x[...] = 99.0
            return [np.tanh(np.maximum(-np.asarray(x), 0))]
        return run


@pytest.mark.parametrize("how", ["setitem", "inplace", "flags"])
def test_runtime_cannot_change_the_callers_feed(how):
    cm = compile_with(WritesInput(how))
    feed = {"x": X["x"].copy()}
    with pytest.raises(PluginError, match="'hostile'"):
        cm.run(feed)
    np.testing.assert_array_equal(feed["x"], X["x"])
    assert feed["x"].flags.writeable  # the caller's own array is left as it was


def test_host_kernels_run_on_read_only_feeds():
    cm = byoc.compile(chain_model(), targets=[])
    feed = {"x": X["x"].copy()}
    np.testing.assert_array_equal(cm.run(feed)["y"], host())
    assert feed["x"].flags.writeable


# -- class 4: STRING inputs hold only str ------------------------------------------------------

def string_model():
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["t"], name="id")], "s",
                              [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
                              [helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bad", [[None, {"k": 1}], ["ok", None], ["ok", 3], [b"bytes", "ok"], ["ok", ["nested"]]])
def test_string_input_rejects_non_str(bad):
    cm = byoc.compile(string_model(), targets=[])
    arr = np.empty(2, dtype=object)
    arr[:] = bad
    with pytest.raises(InputError, match="input 's': element"):
        cm.run({"s": arr})


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=5), st.none(), st.integers(), st.floats(allow_nan=False)),
                min_size=2, max_size=2))
def test_string_input_property(items):
    cm = byoc.compile(string_model(), targets=[])
    arr = np.empty(2, dtype=object)
    arr[:] = items
    if all(isinstance(i, str) for i in items):
        assert list(cm.run({"s": arr})["t"]) == items
    else:
        with pytest.raises(InputError):
            cm.run({"s": arr})


# -- class 8: a long bundle name --------------------------------------------------------------

@pytest.mark.parametrize("stem", ["a" * 244, "é" * 122, "b" * 200])
def test_long_bundle_name_can_be_saved(tmp_path, stem):
    cm = byoc.compile(chain_model(), targets=[])
    path = tmp_path / f"{stem}.byoc"
    assert len(path.name.encode()) <= 255
    cm.save(path)
    np.testing.assert_array_equal(byoc.load(path).run(X)["y"], host())
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_temporary_name_is_within_255_bytes():
    from byoc.bundle.writer import temporary_name

    for name in ["x" * 250, "é" * 127, "短" * 85, "m.byoc"]:
        tmp = temporary_name(name)
        assert len(tmp.encode()) <= 255 and tmp.startswith(".") and tmp.endswith(".tmp")


# -- class 6: refused feeds use up no specialisation slot --------------------------------------

class StaticChip(Chip):
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version="1.0", device="npu", shape_policy="static",
                             max_specializations=1))


def symbolic_relu():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bad", [
    {"x": np.zeros((2, 3), np.float64)},           # wrong dtype
    {"x": np.zeros((2, 3, 1), np.float32)},        # wrong rank
    {"x": np.zeros((2, 4), np.float32)},           # wrong static dim
    {"x": np.zeros((2, 3), np.float32), "z": 1},   # unknown name
])
def test_refused_feeds_use_no_specialisation_slot(bad):
    reg, _ = quiet_registry([("hostile", StaticChip("st"))])
    cm = byoc.compile(symbolic_relu(), targets=["st"], registry=reg)
    for _ in range(3):
        with pytest.raises(InputError):
            cm.run(bad)
    assert cm.specializer.cache == {}
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(cm.run({"x": x})["y"], np.maximum(x, 0))
    (chosen,) = cm.specializer.cache.values()
    assert any(r.device == "st" for r in chosen.records.values())


# -- class 7: fan-in is not quadratic in substitute_regions ------------------------------------

def sum_model(n):
    ins = [f"x{i}" for i in range(n)]
    graph = helper.make_graph([helper.make_node("Sum", ins, ["y"], name="sum")], "g",
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2]) for x in ins],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("n", [3, 300, 3000])
def test_wide_fan_in_region_substitution_is_linear(n, monkeypatch):
    import onnx_ir as ir

    calls = []
    original = ir.Node.replace_input_with
    monkeypatch.setattr(ir.Node, "replace_input_with", lambda self, i, v: (calls.append(i), original(self, i, v)))
    reg, _ = quiet_registry([("chip", Chip("chip", ops=("Sum",)))])
    cm = byoc.compile(sum_model(n), targets=["chip"], registry=reg)
    assert {r.device for r in cm.records.values()} == {"chip"}
    assert len(calls) < 10  # Graph.remove(safe=True) made n calls, each O(n)
    feeds = {f"x{i}": np.full(2, i, np.float32) for i in range(n)}
    np.testing.assert_array_equal(cm.run(feeds)["y"], np.full(2, sum(range(n)), np.float32))
