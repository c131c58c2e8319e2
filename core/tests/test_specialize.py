"""Shape specialisation as a wrapper around one single-shape compile (``byoc.runtime.specialize``)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import byoc
from byoc.runtime import specialize
from byoc.runtime.specialize import has_symbolic_inputs, specialise


def _relu(batch="N"):
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [batch, 3])],
                         [h.make_tensor_value_info("y", T.FLOAT, [batch, 3])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])


class _Compiled:
    """Stands in for a CompiledModel: records what it was compiled for."""

    def __init__(self, proto, targets):
        self.dims = [d.dim_value or d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
        self.targets = [t.name for t in targets]
        self.options = {}
        self.specializer = None
        self.budget = byoc.Budget(max_shape_keys=100, max_specialization_bytes=2500)
        self.runs = []
        # regions holding 1,000 bytes of artifact data
        self.regions = [SimpleNamespace(artifact=SimpleNamespace(data=bytes(1000)))] if targets else []

    def run(self, feeds):
        self.runs.append(feeds)


def test_specialise_compiles_the_base_without_static_targets_then_per_shape():
    calls = []

    def compile_shapes(proto, targets):
        calls.append(_Compiled(proto, targets))
        return calls[-1]

    dyn = byoc.Target("dyn", "1")
    static = byoc.Target("fixed", "1", shape_policy="static", max_specializations=1)
    base = specialise(_relu(), [static, dyn], compile_shapes)
    assert calls == [base] and base.targets == ["dyn"] and base.dims == ["N", 3]
    assert base.options["shape_policy"] == {"fixed": "static", "dyn": "dynamic"}
    two = base.specializer.select({"x": np.zeros((2, 3), np.float32)})
    assert two.targets == ["fixed", "dyn"] and two.dims == [2, 3]  # priority order kept
    assert base.specializer.select({"x": np.ones((2, 3), np.float32)}) is two  # cached per shape
    with pytest.warns(UserWarning, match="no specialisation"):
        assert base.specializer.select({"x": np.zeros((5, 3), np.float32)}) is base  # over the limit
    assert len(calls) == 2


def test_specialisations_stop_at_the_budgets_bytes():
    """``Budget.max_specialization_bytes`` bounds the artifact data the specialisations hold
    together, whatever the targets' ``max_specializations`` allow."""
    static = byoc.Target("fixed", "1", shape_policy="static", max_specializations=100)
    base = specialise(_relu(), [static], lambda proto, targets: _Compiled(proto, targets))
    sp = base.specializer
    for n in (1, 2, 3):  # 0, 1,000 and 2,000 bytes held before each: allowed
        assert sp.select({"x": np.zeros((n, 3), np.float32)}) is not base
    assert sp.held_bytes() == 3000 and sp.describe()["held_bytes"] == 3000
    with pytest.warns(UserWarning, match="max_specialization_bytes"):
        assert sp.select({"x": np.zeros((4, 3), np.float32)}) is base
    assert sp.select({"x": np.zeros((2, 3), np.float32)}) is not base  # those made stay


def test_twenty_thousand_refused_shapes_keep_bounded_state_and_few_warnings():
    static = byoc.Target("fixed", "1", shape_policy="static", max_specializations=1)
    base = specialise(_relu(), [static], lambda proto, targets: _Compiled(proto, targets))
    sp = base.specializer
    sp.select({"x": np.zeros((1, 3), np.float32)})  # the one specialisation
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(2, 20_002):
            assert sp.select({"x": np.zeros((n, 3), np.float32)}) is base
    assert len(caught) == specialize.MAX_WARNINGS
    assert "not warned about" in str(caught[-1].message)
    assert len(sp.refused) == base.budget.max_shape_keys == 100
    assert sp.describe()["refused_count"] == 20_000
    assert sp.select({"x": np.zeros((20_001, 3), np.float32)}) is base  # recent: remembered, no new count
    assert sp.describe()["refused_count"] == 20_000


def _background(compile_shapes, max_specializations=8):
    static = byoc.Target("fixed", "1", shape_policy="static", max_specializations=max_specializations)
    return specialise(_relu(), [static], compile_shapes, background=True)


def test_a_new_shape_is_served_by_the_base_while_its_specialisation_compiles_in_the_background():
    import threading

    calls, release = [], threading.Event()

    def compile_shapes(proto, targets, wait=None):
        calls.append(wait)
        if len(calls) > 1:  # a specialisation: held until the test lets it go
            assert threading.current_thread().name == "byoc-specialise"
            release.wait(30)
        return _Compiled(proto, targets)

    base = _background(compile_shapes)
    sp = base.specializer
    feeds = {"x": np.ones((2, 3), np.float32)}
    assert sp.select(feeds) is base and sp.describe()["compiling"] == {"x": (2, 3)}
    sp.start_queued()
    assert sp.select({"x": np.zeros((2, 3), np.float32)}) is base  # still compiling
    assert sp.select({"x": np.zeros((7, 3), np.float32)}) is base  # one at a time: not queued
    feeds["x"][:] = 5  # the caller's arrays are not the background run's
    release.set()
    assert sp.wait(30)
    two = sp.select(feeds)
    assert two is not base and two.dims == [2, 3] and calls == [None, True]
    assert len(two.runs) == 1 and two.runs[0]["x"].shape == (2, 3) and (two.runs[0]["x"] == 1).all()
    assert sp.select({"x": np.zeros((7, 3), np.float32)}) is base  # now queued
    sp.start_queued()
    assert sp.wait(30) and sp.select({"x": np.zeros((7, 3), np.float32)}).dims == [7, 3]
    assert sp.describe()["compiling"] is None and len(sp.cache) == 2


def test_a_failed_background_specialisation_is_reported_once_and_the_base_keeps_serving():
    def compile_shapes(proto, targets, wait=None):
        if wait:
            raise RuntimeError("no code for these shapes")
        return _Compiled(proto, targets)

    base = _background(compile_shapes)
    sp = base.specializer
    feeds = {"x": np.zeros((4, 3), np.float32)}
    with pytest.warns(RuntimeWarning, match="no code for these shapes"):
        assert sp.select(feeds) is base
        sp.start_queued()
        assert sp.wait(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert sp.select(feeds) is base
            sp.start_queued()
    assert sp.describe()["failed"] == [{"shapes": {"x": (4, 3)}, "error": "RuntimeError: no code for these shapes"}]


def test_background_specialisations_count_against_the_limit():
    base = _background(lambda proto, targets, wait=None: _Compiled(proto, targets), max_specializations=1)
    sp = base.specializer
    assert sp.select({"x": np.zeros((1, 3), np.float32)}) is base
    assert sp.wait(30) and len(sp.cache) == 1  # wait() starts what was queued
    with pytest.warns(UserWarning, match="no specialisation"):
        assert sp.select({"x": np.zeros((2, 3), np.float32)}) is base
    assert sp.wait(30) and len(sp.cache) == 1


def test_symbolic_inputs_are_detected():
    assert has_symbolic_inputs(_relu("N")) and not has_symbolic_inputs(_relu(4))


def test_assumed_shapes_for_a_preview_take_batch_1_and_256_and_keep_names_alike():
    graph = h.make_graph([h.make_node("Add", ["a", "b"], ["y"])], "g",
                         [h.make_tensor_value_info("a", T.FLOAT, ["N", "L", 8]),
                          h.make_tensor_value_info("b", T.FLOAT, [4, "L", ""])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
    assert specialize.assumed_shapes(model) == {"a": (1, 256, 8), "b": (4, 256, 256)}
