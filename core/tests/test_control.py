"""Run time limits, cancellation, and the hook time limit at compile time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import byoc
from byoc.plugins import build_registry
from byoc.contract import host_callable, region_model_bytes

from loops import counting_loop


def test_trip_count_over_budget_is_refused_before_iterating():
    compiled = byoc.compile(counting_loop(10**15), targets=[])
    t0 = time.perf_counter()
    with pytest.raises(byoc.ResourceLimitError, match="runaway.*trip count 1000000000000000"):
        compiled.run({"v0": np.zeros(1, np.float32)})
    assert time.perf_counter() - t0 < 1.0


def test_timeout_stops_a_runaway_loop():
    compiled = byoc.compile(counting_loop(10**15), targets=[], budget=byoc.Budget(max_loop_iterations=10**16))
    small = byoc.compile(counting_loop(3), targets=[])
    assert small.run({"v0": np.zeros(1, np.float32)}, timeout=30)["v"].tolist() == [3.0]
    t0 = time.perf_counter()
    with pytest.raises(byoc.RunTimeoutError, match="runaway"):
        compiled.run({"v0": np.zeros(1, np.float32)}, timeout=0.3)
    assert time.perf_counter() - t0 < 3.0


def test_cancel_from_another_thread():
    compiled = byoc.compile(counting_loop(10**15), targets=[], budget=byoc.Budget(max_loop_iterations=10**16))
    handle = byoc.CancelHandle()
    threading.Timer(0.2, handle.cancel).start()
    with pytest.raises(byoc.RunCancelledError):
        compiled.run({"v0": np.zeros(1, np.float32)}, cancel=handle)
    assert handle.cancelled


def test_bad_timeout_value_is_refused():
    compiled = byoc.compile(counting_loop(1), targets=[])
    with pytest.raises(byoc.OptionError):
        compiled.run({"v0": np.zeros(1, np.float32)}, timeout=0)


class _SlowCodegen:
    def __init__(self, delay: float):
        self.delay = delay

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("slow", version="1", device="npu"))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == "slow":
            register("Relu")

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        time.sleep(self.delay)
        return byoc.Artifact("slow", "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        return host_callable(artifact.data)


def _relu_model():
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [4])], [h.make_tensor_value_info("y", T.FLOAT, [4])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_hanging_codegen_times_out_and_falls_back_to_host():
    registry = build_registry([("slowplugin", _SlowCodegen(3.0))], entry_points=False)
    t0 = time.perf_counter()
    with pytest.warns(UserWarning, match="slowplugin.*byoc_codegen.*did not return within 0.3 s"):
        compiled = byoc.compile(_relu_model(), registry=registry, hook_timeout=0.3)
    assert time.perf_counter() - t0 < 2.5
    assert compiled.regions == []
    rec = compiled.records["relu"]
    assert rec.device == "host" and "did not return" in rec.fallback
    assert any(f.plugin == "slowplugin" and f.hook == "byoc_codegen" for f in compiled.faults)
    x = np.array([-1, 0, 1, 2], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x, 0))
    with pytest.raises(byoc.PluginError, match="slowplugin"):
        byoc.compile(_relu_model(), registry=registry, hook_timeout=0.3, strict=True)


def test_fast_codegen_is_unaffected_by_the_limit():
    registry = build_registry([("fastplugin", _SlowCodegen(0.0))], entry_points=False)
    compiled = byoc.compile(_relu_model(), registry=registry, hook_timeout=5)
    assert [r.region.name for r in compiled.regions] == ["slow_0"]


def test_control_flow_operators_are_run_by_the_plan():
    from byoc.errors import KernelError
    from byoc.kernels import PLAN_OPERATORS, NodeSpec, is_supported, make_kernel, supported_ops
    from byoc.runtime import control_flow

    assert set(control_flow.FACTORIES) == set(PLAN_OPERATORS) == {"If", "Loop", "Scan"}
    assert all(is_supported(op) and is_supported(op, "ai.onnx") and op in supported_ops() for op in PLAN_OPERATORS)
    with pytest.raises(KernelError, match="'loop_1' .*run by the execution plan"):
        make_kernel(NodeSpec("Loop", name="loop_1"))


def test_calibration_observes_tensors_inside_a_loop_body():
    from byoc.quantize import calibrate

    table = calibrate(counting_loop(3), [{"v0": np.ones(1, np.float32)}])
    assert "v_out" in table.stats  # the body's sum, seen on every iteration
    assert table["v_out"].count == 3 and table["v_out"].max == 4.0
