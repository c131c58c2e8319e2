"""Writing a bundle: ``CompiledModel.save`` -> one zip file, replaced atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import onnx
import onnx_ir as ir

from byoc._version import __version__
from byoc.budget import DEFAULT_BUDGET, Budget, _fmt_bytes
from byoc.bundle.format import (
    COMPILED,
    FORMAT,
    FORMAT_VERSION,
    HOST_GRAPH,
    MANIFEST,
    PLAIN_FORMAT_VERSION,
    PROTOBUF_LIMIT,
    SOURCE,
    SPEC_DIR,
    WEIGHTS,
    external_tensor,
    region_members,
    sha256,
)
from byoc.bundle import shared
from byoc.bundle.reader import check_onnx
from byoc.arguments import file_path
from byoc.errors import BundleError
from byoc.contract import HOOK_API_VERSION

if TYPE_CHECKING:  # pragma: no cover
    from byoc.runtime.protocols import CompiledView as CompiledModel

#: a fixed timestamp keeps bundles byte-identical across saves
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        text = json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"cannot save {what}: it is not JSON-serialisable ({exc})") from None
    return text.encode("ascii") + b"\n"


def _onnx_bytes(model: ir.Model, what: str, budget: Budget | None = None, artifact: bytes | None = None,
                prune: bool = False, pool: "shared.Pool | None" = None) -> bytes:
    """``model`` serialised; with ``artifact``, initializers whose bytes it holds become
    references to it; with ``prune``, initializers nothing reads are left out; with ``pool``,
    the other large initializers move to the bundle's weight pool
    (:mod:`byoc.bundle.shared`: weights stored once). What is written passes the loader's checks."""
    try:
        proto = ir.to_proto(model)
    except Exception as exc:
        raise BundleError(f"cannot serialise {what} to ONNX: {type(exc).__name__}: {exc}") from None
    external = external_tensor(proto.graph)
    if external is not None:
        raise BundleError(f"cannot save {what}: {external} keeps its data in an external file")
    if artifact is not None:
        shared.share(proto.graph, artifact)
    if prune:
        shared.prune_unused(proto.graph)
    if pool is not None:
        shared.share_pool(proto.graph, pool)
    _legacy_initializer_inputs(proto)
    _verify_written(proto, what, budget or DEFAULT_BUDGET, artifact, pool.data if pool is not None else None)
    data = proto.SerializeToString(deterministic=True)
    if len(data) > PROTOBUF_LIMIT:
        raise BundleError(f"cannot save {what}: {_fmt_bytes(len(data))} is over the 2 GiB protobuf limit")
    return data


def _legacy_initializer_inputs(proto: onnx.ModelProto) -> None:
    """Write a model of IR version < 4 in its own IR's form: every initializer also a graph input.

    byoc reads such initializer-inputs as constants (:func:`byoc.passes.simplify.drop_legacy_initializer_inputs`)
    and keeps the model's ``ir_version`` (raising it would make them overridable inputs); the
    reader drops them again (:func:`byoc.bundle.reader.parse_onnx`), so the interface is unchanged.
    """
    if proto.ir_version >= 4:
        return
    graph = proto.graph
    listed = {v.name for v in graph.input}
    for t in graph.initializer:
        if t.name not in listed:
            graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            listed.add(t.name)
    _legacy_subgraph_constants(graph, 0)


def _legacy_subgraph_constants(graph: onnx.GraphProto, depth: int) -> None:
    """Subgraph initializers (If/Loop/Scan bodies) cannot be body inputs, whose positions mean
    something: in IR version < 4 they are written as ``Constant`` nodes instead (same values)."""
    if depth > 64:
        return
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                consts = [onnx.helper.make_node("Constant", [], [t.name], name=f"{t.name}__const", value=t)
                          for t in sub.initializer]
                if consts:
                    del sub.initializer[:]
                    nodes = consts + list(sub.node)
                    del sub.node[:]
                    sub.node.extend(nodes)
                _legacy_subgraph_constants(sub, depth + 1)


