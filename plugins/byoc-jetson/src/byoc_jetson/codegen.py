"""Region -> Artifact: a standalone ONNX model plus its TensorRT builder config.

The artifact's bytes are exactly what TensorRT's ONNX parser consumes (``OnnxParser.parse``):
the region's body as an ONNX model, deterministically serialised, with the builder config
recorded in the model's ``metadata_props`` (``byoc.jetson.builder_config``) so the file alone is
enough to rebuild the engine (``trtexec --onnx=region.onnx --fp16`` works on it too). The
same config is in the artifact metadata, next to the subgraph hash (the engine cache key's
first part) and the runtime path that was active when compiling.

The engine itself is not in the artifact: TensorRT engines are specific to the TensorRT
version and the GPU, and their bytes are not reproducible, so they live in the engine cache.

The engine build recipe lives here too, so that its version (:data:`RECIPE_VERSION`, part of
the engine cache key) sits next to what it versions: the optimisation profiles
(:func:`optimisation_profiles`) and, for TensorRT 11's strongly typed networks, the float16
form of the region handed to the parser (:func:`fp16_network`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from byoc.contract import Artifact, Region
from byoc_jetson.options import runtime_note, runtime_path

FORMAT = "onnx"
#: bump when the artifact layout changes
ARTIFACT_VERSION = 1
CONFIG_KEY = "byoc.jetson.builder_config"
#: bump whenever the engine build recipe changes (profiles, flags, the fp16 network): it is part
#: of the engine cache key, so engines built by an older recipe are rebuilt, never reused
RECIPE_VERSION = 2


def builder_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """What the TensorRT builder is configured with (JSON values, fixed key order)."""
    return {
        "precision": options["precision"],
        "workspace": int(options["workspace"]),
        "max_batch_size": int(options["max_batch_size"]),
        "profile_shapes": _profile_shapes(options.get("profile_shapes")),
        "recipe": RECIPE_VERSION,
    }


def _profile_shapes(value: Any) -> list[dict[str, list[int]]] | None:
    if not value:
        return None
    return [{str(k): [int(d) for d in v] for k, v in sorted(entry.items())} for entry in value]


# -- optimisation profiles ----------------------------------------------------------------------

Shape = tuple[int, ...]
#: one profile: input name -> (min, opt, max)
Profile = dict[str, tuple[Shape, Shape, Shape]]


class ProfileError(ValueError):
    """No optimisation profile can be made for the region's dynamic inputs before seeing a feed."""


def _exact(dims: Sequence[int], shape: Sequence[int], name: str) -> Shape:
    if len(shape) != len(dims) or any(d >= 0 and d != s for d, s in zip(dims, shape)):
        raise ProfileError(f"expected shape {list(shape)} does not fit input {name!r} of shape {list(dims)}")
    return tuple(int(s) for s in shape)


def optimisation_profiles(inputs: Sequence[tuple[str, Sequence[int]]], config: Mapping[str, Any],
                          extra: Sequence[Mapping[str, Sequence[int]]] = ()) -> list[Profile]:
    """The optimisation profiles for a network whose inputs are ``(name, dims)`` (-1: dynamic).

    * one exact profile (min = opt = max) per expected shape set: the ``profile_shapes`` option,
      or ``extra`` alone (shapes met at run time beyond every profile, see ``TensorRTRegion``);
    * when only the batch dimension is dynamic: an exact batch-1 profile (so batch 1 is tuned
      for batch 1) and one range profile 1..``max_batch_size`` tuned for the largest batch.

    A dynamic input that no expected shape names gets its batch from the first one that does
    (only its batch dimension may be dynamic then). Static networks need no profile (``[]``).
    :class:`ProfileError` when other dimensions are dynamic and no expected shape is known.
    """
    dynamic = [(n, list(d)) for n, d in inputs if any(x < 0 for x in d)]
    if not dynamic:
        return []
    profiles: list[Profile] = []
    # an engine for shapes met beyond every profile gets exactly those (the first engine has the rest)
    expected = [dict(e) for e in extra] if extra else list(config.get("profile_shapes") or [])
    for shapes in expected:
        known = {n: _exact(d, shapes[n], n) for n, d in dynamic if n in shapes}
        if not known:
            continue
        batch = next(iter(known.values()))[0] if next(iter(known.values())) else 1
        profile: Profile = {}
        for n, d in dynamic:
            if n in known:
                s = known[n]
            elif d and d[0] < 0 and all(x >= 0 for x in d[1:]):
                s = (batch, *d[1:])
            else:
                raise ProfileError(f"input {n!r} of shape {d} has dynamic dimensions and no expected shape")
            profile[n] = (s, s, s)
        if profile not in profiles:
            profiles.append(profile)
    batch_only = all(d and d[0] < 0 and all(x >= 0 for x in d[1:]) for _, d in dynamic)
    if batch_only and not extra:
        top = int(config["max_batch_size"])
        one = {n: ((1, *d[1:]),) * 3 for n, d in dynamic}
        span = {n: ((1, *d[1:]), (top, *d[1:]), (top, *d[1:])) for n, d in dynamic}
        for p in (one, span):
            if p not in profiles:
                profiles.append(p)
    if not profiles:
        names = [f"{n} {d}" for n, d in dynamic]
        raise ProfileError(f"dynamic dimensions other than the batch ({', '.join(names)}) and no expected shape "
                           "(option 'profile_shapes'); the engine is built for the first shapes seen")
    return profiles


