"""Shape specialisation as a wrapper around one single-shape compile (``byoc.runtime.specialize``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import byoc
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


def test_symbolic_inputs_are_detected():
    assert has_symbolic_inputs(_relu("N")) and not has_symbolic_inputs(_relu(4))
