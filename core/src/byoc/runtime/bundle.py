"""Bundles: one file holding a compiled model, written by ``CompiledModel.save``, read by ``byoc.load``.

A bundle is a zip archive with a fixed set of members::

    manifest.json                 format version, byoc version, plugin per target, SHA-256 + size per member
    compiled.json                 options, targets, regions, per-node records, plugin faults
    model.onnx                    the partitioned host graph (regions are ``byoc::Region`` nodes)
    regions/NNNN/artifact.bin     the vendor artifact's bytes, as the code generator returned them
    regions/NNNN/artifact.json    the artifact's target, format and metadata
    regions/NNNN/region.onnx      the region's original subgraph (runs on the host when its plugin is missing)

Nothing in a bundle is ever unpickled or executed as code by byoc: graphs are ONNX protobuf,
everything else JSON or opaque bytes handed to the vendor's ``byoc_runtime`` hook. Loading
refuses, with a :class:`BundleError` naming the member or plugin, anything it did not write:
unsafe or unexpected member names, sizes over the :class:`Budget` (checked on the declared
sizes, before anything is decompressed), hash mismatches, malformed JSON or ONNX, and plugins
that are missing or of another version (unless ``fallback="host"``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import onnx
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget, _fmt_bytes
from byoc.errors import ByocError, BundleError, OptionError

if TYPE_CHECKING:  # pragma: no cover
    from byoc.plugins import Registry
    from byoc.runtime.compiled import CompiledModel

FORMAT = "byoc-bundle"
FORMAT_VERSION = 1
SUFFIX = ".byoc"

MANIFEST = "manifest.json"
COMPILED = "compiled.json"
HOST_GRAPH = "model.onnx"
REGION_DIR = "regions/{:04d}"
ARTIFACT_BIN = "artifact.bin"
ARTIFACT_JSON = "artifact.json"
REGION_ONNX = "region.onnx"

REGION_DOMAIN = "byoc"
REGION_OP = "Region"

#: the manifest is small JSON; anything bigger is not one byoc wrote
MAX_MANIFEST_BYTES = 16 << 20
#: protobuf cannot parse a message of 2 GiB or more
_PROTOBUF_LIMIT = (1 << 31) - 1
#: more members than this is not a bundle byoc wrote (3 per region + 3)
MAX_MEMBERS = 3 * 100_000 + 3
#: zip bookkeeping allowed on top of the contents when checking a file's size against the budget
_ARCHIVE_SLACK = 1 << 20
#: a fixed timestamp keeps bundles byte-identical across saves
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")

_SAFE_COMPRESSION = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


def is_bundle(path: str | os.PathLike) -> bool:
    """``True`` if ``path`` names a bundle: a ``.byoc`` suffix, or a file starting like a zip archive."""
    p = Path(path)
    if p.suffix.lower() == SUFFIX:
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# saving


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        text = json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"cannot save {what}: it is not JSON-serialisable ({exc})") from None
    return text.encode("ascii") + b"\n"


def _onnx_bytes(model: ir.Model, what: str, budget: Budget | None = None) -> bytes:
    try:
        proto = ir.to_proto(model)
    except Exception as exc:
        raise BundleError(f"cannot serialise {what} to ONNX: {type(exc).__name__}: {exc}") from None
    external = _external_tensor(proto.graph)
    if external is not None:
        raise BundleError(f"cannot save {what}: {external} keeps its data in an external file")
    _legacy_initializer_inputs(proto)
    _verify_written(proto, what, budget or DEFAULT_BUDGET)
    data = proto.SerializeToString(deterministic=True)
    if len(data) > _PROTOBUF_LIMIT:
        raise BundleError(f"cannot save {what}: {_fmt_bytes(len(data))} is over the 2 GiB protobuf limit")
    return data


def _legacy_initializer_inputs(proto: onnx.ModelProto) -> None:
    """Write a model of IR version < 4 in its own IR's form: every initializer also a graph input.

    byoc reads such initializer-inputs as constants (:func:`byoc.passes.simplify.drop_legacy_initializer_inputs`)
    and keeps the model's ``ir_version`` (raising it would make them overridable inputs); the
    loader drops them again (:func:`_drop_legacy_initializer_inputs`), so the interface is unchanged.
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


