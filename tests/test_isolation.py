"""``isolation="process"``: a vendor that segfaults, aborts, hangs or runs out of memory costs one
error of byoc's own (or the host's result under ``isolation_fallback="host"``), the fault is
reported by kind, the user's process survives, and a new worker serves the next call.

The crash modes of byoc-faulty act only inside the isolation worker (they raise in this process),
so nothing here takes the test process down.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from itest_models import fault_chain, feeds, registry, require_test_plugins

import byoc
from byoc.errors import OptionError, PluginError
from byoc.report.data import report_data
from byoc.runtime.isolation import IsolatedRegion

require_test_plugins()

NODES = ["n0", "n1", "n2", "n3", "n4", "n5"]
ISOLATED = {"isolation": "process", "isolation_timeout": 3.0, "isolation_memory_mb": 1024}
KINDS = {"segfault": "SIGSEGV (segfault)", "abort": "SIGABRT (abort)", "hang": "did not return within 3 s",
         "memory": "exceeded the worker's memory limit (1024 MiB"}
#: the fault kind byoc reports for each crash mode
REPORTED = {"segfault": "segfault", "abort": "abort", "hang": "timeout", "memory": "memory"}


def compile_faultchip(reg, strict=False, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = byoc.compile(fault_chain(), targets=["faultchip"], registry=reg, strict=strict, hook_timeout=3.0,
                          target_options={"faultchip": {**ISOLATED, **options}})
    return cm, [str(w.message) for w in caught]


def host_result():
    m = fault_chain()
    return byoc.compile(m, targets=[]).run(feeds(m))["y"]


def test_isolated_results_equal_in_process_and_survive_a_bundle(monkeypatch, tmp_path):
    reg, _ = registry(monkeypatch, "ok")
    x = feeds(fault_chain())
    plain = byoc.compile(fault_chain(), targets=["faultchip"], registry=reg)
    cm, warned = compile_faultchip(reg)
    assert not cm.faults and not warned
    assert isinstance(cm.regions[0].fn, IsolatedRegion) and not isinstance(plain.regions[0].fn, IsolatedRegion)
    assert [cm.records[n].device for n in NODES] == ["faultchip"] * 6
    # within float32 rounding: the emulation runs on whichever host kernels each process has
    np.testing.assert_allclose(cm.run(x)["y"], plain.run(x)["y"], rtol=1e-6, atol=1e-7)
    path = tmp_path / "iso.byoc"
    cm.save(path)
    loaded = byoc.load(path, registry=reg)
    assert isinstance(loaded.regions[0].fn, IsolatedRegion)  # the option travels with the bundle
    assert loaded.options["target_options"]["faultchip"]["isolation"] == "process"
    np.testing.assert_allclose(loaded.run(x)["y"], plain.run(x)["y"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_region_call_fault_raises_byocs_error_and_the_next_call_works(monkeypatch, tmp_path, kind):
    reg, _ = registry(monkeypatch, f"callable-{kind}")
    monkeypatch.setenv("BYOC_FAULT_ONCE", str(tmp_path / "crashed"))
    cm, _ = compile_faultchip(reg)
    x = feeds(fault_chain())
    pid = cm.regions[0].fn.worker.proc.pid
    with pytest.raises(PluginError) as err:
        cm.run(x)
    msg = str(err.value)
    assert "plugin 'faulty'" in msg and "faultchip_0" in msg and KINDS[kind] in msg
    assert [f.kind for f in cm.faults] == [REPORTED[kind]]
    (entry,) = report_data(cm)["faults"]
    assert entry["kind"] == REPORTED[kind] and entry["hook"] == "byoc_runtime" and KINDS[kind] in entry["message"]
    # the worker was restarted: the next call runs the vendor again (the fault happens once)
    np.testing.assert_allclose(cm.run(x)["y"], host_result(), rtol=1e-6)
    assert cm.regions[0].fn.worker.proc.pid != pid


@pytest.mark.parametrize("kind", ["segfault", "hang"])
def test_region_call_fault_falls_back_to_the_host(monkeypatch, kind):
    reg, _ = registry(monkeypatch, f"callable-{kind}")
    cm, _ = compile_faultchip(reg, isolation_fallback="host")
    with pytest.warns(UserWarning, match=KINDS[kind].split(" (")[0]):
        y = cm.run(feeds(fault_chain()))["y"]
    np.testing.assert_allclose(y, host_result(), rtol=1e-6)
    assert [f.kind for f in cm.faults] == [REPORTED[kind]] and "the host ran the region" in cm.faults[0].message
    assert report_data(cm)["faults"][0]["kind"] == REPORTED[kind]


@pytest.mark.parametrize("hook", ["codegen", "runtime"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_hook_fault_falls_back_to_the_host_or_raises_when_strict(monkeypatch, tmp_path, hook, kind):
    reg, _ = registry(monkeypatch, f"{hook}-{kind}")
    cm, warned = compile_faultchip(reg)
    assert [cm.records[n].device for n in NODES] == ["host"] * 6
    (fault,) = cm.faults
    assert (fault.kind, fault.hook, fault.plugin) == (REPORTED[kind], f"byoc_{hook}", "faulty")
    assert KINDS[kind] in fault.message and "faultchip_0" in fault.message
    assert any(KINDS[kind] in w for w in warned) and KINDS[kind] in (cm.records["n0"].fallback or "")
    np.testing.assert_allclose(cm.run(feeds(fault_chain()))["y"], host_result(), rtol=1e-6)
    if kind in ("segfault", "abort"):  # strict: byoc's error instead (the slow ones once are enough)
        with pytest.raises(PluginError, match=KINDS[kind].replace("(", r"\(").replace(")", r"\)")):
            compile_faultchip(reg, strict=True)


def test_runtime_fault_at_load_follows_the_bundle_fallback(monkeypatch, tmp_path):
    reg, _ = registry(monkeypatch, "ok")
    path = tmp_path / "iso.byoc"
    compile_faultchip(reg)[0].save(path)
    reg, _ = registry(monkeypatch, "runtime-segfault")
    with pytest.raises(byoc.BundleError, match="SIGSEGV"):
        byoc.load(path, registry=reg)
    with pytest.warns(UserWarning, match="SIGSEGV"):
        loaded = byoc.load(path, registry=reg, fallback="host")
    assert "faultchip_0" in loaded.host_fallback
    np.testing.assert_allclose(loaded.run(feeds(fault_chain()))["y"], host_result(), rtol=1e-6)


def test_without_isolation_crash_modes_never_run_in_the_users_process(monkeypatch):
    reg, _ = registry(monkeypatch, "callable-segfault")
    cm = byoc.compile(fault_chain(), targets=["faultchip"], registry=reg)
    assert not isinstance(cm.regions[0].fn, IsolatedRegion)
    with pytest.raises(PluginError, match="only done in an isolation worker"):
        cm.run(feeds(fault_chain()))
    assert os.environ.get("BYOC_ISOLATION_WORKER") is None


@pytest.mark.parametrize("options,part", [({"isolation": "thread"}, "one of 'none', 'process'"),
                                          ({"isolation_memory_mb": 1}, ">= 64"),
                                          ({"isolation_fallback": "skip"}, "one of 'error', 'host'")])
def test_isolation_options_are_validated(monkeypatch, options, part):
    reg, _ = registry(monkeypatch, "ok")
    with pytest.raises(OptionError, match=part):
        byoc.compile(fault_chain(), targets=["faultchip"], registry=reg, target_options={"faultchip": options})


def test_the_runs_timeout_stops_a_hanging_isolated_call(monkeypatch):
    reg, _ = registry(monkeypatch, "callable-hang")
    cm, _ = compile_faultchip(reg, isolation_timeout=None)
    with pytest.raises(byoc.RunTimeoutError, match="isolated region"):
        cm.run(feeds(fault_chain()), timeout=1.0)
    assert cm.regions[0].fn.worker.proc is None  # stopped; the next call starts a new one
