"""activation kernels."""

from byoc.kernels.registry import NodeSpec, kernel  # noqa: F401

import numba
import numpy as np


@numba.njit(cache=True)
def _relu(x):
    out = np.empty_like(x)
    xf = x.ravel()
    of = out.ravel()
    for i in range(xf.size):
        v = xf[i]
        of[i] = v if v > 0 else 0
    return out


@kernel("Relu")
def make_relu(spec: NodeSpec):
    def run(x):
        return (_relu(np.ascontiguousarray(x)),)

    return run
