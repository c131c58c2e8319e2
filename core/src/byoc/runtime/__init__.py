"""Execution plan (If/Loop/Scan included), CompiledModel, shape specialisation, run control."""

from byoc.runtime.compiled import CompiledModel
from byoc.runtime.plan import InputSpec, Plan, build_plan

__all__ = ["CompiledModel", "InputSpec", "Plan", "build_plan"]
