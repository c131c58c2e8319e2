"""Load an ONNX model from a path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.

Every failure is a :class:`byoc.errors.ByocError` that names the file, node or tensor.
Budgets are checked on *declared* sizes before any tensor data is materialised.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Union

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.errors import ModelLoadError, ModelValidationError
from byoc.frontend import validate

#: every model is converted to this opset of the default domain when it is older
CANONICAL_OPSET = 21

ModelLike = Union[str, os.PathLike, bytes, bytearray, onnx.ModelProto, ir.Model]


def _read_proto(model: ModelLike) -> tuple[onnx.ModelProto, Path | None]:
    if isinstance(model, ir.Model):
        return ir.to_proto(model), None
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "<bytes>"), None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise ModelLoadError(f"model file not found: {path}")
        if not path.is_file():
            raise ModelLoadError(f"not a regular file: {path}")
        data = path.read_bytes()
        return _parse(data, str(path)), path.resolve().parent
    raise ModelLoadError(
        f"cannot load a model from {type(model).__name__}; "
        "give a path, bytes, onnx.ModelProto or onnx_ir.Model"
    )


def _parse(data: bytes, origin: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{origin}: the file is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{origin}: not a readable ONNX protobuf (truncated or corrupt): {exc}") from None
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{origin}: the protobuf holds no graph; not an ONNX model")
    return proto


def _convert_opset(proto: onnx.ModelProto) -> onnx.ModelProto:
    version = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None or version >= CANONICAL_OPSET:
        return proto
    try:
        return onnx.version_converter.convert_version(proto, CANONICAL_OPSET)
    except Exception as exc:  # the converter raises a bare RuntimeError/ValueError
        warnings.warn(
            f"could not convert opset {version} to {CANONICAL_OPSET} ({exc}); "
            f"running the model at opset {version}",
            stacklevel=3,
        )
        return proto


def load_model(
    model: ModelLike, *, budget: Budget = DEFAULT_BUDGET, check: bool = True, require_kernels: bool = True
) -> ir.Model:
    """Load, validate and convert ``model`` into an ``onnx_ir.Model`` at the canonical opset.

    :param model: a path, the serialised bytes, an ``onnx.ModelProto`` or an ``onnx_ir.Model``.
    :param budget: resource limits checked before any tensor data is materialised.
    :param check: run the ONNX checker (on by default).
    :param require_kernels: refuse operators that have no host kernel (on by default).
    :raises ModelLoadError: unreadable, empty or truncated input; unsafe external data.
    :raises ModelValidationError: invalid graph (cycle, bad names, checker failure).
    :raises ResourceLimitError: a declared tensor exceeds the budget.
    :raises UnsupportedOperatorError: lists every node whose operator byoc cannot run.
    """
    proto, base_dir = _read_proto(model)
    validate.check_proto(proto, budget=budget, base_dir=base_dir)
    if base_dir is not None:
        validate.load_external_data(proto, base_dir, budget=budget)
    proto = validate.sort_topologically(proto)
    proto = _convert_opset(proto)
    if check:
        try:
            onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as exc:
            raise ModelValidationError(f"the ONNX checker rejects the model: {exc}") from None
    try:
        model_ir = ir.from_proto(proto)
    except Exception as exc:
        raise ModelLoadError(f"cannot convert the model to byoc's IR: {exc}") from None
    if require_kernels:
        validate.check_supported(model_ir)
    return model_ir


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialise an IR model back to ONNX."""
    return ir.to_proto(model)
