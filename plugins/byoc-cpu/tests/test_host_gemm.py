"""Gemm and MatMul against onnx.reference, and the direct SGEMM entry point."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from byoc.errors import KernelError
from byoc_cpu.host import gemm as G
from byoc.kernels.registry import NodeSpec
from cpu_helpers import host_kernel as make_kernel
from byoc.testing.oracle import assert_close, run_byoc, run_reference, single_node_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(op, inputs, attrs=None, const=(), **tol):
    model, feeds = single_node_model(op, inputs, attrs or {}, const_inputs=const)
    assert_close(run_byoc(model, feeds), run_reference(model, feeds), **tol)


@SETTINGS
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 9),
    n=st.integers(1, 9),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    beta=st.sampled_from([1.0, 0.0, 0.25]),
    c_shape=st.sampled_from(["none", "scalar", "n", "1n", "m1", "mn", "1"]),
    const_b=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemm_property(m, k, n, trans_a, trans_b, alpha, beta, c_shape, const_b, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    shapes = {"scalar": (), "n": (n,), "1n": (1, n), "m1": (m, 1), "mn": (m, n), "1": (1,)}
    inputs = [a, b]
    if c_shape != "none":
        inputs.append(rng.standard_normal(shapes[c_shape]).astype(np.float32))
    attrs = {"alpha": alpha, "beta": beta, "transA": int(trans_a), "transB": int(trans_b)}
    check("Gemm", inputs, attrs, const=(1, 2) if const_b else ())


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_gemm_dtypes(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((4, 6)) * 3).astype(dtype)
    b = (rng.standard_normal((5, 6)) * 3).astype(dtype)
    c = (rng.standard_normal(5) * 3).astype(dtype)
    # float16: byoc accumulates in float32 and rounds once; the reference accumulates in float16
    tol = {"rtol": 1e-2, "atol": 1e-1} if dtype == np.float16 else {}
    alpha = 1.0 if np.dtype(dtype).kind == "i" else 0.5
    check("Gemm", [a, b, c], {"transB": 1, "alpha": alpha}, **tol)


def test_gemm_resnet_classifier():
    # the ResNet-50 head: (1, 2048) x (1000, 2048)^T + bias, weights constant
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 2048)).astype(np.float32)
    b = (rng.standard_normal((1000, 2048)) * 0.02).astype(np.float32)
    c = rng.standard_normal(1000).astype(np.float32)
    check("Gemm", [a, b, c], {"transB": 1}, const=(1, 2), atol=1e-4)


def test_gemm_errors():
    spec = NodeSpec("Gemm", name="g", attrs={}, n_inputs=3)
    run = make_kernel(spec)
    with pytest.raises(KernelError, match="inner dimensions"):
        run(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(KernelError, match="broadcast"):
        run(np.zeros((2, 3), np.float32), np.zeros((3, 5), np.float32), np.zeros((3,), np.float32))
    with pytest.raises(KernelError, match="2-D"):
        run(np.zeros((2, 3, 1), np.float32), np.zeros((3, 5), np.float32))


@st.composite
def matmul_shapes(draw):
    k = draw(st.integers(1, 6))
    a_rank = draw(st.integers(1, 4))
    b_rank = draw(st.integers(1, 4))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3))
    a_shape = (k,) if a_rank == 1 else tuple(batch.input_shapes[0][: a_rank - 2]) + (draw(st.integers(1, 5)), k)
    b_shape = (k,) if b_rank == 1 else tuple(batch.input_shapes[1][: b_rank - 2]) + (k, draw(st.integers(1, 5)))
    return a_shape, b_shape


@SETTINGS
@given(shapes=matmul_shapes(), const_b=st.booleans(), seed=st.integers(0, 2**16))
def test_matmul_property(shapes, const_b, seed):
    a_shape, b_shape = shapes
    try:
        np.matmul(np.zeros(a_shape), np.zeros(b_shape))
    except ValueError:
        return  # batch dims that do not broadcast after truncation to the drawn ranks
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    check("MatMul", [a, b], const=(1,) if const_b else ())


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64, np.uint32])
def test_matmul_dtypes(dtype):
    rng = np.random.default_rng(2)
    a = (rng.random((2, 3, 4)) * 4).astype(dtype)
    b = (rng.random((4, 5)) * 4).astype(dtype)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == np.float16 else {}
    check("MatMul", [a, b], **tol)
    check("MatMul", [a, b], const=(1,), **tol)


def test_matmul_transformer_shapes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 32)).astype(np.float32)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    check("MatMul", [x, w], const=(1,), atol=1e-4)
    q = rng.standard_normal((2, 4, 7, 8)).astype(np.float32)
    kt = rng.standard_normal((2, 4, 8, 7)).astype(np.float32)
    check("MatMul", [q, kt], atol=1e-4)


def test_matmul_errors():
    run = make_kernel(NodeSpec("MatMul", name="m", n_inputs=2))
    with pytest.raises(KernelError, match="inner dimensions"):
        run(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(KernelError, match="broadcast"):
        run(np.zeros((2, 2, 3), np.float32), np.zeros((3, 3, 5), np.float32))


@pytest.mark.skipif(not G.HAVE_SGEMM, reason="numpy's BLAS is not OpenBLAS")
def test_sgemm_strided_accumulate():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 20)).astype(np.float32)
    c = rng.standard_normal((5, 30)).astype(np.float32)
    expected = c.copy()
    expected[:, 3:13] = 0.5 * a @ b[:, 2:12] + 2.0 * c[:, 3:13]
    # B and C as column windows of wider matrices: leading dimensions 20 and 30
    G.sgemm(5, 10, 7, a.ctypes.data, 7, b.ctypes.data + 2 * 4, 20, c.ctypes.data + 3 * 4, 30, 0.5, 2.0)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)
    out = np.zeros((5, 30), np.float32)
    G.matmul_into(a, b, out[:, 5:25])
    np.testing.assert_allclose(out[:, 5:25], a @ b, rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------------------------------------
# byoc's own float32 GEMM (micro-kernel + packing)


@SETTINGS
@given(m=st.integers(1, 40), k=st.integers(1, 600), n=st.integers(1, 200), pad_b=st.integers(0, 40),
       pad_c=st.integers(0, 40), parallel=st.booleans(), init=st.sampled_from([None, "zero", "bias"]),
       seed=st.integers(0, 2**16))
def test_own_gemm_property(m, k, n, pad_b, pad_c, parallel, init, seed):
    # C += A @ B with B and C as column windows of wider matrices (row strides != N), partial
    # row panels (M % 8), partial column panels (N % 32) and several depth blocks (K > 256)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b_big = rng.standard_normal((k, n + pad_b)).astype(np.float32)
    c_big = rng.standard_normal((m, n + pad_c)).astype(np.float32)
    before = c_big.copy()
    b = b_big[:, pad_b:]
    c = c_big[:, :n]
    bias = rng.standard_normal(m).astype(np.float32) if init == "bias" else None
    G.gemm_acc(G.pack_a(a), m, k, b, c, parallel=parallel, init=init is not None, bias=bias)
    # with init the output is overwritten (product + bias), else the product is added
    base = before[:, :n] if init is None else (np.zeros((m, n)) if bias is None else bias[:, None].astype(np.float64))
    expected = base + a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(c_big[:, n:], before[:, n:])  # nothing written outside the window


def test_own_gemm_resnet_shapes():
    rng = np.random.default_rng(9)
    for m, k, n in [(64, 64, 3136), (256, 1024, 196), (512, 4608, 49), (2048, 512, 49)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c = np.zeros((m, n), np.float32)
        G.gemm_acc(G.pack_a(a), m, k, b, c)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_and_matmul_on_own_gemm(trans_b):
    # enough rows for byoc's GEMM (it packs A per call); constant B laid out once
    rng = np.random.default_rng(21)
    a = rng.standard_normal((40, 70)).astype(np.float32)
    b = rng.standard_normal((50, 70) if trans_b else (70, 50)).astype(np.float32)
    c = rng.standard_normal(50).astype(np.float32)
    for const in ((), (1, 2)):
        check("Gemm", [a, b, c], {"transB": trans_b, "alpha": 0.5, "beta": 2.0}, const=const, atol=1e-4)
        check("Gemm", [a, b], {"transB": trans_b}, const=const, atol=1e-4)
    x = rng.standard_normal((3, 20, 70)).astype(np.float32)
    w = rng.standard_normal((70, 50)).astype(np.float32)
    check("MatMul", [x, w], const=(1,), atol=1e-4)
    check("MatMul", [x, w], atol=1e-4)


@SETTINGS
@given(m=st.integers(1, 30), k=st.integers(1, 300), n=st.integers(1, 100), init=st.booleans(),
       seed=st.integers(0, 2**16))
def test_implicit_gemm_property(m, k, n, init, seed):
    # row k of B is b[rowoff[k] : rowoff[k] + n] for arbitrary (overlapping, unordered) offsets
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(k * 7 + n + 64).astype(np.float32)
    rowoff = rng.integers(0, k * 7 + 64, size=k).astype(np.int64)
    lo = int(rng.integers(0, max(1, n // 2)))
    c = rng.standard_normal((m, n)).astype(np.float32)
    before = c.copy()
    bias = rng.standard_normal(m).astype(np.float32)
    G.gemm_rows(G.pack_a(a), m, b, rowoff, c, lo, n, init=init, bias=bias)
    full_b = np.stack([b[o:o + n] for o in rowoff]).astype(np.float64)
    base = bias[:, None].astype(np.float64) if init else before.astype(np.float64)
    expected = base + a.astype(np.float64) @ full_b
    np.testing.assert_allclose(c[:, lo:], expected[:, lo:], rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(c[:, :lo], before[:, :lo])


def _flat_operands(rng, m: int, k: int, n: int):
    """The plugin-facing operands: A (M, K) as a block of a flat buffer (row stride ``ld`` >= K,
    offset ``wo``), B found through a row table ``rows`` plus a base offset ``bo``, C a block of a
    flat buffer (offset ``co``, row stride ``ldc``), and a first column ``lo``."""
    ld, wo = k + int(rng.integers(0, 5)), int(rng.integers(0, 9))
    w = rng.standard_normal(wo + m * ld + 1).astype(np.float32)
    a = w[wo:wo + m * ld].reshape(m, ld)[:, :k]
    b = rng.standard_normal(k * 7 + n + 64).astype(np.float32)
    bo = int(rng.integers(0, 32))
    rows = rng.integers(0, k * 7 + 32, size=k).astype(np.int64)
    ldc, co = n + int(rng.integers(0, 5)), int(rng.integers(0, 9))
    c = rng.standard_normal(co + m * ldc + 3).astype(np.float32)
    lo = int(rng.integers(0, max(1, n // 2)))
    return w, wo, ld, a, b, bo, rows, c, co, ldc, lo


def _check_flat(c, before, a, b, bo, rows, co, ldc, n, cols, base, atol):
    """``C[:, cols] = base + A @ B`` (``base``: "accumulate" for C's old values, else an array or
    0) on the block at ``c[co:]``, and every other element of ``c`` as it was."""
    m = a.shape[0]
    full_b = np.stack([b[bo + o:bo + o + n] for o in rows]).astype(np.float64) if len(rows) else np.zeros((0, n))
    cm = before[co:co + m * ldc].reshape(m, ldc)[:, :n].astype(np.float64)
    expected = (cm if isinstance(base, str) else base) + a.astype(np.float64) @ full_b
    got = c[co:co + m * ldc].reshape(m, ldc)
    np.testing.assert_allclose(got[:, cols], expected[:, cols], rtol=1e-4, atol=atol)
    untouched = np.ones(c.shape, bool)
    untouched[co:co + m * ldc].reshape(m, ldc)[:, cols] = False
    np.testing.assert_array_equal(c[untouched], before[untouched])


@SETTINGS
@given(m=st.integers(1, 30), k=st.integers(1, 300), n=st.integers(1, 100), accumulate=st.booleans(),
       seed=st.integers(0, 2**16))
def test_flat_table_gemm_property(m, k, n, accumulate, seed):
    # the plugin-facing form: A packed from a block of a flat buffer (row stride > k), B found
    # through a row table plus a base offset, C a block of a flat buffer with row stride ldc
    w, wo, ld, a, b, bo, rows, c, co, ldc, lo = _flat_operands(np.random.default_rng(seed), m, k, n)
    before = c.copy()
    G.gemm_table(G.pack(w, wo, m, k, ld), m, k, b, bo, rows, c, co, ldc, lo, n, int(accumulate))
    _check_flat(c, before, a, b, bo, rows, co, ldc, n, np.arange(lo, n), "accumulate" if accumulate else 0.0,
                1e-4 * np.sqrt(k))


def test_pack_rejects_out_of_bounds():
    with pytest.raises(ValueError, match="does not fit"):
        G.pack(np.zeros(10, np.float32), 2, 3, 4, 4)


# -------------------------------------------------------------------------------------------------
# the narrow-output form (vectors along M, pixels broadcast)


@SETTINGS
@given(m=st.integers(1, 80), k=st.integers(0, 600), n=st.integers(1, 40), accumulate=st.booleans(),
       with_bias=st.booleans(), rowed=st.booleans(), seed=st.integers(0, 2**16))
def test_narrow_gemm_property(m, k, n, accumulate, with_bias, rowed, seed):
    # the plugin-facing form of gemm_table with A packed by pack_narrow: partial CW-row panels
    # (M % 32), partial pixel tiles (N % 7, N < 7), several depth blocks (K > 256), K = 0; with
    # a period, only the first `valid` columns of each period are computed, the rest untouched
    rng = np.random.default_rng(seed)
    period = int(rng.integers(1, 12)) if rowed else 0
    valid = int(rng.integers(1, period + 1)) if rowed else 0
    w, wo, ld, a, b, bo, rows, c, co, ldc, lo = _flat_operands(rng, m, k, n)
    before = c.copy()
    bias = rng.standard_normal(m).astype(np.float32) if with_bias else None
    G.gemm_narrow(G.pack_narrow(w, wo, m, k, ld), m, k, b, bo, rows, c, co, ldc, lo, n, int(accumulate), bias,
                  period, valid)
    cols = np.arange(lo, n)
    if period:
        cols = cols[cols % period < valid]
    base = "accumulate" if accumulate else (0.0 if bias is None else bias[:, None].astype(np.float64))
    _check_flat(c, before, a, b, bo, rows, co, ldc, n, cols, base, 1e-4 * np.sqrt(k + 1))


@SETTINGS
@given(m=st.integers(1, 100), k=st.integers(1, 300), n=st.integers(1, 60), pad=st.integers(0, 9),
       parallel=st.booleans(), init=st.sampled_from([None, "zero", "bias"]), seed=st.integers(0, 2**16))
def test_narrow_gemm_acc_property(m, k, n, pad, parallel, init, seed):
    # the host's form: B and C as column windows of wider matrices, split over the pool by panels
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n + pad)).astype(np.float32)[:, pad:]
    c_big = rng.standard_normal((m, n + pad)).astype(np.float32)
    before = c_big.copy()
    c = c_big[:, :n]
    bias = rng.standard_normal(m).astype(np.float32) if init == "bias" else None
    G.gemm_narrow_acc(G.pack_narrow(a.reshape(-1), 0, m, k, k), m, k, b, c, parallel, init is not None, bias)
    base = before[:, :n] if init is None else (np.zeros((m, n)) if bias is None else bias[:, None].astype(np.float64))
    np.testing.assert_allclose(c, base + a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4,
                               atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(c_big[:, n:], before[:, n:])


def test_narrow_form_is_preferred_for_few_columns_only():
    assert not G.prefers_narrow(0)
    assert not G.prefers_narrow(G.NARROW_MAX_COLS + 1)
    assert G.prefers_narrow(49) == G.FULL_WIDTH
    assert G.prefers_narrow(49, 512) == G.FULL_WIDTH  # 49 of 64 columns busy in NR panels, every lane in 7x32 tiles
    assert not G.prefers_narrow(49, 15)  # 15 of 32 lanes busy: the NR form wastes less
    assert not G.prefers_narrow(64, 64)  # two full NR panels
    with pytest.raises(ValueError, match="does not fit"):
        G.pack_narrow(np.zeros(10, np.float32), 2, 3, 4, 4)
