"""The corpus of fixed hostile inputs: each gets its exact error type, within time and memory limits.

Memory is measured with tracemalloc (numpy's buffers are traced) plus the growth of the
process's peak RSS (allocations in C); both must stay under ``MEMORY_LIMIT``.
"""

from __future__ import annotations

import os
import resource
import time
import tracemalloc
from contextlib import contextmanager

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc

from loops import counting_loop

MEMORY_LIMIT = 64 << 20  # bytes
TIME_LIMIT = 5.0  # seconds


@contextmanager
def within_limits(time_limit: float = TIME_LIMIT, memory_limit: int = MEMORY_LIMIT):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    assert elapsed < time_limit, f"took {elapsed:.2f} s"
    assert peak < memory_limit, f"traced peak {peak >> 20} MiB"
    assert rss_growth < memory_limit, f"peak RSS grew by {rss_growth >> 20} MiB"


def _model(nodes, inputs, outputs, inits=(), opset=17):
    return h.make_model(h.make_graph(nodes, "hostile", inputs, outputs, list(inits)),
                        opset_imports=[h.make_opsetid("", opset)])


def _warm():
    # JIT and imports outside the measured blocks
    x = _model([h.make_node("Add", ["a", "a"], ["y"])], [h.make_tensor_value_info("a", T.FLOAT, [1])],
               [h.make_tensor_value_info("y", T.FLOAT, [1])])
    byoc.compile(x, targets=[]).run({"a": np.ones(1, np.float32)})


@pytest.fixture(autouse=True, scope="module")
def warm():
    _warm()


def test_100_byte_model_asking_for_8_gib_at_compile_time():
    model = _model(
        [h.make_node("ConstantOfShape", ["shape"], ["big"], name="huge")],
        [], [h.make_tensor_value_info("big", T.FLOAT, None)],
        [nh.from_array(np.array([2, 1 << 30], np.int64), "shape")],
    )
    data = model.SerializeToString()
    assert len(data) < 150
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="huge"):
        byoc.compile(data, targets=[])


def test_100_byte_model_asking_for_8_gib_at_run_time():
    model = _model([h.make_node("ConstantOfShape", ["shape"], ["big"], name="huge")],
                   [h.make_tensor_value_info("shape", T.INT64, [2])], [h.make_tensor_value_info("big", T.FLOAT, None)])
    assert len(model.SerializeToString()) < 150
    compiled = byoc.compile(model, targets=[])
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="huge"):
        compiled.run({"shape": np.array([2, 1 << 30], np.int64)})


def test_expand_to_an_absurd_shape_at_run_time():
    model = _model([h.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
                   [h.make_tensor_value_info("x", T.FLOAT, [1]), h.make_tensor_value_info("shape", T.INT64, [3])],
                   [h.make_tensor_value_info("y", T.FLOAT, None)])
    compiled = byoc.compile(model, targets=[])
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="expand"):
        compiled.run({"x": np.ones(1, np.float32), "shape": np.array([1 << 20, 1 << 20, 1 << 10], np.int64)})


def test_loop_of_10_to_the_15_iterations_is_refused_before_iterating():
    compiled = byoc.compile(counting_loop(10**15), targets=[])
    with within_limits(time_limit=1.0), pytest.raises(byoc.ResourceLimitError, match="runaway.*trip count"):
        compiled.run({"v0": np.zeros(1, np.float32)})


def test_loop_without_trip_count_stops_at_the_iteration_budget():
    compiled = byoc.compile(counting_loop(None), targets=[], budget=byoc.Budget(max_loop_iterations=2000))
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="runaway.*max_loop_iterations=2000"):
        compiled.run({"v0": np.zeros(1, np.float32)})


def test_loop_without_trip_count_stops_at_the_timeout():
    compiled = byoc.compile(counting_loop(None), targets=[], budget=byoc.Budget(max_loop_iterations=10**12))
    with within_limits(time_limit=2.0), pytest.raises(byoc.RunTimeoutError, match="runaway"):
        compiled.run({"v0": np.zeros(1, np.float32)}, timeout=0.3)


def test_declared_terabyte_initializer_without_data():
    t = onnx.TensorProto()
    t.name, t.data_type = "w", T.FLOAT
    t.dims.extend([1 << 20, 1 << 20])
    model = _model([h.make_node("Add", ["x", "w"], ["y"], name="add")], [h.make_tensor_value_info("x", T.FLOAT, [1])],
                   [h.make_tensor_value_info("y", T.FLOAT, None)], [t])
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="'w'"):
        byoc.compile(model.SerializeToString(), targets=[])


