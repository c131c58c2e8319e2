"""byoc-cpu: the reference byoc plugin (target ``cpu``).

It places Conv/Gemm/MatMul with their epilogues, elementwise chains, pooling, concat and
layout operators on the ``cpu`` target and generates, per region, one Python module of fused
Numba kernels around OpenBLAS GEMMs. See the package README for the tour.
"""

__version__ = "0.1.0"
#: bump when the generated code changes for the same program (it is part of the source hash)
CODEGEN_VERSION = 7