def _drop_legacy_initializer_inputs(model: ir.Model) -> ir.Model:
    """Undo :func:`_legacy_initializer_inputs` on a loaded member (IR version < 4 only)."""
    from byoc.passes.simplify import drop_legacy_initializer_inputs

    drop_legacy_initializer_inputs(model)
    return model


def _verify_written(proto: onnx.ModelProto, what: str, budget: Budget) -> None:
    """The loader's checks (:func:`_check_onnx`) on what ``save`` is about to write: a bundle
    that saves is a bundle that loads; never a silent success."""
    try:
        _check_onnx(proto, "member", "the bundle being saved", budget)
    except BundleError as exc:
        raise BundleError(f"cannot save {what}: byoc's loader would refuse it ({exc})") from None


def _target_json(target) -> dict[str, Any]:
    return {f.name: getattr(target, f.name) for f in dataclasses.fields(target)}


def _region_members(index: int) -> tuple[str, str, str]:
    base = REGION_DIR.format(index)
    return f"{base}/{ARTIFACT_BIN}", f"{base}/{ARTIFACT_JSON}", f"{base}/{REGION_ONNX}"


def bundle_members(cm: "CompiledModel") -> dict[str, bytes]:
    """Every member of ``cm``'s bundle (manifest included), name -> bytes, in archive order."""
    from byoc import __version__
    from byoc.hookspecs import HOOK_API_VERSION

    _refuse_deferred_targets(cm)
    fallback = dict(getattr(cm, "host_fallback", {}) or {})
    region_target = {cr.region.name: cr.region.target for cr in cm.regions}
    budget = getattr(cm, "budget", None)
    members: dict[str, bytes] = {HOST_GRAPH: _onnx_bytes(cm.model, "the host graph", budget)}
    regions_json = []
    for i, cr in enumerate(cm.regions):
        region, artifact = cr.region, cr.artifact
        if region.model is None:
            raise BundleError(f"cannot save region {region.name!r}: it has no subgraph (region.model)")
        bin_name, json_name, onnx_name = _region_members(i)
        members[bin_name] = bytes(artifact.data)
        members[json_name] = _json_bytes(
            {"target": artifact.target, "format": artifact.format, "metadata": artifact.metadata},
            f"the artifact metadata of region {region.name!r}",
        )
        members[onnx_name] = _onnx_bytes(region.model, f"the subgraph of region {region.name!r}", budget)
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
        "members": {name: {"sha256": _sha256(data), "size": len(data)} for name, data in sorted(members.items())},
    }
    return {MANIFEST: _json_bytes(manifest, "the manifest"), **members}


def _refuse_deferred_targets(cm: "CompiledModel") -> None:
    """A model whose static-shape targets compile per input shape at run time cannot be bundled
    faithfully: the bundle would hold only the host-side base, whose outputs differ from what
    ``run`` gives with the specialised targets. Refused, pointing at ``input_shapes=``."""
    spec = getattr(cm, "specializer", None)
    if spec is None:
        return
    names = [t.name for t in spec.static_targets]
    symbolic = []
    for v in spec.proto.graph.input:
        tt = v.type.tensor_type
        dims = [d.dim_param or "?" for d in tt.shape.dim if not d.HasField("dim_value")] if tt.HasField("shape") \
            else ["(unknown rank)"]
        if dims:
            symbolic.append(f"{v.name} {dims}")
    raise BundleError(
        f"cannot save: target(s) {names} compile per input shape at run time and the model's inputs are not "
        f"fixed ({'; '.join(symbolic)}); a bundle would run their nodes on the host instead. Fix the shapes when "
        f"compiling: byoc.compile(..., input_shapes={{...}}) or `--shape NAME=D1,D2,...`, then save"
    )


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
    tmp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
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


# ---------------------------------------------------------------------------------------------
# reading: members


def check_member_name(name: str) -> None:
    """Refuse a member name that could escape a folder or is not one byoc writes."""
    why = None
    if not name:
        why = "is empty"
    elif "\x00" in name:
        why = "contains a NUL byte"
    elif "\\" in name:
        why = "contains a backslash"
    elif name.startswith("/"):
        why = "is an absolute path"
    elif re.match(r"[A-Za-z]:", name) or ":" in name:
        why = "contains a drive letter or colon"
    elif any(part in ("..", ".") for part in name.split("/")):
        why = "contains a '..' or '.' path component and would escape its folder"
    elif name.endswith("/"):
        why = "is a directory entry"
    elif len(name) > 255 or not _NAME_RE.fullmatch(name):
        why = "is not a name byoc writes (letters, digits, '_', '.', '-' and '/' only)"
    if why is not None:
        raise BundleError(f"unsafe member name {name!r}: it {why}; refused")


