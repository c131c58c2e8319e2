"""byoc-vitis: a Vitis-AI DPU plugin for byoc.

Installing the distribution makes the target ``vitis`` available to ``byoc.compile`` through
the entry point ``byoc: vitis = byoc_vitis.plugin``. The target runs int8 code, so it needs
calibration samples: ``byoc.compile(model, targets=["vitis"], calibration=samples)``. Regions
become DPU programs (:mod:`byoc_vitis.program`) run by a bit-accurate integer engine
(:mod:`byoc_vitis.engine`). See README.md for operators, limits, arithmetic and accuracy.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
