"""Resource budgets, checked before any allocation.

One :class:`Budget` travels from the frontend through constant folding into the kernels,
so a tiny model cannot make byoc allocate gigabytes at compile or at run time.

Kernels allocate through one helper, :class:`Alloc` (``spec.alloc`` in a kernel factory; the
budget is the run's, or the compile's during constant folding): it works out the size of what
numpy is about to allocate, checks it, and only then allocates. ``Budget.check_alloc`` (a shape
and dtype) and ``Budget.check_bytes`` (a byte count) check without allocating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from byoc.errors import OptionError, ResourceLimitError

GiB = 1 << 30


@dataclass(frozen=True)
class Budget:
    """Limits that protect the process; every default is generous for real models."""

    #: largest single tensor, in bytes (declared, folded or computed at run time)
    max_tensor_bytes: int = 4 * GiB
    #: sum of all initializer/constant bytes in a model
    max_total_bytes: int = 16 * GiB
    #: nodes in a model, subgraphs included
    max_nodes: int = 1_000_000
    #: nesting depth of subgraphs (If/Loop/Scan bodies)
    max_nesting: int = 64
    #: iterations of one Loop execution
    max_loop_iterations: int = 10_000_000
    #: distinct input shapes a compiled model remembers having refused to specialise
    max_shape_keys: int = 1024
    #: bytes of artifact data (the targets' constants) a model's shape specialisations may hold
    #: together; beyond it new shapes run without the static-shape targets
    max_specialization_bytes: int = 1 * GiB
    #: wall-clock seconds one compile may take; it holds inside onnx's own checker, converter and
    #: shape inference too (:mod:`byoc.frontend.bounded`); ``None``: no limit
    max_compile_seconds: float | None = 600.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_compile_seconds":
                ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                       and 0 < value <= math.inf)
            else:
                ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0
            if not ok:
                raise OptionError(f"Budget({f.name}={value!r}): expected "
                                  + ("a number of seconds > 0 or None" if f.name == "max_compile_seconds"
                                     else "a whole number >= 0"))

    def check_alloc(self, shape, dtype, what: str) -> None:
        """Raise :class:`ResourceLimitError` if a tensor of ``shape``/``dtype`` is too big.

        ``what`` names the node or tensor for the message. Negative dimensions are refused.
        """
        dims = _dims(shape, what)
        nbytes = math.prod(dims) * _itemsize(dtype)
        if nbytes > self.max_tensor_bytes:
            raise ResourceLimitError(
                f"{what}: tensor of shape {dims} ({_fmt_bytes(nbytes)}) exceeds the budget "
                f"max_tensor_bytes={_fmt_bytes(self.max_tensor_bytes)}"
            )

    def check_bytes(self, nbytes: int, what: str, detail: str = "a tensor") -> None:
        """Raise :class:`ResourceLimitError` if ``nbytes`` bytes (``detail`` says of what) are too many."""
        if nbytes > self.max_tensor_bytes:
            raise ResourceLimitError(
                f"{what}: {detail} of {_fmt_bytes(nbytes)} exceeds the budget "
                f"max_tensor_bytes={_fmt_bytes(self.max_tensor_bytes)}"
            )

    def alloc(self, shape, dtype, what: str, fill=None) -> np.ndarray:
        """A new array of ``shape``/``dtype``, checked against the budget first.

        Uninitialised when ``fill`` is ``None``, else filled with ``fill``.
        """
        return Alloc(self, what).full(shape, fill, dtype) if fill is not None else Alloc(self, what).empty(shape, dtype)

    def guard(self, what: str) -> "Alloc":
        """The budgeted allocator for ``what`` (a node or tensor name); see :class:`Alloc`."""
        return Alloc(self, what)


def _dims(shape, what: str) -> list[int]:
    dims = [int(shape)] if np.ndim(shape) == 0 else [int(d) for d in shape]
    for d in dims:
        if d < 0:
            raise ResourceLimitError(f"{what}: negative dimension in shape {dims}")
    return dims


def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize if dtype is not None else 1


class Alloc:
    """Budgeted numpy: every kernel allocation whose size is computed goes through here.

    Each method works out the size of what it will allocate, checks it against ``budget``
    (raising :class:`ResourceLimitError` naming ``what``) and only then calls numpy. Kernels get
    one as ``spec.alloc``; ``tests/test_hostile_budget.py`` fails when a kernel module calls a
    numpy allocator directly instead.
    """

    __slots__ = ("budget", "what")

    def __init__(self, budget: Budget, what: str):
        self.budget = budget
        self.what = what

    def check(self, shape, dtype) -> None:
        self.budget.check_alloc(shape, dtype, self.what)

    def check_bytes(self, nbytes: int, detail: str = "a tensor") -> None:
        self.budget.check_bytes(int(nbytes), self.what, detail)

    # plain allocations ---------------------------------------------------------------------

    def empty(self, shape, dtype=np.float64) -> np.ndarray:
        self.check(shape, dtype)
        return np.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype=np.float64) -> np.ndarray:
        self.check(shape, dtype)
        return np.zeros(shape, dtype=dtype)

    def ones(self, shape, dtype=np.float64) -> np.ndarray:
        self.check(shape, dtype)
        return np.ones(shape, dtype=dtype)

    def full(self, shape, fill, dtype=None) -> np.ndarray:
        dtype = np.asarray(fill).dtype if dtype is None else dtype
        self.check(shape, dtype)
        return np.full(shape, fill, dtype=dtype)

    def empty_like(self, x: np.ndarray, dtype=None) -> np.ndarray:
        return self.empty(x.shape, x.dtype if dtype is None else dtype)

    def arange(self, n: int, dtype=np.int64) -> np.ndarray:
        """``0, 1, ..., n - 1``."""
        self.check([max(int(n), 0)], dtype)
        return np.arange(n, dtype=dtype)

    # numpy operations whose output size follows from their arguments ----------------------

    def concatenate(self, xs, axis: int = 0) -> np.ndarray:
        xs = [np.asarray(x) for x in xs]
        if xs and xs[0].ndim and -xs[0].ndim <= axis < xs[0].ndim:
            shape = list(xs[0].shape)
            shape[axis] = sum(x.shape[axis] if x.ndim == xs[0].ndim else 0 for x in xs)
            self.check(shape, _widest(xs))
        return np.concatenate(xs, axis=axis)

    def stack(self, xs, axis: int = 0) -> np.ndarray:
        xs = [np.asarray(x) for x in xs]
        if xs:
            self.check((len(xs),) + xs[0].shape, _widest(xs))
        return np.stack(xs, axis=axis)

    def take(self, data: np.ndarray, indices, axis: int = 0) -> np.ndarray:
        axis = axis % data.ndim if data.ndim and -data.ndim <= axis < data.ndim else axis
        shape = data.shape[:axis] + np.shape(indices) + data.shape[axis + 1:]
        self.check(shape, data.dtype)
        return np.take(data, indices, axis=axis)

    def take_along_axis(self, data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
        axis = axis % data.ndim if data.ndim and -data.ndim <= axis < data.ndim else axis
        self.check(np.broadcast_shapes(data.shape[:axis] + (1,) + data.shape[axis + 1:], indices.shape), data.dtype)
        return np.take_along_axis(data, indices, axis=axis)

    def tile(self, x: np.ndarray, reps) -> np.ndarray:
        reps = [int(r) for r in reps]
        shape = [1] * max(0, len(reps) - x.ndim) + list(x.shape)
        reps = [1] * max(0, x.ndim - len(reps)) + reps
        self.check([d * r for d, r in zip(shape, reps)], x.dtype)
        return np.tile(x, reps)

    def repeat(self, x: np.ndarray, repeats: int, axis: int) -> np.ndarray:
        shape = list(x.shape)
        shape[axis] *= int(repeats)
        self.check(shape, x.dtype)
        return np.repeat(x, repeats, axis=axis)

    def nonzero(self, x: np.ndarray) -> np.ndarray:
        """The ``(ndim, count)`` int64 array of the indices of non-zero elements."""
        count = int(np.count_nonzero(x))
        # np.nonzero builds one index array per axis before they are stacked: twice the output
        self.check_bytes(2 * x.ndim * count * 8, f"NonZero's index arrays ({x.ndim} x {count} int64, twice)")
        out = np.empty((x.ndim, count), dtype=np.int64)
        for a, idx in enumerate(np.nonzero(x)):
            out[a] = idx
        return out

    def einsum(self, equation: str, *operands: np.ndarray) -> np.ndarray:
        """``np.einsum``, with the output size checked first.

        With more than two operands numpy contracts pairwise; its path search keeps every
        intermediate no larger than the largest input or the output, so those are covered too.
        """
        shape = einsum_shape(equation, [np.shape(o) for o in operands])
        if shape is not None:
            self.check(shape, _widest(operands))
        return np.asarray(np.einsum(equation, *operands, optimize=len(operands) > 2))


def _widest(arrays) -> np.dtype:
    """The widest dtype among ``arrays`` (what numpy's result holds per element, or less)."""
    dtypes = [np.asarray(a).dtype for a in arrays]
    return max(dtypes, key=lambda d: d.itemsize) if dtypes else np.dtype(np.float64)


def einsum_shape(equation: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The output shape of ``np.einsum(equation, ...)`` on operands of ``shapes``.

    ``None`` when the equation does not parse; numpy then reports the problem itself.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return None
    sizes: dict[str, int] = {}
    ell_shapes = []
    counts: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        letters = term.replace("...", "")
        if not letters.isalpha() and letters:
            return None
        n_ell = len(shape) - len(letters)
        if n_ell < 0 or (n_ell and "..." not in term):
            return None
        before = term.split("...")[0] if "..." in term else term
        ell_shapes.append(tuple(shape[len(before):len(before) + n_ell]) if "..." in term else ())
        dims = list(shape[:len(before)]) + list(shape[len(before) + n_ell:])
        for c, d in zip(letters, dims):
            sizes[c] = max(sizes.get(c, 1), int(d)) if d != 0 and sizes.get(c) != 0 else 0
            counts[c] = counts.get(c, 0) + 1
    try:
        ell = np.broadcast_shapes(*ell_shapes) if ell_shapes else ()
    except ValueError:
        return None
    if arrow:
        out_letters = rhs.replace("...", "")
        if any(c not in sizes for c in out_letters):
            return None
        before = rhs.split("...")[0] if "..." in rhs else rhs
        return (tuple(sizes[c] for c in before) + (tuple(ell) if "..." in rhs else ())
                + tuple(sizes[c] for c in out_letters[len(before):]))
    return tuple(ell) + tuple(sizes[c] for c in sorted(c for c, n in counts.items() if n == 1))


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


DEFAULT_BUDGET = Budget()
