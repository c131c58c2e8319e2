"""Corrupted models get a byoc error, never another exception, a crash or a hang.

Randomly corrupted bytes of small valid models (bit flips, truncation, splices, random bytes)
and random field-level edits of their protobufs go to ``byoc.frontend.load_model`` and to
``byoc.compile``. Anything but a :class:`byoc.ByocError` fails the test; each example runs
under a wall-clock limit (SIGALRM) so a hang fails too. A process crash (the C++ checker or
version converter) would take the test run down: the frontend validates the structure itself
before those run, see ``test_frontend.py::test_converter_crash_input_stays_in_process``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.frontend import load_model

#: seconds one example may take (load + compile of a tiny model takes milliseconds)
LIMIT_S = 20

FUZZ = settings(
    max_examples=50,
    deadline=None,  # the SIGALRM limit below catches hangs; timing noise on shared CPUs must not fail
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _vi(name, shape, dtype=T.FLOAT):
    return h.make_tensor_value_info(name, dtype, shape)


def _relu(opset):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g", [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _conv(opset):
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    b = nh.from_array(rng.standard_normal(4).astype(np.float32), "B")
    shape = nh.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        h.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
        h.make_node("Constant", [], ["k"], name="k", value=nh.from_array(np.full((1, 4, 1, 1), 0.5, np.float32))),
        h.make_node("Mul", ["c", "k"], ["m"], name="mul"),
        h.make_node("Relu", ["m"], ["r"], name="relu"),
        h.make_node("Reshape", ["r", "shape"], ["y"], name="reshape"),
    ]
    g = h.make_graph(nodes, "convnet", [_vi("x", [1, 3, 5, 5])], [_vi("y", [1, 100])], [w, b, shape])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _if(opset):
    k = h.make_node("Constant", [], ["k"], name="k", value=nh.from_array(np.array([1.5, 2.5], np.float32)))
    then_g = h.make_graph([h.make_node("Add", ["x", "k"], ["t"], name="tadd")], "then", [], [_vi("t", [2])])
    else_g = h.make_graph([h.make_node("Sub", ["x", "k"], ["e"], name="esub")], "else", [], [_vi("e", [2])])
    nodes = [k, h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    g = h.make_graph(nodes, "ifg", [_vi("x", [2]), _vi("cond", [], T.BOOL)], [_vi("y", [2])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _clip_old():
    nodes = [h.make_node("Clip", ["x"], ["c"], name="clip", min=-1.0, max=1.0),
             h.make_node("Unsqueeze", ["c"], ["y"], name="unsq", axes=[0])]
    g = h.make_graph(nodes, "old", [_vi("x", [3])], [_vi("y", [1, 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 6)])


SEEDS = [_relu(21), _relu(9), _conv(21), _conv(11), _if(21), _if(11), _clip_old()]
SEED_BYTES = [m.SerializeToString() for m in SEEDS]


@contextlib.contextmanager
def _time_limit(seconds: int):
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"took more than {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _only_byoc_errors(data: bytes) -> None:
    for name, fn in (("load_model", load_model), ("compile", lambda d: byoc.compile(d, targets=[]))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with _time_limit(LIMIT_S):
                    fn(data)
            except byoc.ByocError:
                pass
            except Exception as exc:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{name} raised {type(exc).__name__} (not a ByocError): {exc}")


@pytest.fixture(scope="module", autouse=True)
def _warm():
    """JIT-compile the kernels the seeds use once, outside the examples."""
    for data in SEED_BYTES:
        with warnings.catch_warnings(), contextlib.suppress(byoc.ByocError):
            warnings.simplefilter("ignore")
            byoc.compile(data, targets=[])


def test_seeds_are_valid():
    for model in SEEDS:
        load_model(model, require_kernels=False)


seed_bytes = st.sampled_from(SEED_BYTES)


@FUZZ
@given(seed_bytes, st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 7)), min_size=1, max_size=8))
def test_bit_flips(data, flips):
    buf = bytearray(data)
    for pos, bit in flips:
        buf[pos % len(buf)] ^= 1 << bit
    _only_byoc_errors(bytes(buf))


@FUZZ
@given(seed_bytes, st.integers(0, 1 << 20), st.integers(0, 64))
def test_truncation(data, cut, drop):
    cut %= len(data)
    _only_byoc_errors(data[:cut])  # cut short
    _only_byoc_errors(data[:cut] + data[cut + drop + 1:])  # a hole in the middle


@FUZZ
@given(seed_bytes, seed_bytes, st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.integers(1, 200))
def test_splices(data, other, at, start, length):
    at %= len(data)
    start %= len(other)
    _only_byoc_errors(data[:at] + other[start:start + length] + data[at:])  # inserted chunk
    _only_byoc_errors(data[:at] + other[start:])  # head of one, tail of another


@FUZZ
@given(seed_bytes, st.integers(0, 1 << 20), st.binary(min_size=1, max_size=64), st.binary(max_size=256))
def test_random_bytes(data, at, patch, noise):
    at %= len(data)
    _only_byoc_errors(data[:at] + patch + data[at + len(patch):])  # overwritten range
    _only_byoc_errors(noise or b"\x00")  # no model at all


# field-level edits: the result parses, so it reaches the structural checks, the checker,
# the version converter and the compiler
_NAMES = ["x", "y", "W", "B", "c", "k", "", "cond", "t", "r", "shape", "value", "axes"]
_OPS = ["Conv", "Relu", "Clip", "Reshape", "Unsqueeze", "If", "Loop", "Add", "Upsample", "Resize", "Pad", "Slice",
        "Split", "BatchNormalization", "Gemm", "TopK", "Scan", "Softmax", "Cast", "ConstantOfShape", "Frob"]


def _messages(msg, out):
    out.append(msg)
    for fd, value in msg.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            for sub in (value if fd.is_repeated else [value]):
                _messages(sub, out)
    return out


def _edit(rnd, proto):
    msg = rnd.choice(_messages(proto, []))
    fd = rnd.choice(msg.DESCRIPTOR.fields)
    pick = rnd.randrange(4)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        if fd.is_repeated:
            box = getattr(msg, fd.name)
            if pick == 0 and len(box):
                del box[rnd.randrange(len(box))]
            elif fd.type == fd.TYPE_MESSAGE:
                box.add().CopyFrom(rnd.choice(box)) if len(box) and pick < 3 else box.add()
            elif fd.type in (fd.TYPE_INT64, fd.TYPE_INT32):
                box.append(rnd.choice([0, -1, 1, 3, 1 << 40, -(1 << 62)]))
            elif fd.type == fd.TYPE_STRING:
                box.append(rnd.choice(_NAMES))
            elif fd.type == fd.TYPE_FLOAT:
                box.append(rnd.choice([0.0, float("nan"), 1e30]))
        elif fd.type == fd.TYPE_MESSAGE:
            msg.ClearField(fd.name) if pick == 0 else getattr(msg, fd.name).SetInParent()
        elif fd.type == fd.TYPE_ENUM:
            setattr(msg, fd.name, rnd.choice([v.number for v in fd.enum_type.values] + [99]))
        elif fd.type in (fd.TYPE_INT64, fd.TYPE_INT32):
            setattr(msg, fd.name, rnd.choice([0, -1, 1, 2, 6, 9, 11, 13, 21, 25, 1000, -(1 << 31), 1 << 40]))
        elif fd.type == fd.TYPE_STRING:
            pool = _OPS if fd.name == "op_type" else ["", "ai.onnx", "com.x"] if fd.name == "domain" else _NAMES
            setattr(msg, fd.name, rnd.choice(pool))
        elif fd.type == fd.TYPE_BYTES:
            setattr(msg, fd.name, rnd.randbytes(rnd.choice([0, 1, 4, 12, 16])))
        elif fd.type == fd.TYPE_FLOAT:
            setattr(msg, fd.name, rnd.choice([0.0, -1.0, float("nan")]))


@FUZZ
@given(st.sampled_from(SEEDS), st.randoms(use_true_random=False), st.integers(1, 4))
def test_field_edits(model, rnd, n_edits):
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    for _ in range(n_edits):
        _edit(rnd, proto)
    _only_byoc_errors(proto.SerializeToString())