def _expected_region_members(n_regions: int) -> set[str]:
    out = set()
    for i in range(n_regions):
        out.update(_region_members(i))
    return out


class _Reader:
    """The verified members of one bundle file."""

    def __init__(self, path: Path, budget: Budget):
        self.path = path
        self.origin = str(path)
        self.budget = budget
        self.members: dict[str, bytes] = {}
        self.manifest: dict[str, Any] = {}

    def error(self, message: str) -> BundleError:
        return BundleError(f"{self.origin}: {message}")

    def read(self) -> None:
        path = self.path
        try:
            if "\x00" in self.origin:
                raise self.error("the path contains a NUL byte")
            if not path.exists():
                raise self.error("bundle file not found")
            if path.is_dir():
                raise self.error("is a directory, not a byoc bundle")
            if not path.is_file():
                raise self.error("is not a regular file")
            size = path.stat().st_size
            if size == 0:
                raise self.error("the file is empty, not a byoc bundle")
            if size > self.budget.max_total_bytes + _ARCHIVE_SLACK:
                raise self.error(f"the file ({_fmt_bytes(size)}) is over the budget "
                                 f"max_total_bytes={_fmt_bytes(self.budget.max_total_bytes)}")
            with open(path, "rb") as fh:
                try:
                    zf = zipfile.ZipFile(fh)
                except Exception as exc:  # BadZipFile, NotImplementedError, struct/Unicode errors on garbage
                    raise self.error(f"not a byoc bundle (not a readable zip archive: {type(exc).__name__}: "
                                     f"{exc}); truncated or not a bundle") from None
                with zf:
                    self._read_zip(zf)
        except ByocError:
            raise
        except OSError as exc:
            raise self.error(f"cannot read the bundle: {exc}") from None

    def _read_zip(self, zf: zipfile.ZipFile) -> None:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise self.error(f"{len(infos)} members; not a bundle byoc wrote")
        by_name: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = info.orig_filename
            try:
                check_member_name(name)
            except BundleError as exc:
                raise self.error(str(exc)) from None
            if info.filename != name:
                raise self.error(f"unsafe member name {name!r}; refused")
            if name in by_name:
                raise self.error(f"member {name!r} appears twice")
            if info.flag_bits & 0x1:
                raise self.error(f"member {name!r} is encrypted; byoc bundles never are")
            if info.compress_type not in _SAFE_COMPRESSION:
                raise self.error(f"member {name!r} uses compression method {info.compress_type}; "
                                 f"byoc bundles use only {sorted(_SAFE_COMPRESSION.values())}")
            by_name[name] = info
        if MANIFEST not in by_name:
            raise self.error(f"member {MANIFEST!r} is missing; not a byoc bundle")
        self.manifest = manifest = self._parse_manifest(zf, by_name[MANIFEST])
        listed: dict[str, dict[str, Any]] = manifest["members"]
        for name in by_name:
            if name != MANIFEST and name not in listed:
                raise self.error(f"unexpected member {name!r}: the manifest does not list it; refused")
        for name in listed:
            if name not in by_name:
                raise self.error(f"member {name!r} listed in the manifest is missing")
        # zip bombs: every size is checked as declared, before anything is decompressed
        total = by_name[MANIFEST].file_size
        for name, entry in listed.items():
            info = by_name[name]
            if info.file_size != entry["size"]:
                raise self.error(f"member {name!r}: the archive declares {info.file_size} bytes, "
                                 f"the manifest {entry['size']}; tampered or corrupt")
            total += info.file_size
            if total > self.budget.max_total_bytes:
                raise self.error(
                    f"member {name!r}: the bundle's declared contents ({_fmt_bytes(total)} so far) exceed the "
                    f"budget max_total_bytes={_fmt_bytes(self.budget.max_total_bytes)}; refused before decompressing"
                )
        for name, entry in listed.items():
            data = self._read_member(zf, by_name[name])
            digest = _sha256(data)
            if not hmac.compare_digest(digest, entry["sha256"]):
                raise self.error(f"member {name!r}: SHA-256 mismatch (manifest {entry['sha256']}, content "
                                 f"{digest}); the bundle is tampered or corrupt")
            self.members[name] = data

    def _read_member(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
        name = info.orig_filename
        try:
            with zf.open(info) as fh:
                data = fh.read(info.file_size + 1)
        except (zipfile.BadZipFile, EOFError, ValueError, OSError, NotImplementedError, RuntimeError) as exc:
            raise self.error(f"member {name!r} cannot be read ({type(exc).__name__}: {exc}); "
                             f"truncated, tampered or corrupt") from None
        except Exception as exc:  # zlib.error and whatever a broken stream makes the decompressor raise
            raise self.error(f"member {name!r} cannot be decompressed ({type(exc).__name__}: {exc}); "
                             f"tampered or corrupt") from None
        if len(data) != info.file_size:
            raise self.error(f"member {name!r}: {len(data)} bytes where {info.file_size} were declared; "
                             f"truncated or tampered")
        return data

    def _parse_manifest(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> dict[str, Any]:
        if info.file_size > MAX_MANIFEST_BYTES:
            raise self.error(f"member {MANIFEST!r} declares {_fmt_bytes(info.file_size)}; "
                             f"a manifest is at most {_fmt_bytes(MAX_MANIFEST_BYTES)}")
        data = self._read_member(zf, info)
        m = _parse_json(data, MANIFEST, self.origin)
        need = (MANIFEST, m)
        if m.get("format") != FORMAT:
            raise self.error(f"member {MANIFEST!r}: format is {m.get('format')!r}, expected {FORMAT!r}")
        version = m.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise self.error(f"member {MANIFEST!r}: format_version missing or not an integer")
        if version > FORMAT_VERSION or version < 1:
            raise self.error(f"member {MANIFEST!r}: bundle format version {version}, this byoc reads version "
                             f"{FORMAT_VERSION}; upgrade byoc")
        _require(need, "byoc_version", str, self.origin)
        _require(need, "hook_api_version", int, self.origin)
        plugins = _require(need, "plugins", dict, self.origin)
        for target, entry in plugins.items():
            where = f"plugins[{target!r}]"
            if not isinstance(entry, dict):
                raise self.error(f"member {MANIFEST!r}: {where} is not an object")
            for key in ("plugin", "distribution", "version"):
                if not isinstance(entry.get(key), str):
                    raise self.error(f"member {MANIFEST!r}: {where}.{key} missing or not a string")
        members = _require(need, "members", dict, self.origin)
        if MANIFEST in members:
            raise self.error(f"member {MANIFEST!r}: the manifest lists itself")
        for name, entry in members.items():
            try:
                check_member_name(name)
            except BundleError as exc:
                raise self.error(f"member {MANIFEST!r} lists an {exc}") from None
            if not isinstance(entry, dict):
                raise self.error(f"member {MANIFEST!r}: entry for member {name!r} is not an object")
            sha, size = entry.get("sha256"), entry.get("size")
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise self.error(f"member {MANIFEST!r}: the SHA-256 of member {name!r} is missing or malformed")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise self.error(f"member {MANIFEST!r}: the size of member {name!r} is missing or not a count")
        return m


def _parse_json(data: bytes, name: str, origin: str) -> dict[str, Any]:
    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"duplicate key {k!r}")
            out[k] = v
        return out

    try:
        obj = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BundleError(f"{origin}: member {name!r} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise BundleError(f"{origin}: member {name!r} is not a JSON object")
    return obj


def _require(where: tuple[str, Mapping[str, Any]], key: str, kind: type, origin: str):
    name, obj = where
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BundleError(f"{origin}: member {name!r}: {key!r} missing or not a {kind.__name__}")
    return value


def _external_tensor(graph: onnx.GraphProto, depth: int = 0) -> str | None:
    """The first tensor of ``graph`` (subgraphs included) that keeps its data outside the proto."""
    if depth > 64:
        return f"graph {graph.name!r} (nested too deeply)"
    ext = onnx.TensorProto.EXTERNAL
    for t in graph.initializer:
        if t.data_location == ext:
            return f"initializer {t.name!r}"
    for st in graph.sparse_initializer:
        if ext in (st.values.data_location, st.indices.data_location):
            return f"sparse initializer {st.values.name!r}"
    for node in graph.node:
        for attr in node.attribute:
            tensors = [attr.t, *attr.tensors]
            for sp in [attr.sparse_tensor, *attr.sparse_tensors]:
                tensors += [sp.values, sp.indices]
            if any(t.data_location == ext for t in tensors):
                return f"attribute {attr.name!r} of node {node.name!r}"
            for sub in [attr.g, *attr.graphs]:
                found = _external_tensor(sub, depth + 1)
                if found is not None:
                    return found
    return None


def _parse_onnx(data: bytes, name: str, origin: str, budget: Budget) -> ir.Model:
    """Parse an ONNX member with the frontend's structural checks; external data is refused."""
    def fail(msg: str) -> BundleError:
        return BundleError(f"{origin}: member {name!r}: {msg}")

    if not data:
        raise fail("empty, not an ONNX model")
    if len(data) > _PROTOBUF_LIMIT:
        raise fail("over the 2 GiB protobuf limit")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:
        raise fail(f"not a readable ONNX protobuf: {type(exc).__name__}: {exc}") from None
    if not proto.HasField("graph"):
        raise fail("the protobuf holds no graph")
    _check_onnx(proto, name, origin, budget)
    try:
        return _drop_legacy_initializer_inputs(ir.from_proto(proto))
    except Exception as exc:
        raise fail(f"cannot convert to byoc's IR: {type(exc).__name__}: {exc}") from None


def _check_onnx(proto: onnx.ModelProto, name: str, origin: str, budget: Budget) -> None:
    """What the loader requires of an ONNX member (``save`` applies the same checks)."""
    from byoc.frontend import validate

    def fail(msg: str) -> BundleError:
        return BundleError(f"{origin}: member {name!r}: {msg}")

    external = _external_tensor(proto.graph)
    if external is not None:
        raise fail(f"{external} refers to external data; a bundle holds all its data")
    try:
        # the frontend's structural checks (text, budgets on declared sizes, names, cycles; sorts)
        if hasattr(validate, "check_structure"):
            validate.check_text(proto, origin=f"{origin}:{name}")
            validate.check_structure(proto, budget=budget)
        else:  # pragma: no cover - older frontend
            validate.check_proto(proto, budget=budget, base_dir=None)
    except ByocError as exc:
        raise fail(f"{type(exc).__name__}: {exc}") from None
    except RecursionError:
        raise fail("subgraphs nested too deeply") from None
    try:
        # the checker rule the frontend relaxes (inputs/outputs of unknown rank) is relaxed here too:
        # a region's boundary is an intermediate value of the user's model, where unknown rank is legal
        with _checker_relaxations(proto):
            onnx.checker.check_model(proto)
    except Exception as exc:
        raise fail(f"the ONNX checker rejects it: {str(exc).strip() or type(exc).__name__}") from None


def _checker_relaxations(proto: onnx.ModelProto):
    """The frontend loader's relaxations of the ONNX checker (the same validation on both paths)."""
    import contextlib

    from byoc.frontend import loader

    relaxed = getattr(loader, "_shapes_relaxed", None)
    return relaxed(proto) if relaxed is not None else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# reading: the compiled model


def _plugin_problem(registry: "Registry | None", target: str, need: Mapping[str, Any]) -> str | None:
    """Why ``registry`` cannot run ``target`` as the bundle needs it, or ``None``."""
    plugin, dist, version = need["plugin"], need["distribution"], need["version"]
    who = f"plugin {plugin!r}" + (f" (distribution {dist!r})" if dist else "")
    wanted = f"{who} version {version!r} for target {target!r}"
    if registry is None or (target not in registry.targets and target not in registry.conflicts
                            and target not in registry.incompatible):
        return f"the bundle needs {wanted}, which is not installed"
    if target in registry.conflicts:
        return f"the bundle needs {wanted}, but several plugins register it: {', '.join(registry.conflicts[target])}"
    if target in registry.incompatible:
        t = registry.incompatible[target]
        return (f"the bundle needs {wanted}, but the installed plugin {t.plugin!r} was built for another "
                f"hook API version ({t.api_version})")
    have = registry.targets[target]
    if have.version != version:
        return (f"the bundle needs {wanted}, but plugin {have.plugin!r} provides version {have.version!r}; "
                f"install version {version!r} or recompile")
    return None


def _records_from_json(rows: Any, origin: str):
    from byoc.partition.partitioner import NodeRecord

    fields = {f.name for f in dataclasses.fields(NodeRecord)}
    if not isinstance(rows, list):
        raise BundleError(f"{origin}: member {COMPILED!r}: 'records' is not a list")
    records = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or set(row) - fields:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed record {str(row)[:200]}")
        verdicts = row.get("verdicts", {})
        ok = all(isinstance(row.get(k), str) for k in ("name", "op_type", "device") if k in row) and all(
            row.get(k) is None or isinstance(row.get(k), str) for k in ("region", "pattern", "rule", "fallback")
        ) and isinstance(verdicts, dict) and all(v is None or isinstance(v, str) for v in verdicts.values())
        try:
            if not ok:
                raise TypeError("a field has the wrong type")
            rec = NodeRecord(**row)
        except TypeError as exc:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed record {row['name']!r}: {exc}") from None
        records[rec.name] = rec
    return records


def _dataclass_list(cls, rows: Any, what: str, origin: str) -> list:
    fields = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(rows, list):
        raise BundleError(f"{origin}: member {COMPILED!r}: {what!r} is not a list")
    out = []
    for row in rows:
        if not isinstance(row, dict) or set(row) - fields:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed entry in {what!r}: {str(row)[:200]}")
        try:
            out.append(cls(**row))
        except TypeError as exc:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed entry in {what!r}: {exc}") from None
    return out


class _QuietFaults:
    """Collects plugin faults of the runtime hook without warning (load decides what to say)."""

    strict = False

    def __init__(self) -> None:
        from byoc.plugins import PluginFault

        self._cls = PluginFault
        self.items: list = []

    def add(self, plugin: str, hook: str, message: str):
        fault = self._cls(plugin, hook, message)
        self.items.append(fault)
        return fault


def load(
    path: str | os.PathLike,
    *,
    registry: "Registry | None" = None,
    fallback: str | None = None,
    budget: Budget | None = None,
) -> "CompiledModel":
    """Load a bundle written by :meth:`CompiledModel.save`.

    :param path: the bundle file.
    :param registry: the plugin registry (default: the installed plugins, consulted only when the
        bundle has offloaded regions).
    :param fallback: ``"host"`` runs each region whose plugin is missing, of another version, or
        cannot load its artifact on the host from the region's kept subgraph (with a
        :class:`BundleFallbackWarning`); ``None``/``"error"`` (default) raises :class:`BundleError`.
    :param budget: resource limits for reading (declared member sizes) and running.
    :raises BundleError: unreadable, truncated or tampered bundle; unsafe or unexpected members;
        a missing or incompatible plugin (naming it and the version the bundle needs).
    """
    from byoc.compiler import CompiledRegion, codegen_region
    from byoc.partition.types import Artifact, Region, Target
    from byoc.plugins import PluginFault, get_registry
    from byoc.runtime.compiled import CompiledModel
    from byoc.runtime.plan import build_plan
    from byoc.runtime.subgraph import host_callable

    if fallback not in (None, "error", "host"):
        raise OptionError(f"fallback must be None/'error' (refuse) or 'host', got {fallback!r}")
    budget = budget or DEFAULT_BUDGET
    reader = _Reader(Path(os.fspath(path)), budget)
    reader.read()
    origin, members, manifest = reader.origin, reader.members, reader.manifest

    def fail(msg: str) -> BundleError:
        return BundleError(f"{origin}: {msg}")

    # -- compiled.json: structure, and the exact member set it implies --------------------------
    if COMPILED not in members:
        raise fail(f"member {COMPILED!r} is missing")
    if HOST_GRAPH not in members:
        raise fail(f"member {HOST_GRAPH!r} is missing")
    info = _parse_json(members[COMPILED], COMPILED, origin)
    where = (COMPILED, info)
    options = _require(where, "options", dict, origin)
    regions_json = _require(where, "regions", list, origin)
    expected = {COMPILED, HOST_GRAPH} | _expected_region_members(len(regions_json))
    for name in members:
        if name not in expected:
            raise fail(f"unexpected member {name!r}: the compiled model does not use it; refused")
    for name in sorted(expected):
        if name not in members:
            raise fail(f"member {name!r} is missing")
    targets = _dataclass_list(Target, info.get("targets"), "targets", origin)
    faults = _dataclass_list(PluginFault, info.get("faults"), "faults", origin)
    records = _records_from_json(info.get("records"), origin)
    target_options = options.get("target_options", {})
    if not isinstance(target_options, dict):
        raise fail(f"member {COMPILED!r}: options.target_options is not an object")

    # -- the manifest's plugins against compiled.json's targets --------------------------------
    plugins = manifest["plugins"]
    for t in targets:
        need = plugins.get(t.name)
        if need is None:
            raise fail(f"member {MANIFEST!r} names no plugin for target {t.name!r}")
        if (need["plugin"], need["version"]) != (t.plugin, t.version):
            raise fail(f"member {MANIFEST!r} says target {t.name!r} needs plugin {need['plugin']!r} version "
                       f"{need['version']!r}, but {COMPILED!r} records plugin {t.plugin!r} version {t.version!r}; "
                       f"tampered")
    target_by_name = {t.name: t for t in targets}

    # -- the host graph --------------------------------------------------------------------------
    model = _parse_onnx(members[HOST_GRAPH], HOST_GRAPH, origin, budget)
    region_nodes: dict[str, ir.Node] = {}
    for node in model.graph:
        if node.domain != REGION_DOMAIN:
            continue
        if node.op_type != REGION_OP:
            raise fail(f"member {HOST_GRAPH!r}: node {node.name!r} is {REGION_DOMAIN}::{node.op_type}; "
                       f"only {REGION_DOMAIN}::{REGION_OP} nodes may use the {REGION_DOMAIN!r} domain")
        attrs = node.attributes
        region_attr = attrs.get("region")
        target_attr = attrs.get("target")
        if region_attr is None or target_attr is None or region_attr.type != ir.AttributeType.STRING \
                or target_attr.type != ir.AttributeType.STRING:
            raise fail(f"member {HOST_GRAPH!r}: region node {node.name!r} lacks string attributes target/region")
        name = region_attr.value
        if name != node.name or name in region_nodes:
            raise fail(f"member {HOST_GRAPH!r}: region node {node.name!r} names region {name!r}; "
                       f"duplicate or inconsistent")
        region_nodes[name] = node

    # -- which targets this process can run ----------------------------------------------------
    needed_targets = []
    for entry in regions_json:
        if isinstance(entry, dict) and isinstance(entry.get("target"), str):
            if entry["target"] not in needed_targets:
                needed_targets.append(entry["target"])
    if needed_targets and registry is None:
        registry = get_registry()
    unavailable: dict[str, str] = {}
    for target in needed_targets:
        need = plugins.get(target)
        if need is None:
            raise fail(f"member {MANIFEST!r} names no plugin for target {target!r}, which region(s) use")
        if target not in target_by_name:
            raise fail(f"member {COMPILED!r}: regions use target {target!r}, which the model was not compiled for")
        problem = _plugin_problem(registry, target, need)
        if problem is not None:
            if fallback != "host":
                raise fail(f"{problem} (pass fallback='host' to run its regions on the host instead)")
            unavailable[target] = problem
    live_targets = [
        registry.targets[t.name] if registry is not None and t.name in registry.targets
        and t.name not in unavailable and registry.targets[t.name].version == t.version else t
        for t in targets
    ]

    # -- regions -----------------------------------------------------------------------------------
    compiled_regions = []
    host_fallback: dict[str, str] = {}
    seen_regions: set[str] = set()
    for i, entry in enumerate(regions_json):
        if not isinstance(entry, dict):
            raise fail(f"member {COMPILED!r}: region entry #{i} is not an object")
        name, target, plugin = entry.get("name"), entry.get("target"), entry.get("plugin")
        patterns, refs = entry.get("patterns", {}), entry.get("members")
        if not (isinstance(name, str) and isinstance(target, str) and isinstance(plugin, str)
                and isinstance(patterns, dict) and all(isinstance(v, str) for v in patterns.values())):
            raise fail(f"member {COMPILED!r}: region entry #{i} is malformed")
        bin_name, json_name, onnx_name = _region_members(i)
        if refs != {"artifact": bin_name, "metadata": json_name, "subgraph": onnx_name}:
            raise fail(f"member {COMPILED!r}: region {name!r} refers to members {refs!r}, expected "
                       f"{bin_name!r}, {json_name!r}, {onnx_name!r}")
        if name in seen_regions:
            raise fail(f"member {COMPILED!r}: region {name!r} appears twice")
        seen_regions.add(name)
        node = region_nodes.get(name)
        if node is None:
            raise fail(f"member {HOST_GRAPH!r} has no Region node for region {name!r}")
        if node.attributes["target"].value != target:
            raise fail(f"member {HOST_GRAPH!r}: region node {name!r} says target "
                       f"{node.attributes['target'].value!r}, {COMPILED!r} says {target!r}")
        meta_json = _parse_json(members[json_name], json_name, origin)
        metadata = meta_json.get("metadata")
        if not isinstance(meta_json.get("target"), str) or not isinstance(meta_json.get("format"), str) \
                or not isinstance(metadata, dict):
            raise fail(f"member {json_name!r}: malformed artifact metadata for region {name!r}")
        artifact = Artifact(meta_json["target"], meta_json["format"], members[bin_name], metadata)
        body = _parse_onnx(members[onnx_name], onnx_name, origin, budget)
        in_names = [v.name for v in node.inputs if v is not None]
        out_names = [v.name for v in node.outputs]
        if len(in_names) != len(node.inputs) or [v.name for v in body.graph.inputs] != in_names \
                or [v.name for v in body.graph.outputs] != out_names:
            raise fail(f"member {onnx_name!r}: the subgraph's inputs/outputs do not match region node {name!r}")
        if list(artifact.input_names) != in_names or list(artifact.output_names) != out_names:
            raise fail(f"member {json_name!r}: the artifact's inputs/outputs do not match region node {name!r}")
        region = Region(name=name, target=target, nodes=list(body.graph), inputs=list(node.inputs),
                        outputs=list(node.outputs), patterns=dict(patterns), model=body)
        opts = target_options.get(target, {})
        if not isinstance(opts, dict):
            raise fail(f"member {COMPILED!r}: options for target {target!r} are not an object")
        cr = None
        why = unavailable.get(target)
        if why is None:
            hook_faults = _QuietFaults()
            cr = codegen_region(registry, region, opts, hook_faults, artifact=artifact)
            if cr is None:
                fault = hook_faults.items[-1] if hook_faults.items else None
                why = f"{fault}" if fault is not None else "no plugin provided a runtime"
                why = f"plugin {plugin!r} cannot load the artifact of region {name!r}: {why}"
                if fallback != "host":
                    raise fail(why)
        if cr is None:
            try:
                fn = host_callable(body, budget)
            except ByocError as exc:
                raise fail(f"region {name!r} cannot run on the host ({why}): {exc}") from None
            warnings.warn(f"{origin}: region {name!r} runs on the host from its kept subgraph: {why}",
                          BundleFallbackWarning, stacklevel=2)
            host_fallback[name] = why
            cr = CompiledRegion(region, artifact, plugin, fn)
        compiled_regions.append(cr)
    for name in region_nodes:
        if name not in seen_regions:
            raise fail(f"member {HOST_GRAPH!r}: Region node {name!r} has no region in {COMPILED!r}")
    for rec in records.values():
        if rec.region in host_fallback:
            rec.device, rec.fallback = "host", host_fallback[rec.region]

    by_name = {cr.region.name: cr for cr in compiled_regions}

    def step_factory(node: ir.Node, spec):
        if node.domain == REGION_DOMAIN and node.op_type == REGION_OP:
            return by_name[node.name].fn
        return None

    try:
        plan = build_plan(model.graph, budget=budget, step_factory=step_factory)
    except ByocError as exc:
        raise fail(f"member {HOST_GRAPH!r}: {type(exc).__name__}: {exc}") from None
    cm = CompiledModel(
        model,
        plan,
        options=options,
        regions=compiled_regions,
        records=records,
        faults=faults,
        targets=live_targets,
        budget=budget,
    )
    cm.host_fallback = host_fallback
    return cm


class BundleFallbackWarning(UserWarning):
    """A bundle's region runs on the host because its plugin is missing or cannot load it."""


__all__ = [
    "BundleFallbackWarning",
    "FORMAT",
    "FORMAT_VERSION",
    "SUFFIX",
    "bundle_members",
    "check_member_name",
    "is_bundle",
    "load",
    "save",
]
