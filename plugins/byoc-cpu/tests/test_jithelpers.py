"""A first run with an empty Numba cache compiles its kernels in helper processes too
(byoc_cpu.host.jithelpers): the results are the ones a run without helpers gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from byoc_cpu.host import jithelpers

# four Numba kernels (no numpy twins), each a fraction of a second to compile
_CHILD = r"""
import json, sys
import numpy as np
import onnx
from onnx import TensorProto, helper as h
from onnx.reference import ReferenceEvaluator
import byoc
from byoc_cpu.host import jithelpers

nodes = [h.make_node("Sigmoid", ["x"], ["a"]), h.make_node("LeakyRelu", ["a"], ["b"], alpha=0.3),
         h.make_node("HardSigmoid", ["b"], ["c"]), h.make_node("Softsign", ["c"], ["y"])]
graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [4, 300])])
model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
x = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32) * 4
got = byoc.compile(model, wait=True, targets=[]).run({"x": x})["y"]
want = ReferenceEvaluator(model).run(None, {"x": x})[0]
print(json.dumps({"max_err": float(np.max(np.abs(got - want))), "helpers": jithelpers.helper_count(),
                  "helper_compiled": jithelpers.helper_compiled()}))
"""


def _first_run(tmp_path, helpers: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / f"numba-{helpers}"), BYOC_JIT_HELPERS=helpers)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="helpers fork (Linux only)")
def test_helpers_compile_part_of_a_cold_first_run_and_change_no_result(tmp_path):
    helped = _first_run(tmp_path, "1")
    assert helped["helpers"] == 1
    assert helped["max_err"] < 1e-5
    assert helped["helper_compiled"] >= 1, helped  # the helper ran ahead and compiled a kernel
    alone = _first_run(tmp_path, "0")
    assert alone["helpers"] == 0 and alone["helper_compiled"] == 0
    assert alone["max_err"] < 1e-5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="helpers fork (Linux only)")
def test_helper_count_follows_the_environment(monkeypatch):
    monkeypatch.setenv("BYOC_JIT_HELPERS", "0")
    assert jithelpers.helper_count() == 0
    monkeypatch.setenv("BYOC_JIT_HELPERS", "2")
    assert jithelpers.helper_count() == 2
    monkeypatch.setenv("BYOC_JIT_HELPERS", "many")
    assert jithelpers.helper_count() == 0
    monkeypatch.delenv("BYOC_JIT_HELPERS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)), raising=False)
    assert jithelpers.helper_count() == 0  # two cores: none by default
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert jithelpers.helper_count() == 3
