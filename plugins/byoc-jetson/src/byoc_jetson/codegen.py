"""Region -> Artifact: a standalone ONNX model plus its TensorRT builder config.

The artifact's bytes are exactly what TensorRT's ONNX parser consumes (``OnnxParser.parse``):
the region's body as an ONNX model, deterministically serialised, with the builder config
recorded in the model's ``metadata_props`` (``byoc.jetson.builder_config``) so the file alone is
enough to rebuild the engine (``trtexec --onnx=region.onnx --fp16`` works on it too). The
same config is in the artifact metadata, next to the subgraph hash (the engine cache key's
first part) and the runtime path that was active when compiling.

The engine itself is not in the artifact: TensorRT engines are specific to the TensorRT
version and the GPU, and their bytes are not reproducible, so they live in the engine cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import onnx
import onnx_ir as ir

from byoc.contract import Artifact, Region
from byoc_jetson.options import runtime_path

FORMAT = "onnx"
#: bump when the artifact layout changes
ARTIFACT_VERSION = 1
CONFIG_KEY = "byoc.jetson.builder_config"


def builder_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """What the TensorRT builder is configured with (JSON values, fixed key order)."""
    return {
        "precision": options["precision"],
        "workspace": int(options["workspace"]),
        "max_batch_size": int(options["max_batch_size"]),
    }


def _dims(value: ir.Value) -> list:
    if value.shape is None:
        return []
    return [d if isinstance(d, int) else None for d in value.shape]


def region_onnx(region: Region, config: Mapping[str, Any]) -> bytes:
    """The region body as ONNX bytes with the builder config attached, deterministic."""
    if region.model is None:
        raise ValueError(f"region {region.name!r} has no outlined body")
    proto = ir.to_proto(region.model)
    proto.producer_name = "byoc-jetson"
    del proto.metadata_props[:]
    entry = proto.metadata_props.add()
    entry.key, entry.value = CONFIG_KEY, json.dumps(dict(config), sort_keys=True, separators=(",", ":"))
    return proto.SerializeToString(deterministic=True)


def subgraph_hash(onnx_bytes: bytes) -> str:
    """SHA-256 of the region's ONNX bytes: the engine cache key's first part."""
    return hashlib.sha256(onnx_bytes).hexdigest()


def generate(region: Region, options: Mapping[str, Any]) -> Artifact:
    config = builder_config(options)
    data = region_onnx(region, config)
    metadata = {
        "inputs": [v.name for v in region.inputs],
        "outputs": [v.name for v in region.outputs],
        "input_shapes": [_dims(v) for v in region.inputs],
        "output_shapes": [_dims(v) for v in region.outputs],
        "builder_config": config,
        "subgraph_sha256": subgraph_hash(data),
        "artifact_version": ARTIFACT_VERSION,
        "opset": int(region.model.graph.opset_imports.get("", 0)) if region.model is not None else 0,
        "nodes": len(region.nodes),
        "patterns": sorted(set(region.patterns.values())),
        "runtime_path": runtime_path(options),
    }
    return Artifact("jetson", FORMAT, data, metadata)


def read_config(data: bytes) -> dict[str, Any]:
    """The builder config stored inside an artifact's ONNX bytes (``{}`` when absent)."""
    proto = onnx.ModelProto.FromString(data)
    for entry in proto.metadata_props:
        if entry.key == CONFIG_KEY:
            return json.loads(entry.value)
    return {}


__all__ = ["CONFIG_KEY", "FORMAT", "builder_config", "generate", "read_config", "region_onnx", "subgraph_hash"]
