"""What the layers above the runtime (bundles, reports) read of a compiled model, as protocols,
so that they need not import :class:`byoc.runtime.compiled.CompiledModel` (which saves and
reports through them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir

    from byoc.budget import Budget
    from byoc.contract.types import Target
    from byoc.contract.faults import PluginFault


class CompiledView(Protocol):
    """A compiled model as the bundle writer and the report read it."""

    model: "ir.Model"
    regions: list[Any]
    records: dict[str, Any]
    options: dict[str, Any]
    faults: list["PluginFault"]
    targets: list["Target"]
    budget: "Budget"
    specializer: Any
    host_fallback: dict[str, str]


class BodyPlan(Protocol):
    """A lowered subgraph: ``run_positional(inputs then captured values) -> outputs``."""

    def run_positional(self, args: Sequence[Any]) -> list[Any]: ...


__all__ = ["BodyPlan", "CompiledView"]
