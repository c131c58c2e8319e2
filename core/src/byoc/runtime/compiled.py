"""CompiledModel: the result of :func:`byoc.compile`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx_ir as ir

from byoc.arguments import check_run_args
from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.bundle.writer import save as save_bundle
from byoc.runtime.control import CancelHandle, controlled
from byoc.runtime.plan import InputSpec, Plan, check_feeds

if TYPE_CHECKING:  # pragma: no cover
    from byoc.codegen import CompiledRegion
    from byoc.partition.records import NodeRecord
    from byoc.contract import Target
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
        #: set when static-shape targets are specialised per input shapes (byoc.runtime.specialize)
        self.specializer = None
        #: region name -> why it runs on the host (set by ``byoc.load(..., fallback="host")``)
        self.host_fallback: dict[str, str] = {}

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

    def run(self, feeds: dict[str, np.ndarray], *, timeout: float | None = None,
            cancel: "CancelHandle | None" = None) -> dict[str, np.ndarray]:
        """Run the model.

        :param feeds: input name -> numpy array.
        :returns: output name -> numpy array, in the graph's output order.
        :param timeout: seconds after which the run stops with :class:`byoc.RunTimeoutError`
            (checked between nodes and on every Loop/Scan iteration).
        :param cancel: a :class:`byoc.CancelHandle`; ``cancel.cancel()`` from another thread stops
            the run with :class:`byoc.RunCancelledError`.
        :raises InputError: unknown or missing names, wrong dtype or shape (the message says
            what was expected).
        """
        check_run_args(feeds, timeout=timeout, cancel=cancel)
        if timeout is not None or cancel is not None:
            with controlled(timeout, cancel):
                return self.run(feeds)
        if self.specializer is not None and isinstance(feeds, dict):
            chosen = self.specializer.select(feeds)
            if chosen is not self:
                return chosen.run(feeds)
        return self._plan.execute(check_feeds(self._plan.input_specs(), feeds, self.budget))

    def save(self, path: "str | os.PathLike") -> "Path":
        """Write the compiled model to one bundle file (a zip; see :mod:`byoc.bundle`).

        The file is replaced atomically: an existing file at ``path`` is intact until the new
        bundle is complete. ``byoc.load(path)`` gives back a model with bit-identical outputs.
        :returns: the path written.
        :raises BundleError: the model cannot be bundled or the file cannot be written.
        """
        return save_bundle(self, path)

    def placement(self) -> dict[str, str]:
        """Node name -> device (``"host"`` or a target name)."""
        return {name: rec.device for name, rec in self.records.items()}

    def report_data(self) -> dict[str, Any]:
        """The placement report as a JSON-ready dict (see ``byoc/report/schema.json``)."""
        from byoc.report import report_data

        return report_data(self)

    def report(self, format: str = "text") -> str:  # noqa: A002 - "format" is the documented keyword
        """The placement report: per node its device, region, pattern, every target's verdict and
        the rule that dropped it; totals per device, plugin faults and host fallbacks.

        :param format: ``"text"`` (a terminal table), ``"json"``, ``"dot"`` (Graphviz) or
            ``"html"`` (one self-contained page).
        :raises OptionError: an unknown format.
        """
        from byoc.report import render

        return render(self.report_data(), format)

    def __repr__(self) -> str:
        return (
            f"<CompiledModel inputs={self.input_names} outputs={self.output_names} "
            f"regions={[r.region.name for r in self.regions]} steps={len(self._plan.steps)}>"
        )
