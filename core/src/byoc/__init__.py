"""byoc: Bring Your Own Codegen.

A shared ONNX compiler stack: import, optimise, partition between vendor plugins, and run the
rest on the host CPU with Numba reference kernels.
"""

from byoc.budget import Budget
from byoc.compiler import compile
from byoc.hookspecs import HOOK_API_VERSION, hookimpl
from byoc.partition.types import Artifact, Pattern, Region, Rule, Target
from byoc.plugins import list_targets
from byoc.errors import (
    BundleError,
    ByocError,
    CalibrationRequiredError,
    ExternalDataError,
    InputError,
    KernelError,
    ModelLoadError,
    ModelValidationError,
    OptionError,
    PluginError,
    QuantizationError,
    ResourceLimitError,
    RunCancelledError,
    RunTimeoutError,
    UnsupportedOperatorError,
)
from byoc.runtime.bundle import load
from byoc.runtime.compiled import CompiledModel
from byoc.runtime.control import CancelHandle

__version__ = "2.0.0"

__all__ = [
    "HOOK_API_VERSION",
    "Artifact",
    "Pattern",
    "Region",
    "Rule",
    "Target",
    "hookimpl",
    "list_targets",
    "Budget",
    "BundleError",
    "ByocError",
    "CalibrationRequiredError",
    "CancelHandle",
    "CompiledModel",
    "RunCancelledError",
    "RunTimeoutError",
    "ExternalDataError",
    "InputError",
    "KernelError",
    "ModelLoadError",
    "ModelValidationError",
    "OptionError",
    "PluginError",
    "QuantizationError",
    "ResourceLimitError",
    "UnsupportedOperatorError",
    "__version__",
    "compile",
    "load",
]
