"""Helpers plugins share: attribute access, region bodies as bytes, running a body on the host.

The host helpers import the runtime only when called, so the contract stays at the bottom of
the core's import graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import onnx_ir as ir

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import onnx

    from byoc.budget import Budget

#: ``wrap(node, kernel) -> kernel``: adjusts one host kernel (e.g. an emulation rounding outputs)
KernelWrapper = Callable[[ir.Node, Callable[..., Any]], Callable[..., Any]]


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (lists as Python lists), or ``default``."""
    a = node.attributes.get(name)
    if a is None:
        return default
    value = a.value
    if isinstance(value, (str, bytes, int, float)):
        return value
    if isinstance(value, (list, tuple)) or (hasattr(value, "__iter__") and not isinstance(value, ir.Graph)):
        return list(value)
    return value


def input_at(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node``, or ``None`` when it is absent (optional inputs)."""
    return node.inputs[index] if index < len(node.inputs) else None


def region_model_bytes(model: ir.Model) -> bytes:
    """Deterministic ONNX serialisation of a region body (``Region.model``)."""
    return ir.to_proto(model).SerializeToString(deterministic=True)


def host_callable(model: "ir.Model | onnx.ModelProto | bytes", budget: "Budget | None" = None, *,
                  wrap: KernelWrapper | None = None) -> Callable[..., Sequence["np.ndarray"]]:
    """``host_callable(body)(*inputs) -> list of outputs``: run a region body on byoc's host kernels.

    Inputs and outputs follow the body's graph input/output order. ``wrap(node, kernel)`` may
    replace each node's host kernel (an emulation that rounds every output, say).
    """
    from byoc.budget import DEFAULT_BUDGET
    from byoc.kernels import make_kernel
    from byoc.runtime.subgraph import HostCallable

    factory = None
    if wrap is not None:
        def factory(node, spec):
            return wrap(node, make_kernel(spec))

    return HostCallable(model, budget or DEFAULT_BUDGET, step_factory=factory)


__all__ = ["KernelWrapper", "attr", "host_callable", "input_at", "region_model_bytes"]
