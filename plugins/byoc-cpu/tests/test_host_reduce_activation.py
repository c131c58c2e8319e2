"""byoc-cpu's activation and reduction engines: their internals (reduction layouts, the lane path of
max/min, the vectorised float32 exp/tanh/erf) and range splitting (a split run equals a serial one).

The operators' semantics are the core's tests (core/tests/kernels), which ``tox -e cpu`` runs with
byoc-cpu's executor serving the nodes."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from byoc.contract import NodeSpec
from byoc_cpu.host import activation as A
from byoc_cpu.host import elementwise as E
from byoc_cpu.host import reduce as R
from byoc_cpu.host.registry import factory


def kernel(spec: NodeSpec):
    return factory(spec.op_type)(spec)


def serial(fn, n_units, args, unit_cost=1):
    fn(*args, 0, n_units)


def split3(fn, n_units, args, unit_cost=1):
    """Range work in 3 chunks on threads (as byoc-cpu's pool runs it on a larger machine)."""
    bounds = [n_units * i // 3 for i in range(4)]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda i: fn(*args, bounds[i], bounds[i + 1]), range(3)))


def serial_and_split(monkeypatch, module, run, *args):
    monkeypatch.setattr(module, "run_ranges", serial)
    one = run(*args)[0]
    monkeypatch.setattr(module, "run_ranges", split3)
    return one, run(*args)[0]


def test_fast_float32_math_accuracy():
    # the vectorised float32 exp/tanh/erf against float64 libm over a dense sweep
    erf64 = np.vectorize(math.erf, otypes=[np.float64])
    x = np.linspace(-20, 20, 400_001, dtype=np.float32)
    x64 = x.astype(np.float64)
    for op, ref, rtol in [("Tanh", np.tanh, 3e-7), ("Erf", erf64, 6e-7), ("Sigmoid", lambda v: 1 / (1 + np.exp(-v)), 4e-7)]:
        got = kernel(NodeSpec(op))(x)[0].astype(np.float64)
        np.testing.assert_allclose(got, ref(x64), rtol=rtol, atol=1e-37, err_msg=op)
    xe = np.linspace(-87, 88, 400_001, dtype=np.float32)
    got = kernel(NodeSpec("Exp"))(xe)[0].astype(np.float64)
    np.testing.assert_allclose(got, np.exp(xe.astype(np.float64)), rtol=2e-7)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_split_matches_serial(monkeypatch, axis):
    x = np.random.default_rng(0).standard_normal((64, 300, 70)).astype(np.float32)
    one, split = serial_and_split(monkeypatch, A, kernel(NodeSpec("Softmax", attrs={"axis": axis})), x)
    np.testing.assert_array_equal(one, split)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(one, e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-7)


def test_relu_split_matches_serial(monkeypatch):
    x = np.random.default_rng(1).standard_normal((4, 64, 56, 56)).astype(np.float32)
    one, split = serial_and_split(monkeypatch, E, kernel(NodeSpec("Relu")), x)
    np.testing.assert_array_equal(one, split)
    np.testing.assert_array_equal(one, np.maximum(x, 0))


def test_reduce_layouts():
    lay = R.reduce_layout((2, 3, 4, 5), (2, 3), True)  # trailing block: no copy
    assert (lay.perm, lay.outer, lay.r, lay.inner, lay.out_shape) == (None, 6, 20, 1, (2, 3, 1, 1))
    lay = R.reduce_layout((8, 16, 7, 7), (1,), False)  # middle axis: (outer, r, inner)
    assert (lay.perm, lay.outer, lay.r, lay.inner, lay.out_shape) == (None, 8, 16, 49, (8, 7, 7))
    lay = R.reduce_layout((2, 3, 4), (0, 2), False)  # split axes: transpose first
    assert (lay.perm, lay.outer, lay.r, lay.inner) == ((1, 0, 2), 3, 8, 1)
    lay = R.reduce_layout((2, 1, 4), (0, 1), True)  # size-1 axes merge with either side
    assert (lay.perm, lay.outer, lay.r, lay.inner) == (None, 1, 2, 4)


def test_large_float32_sums_split_matches_serial(monkeypatch):
    x = np.random.default_rng(0).uniform(0, 1, size=(64, 4096, 3)).astype(np.float32)
    run = kernel(NodeSpec("ReduceSum", n_inputs=2))
    one, split = serial_and_split(monkeypatch, R, run, x, np.array([1], np.int64))
    np.testing.assert_array_equal(one, split)
    np.testing.assert_allclose(one, x.astype(np.float64).sum(axis=1, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8])
def test_max_min_lane_path(op, dtype):
    # rows of at least 2 * _LANES elements take the lane path; a NaN anywhere in a row still wins
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 203)) * 50).astype(dtype)
    if x.dtype.kind == "f":
        x[1, 150] = np.nan
        x[2, 7] = -np.inf
    got = kernel(NodeSpec(op, n_inputs=2))(x, np.array([-1], np.int64))[0]
    want = (np.max if op == "ReduceMax" else np.min)(x, axis=-1, keepdims=True)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_split_matches_serial(monkeypatch, op, last):
    x = np.random.default_rng(2).integers(0, 5, size=(300, 40, 9)).astype(np.float32)
    x[7, 3, 2] = np.nan
    run = kernel(NodeSpec(op, attrs={"axis": 1, "select_last_index": last}))
    one, split = serial_and_split(monkeypatch, R, run, x)
    np.testing.assert_array_equal(one, split)
    ref = (np.argmax if op == "ArgMax" else np.argmin)(np.flip(x, 1) if last else x, axis=1, keepdims=True)
    np.testing.assert_array_equal(one, 39 - ref if last else ref)
