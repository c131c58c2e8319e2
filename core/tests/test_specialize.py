"""Shape specialisation as a wrapper around one single-shape compile (``byoc.runtime.specialize``)."""

from __future__ import annotations

import warnings

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
        self.budget = byoc.Budget(max_shape_keys=100)


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


def test_symbolic_inputs_are_detected():
    assert has_symbolic_inputs(_relu("N")) and not has_symbolic_inputs(_relu(4))
