"""CompiledModel: the result of :func:`byoc.compile`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.runtime.plan import InputSpec, Plan, check_feeds

if TYPE_CHECKING:  # pragma: no cover
    from byoc.compiler import CompiledRegion
    from byoc.partition.partitioner import NodeRecord
    from byoc.partition.types import Target
    from byoc.plugins import PluginFault


class CompiledModel:
    """A model lowered to an execution plan; ``run`` is safe from many threads at once.

    :ivar model: the partitioned IR model (regions are ``byoc::Region`` nodes).
    :ivar regions: the offloaded regions with their artifacts.
    :ivar records: per node (by name) where it runs and why.
    :ivar faults: plugin faults seen while compiling (each caused a fallback).
    """

    def __init__(
        self,
        model: ir.Model,
        plan: Plan,
        *,
        options: dict[str, Any] | None = None,
        regions: Sequence["CompiledRegion"] = (),
        records: dict[str, "NodeRecord"] | None = None,
        faults: Sequence["PluginFault"] = (),
        targets: Sequence["Target"] = (),
        budget: Budget = DEFAULT_BUDGET,
    ):
        self.model = model
        self._plan = plan
        self.options = dict(options or {})
        self.regions = list(regions)
        self.records = dict(records or {})
        self.faults = list(faults)
        self.targets = list(targets)
        self.budget = budget

    @property
    def inputs(self) -> list[InputSpec]:
        """The inputs a caller must (or may, when ``optional``) feed."""
        return self._plan.input_specs()

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs if not s.optional]

    @property
    def output_names(self) -> list[str]:
        return self._plan.output_names()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model.

        :param feeds: input name -> numpy array.
        :returns: output name -> numpy array, in the graph's output order.
        :raises InputError: unknown or missing names, wrong dtype or shape (the message says
            what was expected).
        """
        return self._plan.execute(check_feeds(self._plan.input_specs(), feeds))

    def placement(self) -> dict[str, str]:
        """Node name -> device (``"host"`` or a target name)."""
        return {name: rec.device for name, rec in self.records.items()}

    def __repr__(self) -> str:
        return (
            f"<CompiledModel inputs={self.input_names} outputs={self.output_names} "
            f"regions={[r.region.name for r in self.regions]} steps={len(self._plan.steps)}>"
        )
