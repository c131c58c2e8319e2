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

from typing import Callable

from byoc.contract.host import NodeSpec, RunFn
from byoc.errors import ByocError, KernelError, ResourceLimitError

Factory = Callable[[NodeSpec], RunFn]

_REGISTRY: dict[tuple[str, str], Factory] = {}


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
