"""The compiled region driver (``run_native``, the ``native`` option): same bits as the Python
driver, any number of threads, the segments compiled once per region."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from cpu_helpers import compile_cpu, make_model, onnxruntime_run
from onnx import helper

from byoc_cpu.host.gemm import FULL_WIDTH
from byoc_cpu import runtime
from byoc_cpu.emit import native_program

#: the compiled segments call byoc's own GEMM, which byoc-cpu uses only on AVX-512 CPUs (elsewhere
#: the weights stay OpenBLAS operands and every region keeps the Python driver)
needs_own_gemm = pytest.mark.skipif(not FULL_WIDTH, reason="compiled segments need byoc's own GEMM (AVX-512)")


def _model():
    """Convolutions (1x1, 3x3, strided), pools, a fire-module Concat, elementwise loops, and a
    Gemm that OpenBLAS runs between two compiled segments."""
    r = np.random.default_rng(0)

    def w(*shape):
        return (r.standard_normal(shape) * 0.2).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["e1"]),
        helper.make_node("Conv", ["r2", "w4", "b4"], ["e3"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["e1", "e3"], ["cat"], axis=1),
        helper.make_node("Relu", ["cat"], ["r3"]),
        helper.make_node("Conv", ["r3", "w5", "b5"], ["c5"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c5"], ["g5"]),
        helper.make_node("AveragePool", ["g5"], ["a5"], kernel_shape=[2, 2], strides=[1, 1]),
        helper.make_node("GlobalAveragePool", ["a5"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"]),
    ]
    inits = {"w1": w(32, 8, 3, 3), "b1": w(32), "w2": w(16, 32, 1, 1), "w3": w(32, 16, 1, 1), "b3": w(32),
             "w4": w(32, 16, 3, 3), "b4": w(32), "w5": w(48, 64, 3, 3), "b5": w(48), "wf": w(10, 48), "bf": w(10)}
    return make_model(nodes, {"x": (1, 8, 40, 40)}, ["y"], inits)


@pytest.fixture(scope="module")
def compiled():
    model = _model()
    cm = compile_cpu(model, threads=2)
    assert len(cm.regions) == 1
    return model, cm


def _regions(cm):
    artifact = cm.regions[0].artifact
    return runtime.load(artifact, {"native": "on"}), runtime.load(artifact, {"native": "off"})


@needs_own_gemm
def test_native_and_python_drivers_compute_the_same_bits(compiled):
    model, cm = compiled
    on, off = _regions(cm)
    assert on.native and not off.native
    x = np.random.default_rng(1).standard_normal((1, 8, 40, 40)).astype(np.float32)
    got_on, got_off = on(x), off(x)
    assert len(got_on) == len(got_off) == 1
    np.testing.assert_array_equal(got_on[0], got_off[0])
    np.testing.assert_allclose(got_on[0], onnxruntime_run(model, {"x": x})[0], rtol=1e-4, atol=1e-6)
    x2 = x[:, :, ::-1].copy()  # the arena is reused: a second run does not see the first's values
    np.testing.assert_array_equal(on(x2)[0], off(x2)[0])


def test_generated_segments_and_driver(compiled):
    _, cm = compiled
    source = cm.regions[0].artifact.metadata["source"]
    assert native_program(cm.regions[0].artifact.metadata["program"])
    assert "def run_native(" in source and "run_spmd(native" in source
    assert "sgemm(" in source.split("def run_native(")[1], "the OpenBLAS Gemm runs between compiled segments"
    # inside the compiled segments every call takes its integers from the table I: a literal
    # would make Numba compile the callee once per value (a model's first run took minutes)
    for body in re.findall(r"^def native\d+\(.*?(?=^\S)", source, re.S | re.M):
        for call in re.findall(r"(?:K\.\w+|wgemm_packed|claim|finish|wait_done)\((.*)\)", body):
            assert not re.search(r"(?:^|, )-?\d+(?=,|$)", call), call


@needs_own_gemm
def test_native_runs_from_several_threads_at_once(compiled):
    """Concurrent calls share one pool: a call that finds it busy runs its segments alone."""
    model, cm = compiled
    on, _ = _regions(cm)
    xs = [np.random.default_rng(s).standard_normal((1, 8, 40, 40)).astype(np.float32) for s in range(4)]
    want = [on(x)[0] for x in xs]
    got: dict[int, np.ndarray] = {}

    def work(i):
        for _ in range(3):
            got[i] = on(xs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_array_equal(got[i], want[i])


@needs_own_gemm
def test_native_option_is_machine_local(compiled):
    """The option picks a driver at load; the artifact (and so a bundle) is the same."""
    model, _ = compiled
    x = np.random.default_rng(2).standard_normal((1, 8, 40, 40)).astype(np.float32)
    on = compile_cpu(model, threads=2, native="on")
    off = compile_cpu(model, threads=2, native="off")
    assert on.regions[0].artifact.metadata == off.regions[0].artifact.metadata
    np.testing.assert_array_equal(on.run({"x": x})["y"], off.run({"x": x})["y"])


@needs_own_gemm
def test_blocked_layout_runs_inside_the_compiled_segment(compiled):
    """The channel-blocked kernel (Zen 4's choice for KxK layers) is a step of the segment, not
    a cut between two: a region stays one compiled function (DenseNet-121 had 59)."""
    model, _ = compiled
    on = compile_cpu(model, threads=2, native="on", conv_strategy="blocked")
    off = compile_cpu(model, threads=2, native="off", conv_strategy="blocked")
    source = on.regions[0].artifact.metadata["source"]
    bodies = re.findall(r"^def native\d+\(.*?(?=^\S)", source, re.S | re.M)
    assert any(re.search(r"K\.conv(8|16)\(", body) and "K.reorder8(" in body for body in bodies)
    x = np.random.default_rng(3).standard_normal((1, 8, 40, 40)).astype(np.float32)
    got = on.run({"x": x})["y"]
    np.testing.assert_array_equal(got, off.run({"x": x})["y"])
    np.testing.assert_allclose(got, onnxruntime_run(model, {"x": x})[0], rtol=1e-4, atol=1e-6)


def test_auto_compiles_only_regions_with_enough_parallel_steps(monkeypatch):
    monkeypatch.delenv("BYOC_CPU_NATIVE", raising=False)
    par = {"kind": "par", "chunks": [[]]}
    few = {"steps": [par] * (runtime.NATIVE_MIN_PAR - 1)}
    many = {"steps": [par] * runtime.NATIVE_MIN_PAR}
    assert not runtime.use_native(few) and runtime.use_native(many)
    assert runtime.use_native(few, "on") and not runtime.use_native(many, "off")
    monkeypatch.setenv("BYOC_CPU_NATIVE", "0")
    assert not runtime.use_native(many) and runtime.use_native(few, "on")
    monkeypatch.setenv("BYOC_CPU_NATIVE", "1")
    assert runtime.use_native(few) and not runtime.use_native(many, "off")
