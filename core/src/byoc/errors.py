"""byoc's exception hierarchy.

Every failure byoc reports on purpose is a :class:`ByocError`. Each error names what it
is about (node, tensor, plugin, bundle member) so that a user can find it in the model.
"""

from __future__ import annotations


class ByocError(Exception):
    """Base class of every error byoc raises on purpose."""


class ModelLoadError(ByocError):
    """The model cannot be read: unreadable, truncated or malformed protobuf, bad file."""


class ModelValidationError(ByocError):
    """The model was read but is not a valid ONNX graph (cycle, bad names, checker)."""


class ExternalDataError(ModelLoadError):
    """External tensor data that escapes the model folder or cannot be read safely."""


class UnsupportedOperatorError(ByocError):
    """One or more nodes use an operator (or domain) byoc cannot run.

    ``nodes`` lists every offending ``(node_name, domain, op_type)``, not only the first.
    """

    def __init__(self, message: str, nodes: list[tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.nodes = list(nodes or [])


class ResourceLimitError(ByocError):
    """A tensor, node count or nesting depth exceeds the configured budget."""


class CompileTimeoutError(ResourceLimitError):
    """A compile ran past ``Budget.max_compile_seconds``; the message names the step it was in."""


class InputError(ByocError):
    """Wrong feeds given to ``CompiledModel.run``: name, shape or dtype."""


class KernelError(ByocError):
    """A kernel failed on a node; the message names the node and operator."""


class OptionError(ByocError, ValueError):
    """An invalid compile option: unknown pass or target name, bad option value."""


class CalibrationRequiredError(OptionError):
    """A target quantises to integers and needs calibration data: ``byoc.compile(..., calibration=samples)``."""


class QuantizationError(ByocError):
    """A region cannot be quantised (e.g. a tensor without calibration statistics); names the tensor."""


class RunTimeoutError(ByocError):
    """``CompiledModel.run(..., timeout=)`` ran out of time; the message names the node it reached."""


class RunCancelledError(ByocError):
    """A run was cancelled through its :class:`byoc.CancelHandle`."""


class PluginError(ByocError):
    """A vendor plugin misbehaved; the message names the plugin and the hook."""


class InferenceOnlyError(ByocError):
    """A PyTorch model in training mode, or a call that needs gradients: byoc compiles inference only."""


class BundleError(ByocError):
    """A saved bundle is missing, tampered, truncated, or needs an unavailable plugin."""


__all__ = [
    "ByocError",
    "BundleError",
    "CalibrationRequiredError",
    "CompileTimeoutError",
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
    "RunCancelledError",
    "RunTimeoutError",
    "UnsupportedOperatorError",
]
