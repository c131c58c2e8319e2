"""byoc-jetson: the NVIDIA TensorRT (Jetson) plugin for byoc.

Installing the distribution makes the target ``jetson`` available to ``byoc.compile`` through
the entry point ``byoc: jetson = byoc_jetson.plugin``. See README.md for the operators, rules,
options and the two runtime paths (TensorRT on a CUDA GPU, float16 CPU emulation otherwise).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
