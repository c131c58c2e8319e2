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


@bounded.operation("test.echo")
def _echo(payload: bytes) -> bytes:
    return payload


@bounded.operation("test.raise")
def _raise(payload: bytes) -> bytes:
    raise ValueError(payload.decode())


@bounded.operation("test.abort")
def _abort(payload: bytes) -> bytes:
    os.abort()


@bounded.operation("test.sleep")
def _sleep(payload: bytes) -> bytes:
    time.sleep(float(payload))
    return b""


@bounded.operation("test.pid")
def _pid(payload: bytes) -> bytes:
    return str(os.getpid()).encode()


@needs_fork
def test_a_bounded_call_reports_what_the_helper_did():
    with bounded.time_limit(30):
        assert bounded.call("test.echo", b"result", "step") == b"result"
        big = os.urandom(3 << 20)
        assert bounded.call("test.echo", big, "step") == big
        with pytest.raises(bounded.ChildError, match="boom") as info:
            bounded.call("test.raise", b"boom", "step")
        assert info.value.kind == "ValueError"
        with pytest.raises(bounded.ChildError, match="SIGABRT"):
            bounded.call("test.abort", b"", "step")
        assert bounded.call("test.echo", b"again", "step") == b"again"  # a new helper
    with bounded.time_limit(0.5), pytest.raises(CompileTimeoutError, match="a sleeping step"):
        bounded.call("test.sleep", b"60", "a sleeping step")
    with bounded.time_limit(30):
        assert bounded.call("test.echo", b"after", "step") == b"after"


@needs_fork
def test_one_helper_serves_calls_until_it_fails():
    with bounded.time_limit(30):
        first = bounded.call("test.pid", b"", "step")
        assert bounded.call("test.pid", b"", "step") == first != str(os.getpid()).encode()
        with pytest.raises(bounded.ChildError):
            bounded.call("test.raise", b"an error in the operation keeps the helper", "step")
        assert bounded.call("test.pid", b"", "step") == first


@needs_fork
def test_threads_share_the_helper_one_call_at_a_time():
    from concurrent.futures import ThreadPoolExecutor

    payloads = [os.urandom(n) for n in range(0, 200_000, 5_000)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: bounded.call("test.echo", p, "step"), payloads))
    assert results == payloads


@needs_fork
def test_a_forked_child_uses_a_helper_of_its_own():
    with bounded.time_limit(30):
        parents = bounded.call("test.pid", b"", "step")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with bounded.time_limit(30):
                os.write(w, bounded.call("test.pid", b"", "step"))
        finally:
            os._exit(0)
    os.close(w)
    childs = os.read(r, 100)
    os.close(r)
    os.waitpid(pid, 0)
    assert childs and childs != parents
    with bounded.time_limit(30):
        assert bounded.call("test.pid", b"", "step") == parents


class _Witness:
    """Garbage in a reference cycle whose destructor leaves a mark naming the process that ran it."""

    def __init__(self, path):
        self.path, self.cycle = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


@bounded.operation("test.collect")
def _collect(payload: bytes) -> bytes:
    import gc

    gc.collect()
    return str(os.getpid()).encode()


@needs_fork
def test_the_helper_never_collects_the_parents_garbage(tmp_path):
    """A collection in the helper would run destructors of the parent's garbage: an onnxruntime
    session in a cycle (a refused run's traceback) would then wait for its thread pool's
    threads, which the helper does not have, until the compile's time limit."""
    import gc

    marks = tmp_path / "marks"
    gc.disable()
    try:
        _Witness(marks)  # unreachable, not collected yet
        bounded.stop_helper()  # the next call forks a helper with the garbage in its memory
        with bounded.time_limit(30):
            helper = bounded.call("test.collect", b"", "step")
    finally:
        gc.enable()
    gc.collect()
    assert marks.read_text().split() == [str(os.getpid())] != [helper.decode()]


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


@needs_fork
def test_an_idle_helper_retires_and_the_next_call_forks_another(monkeypatch):
    """A helper keeps the pages its parent had when it was forked: it exits when idle."""
    monkeypatch.setattr(bounded, "IDLE_SECONDS", 0.5)
    bounded.stop_helper()  # the next call forks a helper with the short idle time
    with bounded.time_limit(30):
        first = bounded.call("test.pid", b"", "step")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # it exits on its own (a zombie until the next call reaps it)
        try:
            with open(f"/proc/{int(first)}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the idle helper did not exit")
    with bounded.time_limit(30):
        second = bounded.call("test.pid", b"", "step")
    assert second != first and bounded.call("test.echo", b"x", "step") == b"x"
