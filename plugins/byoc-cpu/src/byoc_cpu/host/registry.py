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
