"""Writing a bundle: ``CompiledModel.save`` -> one zip file, replaced atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import onnx_ir as ir

from byoc._version import __version__
from byoc.budget import _fmt_bytes
from byoc.bundle.format import (
    COMPILED,
    FORMAT,
    FORMAT_VERSION,
    HOST_GRAPH,
    MANIFEST,
    PROTOBUF_LIMIT,
    external_tensor,
    region_members,
    sha256,
)
from byoc.errors import BundleError
from byoc.contract import HOOK_API_VERSION

if TYPE_CHECKING:  # pragma: no cover
    from byoc.runtime.compiled import CompiledModel

#: a fixed timestamp keeps bundles byte-identical across saves
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        text = json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"cannot save {what}: it is not JSON-serialisable ({exc})") from None
    return text.encode("ascii") + b"\n"


def _onnx_bytes(model: ir.Model, what: str) -> bytes:
    try:
        proto = ir.to_proto(model)
    except Exception as exc:
        raise BundleError(f"cannot serialise {what} to ONNX: {type(exc).__name__}: {exc}") from None
    external = external_tensor(proto.graph)
    if external is not None:
        raise BundleError(f"cannot save {what}: {external} keeps its data in an external file")
    data = proto.SerializeToString(deterministic=True)
    if len(data) > PROTOBUF_LIMIT:
        raise BundleError(f"cannot save {what}: {_fmt_bytes(len(data))} is over the 2 GiB protobuf limit")
    return data


def _target_json(target) -> dict[str, Any]:
    # the declared options are recorded as {name: default}; the installed target's own
    # declarations judge options when loading
    return {f.name: target.defaults if f.name == "options" else getattr(target, f.name)
            for f in dataclasses.fields(target)}



def bundle_members(cm: "CompiledModel") -> dict[str, bytes]:
    """Every member of ``cm``'s bundle (manifest included), name -> bytes, in archive order."""
    fallback = dict(getattr(cm, "host_fallback", {}) or {})
    region_target = {cr.region.name: cr.region.target for cr in cm.regions}
    members: dict[str, bytes] = {HOST_GRAPH: _onnx_bytes(cm.model, "the host graph")}
    regions_json = []
    for i, cr in enumerate(cm.regions):
        region, artifact = cr.region, cr.artifact
        if region.model is None:
            raise BundleError(f"cannot save region {region.name!r}: it has no subgraph (region.model)")
        bin_name, json_name, onnx_name = region_members(i)
        members[bin_name] = bytes(artifact.data)
        members[json_name] = _json_bytes(
            {"target": artifact.target, "format": artifact.format, "metadata": artifact.metadata},
            f"the artifact metadata of region {region.name!r}",
        )
        members[onnx_name] = _onnx_bytes(region.model, f"the subgraph of region {region.name!r}")
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
    members[COMPILED] = _json_bytes(
        {
            "options": cm.options,
            "targets": [_target_json(t) for t in cm.targets],
            "regions": regions_json,
            "records": records,
            "faults": [dataclasses.asdict(f) for f in cm.faults],
        },
        "the compiled model's options, targets and records",
    )
    plugins = {
        t.name: {"plugin": t.plugin, "distribution": t.distribution, "version": t.version, "api_version": t.api_version}
        for t in cm.targets
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
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
    path = Path(os.fspath(path))
    if "\x00" in str(path):
        raise BundleError(f"bundle path {str(path)!r} contains a NUL byte")
    if path.is_dir():
        raise BundleError(f"cannot save the bundle to {str(path)!r}: it is a directory")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise BundleError(f"cannot save the bundle to {str(path)!r}: the folder {str(folder)!r} does not exist")
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


def _write_member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
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
