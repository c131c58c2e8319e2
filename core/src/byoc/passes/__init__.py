"""Shared, target-independent passes.

Each pass is a small function ``pass_(model, ctx) -> bool`` (True when it changed the model),
registered under a name in :data:`PASSES`. :func:`run_passes` runs a selection of them in the
fixed order of :data:`DEFAULT_PASSES`; ``byoc.compile(..., passes=[...])`` chooses which.
"""

from __future__ import annotations

from typing import Iterable

import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.errors import OptionError
from byoc.frontend import bounded
from byoc.passes.base import PassContext
from byoc.passes.bn_folding import fold_batchnorm_and_affine
from byoc.passes.constant_folding import fold_constants
from byoc.passes.simplify import (
    eliminate_common_subexpressions,
    infer_shapes,
    remove_dead_code,
    remove_identities,
)

#: name -> pass function, in the order they run
PASSES = {
    "shape_inference": infer_shapes,
    "constant_folding": fold_constants,
    "identity_removal": remove_identities,
    "bn_folding": fold_batchnorm_and_affine,
    "cse": eliminate_common_subexpressions,
    "dead_code": remove_dead_code,
}

DEFAULT_PASSES: tuple[str, ...] = tuple(PASSES)


def run_passes(
    model: ir.Model, passes: Iterable[str] | None = None, *, budget: Budget = DEFAULT_BUDGET
) -> list[str]:
    """Run the named passes (default: all) in their fixed order; returns those that changed the model.

    Shape inference runs again at the end when folding made constants of values it could not
    see through (an attention mask built from ``Shape``/``Expand``/``ConstantOfShape``): what
    follows them gets its static shape.

    :raises OptionError: an unknown pass name (the message lists the valid ones).
    """
    selected = DEFAULT_PASSES if passes is None else tuple(passes)
    unknown = [p for p in selected if p not in PASSES]
    if unknown:
        raise OptionError(f"unknown pass(es) {unknown}; valid passes: {list(PASSES)}")
    ctx = PassContext(budget=budget)
    changed = []
    for name, fn in PASSES.items():
        bounded.check(f"the {name} pass")
        if name in selected and fn(model, ctx):
            changed.append(name)
    if "shape_inference" in selected and {"constant_folding", "bn_folding"} & set(changed):
        bounded.check("shape inference after folding")
        infer_shapes(model, ctx)
    return changed


__all__ = ["DEFAULT_PASSES", "PASSES", "PassContext", "run_passes"]