def _verify_written(proto: onnx.ModelProto, what: str, budget: Budget, artifact: bytes | None,
                    pool: bytes | bytearray | None = None) -> None:
    """The loader's checks on what ``save`` is about to write: a bundle that saves is a bundle
    that loads; never a silent success. References to ``artifact`` are checked as the reader
    checks them, on a copy (the references themselves are what gets written)."""
    def fail(msg: str) -> BundleError:
        return BundleError(f"the bundle being saved: {msg}")

    try:
        if artifact is not None or pool is not None:
            probe = onnx.ModelProto()
            probe.CopyFrom(proto)  # small: the shared weights are references here
            shared.detach(probe.graph, artifact, fail, budget, pool=pool)
            proto = probe
        check_onnx(proto, "member", "the bundle being saved", budget)
    except BundleError as exc:
        raise BundleError(f"cannot save {what}: byoc's loader would refuse it ({exc})") from None


def _specialisation(spec, budget: Budget | None, pool: shared.Pool) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``compiled.json``'s ``specialisation`` section and the members it names: the symbolic
    source model and every specialisation made so far (:data:`byoc.bundle.format.SPEC_DIR`), so
    that the loaded model runs the shapes seen so far as saved and specialises new ones as this
    one would. Refused only where that cannot hold."""
    static = [t.name for t in spec.static_targets]
    recipe = spec.recipe
    if recipe is None:
        raise BundleError(f"cannot save: target(s) {static} compile per input shape at run time and this model "
                          "records no compile settings to do so after loading (it was not made by byoc.compile); "
                          "fix the shapes: byoc.compile(..., input_shapes={...}), then save")
    if recipe.get("calibrated"):
        raise BundleError(f"cannot save: target(s) {static} calibrate every new input shape on the calibration "
                          "feeds, which a bundle does not hold; fix the shapes when compiling: "
                          "byoc.compile(..., input_shapes={...}) or `--shape NAME=D1,...`, then save")
    with spec._lock:
        cache = list(spec.cache.items())
    members = {SOURCE: _onnx_bytes(ir.from_proto(spec.proto), "the model's source (symbolic shapes)", budget,
                                   pool=pool)}
    shapes = []
    for j, (key, scm) in enumerate(cache):
        prefix = SPEC_DIR.format(j)
        spec_members, compiled = _model_members(scm, prefix, pool)
        spec_members[prefix + COMPILED] = _json_bytes(compiled, f"specialisation {dict(key)}")
        members.update(spec_members)
        shapes.append({"inputs": {name: list(dims) for name, dims in key}, "members": prefix})
    section = {
        "source": SOURCE,
        "targets": [_target_json(t) for t in spec.targets],
        "static_targets": static,
        "settings": {k: recipe[k] for k in ("passes", "strict", "placement", "hook_timeout", "target_options")},
        "shapes": shapes,
    }
    return section, members


def _target_json(target) -> dict[str, Any]:
    # the declared options are recorded as {name: default}; the installed target's own
    # declarations judge options when loading
    # ``available`` says whether this machine has the device (maybe a probe function): it is
    # the loading machine's business, never the bundle's
    return {f.name: target.defaults if f.name == "options" else getattr(target, f.name)
            for f in dataclasses.fields(target) if f.name != "available"}



def _model_members(cm: "CompiledModel", prefix: str = "",
                   pool: shared.Pool | None = None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The members of one compiled model under ``prefix`` (``compiled.json`` left out) and what
    its ``compiled.json`` holds; with ``pool``, large weights go to the bundle's weight pool."""
    fallback = dict(getattr(cm, "host_fallback", {}) or {})
    region_target = {cr.region.name: cr.region.target for cr in cm.regions}
    budget = getattr(cm, "budget", None)
    members: dict[str, bytes] = {prefix + HOST_GRAPH: _onnx_bytes(cm.model, "the host graph", budget, prune=True,
                                                                  pool=pool)}
    regions_json = []
    for i, cr in enumerate(cm.regions):
        region, artifact = cr.region, cr.artifact
        if region.model is None:
            raise BundleError(f"cannot save region {region.name!r}: it has no subgraph (region.model)")
        bin_name, json_name, onnx_name = region_members(i, prefix)
        members[bin_name] = bytes(artifact.data)
        members[json_name] = _json_bytes(
            {"target": artifact.target, "format": artifact.format, "metadata": artifact.metadata},
            f"the artifact metadata of region {region.name!r}",
        )
        members[onnx_name] = _onnx_bytes(region.model, f"the subgraph of region {region.name!r}", budget,
                                         members[bin_name], pool=pool)
        regions_json.append({
            "name": region.name,
            "target": region.target,
            "plugin": cr.plugin,
            "patterns": dict(region.patterns),
            "members": {"artifact": bin_name, "metadata": json_name, "subgraph": onnx_name},
        })
    records = []
    for rec in cm.records.values():
        row = dataclasses.asdict(rec)
        if rec.region in fallback and rec.region in region_target:
            # placed on the target; ran on the host only because the loading process lacked the plugin
            row["device"], row["fallback"] = region_target[rec.region], None
        records.append(row)
    compiled = {
        "options": cm.options,
        "targets": [_target_json(t) for t in cm.targets],
        "regions": regions_json,
        "records": records,
        "faults": [dataclasses.asdict(f) for f in cm.faults],
    }
    return members, compiled


