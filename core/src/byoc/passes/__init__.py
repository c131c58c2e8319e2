"""Shared, target-independent passes."""

from __future__ import annotations

from typing import Iterable

import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget

DEFAULT_PASSES: tuple[str, ...] = ()


def run_passes(model: ir.Model, passes: Iterable[str] | None = None, *, budget: Budget = DEFAULT_BUDGET) -> ir.Model:
    return model
