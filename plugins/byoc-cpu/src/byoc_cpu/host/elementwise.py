"""byoc-cpu's elementwise kernels: arithmetic, math, comparison and logic, Where (Cast, CastLike,
Identity and Dropout are left to byoc's reference kernels: they are numpy calls either way).

This module also holds the machinery the activation and reduce families share:

* **Broadcast plans** (:func:`broadcast_plan`): the output shape of a numpy/ONNX broadcast and,
  per input, element strides over the output dimensions (0 where an input is broadcast), with
  size-1 dimensions dropped and neighbouring dimensions merged wherever every input allows it.
  Same-shape operands collapse to one flat dimension, a scalar operand to stride 0, and a
  per-channel ``[1, C, 1, 1]`` operand against ``[N, C, H, W]`` to ``(N, C, H*W)`` with strides
  ``(0, 1, 0)``. Plans are cached per tuple of input shapes.
* **Range kernels**: every Numba kernel computes the flat output positions ``[start, stop)``.
  One compiled function per operator and dtype handles every broadcast pattern (no compile per
  call); the innermost loop has fast paths for contiguous/contiguous, contiguous/scalar and
  scalar/contiguous operands, which the compiler vectorises.
* **numpy twins**: a range kernel whose scalar operation is exactly one numpy ufunc's (Add,
  Sub, Mul, float Div, the comparisons, bitwise and boolean logic) runs as that ufunc when the
  plan is flat (same-shape operands, or a scalar one), chunked over the same pool: the same
  bits, about as fast on these memory-bound loops, and no Numba compilation on a first run.
  Broadcasting plans keep the Numba kernels (numpy's broadcasting loops measured 2.5-3.3x slower).
* **Parallelism** (:func:`byoc_cpu.host.threads.run_ranges`): kernels are compiled with
  ``nogil=True`` and compute ranges of the output; byoc-cpu's pool splits large ranges.
* **Fast float32 math**: :func:`fexp`, :func:`ftanh`, :func:`ferf` are vectorisable float32
  versions (a few ulp) for the kernels of this and the activation/reduce modules.

Numba's on-disk cache is invalidated per source file: the activation and reduce kernels inline
functions from this module, so after editing one here, clear ``__pycache__/*.nbi`` (a release
install writes every file anew, so users are not affected).

float16 inputs are computed in float32 and the result cast back; integer arithmetic is exact
(with the usual two's-complement wrap-around), integer ``Div`` truncates toward zero as in C.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np
from numba import types
from numba.extending import overload

from byoc_cpu.host.threads import run_ranges
from byoc.contract import NodeSpec
from byoc_cpu.host.registry import kernel
from byoc_cpu.tuning import KERNELS

# --------------------------------------------------------------------------------------------
# input preparation and broadcast plans
# --------------------------------------------------------------------------------------------

_SMALL_READONLY = KERNELS["copy_readonly_max_elements"]


def prep(x: np.ndarray) -> np.ndarray:
    """A C-contiguous array for a Numba kernel (numpy scalars become 0-d arrays).

    Read-only arrays (constants) are types of their own for Numba; small ones are copied so
    that the common kernel specialisation serves them, large ones are passed as they are.
    """
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if not x.dtype.isnative:  # Numba compiles native byte order only
        x = x.astype(x.dtype.newbyteorder("="))
    flags = x.flags
    if not flags.c_contiguous:
        return np.ascontiguousarray(x)
    if not flags.writeable and x.size <= _SMALL_READONLY:
        return x.copy()
    return x


_COMPUTE_DTYPE: dict[np.dtype, np.dtype] = {}


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a kernel computes in: float16 (and bfloat16) are computed in float32."""
    cd = _COMPUTE_DTYPE.get(dt)
    if cd is None:
        cd = np.dtype(np.float32) if (dt == np.float16 or dt.name == "bfloat16") else dt
        _COMPUTE_DTYPE[dt] = cd
    return cd


def as_compute(x: np.ndarray) -> np.ndarray:
    """:func:`prep`, converted to the compute dtype."""
    dt = compute_dtype(x.dtype)
    if dt is not x.dtype and dt != x.dtype:
        return x.astype(dt)
    return prep(x)


@dataclass(frozen=True)
class BroadcastPlan:
    out_shape: tuple[int, ...]
    size: int
    #: merged output dimensions (at least one)
    dims: np.ndarray
    #: per input: element strides over ``dims`` (0 where broadcast)
    strides: tuple[np.ndarray, ...]


@functools.lru_cache(maxsize=4096)
def broadcast_plan(shapes: tuple[tuple[int, ...], ...]) -> BroadcastPlan:
    """The broadcast of ``shapes`` (numpy rules), with dimensions merged for the kernels.

    :raises ValueError: the shapes do not broadcast.
    """
    out_shape = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    nd = len(out_shape)
    all_strides = []
    for s in shapes:
        s = (1,) * (nd - len(s)) + tuple(s)
        st = [0] * nd
        acc = 1
        for d in range(nd - 1, -1, -1):
            st[d] = acc if s[d] != 1 else 0
            acc *= s[d]
        all_strides.append(st)
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in shapes]
    for d in range(nd):
        n = out_shape[d]
        if n == 1:
            continue
        if dims and all(m[-1] == st[d] * n for m, st in zip(merged, all_strides)):
            dims[-1] *= n
            for m, st in zip(merged, all_strides):
                m[-1] = st[d]
        else:
            dims.append(n)
            for m, st in zip(merged, all_strides):
                m.append(st[d])
    if not dims:
        dims = [1]
        merged = [[0] for _ in shapes]
    size = math.prod(out_shape)
    arr = np.array(dims, dtype=np.int64)
    return BroadcastPlan(out_shape, size, arr, tuple(np.array(m, dtype=np.int64) for m in merged))


