"""Broken plugins (byoc-faulty, through its entry points) get the documented treatment.

A hook that raises, returns the wrong type or claims nodes that would form a cycle is named
(plugin, hook, node) in a warning and in ``CompiledModel.faults``; the region falls back to the
next target (testchip) or the host and the node records say so; ``strict=True`` raises
:class:`byoc.PluginError`. Registration faults (import error, duplicate target, wrong hook API
version) are recorded in ``Registry.faults`` and never stop the other plugins.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from itest_models import fault_chain, feeds, registry, require_test_plugins

import byoc
from byoc.errors import PluginError

require_test_plugins()

NODES = ["n0", "n1", "n2", "n3", "n4", "n5"]
TARGETS = ["faultchip", "testchip"]


def compile_with(reg, strict=False, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = byoc.compile(fault_chain(), targets=TARGETS, registry=reg, strict=strict, **kwargs)
    return cm, [str(w.message) for w in caught]


def assert_correct(cm):
    m = fault_chain()
    x = feeds(m)
    # within float32 rounding: the host's kernels are the reference's or an installed executor's
    np.testing.assert_allclose(cm.run(x)["y"], byoc.compile(m, targets=[]).run(x)["y"], rtol=1e-6, atol=1e-7)


def devices(cm):
    return [cm.records[n].device for n in NODES]


def test_inert_without_byoc_fault(monkeypatch):
    reg, warned = registry(monkeypatch)
    assert sorted(reg.targets) == ["testchip"] and not reg.faults and not warned


def test_working_faultchip_baseline(monkeypatch):
    reg, _ = registry(monkeypatch, "ok")
    assert [t.name for t in reg.ordered_targets()] == TARGETS
    cm, warned = compile_with(reg)
    assert not cm.faults and not warned
    assert devices(cm) == ["faultchip"] * 6
    assert cm.records["n0"].pattern == cm.records["n1"].pattern == "faultchip.neg_relu"
    assert_correct(cm)


# -- faults while compiling: (mode, hook, node or region named, message part, where the nodes end up)

# the region is dropped before placement: the next target (testchip) takes the nodes
TO_NEXT_TARGET = [
    ("check-raise", "byoc_register_operators", "node 'n0'", "raised FaultyPluginError"),
    ("check-wrong-type", "byoc_register_operators", "node 'n0'", "returned int"),
    ("rule-raise", "byoc_register_rules", "node 'n0'", "raised FaultyPluginError"),
    ("rule-wrong-type", "byoc_register_rules", "rule 'shape_up'", "returned float"),
    ("rule-cycle", "byoc_register_rules", "node 'n0'", "would form a cycle"),
    ("rule-bad-split", "byoc_register_rules", "rule 'shape_up'", "invalid split"),
]
# the region was placed, then its code generation or runtime failed: it runs on the host
TO_HOST = [
    ("codegen-raise", "byoc_codegen", "region 'faultchip_0'", "raised FaultyPluginError"),
    ("codegen-wrong-type", "byoc_codegen", "region 'faultchip_0'", "returned bytes"),
    ("codegen-bad-metadata", "byoc_codegen", "region 'faultchip_0'", "not JSON serializable"),
    ("codegen-none", "byoc_codegen", "region 'faultchip_0'", "no plugin generated code"),
    ("runtime-raise", "byoc_runtime", "region 'faultchip_0'", "raised FaultyPluginError"),
    ("runtime-wrong-type", "byoc_runtime", "region 'faultchip_0'", "returned int"),
]


def _named(fault, hook, where, part):
    text = str(fault)
    return fault.plugin == "faulty" and fault.hook == hook and where in text and part in text


@pytest.mark.parametrize("mode,hook,where,part", TO_NEXT_TARGET, ids=[c[0] for c in TO_NEXT_TARGET])
def test_fault_falls_back_to_next_target(monkeypatch, mode, hook, where, part):
    reg, _ = registry(monkeypatch, mode)
    cm, warned = compile_with(reg)
    assert any(_named(f, hook, where, part) for f in cm.faults), [str(f) for f in cm.faults]
    # warned, naming plugin, hook and node
    assert any("plugin 'faulty'" in w and hook in w and where in w for w in warned), warned
    assert devices(cm) == ["testchip"] * 6
    if mode.startswith("rule"):
        assert all(cm.records[n].rule.startswith("faultchip:shape_up") for n in NODES)
    else:
        assert "raised" in cm.records["n0"].verdicts["faultchip"] or "wrong type" in cm.records["n0"].verdicts[
            "faultchip"]
    assert [r.region.target for r in cm.regions] == ["testchip"]
    assert_correct(cm)


@pytest.mark.parametrize("mode,hook,where,part", TO_HOST, ids=[c[0] for c in TO_HOST])
def test_fault_falls_back_to_host(monkeypatch, mode, hook, where, part):
    reg, _ = registry(monkeypatch, mode)
    cm, warned = compile_with(reg)
    assert any(_named(f, hook, where, part) for f in cm.faults), [str(f) for f in cm.faults]
    assert any("plugin 'faulty'" in w and hook in w and where in w for w in warned), warned
    assert devices(cm) == ["host"] * 6
    for n in NODES:
        rec = cm.records[n]
        assert rec.region is None and part in rec.fallback, rec
    assert cm.regions == []
    assert_correct(cm)


@pytest.mark.parametrize("mode", [c[0] for c in TO_NEXT_TARGET + TO_HOST] + [
    "pattern-raise", "pre-partition-raise", "post-partition-raise"])
def test_strict_raises(monkeypatch, mode):
    reg, _ = registry(monkeypatch, mode)
    with pytest.raises(PluginError, match="plugin 'faulty'"):
        byoc.compile(fault_chain(), targets=TARGETS, registry=reg, strict=True)


def test_pattern_fault_skips_the_pattern(monkeypatch):
    reg, _ = registry(monkeypatch, "pattern-raise")
    cm, warned = compile_with(reg)
    assert any(_named(f, "byoc_register_patterns", "node 'n1'", "faultchip.neg_relu") for f in cm.faults)
    assert any("byoc_register_patterns" in w and "node 'n1'" in w for w in warned)
    # the nodes are still supported one by one; only the composite is gone
    assert devices(cm) == ["faultchip"] * 6
    assert cm.records["n1"].pattern is None
    assert_correct(cm)


def test_pre_partition_fault_is_recorded(monkeypatch):
    reg, _ = registry(monkeypatch, "pre-partition-raise")
    cm, warned = compile_with(reg)
    assert any(_named(f, "byoc_pre_partition", "target 'faultchip'", "raised FaultyPluginError")
               for f in cm.faults)
    assert any("byoc_pre_partition" in w for w in warned)
    assert_correct(cm)


def test_post_partition_fault_falls_back(monkeypatch):
    reg, _ = registry(monkeypatch, "post-partition-raise")
    cm, warned = compile_with(reg)
    assert any(_named(f, "byoc_post_partition", "region 'faultchip_0'", "raised FaultyPluginError")
               for f in cm.faults)
    assert any("byoc_post_partition" in w and "faultchip_0" in w for w in warned)
    # a pass that failed half-way may have left the region body broken: the region runs on the host
    assert devices(cm) == ["host"] * 6
    assert all("byoc_post_partition" in (cm.records[n].fallback or "") or "FaultyPluginError" in
               (cm.records[n].fallback or "") for n in NODES)
    assert_correct(cm)


@pytest.mark.parametrize("mode,part", [("callable-raise", "raised FaultyPluginError"),
                                       ("callable-wrong-arity", "expected a sequence of 1 arrays")])
def test_runtime_callable_fault_names_plugin_and_region(monkeypatch, mode, part):
    reg, _ = registry(monkeypatch, mode)
    cm, _ = compile_with(reg)
    assert devices(cm) == ["faultchip"] * 6
    with pytest.raises(PluginError) as err:
        cm.run(feeds(fault_chain()))
    msg = str(err.value)
    assert "plugin 'faulty'" in msg and "byoc_runtime" in msg and "faultchip_0" in msg and part in msg


def test_cost_fault_is_recorded(monkeypatch):
    reg, _ = registry(monkeypatch, "cost-raise")
    cm, _ = compile_with(reg)
    region = cm.regions[0].region
    plugin, cost, faults = reg.call_first("byoc_cost", target="faultchip", region=region, options={})
    assert (plugin, cost) == (None, None)
    assert [(f.plugin, f.hook) for f in faults] == [("faulty", "byoc_cost")]
    assert "FaultyPluginError" in faults[0].message


# -- faults while building the registry -------------------------------------------------------


def test_import_error_names_distribution_and_keeps_others(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "byoc_faulty.broken", raising=False)
    reg, warned = registry(monkeypatch, "import")
    [fault] = [f for f in reg.faults if f.kind == "import"]
    assert (fault.plugin, fault.distribution, fault.version) == ("faulty_import", "byoc-faulty", "0.1.0")
    assert "ImportError" in fault.message and "libfaulty.so" in fault.message
    assert any("faulty_import" in w and "byoc-faulty 0.1.0" in w and "ImportError" in w for w in warned)
    assert "testchip" in reg.targets  # the other plugins still load
    cm = byoc.compile(fault_chain(), targets=["testchip"], registry=reg)
    assert devices(cm) == ["testchip"] * 6


@pytest.mark.parametrize("mode,exc", [("targets-raise", "FaultyPluginError"), ("targets-wrong-type", "TypeError")])
def test_register_targets_fault(monkeypatch, mode, exc):
    reg, warned = registry(monkeypatch, mode)
    assert any(f.plugin == "faulty" and f.hook == "byoc_register_targets" and exc in f.message for f in reg.faults)
    assert any("byoc_register_targets" in w and "byoc-faulty" in w for w in warned)
    assert sorted(reg.targets) == ["testchip"]
    with pytest.raises(PluginError, match="unknown target 'faultchip'"):
        byoc.compile(fault_chain(), targets=TARGETS, registry=reg)


def test_register_operators_fault(monkeypatch):
    reg, warned = registry(monkeypatch, "operators-raise")
    assert any(f.plugin == "faulty" and f.hook == "byoc_register_operators" and "faultchip" in f.message
               for f in reg.faults)
    cm, _ = compile_with(reg)
    assert cm.records["n0"].verdicts["faultchip"] == "Neg: operator not supported by faultchip"
    assert devices(cm) == ["testchip"] * 6


def test_duplicate_target_names_both_plugins(monkeypatch):
    reg, warned = registry(monkeypatch, "duplicate")
    assert reg.conflicts == {"testchip": ["faulty_duplicate", "testchip"]}  # entry points load sorted by name
    [fault] = [f for f in reg.faults if f.kind == "duplicate"]
    assert "testchip" in str(fault) and "faulty_duplicate" in str(fault)
    assert any("faulty_duplicate" in w and "'testchip'" in w for w in warned)
    with pytest.raises(PluginError) as err:
        byoc.compile(fault_chain(), targets=["testchip"], registry=reg)
    assert "faulty_duplicate, testchip" in str(err.value)
    # with no explicit targets, the contested target is left out instead of crashing
    cm = byoc.compile(fault_chain(), registry=reg)
    assert devices(cm) == ["host"] * 6


def test_api_version_mismatch_is_reported(monkeypatch):
    reg, warned = registry(monkeypatch, "api-version")
    assert "oldchip" in reg.incompatible and "oldchip" not in reg.targets
    [fault] = [f for f in reg.faults if f.kind == "api-version"]
    assert fault.plugin == "faulty_api" and "999" in fault.message
    assert (fault.distribution, fault.version) == ("byoc-faulty", "0.1.0")
    assert any("999" in w for w in warned)
    cm = byoc.compile(fault_chain(), registry=reg)  # not crashed on: the other targets work
    assert devices(cm) == ["testchip"] * 6
    with pytest.raises(PluginError, match="hook API version 999"):
        byoc.compile(fault_chain(), targets=["oldchip"], registry=reg)


def test_byoc_doctor_reports_every_registration_fault(monkeypatch, capsys):
    import sys

    import byoc.plugins
    from byoc.cli import main

    monkeypatch.delitem(sys.modules, "byoc_faulty.broken", raising=False)
    monkeypatch.setattr(byoc.plugins, "_registry", None)  # the cached registry comes back afterwards
    monkeypatch.setenv("BYOC_PLUGINS", "testchip,faulty_import,faulty_duplicate,faulty_api")
    monkeypatch.setenv("BYOC_FAULT", "import,duplicate,api-version")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "faulty_import" in out and "byoc-faulty 0.1.0" in out and "ImportError" in out
    assert "target 'testchip' is registered by plugins" in out and "'faulty_duplicate'" in out
    assert "'oldchip'" in out and "hook API version 999" in out
    assert "3 problem(s) found" in out


def test_byoc_doctor_explains_a_hook_api_1_plugin(monkeypatch, capsys):
    """An installed plugin written for hook API 1 (it imports byoc.partition.types) is named, not a crash."""
    import sys

    import byoc.plugins
    from byoc.cli import main

    monkeypatch.delitem(sys.modules, "byoc_faulty.api1", raising=False)
    monkeypatch.setattr(byoc.plugins, "_registry", None)
    monkeypatch.setenv("BYOC_PLUGINS", "testchip,faulty_api1")
    monkeypatch.setenv("BYOC_FAULT", "api1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["doctor"]) == 1
        reg = byoc.plugins.get_registry()
    out = capsys.readouterr().out
    assert "incompatible plugins (1)" in out and "'faulty_api1'" in out and "byoc-faulty 0.1.0" in out
    assert "built for hook API version 1" in out and "byoc.partition.types" in out and "upgrade it" in out
    assert list(reg.targets) == ["testchip"]  # the others still work
    assert "1 problem(s) found" in out
