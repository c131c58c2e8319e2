"""``byoc.compile``: frontend -> shared passes -> (partitioning) -> plan."""

from __future__ import annotations

from typing import Iterable, Sequence

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.frontend import load_model
from byoc.frontend.loader import ModelLike
from byoc.passes.simplify import drop_legacy_initializer_inputs
from byoc.runtime.compiled import CompiledModel
from byoc.runtime.plan import build_plan


def compile(  # noqa: A001  (the public name is byoc.compile)
    model: ModelLike,
    targets: Sequence[str] | None = None,
    *,
    passes: Iterable[str] | None = None,
    budget: Budget | None = None,
    **options,
) -> CompiledModel:
    """Compile an ONNX model.

    :param model: a path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.
    :param targets: vendor targets in priority order; ``None`` uses every installed target,
        ``[]`` runs everything on the host.
    :param passes: names of the shared passes to run (default: all of
        :data:`byoc.passes.DEFAULT_PASSES`); ``[]`` switches them off.
    :param budget: resource limits (:class:`byoc.Budget`).
    :returns: a :class:`CompiledModel`.
    """
    from byoc import passes as _passes

    budget = budget or DEFAULT_BUDGET
    ir_model = load_model(model, budget=budget)
    drop_legacy_initializer_inputs(ir_model)
    _passes.run_passes(ir_model, passes, budget=budget)
    plan = build_plan(ir_model.graph, budget=budget)
    return CompiledModel(ir_model, plan, options={"targets": targets, **options})
