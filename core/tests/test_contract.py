"""The vendor contract: scoped hook calls, pluggy's order, typed options, hook API 1, plugin hygiene."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pluggy
import pytest
from onnx import TensorProto, helper

import byoc
import byoc.plugins
from byoc.contract import (
    HOOK_API_VERSION,
    Artifact,
    Option,
    Rule,
    Target,
    hookimpl,
    host_callable,
    region_model_bytes,
    resolve_options,
)
from byoc.contract.options import bundle_options
from byoc.plugins import build_registry

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "core" / "src" / "byoc" / "testing" / "template" / "src" / "__module__" / "plugin.py.tmpl"
SHAPE = [2, 4]


def quiet(plugins):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = build_registry(plugins, entry_points=False)
    return reg, [str(w.message) for w in caught]


def chain_model():
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="n0"), helper.make_node("Relu", ["a"], ["y"], name="n1")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class Unguarded:
    """A target whose hooks never look at the target name; records what it was asked."""

    def __init__(self, name, ops=("Neg", "Relu"), options=()):
        self.name, self.ops, self.options = name, ops, list(options)
        self.asked: list[tuple[str, str]] = []
        self.runtime_options: list[dict] = []

    @hookimpl
    def byoc_register_targets(self, register):
        register(Target(self.name, version="1.0", device="npu", options=self.options, rtol=0.0, atol=0.0))

    @hookimpl
    def byoc_register_operators(self, target, register):
        self.asked.append(("operators", target))
        for o in self.ops:
            register(o)

    @hookimpl
    def byoc_codegen(self, target, region, options):
        self.asked.append(("codegen", target))
        return Artifact(self.name, "onnx", region_model_bytes(region.model))

    @hookimpl
    def byoc_runtime(self, target, artifact, options):
        self.asked.append(("runtime", target))
        self.runtime_options.append(dict(options))
        return host_callable(artifact.data)


# -- target-scoped calls ----------------------------------------------------------------------------


def test_hooks_are_called_only_for_the_plugins_own_target():
    a, b = Unguarded("alpha", ops=("Neg",)), Unguarded("beta", ops=("Relu",))
    reg, warned = quiet([("a", a), ("b", b)])
    assert not warned and not reg.faults
    assert reg.scopes == {"alpha": ["a"], "beta": ["b"]}
    assert set(reg.operators["alpha"]) == {("", "Neg")} and set(reg.operators["beta"]) == {("", "Relu")}
    cm = byoc.compile(chain_model(), targets=["alpha", "beta"], registry=reg)
    assert [cm.records[n].device for n in ("n0", "n1")] == ["alpha", "beta"]
    assert {t for _, t in a.asked} == {"alpha"} and {t for _, t in b.asked} == {"beta"}


def test_an_extending_plugin_is_called_for_the_target_it_extends():
    class Extra:
        @hookimpl
        def byoc_register_targets(self, extend):
            extend("alpha")

        @hookimpl
        def byoc_register_operators(self, target, register):
            assert target == "alpha"
            register("Relu")

    base = Unguarded("alpha", ops=("Neg",))
    reg, _ = quiet([("base", base), ("extra", Extra())])
    assert reg.scopes["alpha"] == ["base", "extra"] and not reg.faults
    assert set(reg.operators["alpha"]) == {("", "Neg"), ("", "Relu")}
    cm = byoc.compile(chain_model(), targets=["alpha"], registry=reg)
    assert [cm.records[n].device for n in ("n0", "n1")] == ["alpha", "alpha"]


def test_a_composite_needs_every_member_supported():
    """The core checks a pattern match's members itself: a plugin's pattern check need not."""
    from byoc.contract import Pattern, any_value, op

    class Fusing(Unguarded):
        @hookimpl
        def byoc_register_patterns(self, register):
            register(Pattern("fuse.neg_relu", op("Relu", op("Neg", any_value()))))

    only_relu = Fusing("fuse", ops=("Relu",))  # Neg is not supported: the match must be refused
    reg, _ = quiet([("f", only_relu)])
    cm = byoc.compile(chain_model(), targets=["fuse"], registry=reg)
    assert cm.records["n0"].device == "host" and cm.records["n1"].device == "fuse"
    assert cm.records["n1"].pattern is None
    both = Fusing("fuse", ops=("Neg", "Relu"))
    reg, _ = quiet([("f", both)])
    cm = byoc.compile(chain_model(), targets=["fuse"], registry=reg)
    assert cm.records["n1"].pattern == "fuse.neg_relu" and cm.records["n0"].device == "fuse"


def test_rules_receive_the_support_context():
    seen = []

    class Counting(Unguarded):
        @hookimpl
        def byoc_register_rules(self, register):
            def at_most_one(region, ctx):
                seen.append((ctx.target, ctx.options["limit"]))
                kept = ctx.state.get("kept", 0)
                ctx.state["kept"] = kept + 1
                return None if kept < ctx.options["limit"] else "limit reached"

            register(Rule("at_most", at_most_one))

    chip = Counting("cnt", ops=("Neg",), options=[Option("limit", 1, type=int, minimum=0)])
    reg, _ = quiet([("c", chip)])
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="n0"), helper.make_node("Relu", ["a"], ["b"], name="n1"),
             helper.make_node("Neg", ["b"], ["y"], name="n2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cm = byoc.compile(model, targets=["cnt"], registry=reg, target_options={"cnt": {"limit": 1}})
    assert seen == [("cnt", 1), ("cnt", 1)]
    assert [cm.records[n].device for n in ("n0", "n1", "n2")] == ["cnt", "host", "host"]
    assert cm.records["n2"].rule == "cnt:at_most (limit reached)"


# -- pluggy's order ---------------------------------------------------------------------------------


def _ordered_plugins():
    """Five implementations of byoc_cost with tryfirst/trylast mixed, registered in this order."""
    out = []
    for name, marks in [("p1", {}), ("p2", {"tryfirst": True}), ("p3", {}), ("p4", {"trylast": True}),
                        ("p5", {"tryfirst": True})]:
        plugin = types.SimpleNamespace()

        def cost(region, options, _name=name):
            return _name

        plugin.byoc_cost = hookimpl(**marks)(cost)
        out.append((name, plugin))
    return out


def test_call_order_is_pluggys_with_tryfirst_and_trylast():
    plugins = _ordered_plugins()
    reg, _ = quiet(plugins)
    ours = [result for _, result, _ in reg.call_each("byoc_cost", region=None, options={})]
    # pluggy's own call: a non-firstresult spec returns every result in call order
    pm = pluggy.PluginManager("byoc")

    class Spec:
        @pluggy.HookspecMarker("byoc")
        def byoc_cost(self, region, options):
            pass

    pm.add_hookspecs(Spec)
    for name, plugin in plugins:
        pm.register(plugin, name=name)
    theirs = pm.hook.byoc_cost(region=None, options={})
    assert ours == theirs == ["p5", "p2", "p3", "p1", "p4"]
    # firstresult: the first in that order wins, as pluggy's byoc_cost (firstresult=True) does
    assert reg.call_first("byoc_cost", region=None, options={})[:2] == ("p5", "p5")
    assert reg.pm.hook.byoc_cost(target=None, region=None, options={}) == "p5"


def test_call_first_follows_pluggy_when_one_is_tryfirst():
    """The issue's case: one tryfirst implementation and one plain one: pluggy picks the first."""
    plain = types.SimpleNamespace(byoc_cost=hookimpl(lambda region, options: "plain"))
    first = types.SimpleNamespace(byoc_cost=hookimpl(tryfirst=True)(lambda region, options: "first"))
    reg, _ = quiet([("first", first), ("plain", plain)])
    assert reg.pm.hook.byoc_cost(target=None, region=None, options={}) == "first"
    assert reg.call_first("byoc_cost", region=None, options={})[:2] == ("first", "first")


