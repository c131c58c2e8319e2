"""byoc's reference kernels: one plain implementation per operator (Numba loops, numpy where it
is the natural tool), one module per operator family; the conformance kit's oracle.

Importing this package (or any module in it) registers every kernel in
:mod:`byoc.kernels.registry`. If, Loop and Scan are not kernels: the execution plan runs their
subgraphs (:mod:`byoc.runtime.control_flow`); the registry lists them in ``PLAN_OPERATORS``.
"""

from byoc.kernels.registry import (
    PLAN_OPERATORS,
    NodeSpec,
    get_factory,
    is_supported,
    kernel,
    make_kernel,
    supported_ops,
)

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
    rnn,
    indexing,
    quant,
    attention,
)


__all__ = ["PLAN_OPERATORS", "NodeSpec", "get_factory", "is_supported", "kernel", "make_kernel", "supported_ops"]
