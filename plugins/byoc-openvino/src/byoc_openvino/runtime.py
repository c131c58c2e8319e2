"""Artifact -> callable: OpenVINO's compiled model, imported from the blob, never recompiled
when the blob fits this machine.

Loading checks the artifact (its sections' SHA-256 against the metadata: an altered artifact is
refused before OpenVINO sees it), then:

* the blob was made by this OpenVINO version, for this device and (on CPU) for the instruction
  set this CPU has: ``import_model``, no compile (``engine.STATS["imports"]``);
* otherwise (a bundle built elsewhere), or when ``import_model`` refuses the blob: the region is
  recompiled from the ONNX the artifact carries, with a :class:`RecompileWarning` that says why
  (the callable's ``recompiled`` attribute keeps the reason). When that fails too, the runtime
  raises, and byoc's ``fallback="host"`` option of ``byoc.load`` (``byoc run --host-fallback``)
  decides: the region runs on the host from its kept subgraph, with a line in the report, or the
  load is refused.

The callable is safe to call from several threads at once: each call borrows an infer request
from a pool (one is made whenever all are busy) and returns fresh output arrays. A region with
symbolic dimensions is compiled once with OpenVINO's dynamic shapes and runs every shape without
compiling again.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from typing import Any, Mapping

import numpy as np

from byoc.contract import Artifact, InputError, PluginError

from byoc_openvino import engine
from byoc_openvino.codegen import FORMAT, join_weights, take_handoff, unpack
from byoc_openvino.options import compile_config


class RecompileWarning(RuntimeWarning):
    """A region's blob does not fit this machine (another OpenVINO, device or CPU): it was
    recompiled from the region's ONNX carried in the artifact."""


_isa_lock = threading.Lock()
_local_isa: dict[str, str] = {}

_ONNX_TO_NUMPY = {
    "FLOAT": np.float32, "DOUBLE": np.float64, "FLOAT16": np.float16, "INT8": np.int8, "INT16": np.int16,
    "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "BOOL": np.bool_,
}


def local_isa(device: str) -> str:
    """The instruction set OpenVINO's CPU plugin compiles for on this machine (read from the
    header of a blob of a one-operation model; cached per process)."""
    with _isa_lock:
        if device in _local_isa:
            return _local_isa[device]
    ov = engine.ov()
    from openvino import opset13 as ops

    param = ops.parameter([1], np.float32)
    model = ov.Model([ops.relu(param)], [param], "byoc_openvino_isa_probe")
    compiled = engine.core().compile_model(model, device, {"INFERENCE_NUM_THREADS": 1})
    isa = engine.blob_header(engine.export(compiled)).get("isa", "")
    with _isa_lock:
        _local_isa[device] = isa
    return isa


def mismatch(meta: Mapping[str, Any], device: str) -> str | None:
    """Why the artifact's blob cannot be imported here, or ``None``."""
    made_by, here = str(meta.get("openvino", "?")), engine.version()
    if made_by != here:
        return f"its blob was compiled by OpenVINO {made_by}, this is OpenVINO {here}"
    if meta.get("device") != device:
        return f"its blob was compiled for device {meta.get('device')!r}, this run uses {device!r}"
    needs = (meta.get("blob") or {}).get("needs") or {}
    if device == "CPU" and needs.get("isa"):
        isa = local_isa(device)
        if isa and isa != needs["isa"]:
            return f"its blob needs the CPU instruction set {needs['isa']!r}, this CPU runs {isa!r}"
    return None