@pytest.mark.parametrize("marks", [{"hookwrapper": True}, {"wrapper": True}])
def test_hook_wrappers_are_refused_with_a_fault(marks):
    class Wrapping(Unguarded):
        @hookimpl(**marks)
        def byoc_codegen(self, target, region, options):
            result = yield
            return result

    reg, warned = quiet([("wrapping", Wrapping("wrapchip")), ("ok", Unguarded("okchip"))])
    [fault] = reg.faults
    assert fault.plugin == "wrapping" and fault.hook == "byoc_codegen" and "not supported" in fault.message
    assert any("hook wrappers" in w for w in warned)
    assert list(reg.targets) == ["okchip"]  # the wrapping plugin is not used at all
    # pluggy itself would have run the wrapper around the others: byoc refuses instead of
    # taking the generator as a result
    assert "wrapping" not in dict(reg.pm.list_name_plugin())


# -- typed options ----------------------------------------------------------------------------------


OPTS = [
    Option("precision", "fp16", choices=("fp16", "fp32"), doc="arithmetic"),
    Option("workspace", 1 << 20, type=int, minimum=1024),
    Option("ratio", 0.5, type=float, check=lambda v: None if v <= 1 else "must be <= 1"),
    Option("fast", False, type=bool),
    Option("cache_dir", None, type=str, machine_local=True),
]
CHIP = Target("optchip", options=OPTS)


