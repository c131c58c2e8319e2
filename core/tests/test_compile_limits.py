"""A compile never hangs: onnx's C++ checker, converter and shape inference run where
``Budget.max_compile_seconds`` can stop them, and what byoc knows they cannot handle is refused first."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import byoc
from byoc.errors import CompileTimeoutError, ModelValidationError, OptionError
from byoc.frontend import bounded, validate

needs_fork = pytest.mark.skipif(not bounded.FORKS, reason="calls run in-process where fork is unavailable")


def einsum_model(equation: str, shapes, opset: int = 17):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation, name="einsum")
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


HOSTILE = ["...i...->i", "i...j...->ij", "ij->ii", "ij->k", "ij,jk->ik", "i$j->i", "ij->...", "i-j->ij", "i->->i"]


@pytest.mark.parametrize("equation", HOSTILE)
def test_an_invalid_einsum_equation_is_refused_before_onnx_sees_it(equation):
    t0 = time.monotonic()
    with pytest.raises(ModelValidationError, match="invalid Einsum equation") as info:
        byoc.compile(einsum_model(equation, [[2, 3]]), targets=[])
    assert "einsum" in str(info.value)
    assert time.monotonic() - t0 < 30


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet="ij.,->k ", max_size=12))
def test_any_einsum_equation_compiles_or_is_refused_quickly(equation):
    model = einsum_model(equation, [[2, 2], [2, 2]])
    try:
        cm = byoc.compile(model, targets=[], budget=byoc.Budget(max_compile_seconds=20))
    except byoc.ByocError as exc:
        assert not isinstance(exc, CompileTimeoutError), exc
        return
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    try:
        want = np.einsum(equation.replace(" ", ""), x, x + 1)
    except ValueError:
        return  # byoc refused at run time or computed; numpy refuses: nothing to compare
    got = cm.run({"x0": x, "x1": x + 1})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@needs_fork
def test_the_time_limit_holds_inside_onnx(monkeypatch):
    monkeypatch.setattr(validate, "_check_onnx_traps", lambda *args: None)  # hand onnx the endless case
    t0 = time.monotonic()
    with pytest.raises(CompileTimeoutError, match="max_compile_seconds"):
        byoc.compile(einsum_model("...i...->i", [[2, 3]]), targets=[], budget=byoc.Budget(max_compile_seconds=2))
    assert time.monotonic() - t0 < 15


@needs_fork
def test_a_bounded_call_reports_what_the_child_did():
    with bounded.time_limit(30):
        assert bounded.call(lambda: b"result", "step") == b"result"
        with pytest.raises(bounded.ChildError, match="boom") as info:
            bounded.call(lambda: (_ for _ in ()).throw(ValueError("boom")), "step")
        assert info.value.kind == "ValueError"
        with pytest.raises(bounded.ChildError, match="SIGABRT"):
            bounded.call(os.abort, "step")
    with bounded.time_limit(0.5), pytest.raises(CompileTimeoutError, match="a sleeping step"):
        bounded.call(lambda: time.sleep(60) or b"", "a sleeping step")


@needs_fork
def test_the_child_runs_no_garbage_collection():
    """A collection in the forked child would run destructors of the parent's garbage: an
    onnxruntime session in a cycle (a refused run's traceback) then waits for its thread pool's
    threads, which the child does not have, until the compile's time limit."""
    import gc

    with bounded.time_limit(30):
        assert gc.isenabled() and bounded.call(lambda: str(gc.isenabled()).encode(), "step") == b"False"


def test_nested_limits_keep_the_earlier_deadline():
    with bounded.time_limit(10):
        with bounded.time_limit(1000):
            assert bounded.remaining() <= 10
        with bounded.time_limit(None):
            assert bounded.remaining() <= 10
    with bounded.time_limit(None):
        assert bounded.remaining() is None


@pytest.mark.parametrize(("field", "value"), [("max_nodes", "5"), ("max_tensor_bytes", -1), ("max_nesting", 2.5),
                                              ("max_loop_iterations", True), ("max_compile_seconds", 0),
                                              ("max_compile_seconds", "60")])
def test_budget_fields_are_checked_when_made(field, value):
    with pytest.raises(OptionError, match=field):
        byoc.Budget(**{field: value})
