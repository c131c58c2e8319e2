"""Numba reference kernels, one module per operator family.

Importing this package registers every kernel in :mod:`byoc.kernels.registry`.
"""

from byoc.kernels.registry import NodeSpec, get_factory, is_supported, kernel, make_kernel, supported_ops

# kernel families (import order does not matter; each registers its operators)
from byoc.kernels import (  # noqa: E402,F401  isort: skip
    elementwise,
    activation,
    reduce,
    conv,
    gemm,
    pool,
    norm,
    tensor,
    resize,
    control_flow,
    rnn,
    indexing,
    quant,
)

__all__ = ["NodeSpec", "get_factory", "is_supported", "kernel", "make_kernel", "supported_ops"]