def plan_for(spec: NodeSpec, *arrays: np.ndarray) -> BroadcastPlan:
    """The broadcast plan of ``arrays`` for ``spec``'s node.

    An output larger than every input (``[N, 1] x [1, M]``) is checked against the budget.
    """
    try:
        plan = broadcast_plan(tuple(a.shape for a in arrays))
    except ValueError:
        shapes = ", ".join(str(list(a.shape)) for a in arrays)
        raise spec.error(f"input shapes {shapes} do not broadcast") from None
    if plan.size > max(a.size for a in arrays):
        spec.check_alloc(plan.out_shape, arrays[-1].dtype)
    return plan


# --------------------------------------------------------------------------------------------
# traversal loops (inlined into every kernel)
# --------------------------------------------------------------------------------------------

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_inline = numba.njit(inline="always", error_model="numpy")


@_inline
def binary_loop(f, a, b, out, dims, sa, sb, start, stop):
    nd = dims.size
    last = nd - 1
    idx = np.empty(nd, np.int64)
    ia = 0
    ib = 0
    rem = start
    for d in range(last, -1, -1):
        q = rem % dims[d]
        rem //= dims[d]
        idx[d] = q
        ia += q * sa[d]
        ib += q * sb[d]
    inner = dims[last]
    xa = sa[last]
    xb = sb[last]
    pos = start
    while pos < stop:
        m = min(inner - idx[last], stop - pos)
        # slices give the compiler zero-based, non-negative indices: the loops vectorise
        o = out[pos : pos + m]
        if xa == 1 and xb == 1:
            av = a[ia : ia + m]
            bv = b[ib : ib + m]
            for i in range(m):
                o[i] = f(av[i], bv[i])
        elif xa == 1 and xb == 0:
            av = a[ia : ia + m]
            bs = b[ib]
            for i in range(m):
                o[i] = f(av[i], bs)
        elif xa == 0 and xb == 1:
            as_ = a[ia]
            bv = b[ib : ib + m]
            for i in range(m):
                o[i] = f(as_, bv[i])
        else:
            av = a[ia:]
            bv = b[ib:]
            for i in range(m):
                o[i] = f(av[i * xa], bv[i * xb])
        pos += m
        ia += m * xa
        ib += m * xb
        idx[last] += m
        d = last
        while d > 0 and idx[d] == dims[d]:
            idx[d] = 0
            ia -= dims[d] * sa[d]
            ib -= dims[d] * sb[d]
            d -= 1
            idx[d] += 1
            ia += sa[d]
            ib += sb[d]


@_inline
def ternary_loop(f, a, b, c, out, dims, sa, sb, sc, start, stop):
    nd = dims.size
    last = nd - 1
    idx = np.empty(nd, np.int64)
    ia = 0
    ib = 0
    ic = 0
    rem = start
    for d in range(last, -1, -1):
        q = rem % dims[d]
        rem //= dims[d]
        idx[d] = q
        ia += q * sa[d]
        ib += q * sb[d]
        ic += q * sc[d]
    inner = dims[last]
    xa = sa[last]
    xb = sb[last]
    xc = sc[last]
    pos = start
    while pos < stop:
        m = min(inner - idx[last], stop - pos)
        o = out[pos : pos + m]
        av = a[ia:]
        bv = b[ib:]
        cv = c[ic:]
        if xa == 1 and xb == 1 and xc == 1:
            for i in range(m):
                o[i] = f(av[i], bv[i], cv[i])
        else:
            for i in range(m):
                o[i] = f(av[i * xa], bv[i * xb], cv[i * xc])
        pos += m
        ia += m * xa
        ib += m * xb
        ic += m * xc
        idx[last] += m
        d = last
        while d > 0 and idx[d] == dims[d]:
            idx[d] = 0
            ia -= dims[d] * sa[d]
            ib -= dims[d] * sb[d]
            ic -= dims[d] * sc[d]
            d -= 1
            idx[d] += 1
            ia += sa[d]
            ib += sb[d]
            ic += sc[d]


@_inline
def unary_loop(f, x, out, p0, p1, start, stop):
    xv = x[start:stop]
    o = out[start:stop]
    for i in range(stop - start):
        o[i] = f(xv[i], p0, p1)


# --------------------------------------------------------------------------------------------
# vectorisable float32 exp / tanh / erf
#
# libm's expf/tanhf/erff are scalar calls the compiler cannot vectorise (Numba has no SVML
# here); these are branch-free polynomial forms, within a few float32 ulp, 5-100x faster on
# large tensors. fexp/ftanh/ferf pick them for float32 and use numpy's for other types.
# --------------------------------------------------------------------------------------------


@_inline
def _bits_as_float32(v):
    """The float32 whose bits are the low 32 bits of the integer ``v``."""
    return np.int32(v).view(np.float32)


_F = np.float32


