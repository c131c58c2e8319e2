"""byoc: Bring Your Own Codegen.

A shared ONNX compiler stack: import, optimise, partition between vendor plugins, and run the
rest on the host CPU with Numba reference kernels.
"""

from byoc._version import __version__
from byoc import numba_cache as _numba_cache

_numba_cache.secure()  # before any of byoc's Numba functions is made

# ruff: noqa: E402  (the imports below come after the Numba cache is secured)
from byoc.budget import Budget
from byoc.compiler import compile
from byoc.contract import HOOK_API_VERSION, Artifact, Option, Pattern, Region, Rule, SupportContext, Target, hookimpl
from byoc.diagnostics import doctor, info
from byoc.plugins import list_targets
from byoc.errors import (
    BundleError,
    ByocError,
    CalibrationRequiredError,
    CompileTimeoutError,
    ExternalDataError,
    InferenceOnlyError,
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
from byoc.bundle.loader import load
from byoc.runtime.compiled import CompiledModel
from byoc.runtime.control import CancelHandle
from byoc.jitcache import warmup


__all__ = [
    "HOOK_API_VERSION",
    "Artifact",
    "Option",
    "Pattern",
    "Region",
    "Rule",
    "SupportContext",
    "Target",
    "hookimpl",
    "list_targets",
    "Budget",
    "BundleError",
    "ByocError",
    "CalibrationRequiredError",
    "CancelHandle",
    "CompileTimeoutError",
    "CompiledModel",
    "RunCancelledError",
    "RunTimeoutError",
    "ExternalDataError",
    "InferenceOnlyError",
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
    "doctor",
    "info",
    "load",
    "warmup",
]
