"""byoc-cpu's elementwise engine: broadcast plans, range splitting over the pool, the numpy twins of
the range kernels, the vectorisable float32 exp/tanh/erf, and its input preparation. The operators'
semantics are core/tests/kernels/test_elementwise.py's, which ``tox -e cpu`` runs with byoc-cpu's
host executor serving the nodes."""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest

from byoc.kernels.registry import NodeSpec
from byoc_cpu.host import elementwise as E
from cpu_helpers import host_kernel as make_kernel


@contextlib.contextmanager
def ranges(monkeypatch, parts: int):
    """The engine's range work in ``parts`` chunks on threads (1: one call on the calling thread)."""

    def run_ranges(fn, n_units, args, unit_cost=1):
        bounds = [n_units * i // parts for i in range(parts + 1)]
        with ThreadPoolExecutor(parts) as pool:
            list(pool.map(lambda i: fn(*args, bounds[i], bounds[i + 1]), range(parts)))

    with monkeypatch.context() as m:
        m.setattr(E, "run_ranges", run_ranges)
        yield


def test_broadcast_plan_merges_dimensions():
    p = E.broadcast_plan(((2, 3, 4, 5), (2, 3, 4, 5)))
    assert p.dims.tolist() == [120] and [s.tolist() for s in p.strides] == [[1], [1]]
    p = E.broadcast_plan(((1, 64, 7, 7), (1, 64, 1, 1)))
    assert p.dims.tolist() == [64, 49] and [s.tolist() for s in p.strides] == [[49, 1], [1, 0]]
    p = E.broadcast_plan(((8, 4), ()))
    assert p.dims.tolist() == [32] and [s.tolist() for s in p.strides] == [[1], [0]]
    p = E.broadcast_plan(((), ()))
    assert p.out_shape == () and p.size == 1


@pytest.mark.parametrize(
    ("sa", "sb"), [((3, 257, 300), (3, 257, 300)), ((3, 257, 300), (257, 1)), ((1, 64, 40, 40), (1, 64, 1, 1))]
)
def test_parallel_split_matches_serial(monkeypatch, sa, sb):
    rng = np.random.default_rng(0)
    a = rng.uniform(-5, 5, sa).astype(np.float32)
    b = rng.uniform(-5, 5, sb).astype(np.float32)
    run = make_kernel(NodeSpec("Mul", n_inputs=2))
    with ranges(monkeypatch, 1):
        serial = run(a, b)[0]
    with ranges(monkeypatch, 3):
        parallel = run(a, b)[0]
    np.testing.assert_array_equal(serial, parallel)
    np.testing.assert_array_equal(serial, a * b)


@pytest.mark.parametrize("fn", [E.k_add, E.k_sub, E.k_mul, E.k_div_float, E.k_less, E.k_equal])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_numpy_twins_give_the_range_kernels_bits(fn, dtype):
    """A flat plan runs the kernel's ufunc twin; a broadcasting one the Numba kernel: the same bits."""
    uf, kinds = E._UFUNC_TWINS[fn]
    if np.dtype(dtype).kind not in kinds:
        pytest.skip(f"{fn.__name__} has no twin for {np.dtype(dtype)}")
    rng = np.random.default_rng(1)
    a = rng.integers(-3, 4, (5, 7)).astype(dtype)  # few values: ties for the comparisons
    b = rng.integers(-3, 4, (5, 7)).astype(dtype)
    b[b == 0] = 2
    out_dtype = np.bool_ if fn in (E.k_less, E.k_equal) else a.dtype
    flat = E.broadcast_plan((a.shape, b.shape))
    assert E._twin(fn, a, b, np.empty(a.shape, out_dtype), flat) is uf
    with np.errstate(all="ignore"):
        twin = E.binary(fn, a, b, out_dtype, flat)
    kernel = np.empty(a.shape, out_dtype)
    E.run_ranges(fn, flat.size, (a.reshape(-1), b.reshape(-1), kernel.reshape(-1), flat.dims, *flat.strides))
    np.testing.assert_array_equal(twin, kernel)
    row = np.ascontiguousarray(b[:1])
    bcast = E.broadcast_plan((a.shape, row.shape))
    assert E._twin(fn, a, row, np.empty(a.shape, out_dtype), bcast) is None
    np.testing.assert_array_equal(E.binary(fn, a, row, out_dtype, bcast), uf(a, row))


@numba.njit
def _fexp(x, out):
    for i in range(x.size):
        out[i] = E.fexp(x[i])


@numba.njit
def _ftanh(x, out):
    for i in range(x.size):
        out[i] = E.ftanh(x[i])


@numba.njit
def _ferf(x, out):
    for i in range(x.size):
        out[i] = E.ferf(x[i])


@pytest.mark.parametrize(
    ("fast", "exact", "lo", "hi", "ulps"),
    [(_fexp, np.exp, -87.0, 88.0, 4), (_ftanh, np.tanh, -9.0, 9.0, 4), (_ferf, np.vectorize(math.erf), -5.0, 5.0, 8)],
)
def test_float32_exp_tanh_erf_are_within_a_few_ulp(fast, exact, lo, hi, ulps):
    x = np.concatenate([np.linspace(lo, hi, 200_001, dtype=np.float32), np.float32([0.0, -0.0, 1e-30, -1e-30])])
    got = np.empty_like(x)
    fast(x, got)
    want = exact(x.astype(np.float64))
    err = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert err.max() <= ulps, (float(x[err.argmax()]), float(err.max()))
    float64 = np.linspace(-3, 3, 101)
    out = np.empty_like(float64)
    fast(float64, out)  # other types: numpy's own functions
    np.testing.assert_allclose(out, exact(float64), rtol=1e-15)


def test_readonly_and_noncontiguous_inputs():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    b = np.full(6, 2.0, np.float32)
    b.flags.writeable = False
    run = make_kernel(NodeSpec("Sub", n_inputs=2))
    np.testing.assert_array_equal(run(a.T, b[:4])[0], a.T - b[:4])
    np.testing.assert_array_equal(run(a, b)[0], a - b)
    big = np.ones(E._SMALL_READONLY + 1, np.float32)  # passed to the kernels as it is, not copied
    big.flags.writeable = False
    np.testing.assert_array_equal(run(big, big)[0], np.zeros(big.size, np.float32))


def test_pool_survives_fork():
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    x = np.ones(1 << 20, np.float32)  # large enough to be split across the pool
    run = make_kernel(NodeSpec("Add", n_inputs=2))
    run(x, x)  # the pool exists now
    with mp.get_context("fork").Pool(1) as pool:
        total = pool.apply_async(_sum_in_child, (x,)).get(timeout=60)
    assert total == 2.0 * x.size


def _sum_in_child(x):
    return float(make_kernel(NodeSpec("Add", n_inputs=2))(x, x)[0].sum())