@_inline
def _expf(x):
    # exp(x) = 2**n * exp(r), n = round(x / ln2), |r| <= ln2 / 2; Cephes' expf polynomial for
    # exp(r); 2**n built from exponent bits in two halves so that n may reach -252..254
    if x > _F(88.8):  # noqa: PLR1730  (explicit compares keep NaN)
        x = _F(88.8)
    if x < _F(-104.0):  # noqa: PLR1730
        x = _F(-104.0)
    fn = np.floor(x * _F(1.44269504088896341) + _F(0.5))
    r = x - fn * _F(0.693359375) - fn * _F(-2.12194440e-4)
    y = _F(1.9875691500e-4)
    y = y * r + _F(1.3981999507e-3)
    y = y * r + _F(8.3334519073e-3)
    y = y * r + _F(4.1665795894e-2)
    y = y * r + _F(1.6666665459e-1)
    y = y * r + _F(5.0000001201e-1)
    y = y * (r * r) + r + _F(1.0)
    n = np.int32(fn)
    n1 = n >> 1
    return (y * _bits_as_float32((n1 + 127) << 23)) * _bits_as_float32((n - n1 + 127) << 23)


@_inline
def _tanhf(x):
    # |x| < 0.625: odd polynomial (Cephes' tanhf); else 1 - 2 / (exp(2|x|) + 1)
    a = abs(x)
    z = x * x
    small = _F(-5.70498872745e-3)
    small = small * z + _F(2.06390887954e-2)
    small = small * z - _F(5.37397155531e-2)
    small = small * z + _F(1.33314422036e-1)
    small = small * z - _F(3.33332819422e-1)
    small = small * z * x + x
    big = _F(1.0) - _F(2.0) / (_expf(_F(2.0) * a) + _F(1.0))
    big = big if x >= 0 else -big
    return small if a < _F(0.625) else big


@_inline
def _erff(x):
    # a rational approximation x * P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 in float32 beyond),
    # with the coefficients Eigen and XLA use for float32
    c = x
    if c > _F(4.0):  # noqa: PLR1730
        c = _F(4.0)
    if c < _F(-4.0):  # noqa: PLR1730
        c = _F(-4.0)
    z = c * c
    p = _F(-2.72614225801306e-10)
    p = p * z + _F(2.77068142495902e-08)
    p = p * z + _F(-2.10102402082508e-06)
    p = p * z + _F(-5.69250639462346e-05)
    p = p * z + _F(-7.34990630326855e-04)
    p = p * z + _F(-2.95459980854025e-03)
    p = p * z + _F(-1.60960333262415e-02)
    q = _F(-1.45660718464996e-05)
    q = q * z + _F(-2.13374055278905e-04)
    q = q * z + _F(-1.68282697438203e-03)
    q = q * z + _F(-7.37332916720468e-03)
    q = q * z + _F(-1.42647390514189e-02)
    return c * p / q


def cst(x, v):
    """``v`` in the type of ``x`` (use from jitted code): keeps float32 math in float32, where a
    bare Python constant would promote it to float64."""
    return v


@overload(cst)
def _ov_cst(x, v):
    if isinstance(x, (types.Float, types.Integer)):
        t = x

        def impl(x, v):
            return t(v)

        return impl
    return lambda x, v: v


def fexp(x):
    """exp; the float32 overload is vectorisable (use from jitted code)."""
    return np.exp(x)


def ftanh(x):
    """tanh; the float32 overload is vectorisable (use from jitted code)."""
    return np.tanh(x)


def ferf(x):
    """erf; the float32 overload is vectorisable (use from jitted code)."""
    return math.erf(x)


@overload(fexp)
def _ov_fexp(x):
    if x == types.float32:
        return lambda x: _expf(x)
    return lambda x: np.exp(x)


@overload(ftanh)
def _ov_ftanh(x):
    if x == types.float32:
        return lambda x: _tanhf(x)
    return lambda x: np.tanh(x)


@overload(ferf)
def _ov_ferf(x):
    if x == types.float32:
        return lambda x: _erff(x)
    return lambda x: math.erf(x)


# --------------------------------------------------------------------------------------------
# scalar operations
# --------------------------------------------------------------------------------------------


@_inline
def _add(x, y):
    return x + y


@_inline
def _sub(x, y):
    return x - y


@_inline
def _mul(x, y):
    return x * y


@_inline
def _div_float(x, y):
    return x / y


@_inline
def _div_int(x, y):
    # C-style division: truncate toward zero (numba's // floors); x / 0 gives 0
    if y == 0:
        return x - x
    q = x // y
    if q < 0 and q * y != x:
        q += 1
    return q


@_inline
def _max(x, y):
    # NaN-propagating like np.maximum
    return x if (x > y or x != x) else y  # noqa: PLR0124  (x != x: NaN, also for ints)


@_inline
def _min(x, y):
    return x if (x < y or x != x) else y  # noqa: PLR0124


@_inline
def _pow(x, y):
    return x**y


@_inline
def _pow_int(x, y):
    # integer base and exponent: exact by squaring (wraps like C); negative exponents as C++ pow + cast
    if y < 0:
        return int(float(x) ** float(y))
    result = x - x + 1
    base = x
    e = y
    while e > 0:
        if e & 1:
            result = result * base
        base = base * base
        e >>= 1
    return result


@_inline
def _pow_int_float(x, y):
    return float(x) ** float(y)


@_inline
def _mod_int(x, y):
    # Python/numpy modulo: sign of the divisor; x % 0 gives 0
    if y == 0:
        return x - x
    return x % y


@_inline
def _fmod_int(x, y):
    # C fmod: sign of the dividend
    if y == 0:
        return x - x
    return x - _div_int(x, y) * y


@_inline
def _mod_float(x, y):
    r = np.fmod(x, y)
    if r != 0 and ((r < 0) != (y < 0)):
        r += y
    return r


@_inline
def _fmod_float(x, y):
    return np.fmod(x, y)


