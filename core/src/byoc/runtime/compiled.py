"""CompiledModel: the result of :func:`byoc.compile`."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from byoc.runtime.plan import InputSpec, Plan, check_feeds


class CompiledModel:
    """A model lowered to an execution plan; ``run`` is safe from many threads at once."""

    def __init__(self, model: ir.Model, plan: Plan, *, options: dict[str, Any] | None = None):
        self.model = model
        self._plan = plan
        self.options = dict(options or {})

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

    def __repr__(self) -> str:
        return f"<CompiledModel inputs={self.input_names} outputs={self.output_names} steps={len(self._plan.steps)}>"