def test_options_resolve_with_defaults():
    assert resolve_options(CHIP, None) == {"precision": "fp16", "workspace": 1 << 20, "ratio": 0.5, "fast": False,
                                           "cache_dir": None}
    assert resolve_options(CHIP, {"ratio": 1, "cache_dir": "/tmp/x"})["ratio"] == 1
    assert CHIP.defaults["precision"] == "fp16" and CHIP.option("fast").type is bool


@pytest.mark.parametrize("given,allowed", [
    ({"precision": "int4"}, "one of 'fp16', 'fp32'"),
    ({"workspace": 10}, "an integer >= 1024"),
    ({"workspace": True}, "an integer >= 1024"),
    ({"workspace": "big"}, "an integer >= 1024"),
    ({"ratio": 2.0}, "must be <= 1"),
    ({"fast": 1}, "True or False"),
    ({"cache_dir": 3}, "a string or None"),
    ({"precision": None}, "one of 'fp16', 'fp32'"),
])
def test_bad_option_values_name_target_option_value_and_allowed(given, allowed):
    [(key, value)] = given.items()
    with pytest.raises(byoc.OptionError) as exc:
        resolve_options(CHIP, given)
    msg = str(exc.value)
    assert "'optchip'" in msg and repr(key) in msg and repr(value) in msg and allowed in msg


def test_unknown_option_names_the_known_ones():
    with pytest.raises(byoc.OptionError, match=r"target 'optchip' has no option 'speed' .*cache_dir, fast, "
                                               r"precision, ratio, workspace"):
        resolve_options(CHIP, {"speed": 3})


def test_bundle_options_are_validated_and_machine_local_ones_come_from_the_user():
    stored = {"precision": "fp32", "cache_dir": "/somewhere/the/bundle/chose"}
    got = bundle_options(CHIP, stored, None)
    assert got["precision"] == "fp32" and got["cache_dir"] is None
    got = bundle_options(CHIP, stored, {"cache_dir": "/mine"})
    assert got["cache_dir"] == "/mine"
    with pytest.raises(byoc.OptionError, match="'precision' = 'int4' \\(the.bundle"):
        bundle_options(CHIP, {"precision": "int4"}, None, origin="the.bundle")
    with pytest.raises(byoc.OptionError, match="has no option 'evil'"):
        bundle_options(CHIP, {"evil": 1}, None)


def test_targets_json_lists_options(capsys, monkeypatch):
    from byoc.report.commands import _target_rows

    reg, _ = quiet([("o", Unguarded("optchip", options=OPTS))])
    [row] = _target_rows(reg)
    by_name = {o["name"]: o for o in row["options"]}
    assert by_name["precision"] == {"name": "precision", "type": "str", "default": "fp16",
                                    "allowed": "one of 'fp16', 'fp32'", "choices": ["fp16", "fp32"],
                                    "doc": "arithmetic", "machine_local": False}
    assert by_name["cache_dir"]["machine_local"] is True and by_name["cache_dir"]["type"] == "str | None"


def test_user_and_bundle_options_end_to_end(tmp_path):
    chip = Unguarded("optchip", options=OPTS)
    reg, _ = quiet([("o", chip)])
    with pytest.raises(byoc.OptionError, match="option 'precision' = 'bf16'"):
        byoc.compile(chain_model(), targets=["optchip"], registry=reg, target_options={"optchip": {"precision": "bf16"}})
    cm = byoc.compile(chain_model(), targets=["optchip"], registry=reg,
                      target_options={"optchip": {"precision": "fp32", "cache_dir": "/compile/machine"}})
    assert chip.runtime_options[-1]["cache_dir"] == "/compile/machine"
    path = tmp_path / "m.byoc"
    cm.save(path)
    loaded = byoc.load(path, registry=reg)
    assert chip.runtime_options[-1]["precision"] == "fp32"  # portable: from the bundle
    assert chip.runtime_options[-1]["cache_dir"] is None    # machine-local: never from the bundle
    x = {"x": np.ones(SHAPE, np.float32)}
    np.testing.assert_array_equal(loaded.run(x)["y"], cm.run(x)["y"])
    byoc.load(path, registry=reg, target_options={"optchip": {"cache_dir": "/loading/machine"}})
    assert chip.runtime_options[-1]["cache_dir"] == "/loading/machine"
    # a bundle whose options the installed target refuses
    cm.options["target_options"]["optchip"]["precision"] = "int4"
    bad = tmp_path / "bad.byoc"
    cm.save(bad)
    with pytest.raises(byoc.OptionError, match="option 'precision' = 'int4'"):
        byoc.load(bad, registry=reg)


