"""The thread policies give the same results: byoc's pool (default), ``off`` and ``blas``
(each GEMM one OpenBLAS call on OpenBLAS's own threads), for the host kernels and byoc-cpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, sys
import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh
import byoc
from byoc_cpu.host import threads

rng = np.random.default_rng(0)
nodes = [
    h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),        # shift / im2col / Winograd
    h.make_node("Relu", ["a"], ["b"]),
    h.make_node("Conv", ["b", "w2"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),  # strided
    h.make_node("Conv", ["c", "w3"], ["d"]),                           # pointwise
    h.make_node("Flatten", ["d"], ["e"]),
    h.make_node("MatMul", ["e", "w4"], ["y"]),
]
inits = [nh.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n) for n, s in
         [("w1", (96, 80, 3, 3)), ("w2", (64, 96, 3, 3)), ("w3", (48, 64, 1, 1)), ("w4", (48 * 10 * 10, 32))]]
g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, (2, 80, 20, 20))],
                 [h.make_tensor_value_info("y", T.FLOAT, (2, 32))], inits)
model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
x = rng.standard_normal((2, 80, 20, 20)).astype(np.float32)
out = {}
for targets in ([], ["cpu"]):
    cm = byoc.compile(model, wait=True, targets=targets)
    out["+".join(targets) or "host"] = cm.run({"x": x})["y"].tolist()
print(json.dumps({"policy": threads.blas_info()["policy"], "blas": threads.blas_gemms(), "out": out}))
"""


def _run(policy: str) -> dict:
    env = dict(os.environ, BYOC_THREAD_POLICY=policy, BYOC_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_policies_agree():
    pytest.importorskip("byoc_cpu")
    import numpy as np

    base = _run("")
    assert not base["blas"]
    for policy in ("blas", "off"):
        got = _run(policy)
        assert got["blas"] == (policy == "blas"), got["policy"]
        for engine, want in base["out"].items():
            np.testing.assert_allclose(np.asarray(got["out"][engine]), np.asarray(want), rtol=1e-4, atol=1e-4)
