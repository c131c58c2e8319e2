"""Tiered first runs (byoc.runtime.tiers) with byoc-cpu, a JIT engine: the reference kernels answer
while byoc-cpu's code compiles in the background, then byoc-cpu's code serves."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper
from cpu_helpers import REGISTRY
from test_bundle import small_net

import byoc
from byoc.report import render


@pytest.fixture(params=[None, []], ids=["cpu-target", "host-executor"])
def targets(request):
    return request.param


def test_the_first_tier_answers_and_the_compiled_code_takes_over(targets):
    model, feeds = small_net(seed=11)
    cm = byoc.compile(model, targets=targets, registry=REGISTRY, wait=False)
    assert cm.tiers is not None and cm.tiers.state == "first"
    first = cm.run(feeds)
    assert cm.tiers.state in ("compiling", "full")
    assert "First tier" in cm.report()
    assert cm.wait(timeout=600) and cm.tiers.state == "full" and cm.tiers.ready_after_s > 0
    later = cm.run(feeds)
    for name in first:
        np.testing.assert_allclose(first[name], later[name], rtol=1e-4, atol=1e-4)
    assert cm.report_data()["first_tier"]["state"] == "full"
    assert "serving since" in render(cm.report_data(), "text")


def test_runs_racing_the_swap_are_all_correct(targets):
    model, feeds = small_net(seed=12)
    want = byoc.compile(model, targets=[], host="reference").run(feeds)
    cm = byoc.compile(model, targets=targets, registry=REGISTRY, wait=False)
    results, errors = [], []

    def worker():
        try:
            for _ in range(15):
                results.append(cm.run(feeds))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cm.wait(timeout=600)
    results.append(cm.run(feeds))
    for out in results:
        for name in want:
            np.testing.assert_allclose(out[name], want[name], rtol=1e-4, atol=1e-4)


def test_a_failed_background_compile_leaves_the_first_tier_serving_and_says_so_once():
    model, feeds = small_net(seed=13)
    cm = byoc.compile(model, registry=REGISTRY, wait=False)

    def broken(_feeds):
        raise RuntimeError("the code generator's module did not compile")

    cm.tiers._full_first_run = broken
    want = byoc.compile(model, targets=[], host="reference").run(feeds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm.run(feeds)
        assert not cm.wait(timeout=600)
        outs = [cm.run(feeds) for _ in range(3)]
    said = [w for w in caught if "failed on its first run" in str(w.message)]
    assert len(said) == 1 and "did not compile" in str(said[0].message)
    assert cm.tiers.state == "failed" and "did not compile" in cm.report()
    for out in outs:
        for name in want:
            np.testing.assert_allclose(out[name], want[name], rtol=1e-5, atol=1e-6)


def _relu_reshape(rows):
    """y = reshape(relu(x), shape) with x of ``rows`` x 6 and the shape an input: feeds decide
    whether it can run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 6])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])],
                              "reshape", [x, shape], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_first_run_that_fails_on_its_feeds_starts_no_compile_and_demotes_nothing(targets):
    """Feeds no plan can run (a Reshape to a shape that does not fit) fail on the first tier; the
    compiled code is not tried on them, and the next good run starts it as usual."""
    model = _relu_reshape(2)
    cm = byoc.compile(model, targets=targets, registry=REGISTRY, wait=False)
    x_value = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(byoc.ByocError, match="Reshape"):
            cm.run({"x": x_value, "shape": np.array([1, 0], np.int64)})
        assert cm.tiers.state == "first"
        out = cm.run({"x": x_value, "shape": np.array([3, 4], np.int64)})
        assert cm.wait(timeout=600) and cm.tiers.state == "full"
    assert not [w for w in caught if "failed on its first run" in str(w.message)]
    np.testing.assert_array_equal(out["y"], np.maximum(x_value, 0).reshape(3, 4))


def test_wait_true_has_no_first_tier():
    model, feeds = small_net(seed=14)
    cm = byoc.compile(model, registry=REGISTRY, wait=True)
    assert cm.tiers is None and cm.wait() and "first_tier" not in cm.report_data()
    cm.run(feeds)


def test_the_reference_alone_has_no_first_tier():
    model, _ = small_net(seed=15)
    assert byoc.compile(model, targets=[], host="reference").tiers is None


def test_new_input_shapes_are_served_at_once_and_specialised_in_the_background():
    """A symbolic model: the base compile (byoc-cpu's host kernels) serves each new batch size
    while byoc-cpu's specialisation for it compiles on a background thread; then it serves."""
    from cpu_helpers import make_model
    from onnx import helper

    rng = np.random.default_rng(5)
    k = rng.standard_normal(4).astype(np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])],
                       {"x": ("N", 4)}, ["y"], {"k": k})
    cm = byoc.compile(model, registry=REGISTRY, wait=False)
    sp = cm.specializer
    assert sp is not None and sp.background
    for n in (1, 3, 6):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(cm.run({"x": x})["y"], np.maximum(x, 0) * k, rtol=1e-6)
        assert cm.wait(timeout=600)
        np.testing.assert_allclose(cm.run({"x": x})["y"], np.maximum(x, 0) * k, rtol=1e-6)
    data = cm.report_data()["specialisations"]
    assert [s["shapes"] for s in data["compiled"]] == [{"x": [n, 4]} for n in (1, 3, 6)]
    assert all(s["nodes"] == {"cpu": 2} for s in data["compiled"]) and data["compiling"] is None


def test_runs_while_specialisations_compile_in_the_background_are_correct():
    """Runs of new and old shapes, back to back, while byoc-cpu's specialisations compile and
    first-run on the background thread (both on byoc-cpu's pool)."""
    model, _ = small_net(seed=13)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    want_cm = byoc.compile(model, targets=[], host="reference")
    cm = byoc.compile(model, registry=REGISTRY, wait=False)
    rng = np.random.default_rng(13)
    for n in (1, 2, 3, 1, 4, 2, 5, 3, 1, 6, 4, 2):
        x = {"x": rng.standard_normal((n, 3, 12, 12)).astype(np.float32)}
        got, want = cm.run(x), want_cm.run(x)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    assert cm.wait(timeout=600)
    assert len(cm.report_data()["specialisations"]["compiled"]) >= 1


def test_a_run_that_fails_on_its_feeds_queues_no_specialisation():
    """New shapes whose run fails (a Reshape that does not fit) leave no failed specialisation
    behind: the next good run of those shapes specialises them as usual."""
    model = _relu_reshape("N")
    cm = byoc.compile(model, registry=REGISTRY, wait=False)
    assert cm.specializer is not None and cm.specializer.background
    x_value = np.arange(-12, 12, dtype=np.float32).reshape(4, 6)
    with pytest.raises(byoc.ByocError, match="Reshape"):
        cm.run({"x": x_value, "shape": np.array([5, 0], np.int64)})
    cm.wait(timeout=600)
    assert not cm.specializer.failed and not cm.specializer.cache
    out = cm.run({"x": x_value, "shape": np.array([6, 4], np.int64)})
    assert cm.wait(timeout=600) and not cm.specializer.failed and len(cm.specializer.cache) == 1
    np.testing.assert_array_equal(out["y"], np.maximum(x_value, 0).reshape(6, 4))
