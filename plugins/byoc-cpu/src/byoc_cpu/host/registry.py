"""byoc-cpu's host kernels: operator type -> kernel factory, as byoc's reference registry."""

from __future__ import annotations

from typing import Callable

from byoc.contract import NodeSpec

Factory = Callable[[NodeSpec], Callable]

_REGISTRY: dict[tuple[str, str], Factory] = {}


def kernel(*op_types: str, domain: str = "") -> Callable[[Factory], Factory]:
    """Register a host kernel factory for one or more operator types."""

    def deco(factory: Factory) -> Factory:
        for op in op_types:
            _REGISTRY[(domain, op)] = factory
        return factory

    return deco


def factory(op_type: str, domain: str = "") -> Factory | None:
    return _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))


def reference(spec: NodeSpec) -> Callable:
    """byoc's reference kernel of ``spec``'s node (``byoc.kernels.make_kernel``), built on its first
    call: the kernels here hand it what they leave to it (zero-size tensors, which have no work to
    split over the pool, nothing to pack, and the reference's results and errors)."""
    built: list = []

    def run(*inputs):
        if not built:
            from byoc.kernels import make_kernel

            built.append(make_kernel(spec))
        return built[0](*inputs)

    return run
