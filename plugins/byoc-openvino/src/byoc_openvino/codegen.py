"""Region -> Artifact: the region as ONNX, compiled by OpenVINO, exported as a blob.

``Artifact.format`` is ``"openvino-blob"``. ``Artifact.data`` is a small container, no pickle::

    0   b"BYOCOV01"                      magic
    8   uint64 LE  onnx_length           the region's ONNX, its large weights moved out
    16  uint64 LE  weights_offset, 24: weights_length      the weights, each 64-byte aligned
    32  uint64 LE  blob_offset,    40: blob_length         OpenVINO's exported compiled model
    48  onnx bytes, then the weights section, then the blob (both sections 64-byte aligned)

The region's ONNX travels with the blob so that a bundle loaded by another OpenVINO version, on
another device or on a CPU without the instruction set the blob was compiled for, is recompiled
from it (:mod:`byoc_openvino.runtime`). Its weights are stored as raw little-endian arrays at
aligned offsets (an initializer refers to them as external data at
``location = "byoc-openvino:weights"``), so that a bundle's kept subgraph shares their bytes
instead of storing them again.

``Artifact.metadata``::

    inputs, outputs        value names in call order; input_types/output_types their ONNX types
    region                 the region's name
    openvino               the full version that compiled the blob (a blob imports only there)
    device                 the device it was compiled for (CPU, GPU, NPU)
    settings               what decides the blob: precision, performance_hint
    blob                   sha256, bytes, and what it needs: ``needs`` = the blob's own header
                           (``ov``: version, ``isa``: the CPU instruction set its kernels use) and
                           the device's name and architecture
    onnx_sha256, weights_sha256, dynamic (any symbolic input dimension), nodes, op_types
"""

from __future__ import annotations

import hashlib
import struct
import threading
from typing import Any, Mapping

import onnx
import onnx_ir as ir

from byoc.contract import Artifact, PluginError, Region, region_model_bytes

from byoc_openvino import ARTIFACT_VERSION, __version__, engine
from byoc_openvino.options import compile_config, portable_config, usable_cache_dir

FORMAT = "openvino-blob"
TARGET = "openvino"
MAGIC = b"BYOCOV01"
HEADER = struct.Struct("<8sQQQQQ")
ALIGN = 64
WEIGHTS_LOCATION = "byoc-openvino:weights"
#: smaller initializers stay inside the ONNX bytes
MIN_EXTERNAL_BYTES = 1024

#: compiled models made by byoc_codegen, handed to byoc_runtime in the same process (by blob hash)
_handoff: dict[str, Any] = {}
_handoff_lock = threading.Lock()


def _pad(n: int) -> int:
    return -n % ALIGN


def split_weights(onnx_bytes: bytes) -> tuple[bytes, bytes]:
    """(ONNX bytes whose large initializers refer to the weights section, the weights section)."""
    proto = onnx.ModelProto.FromString(onnx_bytes)
    parts: list[bytes] = []
    pos = 0
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data") \
                or len(t.raw_data) < MIN_EXTERNAL_BYTES:
            continue
        raw = t.raw_data
        parts.append(raw)
        parts.append(bytes(_pad(len(raw))))
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", WEIGHTS_LOCATION), ("offset", str(pos)), ("length", str(len(raw)))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        pos += len(raw) + _pad(len(raw))
    return proto.SerializeToString(deterministic=True), b"".join(parts)


def join_weights(onnx_bytes: bytes, weights: bytes) -> bytes:
    """The region's ONNX with its weights back inline (what OpenVINO's frontend reads)."""
    proto = onnx.ModelProto.FromString(onnx_bytes)
    for t in proto.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        ext = {e.key: e.value for e in t.external_data}
        if ext.get("location") != WEIGHTS_LOCATION:
            raise PluginError(f"openvino artifact: initializer {t.name!r} refers to {ext.get('location')!r}; refused")
        offset, length = int(ext.get("offset", -1)), int(ext.get("length", -1))
        if offset < 0 or length < 0 or offset + length > len(weights):
            raise PluginError(f"openvino artifact: initializer {t.name!r} lies outside the weights section")
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        t.raw_data = weights[offset:offset + length]
    return proto.SerializeToString(deterministic=True)