class OpenVINORegion:
    """One region's OpenVINO compiled model, callable as ``fn(*inputs) -> [outputs]``."""

    def __init__(self, compiled: Any, metadata: Mapping[str, Any], device: str, recompiled: str | None = None):
        self.compiled = compiled
        self.name = str(metadata.get("region", "?"))
        self.device = device
        self.inputs = list(metadata.get("inputs", []))
        self.outputs = list(metadata.get("outputs", []))
        self.output_types = [_ONNX_TO_NUMPY.get(t) if t else None for t in metadata.get("output_types", [])]
        self.output_ranks = list(metadata.get("output_ranks", []))
        #: why the blob was recompiled on load (``None``: imported as it was, or compiled just now)
        self.recompiled = recompiled
        n_in = len(compiled.inputs)
        if n_in != len(self.inputs) or len(compiled.outputs) != len(self.outputs):
            raise PluginError(f"openvino region {self.name!r}: the compiled model has {n_in} inputs and "
                              f"{len(compiled.outputs)} outputs, the artifact names {len(self.inputs)} and "
                              f"{len(self.outputs)}")
        # each input's dimensions as the compiled model declares them (-1: dynamic; None: any rank)
        self._dims: list[list[int] | None] = []
        for port in compiled.inputs:
            ps = port.get_partial_shape()
            self._dims.append(None if ps.rank.is_dynamic else
                              [d.get_length() if d.is_static else -1 for d in ps])
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self.requests_made = 0

    def _borrow(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.requests_made += 1
        return self.compiled.create_infer_request()

    def _give_back(self, request: Any) -> None:
        with self._lock:
            self._idle.append(request)

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise InputError(f"openvino region {self.name!r} takes {len(self.inputs)} inputs "
                             f"({', '.join(self.inputs)}), got {len(arrays)}")
        # shared with OpenVINO without a copy where it can be: C-contiguous, and (OpenVINO refuses
        # to share those) not a read-only 0-d array; np.ascontiguousarray would make a 0-d array 1-d
        feeds = [a if isinstance(a, np.ndarray) and a.flags.c_contiguous and (a.ndim or a.flags.writeable)
                 else np.array(a, order="C") for a in arrays]
        for i, (a, dims) in enumerate(zip(feeds, self._dims)):
            if dims is not None and (a.ndim != len(dims) or any(d >= 0 and d != s for d, s in zip(dims, a.shape))):
                raise InputError(f"openvino region {self.name!r}: input {self.inputs[i]!r} has shape {list(a.shape)}, "
                                 f"the compiled model takes {['?' if d < 0 else d for d in dims]}")
        request = self._borrow()
        try:
            result = request.infer(feeds, share_inputs=True, share_outputs=False)
            outs = list(result.to_tuple())
        except Exception:
            # a request that failed mid-run is dropped, not reused
            raise
        else:
            self._give_back(request)
        fixed = []
        for i, arr in enumerate(outs):
            arr = np.asarray(arr)
            want = self.output_types[i] if i < len(self.output_types) else None
            if want is not None and arr.dtype != want:
                arr = arr.astype(want)
            if arr.ndim == 1 and arr.size == 1 and i < len(self.output_ranks) and self.output_ranks[i] == 0:
                # OpenVINO returns some rank-0 results as [1] (Expand to shape [], BitShift of
                # scalars): the region declares a scalar (README, "Where OpenVINO disagrees")
                arr = arr.reshape(())
            fixed.append(arr)
        return fixed

    @property
    def note(self) -> str | None:
        """byoc's report line (see ``byoc_runtime``): why the blob was recompiled on load."""
        return f"recompiled from the region's ONNX on load: {self.recompiled}" if self.recompiled else None

    def __repr__(self) -> str:
        how = f", recompiled: {self.recompiled}" if self.recompiled else ""
        return f"<OpenVINORegion {self.name!r} on {self.device}{how}>"


def _check(data: bytes, meta: Mapping[str, Any]) -> tuple[bytes, bytes, bytes]:
    onnx_bytes, weights, blob = unpack(data)
    blob_meta = meta.get("blob") or {}
    for what, part, want in (("ONNX", onnx_bytes, meta.get("onnx_sha256")), ("weights", weights, meta.get("weights_sha256")),
                             ("blob", blob, blob_meta.get("sha256"))):
        if hashlib.sha256(part).hexdigest() != want:
            raise PluginError(f"openvino artifact of region {meta.get('region')!r}: its {what} section does not match "
                              "its recorded SHA-256; altered or truncated")
    return onnx_bytes, weights, blob


def load(artifact: Artifact, options: Mapping[str, Any]) -> OpenVINORegion:
    if artifact.format != FORMAT:
        raise PluginError(f"openvino artifact of format {artifact.format!r}, expected {FORMAT!r}")
    meta = artifact.metadata
    name = meta.get("region", "?")
    onnx_bytes, weights, blob = _check(artifact.data, meta)
    device = engine.resolve_device(str(options.get("device", "CPU")))
    config = compile_config(options, device)
    compiled = take_handoff(meta["blob"]["sha256"])
    if compiled is not None:  # compiled a moment ago by byoc_codegen in this process
        return OpenVINORegion(compiled, meta, device)
    why = mismatch(meta, device)
    if why is None:
        try:
            return OpenVINORegion(engine.import_blob(blob, device, config, f"region {name!r}"), meta, device)
        except PluginError:
            raise
        except Exception as exc:
            why = f"import_model refused its blob: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    warnings.warn(f"byoc-openvino: region {name!r}: {why}; recompiling it from the region's ONNX in the artifact",
                  RecompileWarning, stacklevel=3)
    try:
        compiled = engine.compile_model(join_weights(onnx_bytes, weights), device, config, f"region {name!r}")
    except Exception as exc:
        raise PluginError(f"openvino region {name!r}: {why}, and recompiling its ONNX for {device} failed: "
                          f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}") from exc
    return OpenVINORegion(compiled, meta, device, recompiled=why)


__all__ = ["OpenVINORegion", "RecompileWarning", "load", "local_isa", "mismatch"]
