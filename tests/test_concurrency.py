"""One CompiledModel run from 8 threads x 200 runs: bit-identical to sequential runs.

For host-only and for each installed target (the test plugin, and every vendor plugin in the
integration environment).
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc

THREADS, RUNS = 8, 200


def _model():
    rng = np.random.default_rng(0)
    inits = [
        nh.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
        nh.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b1"),
        nh.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2"),
        nh.from_array((rng.standard_normal((8 * 4 * 4, 10)) * 0.1).astype(np.float32), "fc"),
        nh.from_array(np.array([0, -1], np.int64), "flat"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        h.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        h.make_node("Sigmoid", ["c2"], ["s2"], name="sig"),
        h.make_node("Add", ["s2", "p1"], ["a2"], name="add"),
        h.make_node("Reshape", ["a2", "flat"], ["f"], name="flatten"),
        h.make_node("MatMul", ["f", "fc"], ["logits"], name="fc"),
        h.make_node("Softmax", ["logits"], ["y"], axis=-1, name="softmax"),
    ]
    graph = h.make_graph(nodes, "concurrency", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2, 10])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _target_sets():
    sets = [[]]
    for t in byoc.list_targets():
        sets.append([t.name])
    return sets


@pytest.mark.parametrize("targets", _target_sets(), ids=lambda t: "+".join(t) or "host")
def test_threads_give_bit_identical_results(targets):
    model = _model()
    calib_rng = np.random.default_rng(2)
    needs_calibration = any(getattr(t, "needs_calibration", False) for t in byoc.list_targets() if t.name in targets)
    calibration = [{"x": calib_rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = byoc.compile(model, targets=targets, calibration=calibration if needs_calibration else None)
    if targets:
        assert compiled.regions, f"{targets} took no region of the test model"
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    expected = [compiled.run({"x": x})["y"] for x in inputs]
    failures: list[str] = []
    barrier = threading.Barrier(THREADS)

    def worker(tid: int) -> None:
        barrier.wait()
        for i in range(RUNS):
            k = (tid + i) % len(inputs)
            try:
                got = compiled.run({"x": inputs[k]})["y"]
            except Exception as exc:  # recorded, asserted below
                failures.append(f"thread {tid} run {i}: {type(exc).__name__}: {exc}")
                return
            if not np.array_equal(got, expected[k]):
                failures.append(f"thread {tid} run {i}: differs from the sequential result")
                return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