def bundle_members(cm: "CompiledModel") -> dict[str, bytes]:
    """Every member of ``cm``'s bundle (manifest included), name -> bytes, in archive order."""
    spec = getattr(cm, "specializer", None)
    # a model with specialisations holds the same weights in many graphs: each is stored once
    pool = shared.Pool() if spec is not None else None
    members, compiled = _model_members(cm, "", pool)
    targets = list(cm.targets)
    if spec is not None:
        compiled["specialisation"], spec_members = _specialisation(spec, getattr(cm, "budget", None), pool)
        members.update(spec_members)
        members[WEIGHTS] = bytes(pool.data)
        targets += [t for t in spec.targets if t.name not in {u.name for u in targets}]
    members[COMPILED] = _json_bytes(compiled, "the compiled model's options, targets and records")
    plugins = {
        t.name: {"plugin": t.plugin, "distribution": t.distribution, "version": t.version, "api_version": t.api_version}
        for t in targets
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if spec is not None else PLAIN_FORMAT_VERSION,
        "byoc_version": __version__,
        "hook_api_version": HOOK_API_VERSION,
        "plugins": plugins,
        "members": {name: {"sha256": sha256(data), "size": len(data)} for name, data in sorted(members.items())},
    }
    return {MANIFEST: _json_bytes(manifest, "the manifest"), **members}


def temporary_name(name: str, limit: int = 255) -> str:
    """``.<name>.<random>.tmp`` within ``limit`` bytes (a file name's usual maximum): a long name is
    shortened, on a character boundary, so that a 250-character bundle name can still be saved."""
    suffix = f".{secrets.token_hex(6)}.tmp"
    room = limit - 1 - len(suffix)
    head = name.encode("utf-8")[:room].decode("utf-8", "ignore")
    return f".{head}{suffix}"


def save(cm: "CompiledModel", path: str | os.PathLike) -> Path:
    """Write ``cm`` to ``path`` atomically: a temporary file beside it, fsync, then ``os.replace``.

    An existing file at ``path`` stays untouched until the new bundle is complete on disk.
    :returns: the path written.
    """
    path = Path(file_path(path, "the bundle path", BundleError))
    folder = path.parent if str(path.parent) else Path(".")
    try:
        if path.is_dir():
            raise BundleError(f"cannot save the bundle to {str(path)!r}: it is a directory")
        if not folder.is_dir():
            raise BundleError(f"cannot save the bundle to {str(path)!r}: the folder {str(folder)!r} does not exist")
    except OSError as exc:  # a name too long, a folder that cannot be searched
        raise BundleError(f"cannot save the bundle to {str(path)!r}: {exc.strerror or exc}") from None
    members = bundle_members(cm)  # everything that can fail on content fails before any file exists
    tmp = folder / temporary_name(path.name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as fh:
            _write_zip(fh, members)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise BundleError(f"cannot save the bundle to {str(path)!r}: {exc}") from exc
        raise
    _fsync_dir(folder)
    return path


def _write_zip(fh, members: Mapping[str, bytes]) -> None:
    with zipfile.ZipFile(fh, "w", allowZip64=True) as zf:
        for name, data in members.items():
            _write_member(zf, name, data)


#: a member is deflated unless a sample of it shrinks by less than this (weights barely do, and
#: inflating them is most of a large bundle's load time)
_MIN_DEFLATE_GAIN = 0.1
_SAMPLE = 1 << 20


def _compressible(data: bytes) -> bool:
    if len(data) <= _SAMPLE:
        return True
    step = len(data) // 4
    sample = b"".join(data[i * step:i * step + _SAMPLE // 4] for i in range(4))
    return len(zlib.compress(sample, 1)) < (1 - _MIN_DEFLATE_GAIN) * len(sample)


def _write_member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED if _compressible(data) else zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever the platform: byte-identical bundles everywhere
    zf.writestr(info, data, compresslevel=1)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["bundle_members", "save"]
