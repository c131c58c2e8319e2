"""Host execution: what a kernel knows about its node, and the pluggable CPU executor.

The nodes that no target took run on the host. byoc's own kernels (:mod:`byoc.kernels`) are the
plain reference: one obvious implementation per operator, the oracle of the conformance kit.
A plugin may offer a faster CPU executor for those nodes with :func:`byoc_register_host_executor
<byoc.contract.hookspecs.byoc_register_host_executor>`; byoc then asks it first for every host
node and keeps the reference kernel for the nodes it declines. The executor with the highest
``priority`` serves; ``BYOC_HOST_EXECUTOR=reference`` (or ``byoc.compile(..., host="reference")``)
keeps the reference alone.

A kernel is built once per node from a :class:`NodeSpec` (a *kernel factory*) and returns a
*run function*: ``run(*inputs) -> tuple of outputs``, numpy arrays in and out (``None`` for a
missing optional input). A run function is pure and thread-safe: it never mutates its closure
or writes into its inputs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from byoc.budget import DEFAULT_BUDGET, Alloc, Budget
from byoc.errors import KernelError

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir

RunFn = Callable[..., Sequence[np.ndarray]]


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
    #: the host executor of the plan this node belongs to (``None``: the reference kernels)
    executor: "HostExecutor | None" = None

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


@dataclass
class Fusion:
    """A chain of host nodes that an executor runs as one plan step.

    The step reads the first node's inputs (padded with ``None`` to ``arity`` slots), then
    ``extra_inputs``; it writes the last node's outputs, and runs where the last node stood in
    the plan. Only values that leave the chain may be read by other nodes.

    :param nodes: the chain, in order; each node's output is read only by the next one.
    :param extra_inputs: values the chain reads besides the first node's inputs.
    :param arity: input slots of the first node before the extra inputs.
    :param build: ``build(runs, dies) -> run``: ``runs`` are the chain's nodes' own run
        functions (the executor's or the reference), ``dies(value)`` says whether the plan
        releases ``value`` at this step (nothing reads it later), so the step may write over it.
    """

    nodes: list["ir.Node"]
    extra_inputs: list["ir.Value | None"]
    arity: int
    build: Callable[[list[RunFn], Callable[["ir.Value"], bool]], RunFn]


@dataclass
class HostExecutor:
    """A CPU executor for the host's nodes, registered by a plugin.

    :param name: what ``byoc.compile(host=...)`` and ``BYOC_HOST_EXECUTOR`` select (``"cpu"``).
    :param description: one line.
    :param priority: the highest-priority installed executor serves.
    :param kernel: ``kernel(spec) -> run function | None``; ``None`` leaves the node to the
        reference kernel. Errors follow the reference's rules (:class:`byoc.KernelError` naming
        the node).
    :param begin_run: called at the start of every plan run (a pool waking its threads).
    :param fusions: ``fusions(nodes, is_host) -> list of Fusion``: chains of host nodes run as
        one step, offered where nothing observes the values between nodes (not calibration, not
        a kernel wrapper). ``is_host(node)`` says whether a node runs on the host.
    :param first_run: ``first_run(run) -> run()``: how a host-only plan's first run goes (its
        kernels compiled in helper processes meanwhile, say); ``None``: just ``run()``.
    :param jit: the kernels compile on their first call: byoc answers runs from its reference
        kernels until a first run in the background is done (see :mod:`byoc.runtime.tiers`).
    """

    name: str
    description: str = ""
    priority: int = 0
    kernel: Callable[[NodeSpec], "RunFn | None"] = lambda spec: None
    begin_run: Callable[[], None] | None = None
    fusions: Callable[[list["ir.Node"], Callable[["ir.Node"], bool]], list[Fusion]] | None = None
    first_run: Callable[[Callable[[], Any]], Any] | None = None
    jit: bool = False
    #: the plugin that registered it (set by byoc)
    plugin: str = ""


__all__ = ["Fusion", "HostExecutor", "NodeSpec", "RunFn"]