# -- hook API 1 ---------------------------------------------------------------------------------


@pytest.fixture
def api1_entry_point(monkeypatch):
    """An installed plugin written for hook API 1: it imports byoc.partition.types."""
    source = "from byoc.partition.types import Target\n"
    module_name = "byoc_fake_api1_plugin"
    eps = [md.EntryPoint("oldie", module_name, "byoc")]

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != module_name:
                return None
            import importlib.util

            class Loader:
                def create_module(self, spec):
                    return None

                def exec_module(self, module):
                    exec(compile(source, "<api1 plugin>", "exec"), module.__dict__)

            return importlib.util.spec_from_loader(name, Loader())

    monkeypatch.setattr(sys, "meta_path", [Finder()] + sys.meta_path)
    monkeypatch.setattr(byoc.plugins, "_entry_points", lambda: eps)
    monkeypatch.delenv("BYOC_PLUGINS", raising=False)
    monkeypatch.setattr(byoc.plugins, "_registry", None)


def test_a_hook_api_1_plugin_is_reported_not_used(api1_entry_point):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        reg = build_registry()
    [fault] = reg.faults
    assert (fault.plugin, fault.kind) == ("oldie", "api-version")
    assert "hook API version 1" in fault.message and "byoc.partition.types" in fault.message
    assert reg.targets == {}


def test_doctor_explains_a_hook_api_1_plugin(api1_entry_point, capsys):
    from byoc.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "incompatible plugins (1)" in out and "'oldie'" in out
    assert f"hook API version {HOOK_API_VERSION} replaced by byoc.contract" in out and "upgrade it" in out


# -- plugin hygiene: no target guards, only the contract and public APIs ---------------------------------


def _plugin_sources() -> list[tuple[str, str]]:
    files = sorted(ROOT.glob("plugins/*/src/**/*.py")) + sorted(ROOT.glob("tests/plugins/*/src/**/*.py"))
    files = [p for p in files if p.name != "api1.py"]  # byoc-faulty's deliberate hook-API-1 plugin
    out = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files]
    template = TEMPLATE.read_text(encoding="utf-8").replace("{{name}}", "mychip").replace("{{module}}", "byoc_mychip")
    out.append((str(TEMPLATE.relative_to(ROOT)), template))
    assert len(out) > 20
    return out


def _is_target_name(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "target") or (
        isinstance(node, ast.Attribute) and node.attr == "target" and isinstance(node.value, ast.Name)
        and node.value.id == "ctx")


def test_no_plugin_guards_on_the_target_name():
    guards = []
    for path, text in _plugin_sources():
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.Compare) and any(_is_target_name(n) for n in [node.left, *node.comparators]):
                guards.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not guards, "target-name guards (byoc scopes hook calls itself):\n" + "\n".join(guards)


#: the modules of byoc a plugin may import (documented in docs/plugin-guide.md and the contract's docstring)
PUBLIC = ("byoc", "byoc.contract", "byoc.kernels", "byoc.quantize")


def _allowed(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PUBLIC[1:]) or module == "byoc"


def test_plugins_import_only_the_contract_and_public_apis():
    bad = []
    for path, text in _plugin_sources():
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                if node.module == "byoc":  # `from byoc import x`: x must be a public name, not a module
                    names += [f"byoc.{a.name}" for a in node.names if a.name not in byoc.__all__]
            else:
                continue
            for name in names:
                if (name == "byoc" or name.startswith("byoc.")) and not _allowed(name):
                    bad.append(f"{path}:{node.lineno}: {name}")
    assert not bad, "plugins import core internals (use byoc.contract):\n" + "\n".join(bad)


def test_the_contract_docstring_lists_the_public_apis():
    import byoc.contract

    for name in PUBLIC:
        assert f"``{name}``" in byoc.contract.__doc__ or name == "byoc.contract"
    assert re.search(r"byoc\.contract", (ROOT / "docs" / "plugin-guide.md").read_text(encoding="utf-8"))
