"""The kernel registry: operator type -> kernel factory.

A *kernel factory* is called once per node when the execution plan is built. It reads the
node's attributes (already converted to Python values in :class:`NodeSpec`), does all
attribute parsing and validation there, and returns a *run function*. The run function
is the hot path: it takes the node's inputs as numpy arrays (``None`` for a missing optional
input) and returns a tuple with one array per node output. It must be pure and thread-safe
(no mutation of its closure, never write into its inputs).

Kernels allocate through ``spec.alloc`` (a :class:`byoc.budget.Alloc`: ``spec.alloc.empty(shape,
dtype)``, ``spec.alloc.concatenate(xs, axis)``, ``spec.alloc.take(...)``, ...), which checks the
size against the budget before numpy allocates, so the resource budget holds at run time and in
constant folding alike. ``spec.check_alloc(shape, dtype)`` checks without allocating. A test
scans the kernel modules for direct numpy allocator calls.

A factory that raises anything but a :class:`~byoc.errors.ByocError` is reported as a
:class:`KernelError` naming the node, like a failing run function.

Example::

    @kernel("Relu")
    def make_relu(spec: NodeSpec):
        def run(x):
            return (relu(x),)
        return run
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from byoc.budget import DEFAULT_BUDGET, Alloc, Budget
from byoc.errors import ByocError, KernelError, ResourceLimitError

RunFn = Callable[..., Sequence[np.ndarray]]
Factory = Callable[["NodeSpec"], RunFn]

_REGISTRY: dict[tuple[str, str], Factory] = {}


@dataclass
class NodeSpec:
    """What a kernel factory knows about the node it builds a kernel for."""

    op_type: str
    name: str = ""
    domain: str = ""
    #: opset version of the node's domain in the model (the canonical opset after conversion)
    opset: int = 21
    #: attributes as Python values: int, float, str, bytes, lists of those, numpy arrays for
    #: tensors, and ``onnx_ir.Graph`` for graph attributes
    attrs: dict[str, Any] = field(default_factory=dict)
    #: number of input slots (missing optional inputs count, and arrive as ``None``)
    n_inputs: int = 1
    #: number of output slots
    n_outputs: int = 1
    #: static input shapes/dtypes when known (``None`` entries when unknown)
    input_shapes: list[tuple | None] = field(default_factory=list)
    input_dtypes: list[np.dtype | None] = field(default_factory=list)
    #: which inputs are compile-time constants (value known), for kernels that pre-pack
    const_inputs: dict[int, np.ndarray] = field(default_factory=dict)
    budget: Budget = DEFAULT_BUDGET
    #: outer-scope values the node's subgraphs read (If/Loop/Scan); they arrive after the inputs
    captured: list[Any] = field(default_factory=list)
    #: the plan's step factory, for kernels that build plans of their own subgraphs
    step_factory: Callable[..., Any] | None = None

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def label(self) -> str:
        """How error messages name this node."""
        return f"node {self.name!r} ({self.op_type})" if self.name else f"a {self.op_type} node"

    def check_alloc(self, shape, dtype) -> None:
        """Raise ``ResourceLimitError`` naming this node if the tensor exceeds the budget."""
        self.budget.check_alloc(shape, dtype, self.label)

    @functools.cached_property
    def alloc(self) -> Alloc:
        """Budgeted numpy allocations for this node (checked first, errors name the node)."""
        return self.budget.guard(self.label)

    def error(self, message: str) -> KernelError:
        """A :class:`KernelError` naming this node; ``raise spec.error("...")``."""
        return KernelError(f"{self.label}: {message}")


def kernel(*op_types: str, domain: str = "") -> Callable[[Factory], Factory]:
    """Register a kernel factory for one or more operator types."""

    def deco(factory: Factory) -> Factory:
        for op in op_types:
            _REGISTRY[(domain, op)] = factory
        return factory

    return deco


def _ensure_loaded() -> None:
    # importing the package registers every kernel module
    import byoc.kernels  # noqa: F401


def get_factory(op_type: str, domain: str = "") -> Factory | None:
    _ensure_loaded()
    if domain == "ai.onnx":
        domain = ""
    return _REGISTRY.get((domain, op_type))


def supported_ops(domain: str = "") -> list[str]:
    _ensure_loaded()
    return sorted(op for (d, op) in _REGISTRY if d == domain)


def is_supported(op_type: str, domain: str = "") -> bool:
    return get_factory(op_type, domain) is not None


def make_kernel(spec: NodeSpec) -> RunFn:
    """Build the run function for ``spec``; raises ``KernelError`` if unsupported."""
    factory = get_factory(spec.op_type, spec.domain)
    if factory is None:
        raise KernelError(f"{spec.label}: no kernel for operator {spec.domain or 'ai.onnx'}::{spec.op_type}")
    try:
        return factory(spec)
    except ByocError:
        raise
    except MemoryError as exc:
        raise ResourceLimitError(f"{spec.label}: out of memory while building the kernel: {exc}") from exc
    except Exception as exc:  # a foreign exception from attribute parsing or weight packing
        raise KernelError(f"{spec.label}: cannot build the kernel: {type(exc).__name__}: {exc}") from exc