def test_deeply_nested_subgraphs_are_refused():
    # protobuf itself refuses messages nested ~100 deep (about 30 If levels); the budget's
    # max_nesting is what refuses the depths protobuf still parses
    vi = h.make_tensor_value_info("y", T.FLOAT, [1])
    node = h.make_node("Neg", ["x"], ["y"], name="leaf")
    for level in range(30):
        branch = h.make_graph([node], f"level{level}", [], [vi])
        other = h.make_graph([h.make_node("Identity", ["x"], ["y"])], f"other{level}", [], [vi])
        node = h.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other, name=f"if{level}")
    model = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [1]), h.make_tensor_value_info("flag", T.BOOL, [])],
                   [vi])
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="nest"):
        byoc.compile(model.SerializeToString(), targets=[], budget=byoc.Budget(max_nesting=8))


def test_conv_with_absurd_padding_is_refused_before_allocating():
    rng = np.random.default_rng(0)
    node = h.make_node("Conv", ["x", "w"], ["y"], pads=[0, 0, 2**31, 2**31], name="padded")
    model = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                   [nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")])
    with within_limits():
        with pytest.raises((byoc.ResourceLimitError, byoc.ModelValidationError), match="padded"):
            compiled = byoc.compile(model, targets=[])
            compiled.run({"x": np.ones((1, 3, 6, 6), np.float32)})


# -- external data that escapes the model folder -----------------------------------------------


def _external_model(tmp_path, location: str):
    t = nh.from_array(np.ones(4, np.float32), "w")
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    model = _model([h.make_node("Add", ["x", "w"], ["y"], name="add")], [h.make_tensor_value_info("x", T.FLOAT, [4])],
                   [h.make_tensor_value_info("y", T.FLOAT, [4])], [t])
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def secret(tmp_path):
    p = tmp_path / "secret.bin"
    p.write_bytes(np.full(4, 7, np.float32).tobytes())
    return p


def test_external_data_through_dotdot(tmp_path, secret):
    path = _external_model(tmp_path, "../secret.bin")
    with within_limits(), pytest.raises(byoc.ExternalDataError, match=r"'w'.*\.\./secret\.bin"):
        byoc.compile(path, targets=[])


def test_external_data_absolute_path(tmp_path, secret):
    path = _external_model(tmp_path, str(secret))
    with within_limits(), pytest.raises(byoc.ExternalDataError, match="'w'"):
        byoc.compile(path, targets=[])


def test_external_data_symbolic_link(tmp_path, secret):
    path = _external_model(tmp_path, "link.bin")
    os.symlink(secret, path.parent / "link.bin")
    with within_limits(), pytest.raises(byoc.ExternalDataError, match="'w'.*link"):
        byoc.compile(path, targets=[])


def test_external_data_hard_link(tmp_path, secret):
    path = _external_model(tmp_path, "hard.bin")
    os.link(secret, path.parent / "hard.bin")
    with within_limits(), pytest.raises(byoc.ExternalDataError, match="'w'.*hard"):
        byoc.compile(path, targets=[])


def test_external_data_nul_byte(tmp_path):
    path = _external_model(tmp_path, "a\x00b.bin")
    with within_limits(), pytest.raises(byoc.ExternalDataError, match="'w'"):
        byoc.compile(path, targets=[])


def test_external_data_inside_the_folder_is_read(tmp_path):
    path = _external_model(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(np.full(4, 2, np.float32).tobytes())
    out = byoc.compile(path, targets=[]).run({"x": np.ones(4, np.float32)})["y"]
    np.testing.assert_array_equal(out, np.full(4, 3, np.float32))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling_with_absurd_padding_is_refused_before_allocating(op):
    node = h.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], pads=[0, 0, 2**31, 2**31], name="pool")
    model = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6])], [h.make_tensor_value_info("y", T.FLOAT, None)])
    compiled = byoc.compile(model, targets=[])
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="'pool'"):
        compiled.run({"x": np.ones((1, 3, 6, 6), np.float32)})


def test_conv_transpose_with_absurd_strides_is_refused_before_allocating():
    node = h.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2**20, 2**20], name="deconv")
    model = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                   [nh.from_array(np.ones((3, 2, 3, 3), np.float32), "w")])
    compiled = byoc.compile(model, targets=[])
    with within_limits(), pytest.raises(byoc.ResourceLimitError, match="'deconv'"):
        compiled.run({"x": np.ones((1, 3, 6, 6), np.float32)})