@_inline
def _equal(x, y):
    return x == y


@_inline
def _less(x, y):
    return x < y


@_inline
def _greater(x, y):
    return x > y


@_inline
def _less_equal(x, y):
    return x <= y


@_inline
def _greater_equal(x, y):
    return x >= y


@_inline
def _and(x, y):
    return x and y


@_inline
def _or(x, y):
    return x or y


@_inline
def _xor(x, y):
    return x != y


@_inline
def _bit_and(x, y):
    return x & y


@_inline
def _bit_or(x, y):
    return x | y


@_inline
def _bit_xor(x, y):
    return x ^ y


def bitwidth(x):
    """The number of bits of ``x``'s integer type (use from jitted code)."""
    return np.dtype(type(x)).itemsize * 8


@overload(bitwidth)
def _ov_bitwidth(x):
    if isinstance(x, types.Integer):
        bits = x.bitwidth
        return lambda x: bits
    return None


@_inline
def _shift_left(x, y):
    # shifts outside [0, width) give 0; the kernel stores into the input's width, which drops
    # the bits shifted out (for signed types: the two's-complement pattern, as onnx)
    if y < 0 or y >= bitwidth(x):
        return x - x
    return x << y


@_inline
def _shift_right(x, y):
    # arithmetic shift for signed types; shifts outside [0, width) leave only the sign
    if y < 0 or y >= bitwidth(x):
        return x - x - 1 if x < 0 else x - x
    return x >> y


@_inline
def _prelu(x, s):
    return x if x >= 0 else x * s


@_inline
def _where(c, x, y):
    return x if c else y


# binary kernels: (a, b, out, dims, sa, sb, start, stop)


