"""elementwise kernels."""

from byoc.kernels.registry import NodeSpec, kernel  # noqa: F401
