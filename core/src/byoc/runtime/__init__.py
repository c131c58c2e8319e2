"""Execution plan, CompiledModel, bundle save/load."""

from byoc.runtime.compiled import CompiledModel
from byoc.runtime.plan import InputSpec, Plan, build_plan

__all__ = ["CompiledModel", "InputSpec", "Plan", "build_plan"]
