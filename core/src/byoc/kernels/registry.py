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
    #: the plan's step factory, used again for the plans of the node's subgraphs (If/Loop/Scan)
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


#: operators with subgraphs that the execution plan runs itself, as plans of their bodies
#: (:mod:`byoc.runtime.control_flow`); they are supported on the host but have no kernel here
PLAN_OPERATORS = frozenset({"If", "Loop", "Scan"})


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


# Importing this module imports the package ``byoc.kernels`` first, which registers every
# kernel family: the lookups below always see the full registry.


def get_factory(op_type: str, domain: str = "") -> Factory | None:
    """The kernel factory of an operator, or ``None`` (also for :data:`PLAN_OPERATORS`)."""
    return _REGISTRY.get((_domain(domain), op_type))


def supported_ops(domain: str = "") -> list[str]:
    """Every operator of ``domain`` the host runs (kernels and :data:`PLAN_OPERATORS`)."""
    ops = {op for (d, op) in _REGISTRY if d == _domain(domain)}
    if _domain(domain) == "":
        ops |= PLAN_OPERATORS
    return sorted(ops)


def is_supported(op_type: str, domain: str = "") -> bool:
    """Whether the host runs the operator (with a kernel, or in the plan for If/Loop/Scan)."""
    if _domain(domain) == "" and op_type in PLAN_OPERATORS:
        return True
    return get_factory(op_type, domain) is not None


def make_kernel(spec: NodeSpec) -> RunFn:
    """Build the run function for ``spec``; raises ``KernelError`` if unsupported.

    If/Loop/Scan are not kernels: ``byoc.runtime.plan.host_step`` builds those (and every other
    node) the way the execution plan does.
    """
    factory = get_factory(spec.op_type, spec.domain)
    if factory is None:
        if _domain(spec.domain) == "" and spec.op_type in PLAN_OPERATORS:
            raise KernelError(f"{spec.label}: {spec.op_type} is run by the execution plan, not a kernel "
                              "(use byoc.runtime.plan.host_step)")
        raise KernelError(f"{spec.label}: no kernel for operator {spec.domain or 'ai.onnx'}::{spec.op_type}")
    try:
        return factory(spec)
    except ByocError:
        raise
    except MemoryError as exc:
        raise ResourceLimitError(f"{spec.label}: out of memory while building the kernel: {exc}") from exc
    except Exception as exc:  # a foreign exception from attribute parsing or weight packing
        raise KernelError(f"{spec.label}: cannot build the kernel: {type(exc).__name__}: {exc}") from exc
