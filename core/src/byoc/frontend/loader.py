"""Load an ONNX model from a path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.

Every failure is a :class:`byoc.errors.ByocError` that names the file, node or tensor.
The order of the steps is part of the safety design:

1. read and parse the protobuf (size-limited; empty, truncated, corrupt input refused);
2. :func:`validate.check_text`: every string field is valid UTF-8;
3. :func:`weights.skeleton`: a weight-less copy of the model (big float initializers become
   stubs that keep name, type and dims; their payloads are read once and kept aside), on
   which every following step works, so no weight is serialised or copied again;
4. :func:`validate.check_structure`: node/nesting/tensor budgets on *declared* sizes, tensor
   payloads against dims/dtype, duplicate and dangling names, cycles; graphs get sorted;
5. :func:`external.prepare`: every external data reference is checked and its file opened;
6. the ONNX checker, once (its failures become :class:`ModelValidationError`; inputs/outputs of
   unknown rank are accepted);
7. external data is read (big float weights are kept aside as well);
8. older opsets are converted to :data:`CANONICAL_OPSET` (a failure is a warning); a model
   already at that opset or newer is not converted; the converter's output gets the checks of
   steps 2 and 4;
9. one error listing every node without a kernel (nodes with an operator unknown to ONNX are
   reported this way before the checker runs), then conversion to ``onnx_ir``, and the weights
   are attached to it as read-only arrays over the bytes read in step 3 or 7.

The C++ checker and version converter therefore only ever see structurally sound models;
the converter additionally only gets models the checker accepts, even with ``check=False``
(onnx 1.23's converter segfaults on, e.g., an attribute whose declared type does not match
the value it holds; fuzzing found no other crash, and none in the checker).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Union

import onnx
import onnx_ir as ir

from byoc.arguments import file_path
from byoc.budget import DEFAULT_BUDGET, Budget, _fmt_bytes
from byoc.errors import ByocError, ModelLoadError, ModelValidationError, ResourceLimitError
from byoc.frontend import bounded, external, validate, weights

#: every model is converted to this opset of the default domain when it is older
CANONICAL_OPSET = 21

#: a stub size no tensor reaches: nothing is stubbed
_NEVER = 1 << 62

#: protobuf cannot parse or serialise a message of 2 GiB or more
_PROTOBUF_LIMIT = (1 << 31) - 1

ModelLike = Union[str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto, ir.Model]


class ModelConversionWarning(UserWarning):
    """The ONNX version converter could not bring the model to the canonical opset."""


def _read_ir(model: ir.Model, min_bytes: int) -> tuple[onnx.ModelProto, Path | None, dict]:
    """Serialise an ``onnx_ir.Model`` without its big float weights (they are returned apart)."""
    base_dir = _ir_base_dir(model)
    try:
        with weights.ir_held_out(model, min_bytes) as held:
            return ir.to_proto(model), base_dir, held
    except Exception as exc:
        raise ModelLoadError(f"cannot serialise the onnx_ir.Model: {type(exc).__name__}: {exc}") from None


def _read_proto(model: ModelLike, budget: Budget) -> tuple[onnx.ModelProto, str, Path | None]:
    """Return ``(the proto, how messages name it, folder of the model file)``.

    A given ``ModelProto`` is returned as it is: the caller only ever reads it (the loader works
    on a skeleton copy, :func:`byoc.frontend.weights.skeleton`).
    """
    if isinstance(model, ir.Model):
        proto, base_dir, _ = _read_ir(model, _NEVER)
        return proto, "<onnx_ir.Model>", base_dir
    if isinstance(model, onnx.ModelProto):
        return model, "<ModelProto>", None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "<bytes>"), "<bytes>", None
    if isinstance(model, (str, os.PathLike)):
        return _read_file(model, budget)
    raise ModelLoadError(
        f"cannot load a model from {type(model).__name__}; give a path, bytes, onnx.ModelProto or onnx_ir.Model"
    )


def _read_file(model: str | os.PathLike, budget: Budget) -> tuple[onnx.ModelProto, str, Path | None]:
    try:
        path = Path(file_path(model, "the model path", ModelLoadError))
        origin = str(path)
        if not path.exists():
            raise ModelLoadError(f"model file not found: {origin}")
        if path.is_dir():
            raise ModelLoadError(f"{origin} is a directory, not an ONNX model file")
        if not path.is_file():
            raise ModelLoadError(f"{origin} is not a regular file")
        size = path.stat().st_size
        if size > _PROTOBUF_LIMIT:
            raise ModelLoadError(
                f"{origin}: {_fmt_bytes(size)} is over the 2 GiB protobuf limit; store the weights as external data"
            )
        if size > budget.max_total_bytes:
            raise ResourceLimitError(
                f"{origin}: the file ({_fmt_bytes(size)}) is over the budget "
                f"max_total_bytes={_fmt_bytes(budget.max_total_bytes)}"
            )
        data = path.read_bytes()
    except ByocError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the model file {str(model)!r}: {exc}") from None
    return _parse(data, origin), origin, path.absolute().parent


def _ir_base_dir(model: ir.Model) -> Path | None:
    """The folder an ``onnx_ir`` model's external tensors were loaded from, if any."""
    dirs = set()
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and tensor.base_dir:
                dirs.add(os.fspath(tensor.base_dir))
    if len(dirs) > 1:
        raise ModelLoadError(
            f"the onnx_ir.Model's external tensors come from several folders ({sorted(dirs)}); "
            f"byoc reads external data from one model folder"
        )
    return Path(dirs.pop()) if dirs else None


