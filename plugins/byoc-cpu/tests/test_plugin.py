"""Discovery through the ``byoc`` entry-point group, the CLI, and the plugin's hooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cpu_helpers import REGISTRY, make_model
from onnx import helper, save

import byoc
import byoc_cpu
from byoc_cpu import plugin


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "byoc.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


def test_entry_point_registers_cpu():
    from importlib.metadata import entry_points

    [ep] = [ep for ep in entry_points(group="byoc") if ep.name == "cpu"]
    assert ep.value == "byoc_cpu.plugin"
    out = _cli("targets", "--json", env={"BYOC_PLUGINS": "cpu"})
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    rows = rows if isinstance(rows, list) else rows.get("targets", rows)
    [row] = [r for r in rows if r.get("name") == "cpu"]
    assert row.get("version") == byoc_cpu.__version__


@pytest.fixture
def tiny_model(tmp_path):
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                        helper.make_node("Relu", ["c"], ["y"], name="relu")], {"x": (1, 3, 6, 6)}, ["y"],
                       {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)})
    path = tmp_path / "tiny.onnx"
    save(model, str(path))
    return path


def test_explain_show_code_prints_the_generated_source(tiny_model):
    out = _cli("explain", str(tiny_model), "-t", "cpu", "--show-code", env={"BYOC_PLUGINS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert "cpu.conv_bias_act" in out.stdout
    assert "== region cpu_0 (target cpu, format python) ==" in out.stdout
    assert "def run(arena, consts, weights, in0):" in out.stdout
    assert "@numba.njit(" in out.stdout


def test_default_compile_uses_cpu_when_installed(tiny_model):
    """With the entry point installed and no targets given, byoc.compile offloads to cpu."""
    code = ("import byoc; cm = byoc.compile(__import__('sys').argv[1], wait=True); "
            "print(sorted({r.region.target for r in cm.regions}))")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_model)], capture_output=True, text=True,
                         env=dict(os.environ, BYOC_PLUGINS="cpu"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['cpu']"


def test_hooks_are_scoped_to_the_cpu_target():
    """byoc calls the cpu hooks only for "cpu": no hook needs to check the target name."""
    from byoc.plugins import build_registry

    reg = build_registry([("cpu", plugin)], entry_points=False)
    assert reg.scopes == {"cpu": ["cpu"]}
    assert reg.hookimpls("byoc_codegen", "other") == []
    assert [i.plugin_name for i in reg.hookimpls("byoc_codegen", "cpu")] == ["cpu"]


def test_conv_strategy_is_validated():
    with pytest.raises(byoc.OptionError, match="option 'conv_strategy' = 'bogus'.*one of 'auto', 'im2col'"):
        byoc.compile(make_model([helper.make_node("Relu", ["a"], ["y"])], {"a": (2, 2)}, ["y"]), wait=True,
                     targets=["cpu"], target_options={"cpu": {"conv_strategy": "bogus"}})


def test_cost_hook_counts_gemm_work():
    cm = byoc.compile(make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": (64, 64)}, ["y"],
                                 {"b": np.ones((64, 64), np.float32)}), wait=True, targets=["cpu"], registry=REGISTRY)
    seconds = plugin.byoc_cost(cm.regions[0].region)
    assert 0 < seconds < 1e-3


def test_unknown_option_is_refused():
    with pytest.raises(byoc.OptionError):
        byoc.compile(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2,)}, ["y"]), wait=True, targets=["cpu"],
                     registry=REGISTRY, target_options={"cpu": {"nope": 1}})
