"""Run a standalone (region) model on the host kernels.

Used wherever a region must run without its vendor: the host fallback of a bundle whose
plugin is missing, emulated runtimes (e.g. Jetson without a GPU), and test plugins.
"""

from __future__ import annotations


import numpy as np
import onnx
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.plugins import host_executor
from byoc.runtime.plan import Plan, build_plan


class HostCallable:
    """``HostCallable(model)(*inputs) -> list of outputs``, in the model's input/output order."""

    def __init__(self, model: ir.Model | onnx.ModelProto | bytes, budget: Budget = DEFAULT_BUDGET,
                 step_factory=None, reference: bool = False):
        if isinstance(model, (bytes, bytearray)):
            model = onnx.ModelProto.FromString(bytes(model))
        if isinstance(model, onnx.ModelProto):
            model = ir.from_proto(model)
        # no wrapper between the nodes: the host executor may fuse chains of nodes; ``reference``:
        # byoc's reference kernels alone (an oracle)
        self.plan: Plan = build_plan(model.graph, budget=budget, step_factory=step_factory, fuse=step_factory is None,
                                     host=None if reference else host_executor())
        self.input_names = [s.name for s in self.plan.input_specs()]
        self.output_names = self.plan.output_names()

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        out = self.plan.execute(dict(zip(self.input_names, inputs)))
        return [out[name] for name in self.output_names]


def host_callable(model: ir.Model | onnx.ModelProto | bytes, budget: Budget = DEFAULT_BUDGET,
                  reference: bool = False) -> HostCallable:
    return HostCallable(model, budget, reference=reference)


__all__ = ["HostCallable", "host_callable"]