def _parse(data: bytes, origin: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{origin}: the file is empty, not an ONNX model")
    if len(data) > _PROTOBUF_LIMIT:
        raise ModelLoadError(f"{origin}: over the 2 GiB protobuf limit; store the weights as external data")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # DecodeError, RuntimeError, ... depending on the protobuf runtime
        raise ModelLoadError(
            f"{origin}: not a readable ONNX protobuf (truncated or corrupt): {type(exc).__name__}: {exc}"
        ) from None
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{origin}: the protobuf holds no graph; not an ONNX model")
    return proto


def _default_opset(proto: onnx.ModelProto) -> int | None:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


@bounded.operation("onnx.check")
def _check(model: bytes) -> bytes:
    onnx.checker.check_model(model)
    return b""


@bounded.operation("onnx.convert")
def _convert(model: bytes) -> bytes:
    return onnx.version_converter.convert_version(onnx.ModelProto.FromString(model), CANONICAL_OPSET).SerializeToString()


def _checker_error(proto: onnx.ModelProto) -> str | None:
    """Run the ONNX checker; returns its complaint, or ``None`` when it accepts the model."""
    if proto.ByteSize() > _PROTOBUF_LIMIT:
        warnings.warn(
            "the model is over 2 GiB in memory, too large for the in-memory ONNX checker; only byoc's own "
            "structural checks ran (save it with external data to have it checked)",
            stacklevel=4,
        )
        return None
    try:
        bounded.call("onnx.check", proto.SerializeToString(), "the ONNX checker")
    except ByocError:
        raise
    except Exception as exc:  # ValidationError, and whatever the C++ side raises
        return str(exc).strip() or type(exc).__name__
    return None


@contextlib.contextmanager
def shapes_relaxed(proto: onnx.ModelProto):
    """Let the checker accept main-graph inputs/outputs of unknown rank (no ``shape`` field).

    The checker demands the field on the main graph only (subgraphs may omit it), and models
    with outputs of unknown rank are common; byoc infers shapes itself, so the field is
    temporarily present while the checker runs. This is the one checker rule byoc relaxes.
    """
    added = []
    for vi in [*proto.graph.input, *proto.graph.output]:
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape"):
            vi.type.tensor_type.shape.SetInParent()
            added.append(vi)
    try:
        yield
    finally:
        for vi in added:
            vi.type.tensor_type.ClearField("shape")


def _try_convert(proto: onnx.ModelProto, budget: Budget) -> tuple[onnx.ModelProto | None, str]:
    """Convert the default domain to :data:`CANONICAL_OPSET`: ``(converted, "")`` or ``(None, why)``."""
    if proto.ByteSize() > _PROTOBUF_LIMIT:
        return None, "the model is over the 2 GiB the converter can handle"
    try:
        converted = onnx.ModelProto.FromString(
            bounded.call("onnx.convert", proto.SerializeToString(), "the ONNX version converter"))
    except ByocError:
        raise
    except Exception as exc:  # the converter raises bare RuntimeError/ValueError/IndexError
        return None, bounded.describe(exc)
    # the converter's output must pass the same checks as its input did
    try:
        validate.check_text(converted, origin="<converted model>")
        validate.check_structure(converted, budget=budget)
    except ByocError as exc:
        return None, f"the converted model is invalid: {exc}"
    return converted, ""


def _convert_opset(proto: onnx.ModelProto, held: weights.Weights, version: int, budget: Budget,
                   origin: str) -> onnx.ModelProto:
    """``proto`` converted to :data:`CANONICAL_OPSET`, or ``proto`` itself with a warning when that fails.

    The weight-less skeleton is converted first; if the converter fails on it or touches a
    stub, the weights go back into ``proto`` (emptying ``held``) and the full model is converted.
    """
    if len(held):
        converted, why = _try_convert(proto, budget)
        if converted is not None and held.converted_intact(converted):
            return converted
        held.materialise(proto)
    converted, why = _try_convert(proto, budget)
    if converted is None:
        warnings.warn(
            f"{origin}: could not convert the model from opset {version} to {CANONICAL_OPSET} ({why}); "
            f"running it at opset {version}",
            ModelConversionWarning,
            stacklevel=3,
        )
        return proto
    return converted


def load_model(
    model: ModelLike,
    *,
    budget: Budget | None = DEFAULT_BUDGET,
    check: bool = True,
    require_kernels: bool = True,
    base_dir: str | os.PathLike | None = None,
    stub_min_bytes: int | None = weights.STUB_MIN_BYTES,
) -> ir.Model:
    """Load, validate and convert ``model`` into an ``onnx_ir.Model`` at the canonical opset.

    :param model: a path, the serialised bytes, an ``onnx.ModelProto`` or an ``onnx_ir.Model``.
        A given ``ModelProto`` is neither copied nor modified.
    :param budget: resource limits checked before any tensor data is materialised.
    :param check: run the ONNX checker (on by default).
    :param require_kernels: refuse operators that have no host kernel (on by default).
    :param base_dir: the folder that holds external data files; defaults to the model file's
        folder (a model given in memory with external data needs it).
    :param stub_min_bytes: float initializers of at least this many bytes bypass the ONNX
        checker and version converter (see :mod:`byoc.frontend.weights`); ``None`` sends every
        weight through them (slow; the result is the same).
    :raises ModelLoadError: unreadable, empty or truncated input; invalid UTF-8 text.
    :raises ExternalDataError: external data that escapes the model folder or does not fit.
    :raises ModelValidationError: invalid graph (cycle, dangling or duplicate names, bad tensors,
        checker failure).
    :raises ResourceLimitError: a declared tensor, the node count or the nesting depth exceeds the budget.
    :raises UnsupportedOperatorError: lists every node whose operator byoc cannot run.
    """
    budget = budget or DEFAULT_BUDGET
    min_bytes = _NEVER if stub_min_bytes is None else stub_min_bytes
    ir_held: dict = {}
    if isinstance(model, ir.Model):  # its big weights are never serialised
        source, model_dir, ir_held = _read_ir(model, min_bytes)
        origin = "<onnx_ir.Model>"
    else:
        source, origin, model_dir = _read_proto(model, budget)
    if base_dir is not None:
        model_dir = Path(base_dir)
    validate.check_text(source, origin=origin)
    # the checks, the checker and the converter work on a weight-less skeleton of the model
    proto, held = weights.skeleton(source, min_bytes)
    held.adopt(proto, ir_held)
    del source
    validate.check_structure(proto, budget=budget)
    if require_kernels:
        # an operator or domain ONNX does not know would fail the checker: report it as unsupported
        validate.check_supported_proto(proto, only_if_unknown=True)
    ext = external.prepare(proto, model_dir, budget=budget, skip=held.is_held_stub)
    version = _default_opset(proto)
    convert = version is not None and version < CANONICAL_OPSET
    try:
        with ext.stubbed() if ext is not None else contextlib.nullcontext(), held.checker_view(), \
                shapes_relaxed(proto):
            # The checker runs before any external data is read, and always before the C++
            # version converter, which can crash the process on a model the checker refuses.
            problem = _checker_error(proto) if (check or convert) else None
        if problem is not None and check:
            raise ModelValidationError(f"{origin}: the ONNX checker rejects the model: {problem}")
        if ext is not None:
            for tensor, data in ext.fill(hold=lambda t, what: weights.holdable(t, what, min_bytes, held)):
                held.take_bytes(tensor, data)
    finally:
        if ext is not None:
            ext.close()
    if convert:
        if problem is not None:  # only with check=False
            warnings.warn(
                f"{origin}: not converting the model from opset {version} to {CANONICAL_OPSET}: the ONNX checker "
                f"rejects it ({problem})",
                ModelConversionWarning,
                stacklevel=2,
            )
        else:
            proto = _convert_opset(proto, held, version, budget, origin)
    if require_kernels:
        validate.check_supported_proto(proto)  # after conversion: e.g. Upsample has become Resize
    try:
        model_ir = ir.from_proto(proto)
        held.attach(model_ir)
    except Exception as exc:
        raise ModelLoadError(f"{origin}: cannot convert the model to byoc's IR: {type(exc).__name__}: {exc}") from None
    return model_ir


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialise an IR model back to ONNX."""
    return ir.to_proto(model)