def profile_covers(profile: Mapping[str, tuple[Shape, Shape, Shape]], shapes: Mapping[str, Shape]) -> bool:
    """Every shape in ``shapes`` that the profile constrains lies within its min..max."""
    for name, (lo, _, hi) in profile.items():
        s = shapes.get(name)
        if s is None or len(s) != len(lo) or any(not (a <= x <= b) for a, x, b in zip(lo, s, hi)):
            return False
    return True


# -- the float16 network for strongly typed TensorRT (11 and later) --------------------------------

#: (op_type, input index) slots the ONNX standard types as float32 only: they stay float32
_FLOAT32_ONLY = {("Resize", 2), ("Upsample", 1)}
_FLOAT = TensorProto.FLOAT
_HALF = TensorProto.FLOAT16


def _half_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    arr = numpy_helper.to_array(t)
    with np.errstate(over="ignore"):
        return numpy_helper.from_array(arr.astype(np.float16), t.name)


def fp16_network(onnx_bytes: bytes) -> bytes:
    """The region as a float16 network, for builders that take precision from the network's types.

    TensorRT 11 removed ``BuilderFlag.FP16``: every network is strongly typed and computes in the
    types it declares. So for precision ``fp16`` the plugin hands the parser this form: float32
    weights and constants become float16, each float32 region input is cast to float16 on entry
    and each float32 output back to float32 on exit (the engine's I/O stays float32), and casts
    to float32 inside the region cast to float16 instead. Inputs the ONNX standard types as
    float32 only (Resize scales) stay float32.
    """
    model = onnx.ModelProto.FromString(onnx_bytes)
    g = model.graph
    keep32: set[str] = set()
    for node in g.node:
        for i, name in enumerate(node.input):
            if (node.op_type, i) in _FLOAT32_ONLY and name:
                keep32.add(name)
    inits = {t.name for t in g.initializer}
    new_inits = []
    for t in g.initializer:
        if t.data_type == _FLOAT and t.name not in keep32:
            new_inits.append(_half_tensor(t))
        else:
            new_inits.append(t)
    del g.initializer[:]
    g.initializer.extend(new_inits)
    renames: dict[str, str] = {}
    head = []
    for v in g.input:
        if v.type.tensor_type.elem_type == _FLOAT and v.name not in inits:
            renames[v.name] = f"{v.name}__fp16"
            head.append(helper.make_node("Cast", [v.name], [renames[v.name]], name=f"{v.name}__to_fp16", to=_HALF))
    outs = {v.name: f"{v.name}__fp16" for v in g.output if v.type.tensor_type.elem_type == _FLOAT
            and v.name not in renames and v.name not in inits}
    body = []
    for node in g.node:
        node = _half_node(node)
        for i, name in enumerate(node.input):
            if (node.op_type, i) in _FLOAT32_ONLY and name and name not in inits:
                cast = f"{name}__fp32_{node.name or len(body)}"
                body.append(helper.make_node("Cast", [renames.get(name, outs.get(name, name))], [cast], to=_FLOAT))
                node.input[i] = cast
            elif name in renames:
                node.input[i] = renames[name]
            elif name in outs:
                node.input[i] = outs[name]
        for i, name in enumerate(node.output):
            if name in outs:
                node.output[i] = outs[name]
        body.append(node)
    tail = [helper.make_node("Cast", [half], [name], name=f"{name}__to_fp32", to=_FLOAT) for name, half in outs.items()]
    del g.node[:]
    g.node.extend(head + body + tail)
    del g.value_info[:]  # float32 intermediates are float16 now; the parser infers them again
    return model.SerializeToString(deterministic=True)


def _half_node(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    for a in out.attribute:
        if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == _FLOAT:
            a.i = _HALF
        elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _FLOAT:
            a.t.CopyFrom(_half_tensor(a.t))
        elif out.op_type == "Constant" and a.name == "value_float":
            value = numpy_helper.from_array(np.array(a.f, np.float16))
            a.Clear()
            a.name, a.type = "value", onnx.AttributeProto.TENSOR
            a.t.CopyFrom(value)
        elif out.op_type == "Constant" and a.name == "value_floats":
            value = numpy_helper.from_array(np.array(list(a.floats), np.float16))
            a.Clear()
            a.name, a.type = "value", onnx.AttributeProto.TENSOR
            a.t.CopyFrom(value)
    return out


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
        "region": region.name,
    }
    note = runtime_note(options)
    if note and metadata["runtime_path"] == "emulation":
        metadata["runtime_note"] = f"TensorRT not used: {note}"
    return Artifact("jetson", FORMAT, data, metadata)


def read_config(data: bytes) -> dict[str, Any]:
    """The builder config stored inside an artifact's ONNX bytes (``{}`` when absent)."""
    proto = onnx.ModelProto.FromString(data)
    for entry in proto.metadata_props:
        if entry.key == CONFIG_KEY:
            return json.loads(entry.value)
    return {}


__all__ = [
    "CONFIG_KEY",
    "FORMAT",
    "RECIPE_VERSION",
    "ProfileError",
    "builder_config",
    "fp16_network",
    "generate",
    "optimisation_profiles",
    "profile_covers",
    "read_config",
    "region_onnx",
    "subgraph_hash",
]