@_jit
def k_add(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_add, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_sub(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_sub, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_mul(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_mul, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_div_float(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_div_float, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_div_int(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_div_int, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_max(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_max, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_min(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_min, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_pow(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_pow, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_pow_int(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_pow_int, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_pow_int_float(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_pow_int_float, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_mod_int(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_mod_int, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_fmod_int(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_fmod_int, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_mod_float(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_mod_float, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_fmod_float(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_fmod_float, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_equal(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_equal, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_less(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_less, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_greater(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_greater, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_less_equal(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_less_equal, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_greater_equal(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_greater_equal, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_and(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_and, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_or(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_or, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_xor(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_xor, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_bit_and(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_bit_and, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_bit_or(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_bit_or, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_bit_xor(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_bit_xor, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_shift_left(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_shift_left, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_shift_right(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_shift_right, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_prelu(a, b, out, dims, sa, sb, start, stop):
    binary_loop(_prelu, a, b, out, dims, sa, sb, start, stop)


@_jit
def k_where(c, x, y, out, dims, sc, sx, sy, start, stop):
    ternary_loop(_where, c, x, y, out, dims, sc, sx, sy, start, stop)


# Range kernels whose scalar operation is exactly one numpy ufunc's, per dtype kind: the same
# IEEE (or wrapping integer) operation per element, so the same bits. On a flat plan these run
# as the ufunc (no Numba compilation: about a second of a first run per kernel and dtype); the
# ufuncs release the GIL, so their chunks may run on a host executor's threads.
_UFUNC_TWINS: dict[Callable, tuple[np.ufunc, str]] = {
    k_add: (np.add, "iuf"),
    k_sub: (np.subtract, "iuf"),
    k_mul: (np.multiply, "iuf"),
    k_div_float: (np.true_divide, "f"),
    k_equal: (np.equal, "iufb"),
    k_less: (np.less, "iuf"),
    k_greater: (np.greater, "iuf"),
    k_less_equal: (np.less_equal, "iuf"),
    k_greater_equal: (np.greater_equal, "iuf"),
    k_and: (np.logical_and, "b"),
    k_or: (np.logical_or, "b"),
    k_xor: (np.not_equal, "b"),
    k_bit_and: (np.bitwise_and, "iub"),
    k_bit_or: (np.bitwise_or, "iub"),
    k_bit_xor: (np.bitwise_xor, "iub"),
}


def _ufunc_ranges(uf: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray, start: int, stop: int) -> None:
    """``out[start:stop] = uf(a, b)`` over flat operands, a size-1 operand broadcast."""
    with np.errstate(all="ignore"):  # IEEE results, as the kernels give, without warnings
        uf(a if a.shape[0] == 1 else a[start:stop], b if b.shape[0] == 1 else b[start:stop], out=out[start:stop])


def _twin(fn: Callable, a: np.ndarray, b: np.ndarray, out: np.ndarray, plan: BroadcastPlan) -> np.ufunc | None:
    """The ufunc twin of ``fn`` where it runs as fast: same-shape operands or a scalar one (a flat
    plan). Real broadcasting (a bias row, a per-channel operand) stays a Numba kernel, which
    measured 2.5-3.3x faster than numpy's broadcasting loops."""
    twin = _UFUNC_TWINS.get(fn)
    if twin is None or plan.dims.shape[0] != 1 or a.dtype != b.dtype or a.dtype.kind not in twin[1]:
        return None
    if out.dtype != a.dtype and out.dtype != np.bool_:
        return None
    return twin[0]


def _run_binary(fn: Callable, a: np.ndarray, b: np.ndarray, out: np.ndarray, plan: BroadcastPlan) -> None:
    sa, sb = plan.strides
    uf = _twin(fn, a, b, out, plan)
    if uf is None:
        run_ranges(fn, plan.size, (a.reshape(-1), b.reshape(-1), out.reshape(-1), plan.dims, sa, sb))
        return
    # one merged dimension: each operand is contiguous (stride 1) or a scalar (stride 0)
    av = a.reshape(-1) if sa[0] else a.reshape(-1)[:1]
    bv = b.reshape(-1) if sb[0] else b.reshape(-1)[:1]
    run_ranges(functools.partial(_ufunc_ranges, uf), plan.size, (av, bv, out.reshape(-1)))


def binary(fn: Callable, a: np.ndarray, b: np.ndarray, out_dtype, plan: BroadcastPlan) -> np.ndarray:
    """Run a binary range kernel over the broadcast of ``a`` and ``b`` (already prepared)."""
    out = np.empty(plan.out_shape, dtype=out_dtype)
    if plan.size:
        _run_binary(fn, a, b, out, plan)
    return out


def binary_into(fn: Callable, a: np.ndarray, b: np.ndarray, out: np.ndarray, plan: BroadcastPlan) -> np.ndarray:
    """Like :func:`binary` into an existing C-contiguous ``out`` of the plan's shape (may be ``a``)."""
    if plan.size:
        _run_binary(fn, a, b, out, plan)
    return out


# unary scalar ops: f(x, p0, p1); p0/p1 carry attributes in the compute dtype


@_inline
def _u_copy(x, p0, p1):
    return x


@_inline
def _u_neg(x, p0, p1):
    return -x


@_inline
def _u_abs(x, p0, p1):
    return x if x >= 0 else -x


@_inline
def _u_sqrt(x, p0, p1):
    return np.sqrt(x)


@_inline
def _u_exp(x, p0, p1):
    return fexp(x)


@_inline
def _u_log(x, p0, p1):
    return np.log(x)


@_inline
def _u_reciprocal(x, p0, p1):
    return p0 / x


@_inline
def _u_floor(x, p0, p1):
    return np.floor(x)


@_inline
def _u_ceil(x, p0, p1):
    return np.ceil(x)


@_inline
def _u_round(x, p0, p1):
    return np.rint(x)  # round half to even


@_inline
def _u_sign(x, p0, p1):
    if x > 0:
        return p0
    if x < 0:
        return -p0
    return x - x


@_inline
def _u_sin(x, p0, p1):
    return np.sin(x)


@_inline
def _u_cos(x, p0, p1):
    return np.cos(x)


@_inline
def _u_tan(x, p0, p1):
    return np.tan(x)


@_inline
def _u_asin(x, p0, p1):
    return np.arcsin(x)


@_inline
def _u_acos(x, p0, p1):
    return np.arccos(x)


@_inline
def _u_atan(x, p0, p1):
    return np.arctan(x)


@_inline
def _u_sinh(x, p0, p1):
    return np.sinh(x)


@_inline
def _u_cosh(x, p0, p1):
    return np.cosh(x)


@_inline
def _u_asinh(x, p0, p1):
    return np.arcsinh(x)


@_inline
def _u_acosh(x, p0, p1):
    return np.arccosh(x)


@_inline
def _u_atanh(x, p0, p1):
    return np.arctanh(x)


@_inline
def _u_isnan(x, p0, p1):
    return x != x  # noqa: PLR0124


@_inline
def _u_isinf(x, p0, p1):
    # p0: detect +inf, p1: detect -inf
    return (p0 != 0 and x == np.inf) or (p1 != 0 and x == -np.inf)


@_inline
def _u_not(x, p0, p1):
    return not x


@_inline
def _u_bit_not(x, p0, p1):
    return ~x


@_jit
def k_copy(x, out, p0, p1, start, stop):
    unary_loop(_u_copy, x, out, p0, p1, start, stop)


@_jit
def k_neg(x, out, p0, p1, start, stop):
    unary_loop(_u_neg, x, out, p0, p1, start, stop)


@_jit
def k_abs(x, out, p0, p1, start, stop):
    unary_loop(_u_abs, x, out, p0, p1, start, stop)


@_jit
def k_sqrt(x, out, p0, p1, start, stop):
    unary_loop(_u_sqrt, x, out, p0, p1, start, stop)


@_jit
def k_exp(x, out, p0, p1, start, stop):
    unary_loop(_u_exp, x, out, p0, p1, start, stop)


@_jit
def k_log(x, out, p0, p1, start, stop):
    unary_loop(_u_log, x, out, p0, p1, start, stop)


@_jit
def k_reciprocal(x, out, p0, p1, start, stop):
    unary_loop(_u_reciprocal, x, out, p0, p1, start, stop)


@_jit
def k_floor(x, out, p0, p1, start, stop):
    unary_loop(_u_floor, x, out, p0, p1, start, stop)


@_jit
def k_ceil(x, out, p0, p1, start, stop):
    unary_loop(_u_ceil, x, out, p0, p1, start, stop)


@_jit
def k_round(x, out, p0, p1, start, stop):
    unary_loop(_u_round, x, out, p0, p1, start, stop)


@_jit
def k_sign(x, out, p0, p1, start, stop):
    unary_loop(_u_sign, x, out, p0, p1, start, stop)


@_jit
def k_sin(x, out, p0, p1, start, stop):
    unary_loop(_u_sin, x, out, p0, p1, start, stop)


@_jit
def k_cos(x, out, p0, p1, start, stop):
    unary_loop(_u_cos, x, out, p0, p1, start, stop)


@_jit
def k_tan(x, out, p0, p1, start, stop):
    unary_loop(_u_tan, x, out, p0, p1, start, stop)


@_jit
def k_asin(x, out, p0, p1, start, stop):
    unary_loop(_u_asin, x, out, p0, p1, start, stop)


@_jit
def k_acos(x, out, p0, p1, start, stop):
    unary_loop(_u_acos, x, out, p0, p1, start, stop)


@_jit
def k_atan(x, out, p0, p1, start, stop):
    unary_loop(_u_atan, x, out, p0, p1, start, stop)


@_jit
def k_sinh(x, out, p0, p1, start, stop):
    unary_loop(_u_sinh, x, out, p0, p1, start, stop)


@_jit
def k_cosh(x, out, p0, p1, start, stop):
    unary_loop(_u_cosh, x, out, p0, p1, start, stop)


@_jit
def k_asinh(x, out, p0, p1, start, stop):
    unary_loop(_u_asinh, x, out, p0, p1, start, stop)


@_jit
def k_acosh(x, out, p0, p1, start, stop):
    unary_loop(_u_acosh, x, out, p0, p1, start, stop)


@_jit
def k_atanh(x, out, p0, p1, start, stop):
    unary_loop(_u_atanh, x, out, p0, p1, start, stop)


@_jit
def k_isnan(x, out, p0, p1, start, stop):
    unary_loop(_u_isnan, x, out, p0, p1, start, stop)


@_jit
def k_isinf(x, out, p0, p1, start, stop):
    unary_loop(_u_isinf, x, out, p0, p1, start, stop)


@_jit
def k_not(x, out, p0, p1, start, stop):
    unary_loop(_u_not, x, out, p0, p1, start, stop)


@_jit
def k_bit_not(x, out, p0, p1, start, stop):
    unary_loop(_u_bit_not, x, out, p0, p1, start, stop)


def unary(fn: Callable, x: np.ndarray, out_dtype=None, p0=0, p1=0, cost: int = 1) -> np.ndarray:
    """Run a unary range kernel on a prepared (C-contiguous) ``x``.

    ``p0``/``p1`` are converted to ``x``'s dtype so that the kernel computes in that dtype;
    ``cost`` weighs an element for the parallel split (transcendental functions: more).
    """
    out = np.empty(x.shape, dtype=x.dtype if out_dtype is None else out_dtype)
    if x.size:
        t = x.dtype.type
        run_ranges(fn, x.size, (x.reshape(-1), out.reshape(-1), t(p0), t(p1)), unit_cost=cost)
    return out


# --------------------------------------------------------------------------------------------
# operator factories
# --------------------------------------------------------------------------------------------


def _require_same_dtype(spec: NodeSpec, arrays: Sequence[np.ndarray]) -> None:
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dt:
            kinds = ", ".join(str(x.dtype) for x in arrays)
            raise spec.error(f"inputs must share one element type, got {kinds}")


def _legacy_broadcast(spec: NodeSpec) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """Before opset 7, ``broadcast=1`` with ``axis`` aligned B's dimensions at ``axis`` of A."""
    if spec.opset >= 7 or not spec.attr("broadcast", 0):
        return None
    axis = spec.attr("axis")

    def align(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if axis is None or b.ndim == 0:
            return b
        ax = axis + a.ndim if axis < 0 else axis
        tail = a.ndim - ax - b.ndim
        if ax < 0 or tail < 0:
            raise spec.error(f"legacy broadcast: B of shape {list(b.shape)} does not fit A at axis {axis}")
        return b.reshape(b.shape + (1,) * tail)

    return align


def _make_binary(spec: NodeSpec, pick: Callable[[np.dtype], Callable | None], out_bool: bool = False):
    """A run function for an ONNX binary operator whose kernel depends on the dtype."""
    align = _legacy_broadcast(spec)

    def run(a, b):
        a = np.asarray(a)
        b = np.asarray(b)
        if a.dtype != b.dtype:
            raise spec.error(f"inputs must share one element type, got {a.dtype} and {b.dtype}")
        if align is not None:
            b = align(a, b)
        fn = pick(compute_dtype(a.dtype))
        if fn is None:
            raise spec.error(f"element type {a.dtype} is not supported")
        plan = plan_for(spec, a, b)
        ac, bc = as_compute(a), as_compute(b)
        if out_bool:
            return (binary(fn, ac, bc, np.bool_, plan),)
        out = binary(fn, ac, bc, ac.dtype, plan)
        return (out if out.dtype == a.dtype else out.astype(a.dtype),)

    return run


def _num(fn):
    return lambda dt: fn if dt.kind in "iuf" else None


def _num_or_bool(fn):
    return lambda dt: fn if dt.kind in "iufb" else None


def _by_kind(float_fn, int_fn):
    return lambda dt: float_fn if dt.kind == "f" else (int_fn if dt.kind in "iu" else None)


@kernel("Add")
def make_add(spec: NodeSpec):
    return _make_binary(spec, _num(k_add))


@kernel("Sub")
def make_sub(spec: NodeSpec):
    return _make_binary(spec, _num(k_sub))


@kernel("Mul")
def make_mul(spec: NodeSpec):
    return _make_binary(spec, _num(k_mul))


@kernel("Div")
def make_div(spec: NodeSpec):
    return _make_binary(spec, _by_kind(k_div_float, k_div_int))


@kernel("BitwiseAnd")
def make_bitwise_and(spec: NodeSpec):
    return _make_binary(spec, lambda dt: k_bit_and if dt.kind in "iub" else None)


@kernel("BitwiseOr")
def make_bitwise_or(spec: NodeSpec):
    return _make_binary(spec, lambda dt: k_bit_or if dt.kind in "iub" else None)


@kernel("BitwiseXor")
def make_bitwise_xor(spec: NodeSpec):
    return _make_binary(spec, lambda dt: k_bit_xor if dt.kind in "iub" else None)


@kernel("BitShift")
def make_bitshift(spec: NodeSpec):
    direction = spec.attr("direction", "")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("LEFT", "RIGHT"):
        raise spec.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    fn = k_shift_left if direction == "LEFT" else k_shift_right
    # unsigned types; signed ones (opset 28) with arithmetic right shifts
    return _make_binary(spec, lambda dt: fn if dt.kind in "iu" else None)


@kernel("Mod")
def make_mod(spec: NodeSpec):
    fmod = int(spec.attr("fmod", 0))
    if fmod:
        return _make_binary(spec, _by_kind(k_fmod_float, k_fmod_int))
    return _make_binary(spec, _by_kind(k_mod_float, k_mod_int))


@kernel("PRelu")
def make_prelu(spec: NodeSpec):
    def run(x, slope):
        x = np.asarray(x)
        slope = np.asarray(slope)
        if x.dtype != slope.dtype:
            raise spec.error(f"X and slope must share one element type, got {x.dtype} and {slope.dtype}")
        if x.dtype.kind not in "iuf":
            raise spec.error(f"element type {x.dtype} is not supported")
        plan = plan_for(spec, x, slope)
        if plan.out_shape != x.shape:
            raise spec.error(f"slope of shape {list(slope.shape)} does not broadcast to X {list(x.shape)}")
        xc = as_compute(x)
        out = binary(k_prelu, xc, as_compute(slope), xc.dtype, plan)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run


@kernel("Pow")
def make_pow(spec: NodeSpec):
    def run(x, y):
        x = np.asarray(x)
        y = np.asarray(y)
        if compute_dtype(x.dtype).kind not in "if" or compute_dtype(y.dtype).kind not in "iuf":
            raise spec.error(f"element types {x.dtype} and {y.dtype} are not supported")
        plan = plan_for(spec, x, y)
        xc = as_compute(x)
        if xc.dtype.kind == "f":
            # float base: compute in the base's (compute) type, as onnx casts the result to it
            if y.size == 1 and plan.out_shape == x.shape:
                e = float(y.reshape(-1)[0])
                if e == 2.0:
                    out = binary(k_mul, xc, xc, xc.dtype, broadcast_plan((x.shape, x.shape)))
                    return (out if out.dtype == x.dtype else out.astype(x.dtype),)
                if e == 1.0:
                    return (x.copy(),)
                if e == 0.5:
                    out = unary(k_sqrt, xc)
                    return (out if out.dtype == x.dtype else out.astype(x.dtype),)
            yc = y.astype(xc.dtype) if y.dtype != xc.dtype else prep(y)
            out = binary(k_pow, xc, yc, xc.dtype, plan)
        elif compute_dtype(y.dtype).kind == "f":
            out = binary(k_pow_int_float, xc, as_compute(y), x.dtype, plan)
        else:
            out = binary(k_pow_int, xc, prep(y), x.dtype, plan)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run


def _make_variadic(spec: NodeSpec, pick: Callable[[np.dtype], Callable | None], mean: bool = False):
    """Sum/Mean/Max/Min: fold the inputs pairwise with multi-way (numpy) broadcasting."""

    def run(*inputs):
        arrays = [np.asarray(a) for a in inputs if a is not None]
        if not arrays:
            raise spec.error("needs at least one input")
        _require_same_dtype(spec, arrays)
        dt = arrays[0].dtype
        fn = pick(compute_dtype(dt))
        if fn is None:
            raise spec.error(f"element type {dt} is not supported")
        plan_for(spec, *arrays)  # a clear error when the shapes do not broadcast
        acc = as_compute(arrays[0])
        owned = False  # True once acc is a buffer this call allocated
        for nxt in arrays[1:]:
            plan = broadcast_plan((acc.shape, nxt.shape))
            if owned and plan.out_shape == acc.shape:
                binary_into(fn, acc, as_compute(nxt), acc, plan)
            else:
                acc = binary(fn, acc, as_compute(nxt), acc.dtype, plan)
                owned = True
        if mean:
            n = np.asarray(len(arrays), dtype=acc.dtype)
            acc = binary(k_div_float, acc, n, acc.dtype, broadcast_plan((acc.shape, ())))
            owned = True
        if acc.dtype != dt:
            return (acc.astype(dt),)
        return (acc if owned else acc.copy(),)

    return run


@kernel("Sum")
def make_sum(spec: NodeSpec):
    return _make_variadic(spec, _num(k_add))


@kernel("Mean")
def make_mean(spec: NodeSpec):
    return _make_variadic(spec, lambda dt: k_add if dt.kind == "f" else None, mean=True)


@kernel("Max")
def make_max(spec: NodeSpec):
    return _make_variadic(spec, _num(k_max))


@kernel("Min")
def make_min(spec: NodeSpec):
    return _make_variadic(spec, _num(k_min))


# comparison and logic


@kernel("Equal")
def make_equal(spec: NodeSpec):
    inner = _make_binary(spec, _num_or_bool(k_equal), out_bool=True)

    def run(a, b):
        a = np.asarray(a)
        if a.dtype.kind in "OUS":  # strings (opset 19): a comparison of python objects
            b = np.asarray(b)
            plan_for(spec, a, b)
            return (np.equal(a.astype(object), b.astype(object)).astype(np.bool_),)
        return inner(a, b)

    return run


@kernel("Less")
def make_less(spec: NodeSpec):
    return _make_binary(spec, _num(k_less), out_bool=True)


@kernel("Greater")
def make_greater(spec: NodeSpec):
    return _make_binary(spec, _num(k_greater), out_bool=True)


@kernel("LessOrEqual")
def make_less_equal(spec: NodeSpec):
    return _make_binary(spec, _num(k_less_equal), out_bool=True)


@kernel("GreaterOrEqual")
def make_greater_equal(spec: NodeSpec):
    return _make_binary(spec, _num(k_greater_equal), out_bool=True)


def _bool_only(fn):
    return lambda dt: fn if dt.kind == "b" else None


@kernel("And")
def make_and(spec: NodeSpec):
    return _make_binary(spec, _bool_only(k_and), out_bool=True)


@kernel("Or")
def make_or(spec: NodeSpec):
    return _make_binary(spec, _bool_only(k_or), out_bool=True)


@kernel("Xor")
def make_xor(spec: NodeSpec):
    return _make_binary(spec, _bool_only(k_xor), out_bool=True)


@kernel("Where")
def make_where(spec: NodeSpec):
    def run(cond, x, y):
        cond = np.asarray(cond)
        x = np.asarray(x)
        y = np.asarray(y)
        if cond.dtype != np.bool_:
            raise spec.error(f"condition must be bool, got {cond.dtype}")
        if x.dtype != y.dtype:
            raise spec.error(f"X and Y must share one element type, got {x.dtype} and {y.dtype}")
        plan = plan_for(spec, cond, x, y)
        if x.dtype.kind not in "iufb" or x.dtype.itemsize > 8:
            # strings and exotic types: a pure selection, no arithmetic
            return (np.where(cond, x, y),)
        out = spec.alloc.empty(plan.out_shape, x.dtype)
        if plan.size:
            # bit-pattern selection: reinterpret as same-size unsigned ints (covers float16/bfloat16)
            view = np.dtype(f"u{x.dtype.itemsize}") if x.dtype.kind != "b" else np.dtype(np.bool_)
            sc, sx, sy = plan.strides
            args = (
                prep(cond).reshape(-1),
                prep(x).reshape(-1).view(view),
                prep(y).reshape(-1).view(view),
                out.reshape(-1).view(view),
                plan.dims,
                sc,
                sx,
                sy,
            )
            run_ranges(k_where, plan.size, args)
        return (out,)

    return run


# unary math


def _make_unary(
    spec: NodeSpec,
    fn: Callable,
    kinds: str = "f",
    out_bool: bool = False,
    p0: float = 0,
    p1: float = 0,
):
    def run(x):
        x = np.asarray(x)
        if x.dtype.kind not in kinds:
            raise spec.error(f"element type {x.dtype} is not supported")
        xc = as_compute(x)
        if out_bool:
            return (unary(fn, xc, np.bool_, p0, p1),)
        out = unary(fn, xc, None, p0, p1)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    return run


_UNARY_FLOAT = {
    "Sqrt": k_sqrt,
    "Exp": k_exp,
    "Log": k_log,
    "Floor": k_floor,
    "Ceil": k_ceil,
    "Round": k_round,
    "Sin": k_sin,
    "Cos": k_cos,
    "Tan": k_tan,
    "Asin": k_asin,
    "Acos": k_acos,
    "Atan": k_atan,
    "Sinh": k_sinh,
    "Cosh": k_cosh,
    "Asinh": k_asinh,
    "Acosh": k_acosh,
    "Atanh": k_atanh,
}


def _register_unary_float(op: str, fn: Callable) -> None:
    @kernel(op)
    def make(spec: NodeSpec):
        return _make_unary(spec, fn)

    make.__name__ = f"make_{op.lower()}"


for _op, _fn in _UNARY_FLOAT.items():
    _register_unary_float(_op, _fn)


@kernel("Abs")
def make_abs(spec: NodeSpec):
    signed = _make_unary(spec, k_abs, kinds="if")

    def run(x):
        x = np.asarray(x)
        if x.dtype.kind == "u":
            return (x.copy(),)
        return signed(x)

    return run


@kernel("Neg")
def make_neg(spec: NodeSpec):
    return _make_unary(spec, k_neg, kinds="if")


@kernel("Sign")
def make_sign(spec: NodeSpec):
    return _make_unary(spec, k_sign, kinds="iuf", p0=1)


@kernel("Reciprocal")
def make_reciprocal(spec: NodeSpec):
    return _make_unary(spec, k_reciprocal, p0=1)


@kernel("IsNaN")
def make_isnan(spec: NodeSpec):
    return _make_unary(spec, k_isnan, out_bool=True)


@kernel("IsInf")
def make_isinf(spec: NodeSpec):
    pos = int(spec.attr("detect_positive", 1))
    neg = int(spec.attr("detect_negative", 1))
    inner = _make_unary(spec, k_isinf, out_bool=True, p0=float(bool(pos)), p1=float(bool(neg)))

    def run(x):
        x = np.asarray(x)
        if x.dtype.kind in "iu":
            return (spec.alloc.zeros(x.shape, np.bool_),)
        return inner(x)

    return run


@kernel("Not")
def make_not(spec: NodeSpec):
    return _make_unary(spec, k_not, kinds="b")


@kernel("BitwiseNot")
def make_bitwise_not(spec: NodeSpec):
    return _make_unary(spec, k_bit_not, kinds="iu")