def pack(onnx_bytes: bytes, weights: bytes, blob: bytes) -> bytes:
    w_off = HEADER.size + len(onnx_bytes)
    w_off += _pad(w_off)
    b_off = w_off + len(weights)
    b_off += _pad(b_off)
    head = HEADER.pack(MAGIC, len(onnx_bytes), w_off, len(weights), b_off, len(blob))
    body = head + onnx_bytes
    body += bytes(w_off - len(body)) + weights
    body += bytes(b_off - len(body)) + blob
    return body


def unpack(data: bytes) -> tuple[bytes, bytes, bytes]:
    """(ONNX bytes, weights section, blob) of an artifact's data; :class:`PluginError` if malformed."""
    if len(data) < HEADER.size:
        raise PluginError(f"openvino artifact: {len(data)} bytes, shorter than its header")
    magic, onnx_len, w_off, w_len, b_off, b_len = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PluginError(f"openvino artifact: bad magic {magic!r} (expected {MAGIC!r})")
    if HEADER.size + onnx_len > w_off or w_off + w_len > b_off or b_off + b_len != len(data):
        raise PluginError("openvino artifact: its sections do not fit its length; truncated or altered")
    return bytes(data[HEADER.size:HEADER.size + onnx_len]), bytes(data[w_off:w_off + w_len]), \
        bytes(data[b_off:b_off + b_len])


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _type_name(v: ir.Value) -> str | None:
    return v.dtype.name if v.dtype is not None else None


def _dynamic(region: Region) -> bool:
    for v in region.inputs:
        if v.shape is None or any(not isinstance(d, int) for d in v.shape):
            return True
    return False


def generate(region: Region, options: Mapping[str, Any]) -> Artifact:
    if region.model is None:
        raise PluginError(f"openvino: region {region.name!r} has no outlined body")
    body = ir.to_proto(region.model)
    body.producer_name, body.producer_version = "byoc-openvino", __version__
    del body.metadata_props[:]
    full = body.SerializeToString(deterministic=True)
    onnx_bytes, weights = split_weights(full)
    device = engine.resolve_device(str(options.get("device", "CPU")))
    settings = portable_config(options)
    config = compile_config(options, device)
    what = f"region {region.name!r}"
    try:
        blob, compiled = engine.compiled_blob(full, device, config, settings, usable_cache_dir(options), what)
    except Exception as exc:
        raise PluginError(f"openvino: OpenVINO could not compile region {region.name!r} "
                          f"({len(region.nodes)} nodes: {', '.join(sorted(set(region.op_types)))[:200]}) for {device}: "
                          f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}") from exc
    blob_sha = _sha(blob)
    if compiled is not None:
        with _handoff_lock:
            _handoff[blob_sha] = compiled
    needs = {**engine.blob_header(blob), **engine.device_facts(device)}
    ops: dict[str, int] = {}
    for n in region.nodes:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    metadata = {
        "inputs": [v.name for v in region.inputs],
        "outputs": [v.name for v in region.outputs],
        "input_types": [_type_name(v) for v in region.inputs],
        "output_types": [_type_name(v) for v in region.outputs],
        "output_ranks": [len(v.shape) if v.shape is not None else None for v in region.outputs],
        "region": region.name,
        "artifact_version": ARTIFACT_VERSION,
        "plugin_version": __version__,
        "openvino": engine.version(),
        "device": device,
        "settings": settings,
        "blob": {"sha256": blob_sha, "bytes": len(blob), "needs": needs},
        "onnx_sha256": _sha(onnx_bytes),
        "weights_sha256": _sha(weights),
        "dynamic": _dynamic(region),
        "nodes": len(region.nodes),
        "op_types": dict(sorted(ops.items())),
    }
    return Artifact(TARGET, FORMAT, pack(onnx_bytes, weights, blob), metadata)


def take_handoff(blob_sha: str) -> Any:
    """The compiled model ``generate`` made for this blob in this process, once (else ``None``)."""
    with _handoff_lock:
        return _handoff.pop(blob_sha, None)


__all__ = ["FORMAT", "MAGIC", "TARGET", "generate", "join_weights", "pack", "region_model_bytes", "split_weights",
           "take_handoff", "unpack"]
