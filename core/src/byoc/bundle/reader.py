"""Reading a bundle: the zip archive checked member by member before anything is used.

Refused, with a :class:`BundleError` naming the member: unsafe or unexpected member names,
sizes over the :class:`Budget` (checked on the declared sizes, before anything is
decompressed), hash mismatches, malformed JSON or ONNX. Nothing is unpickled or executed.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import zipfile
from pathlib import Path
from typing import Any, Mapping

import onnx
import onnx_ir as ir

from byoc.budget import Budget, _fmt_bytes
from byoc.bundle import shared
from byoc.bundle.format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_MEMBERS,
    PROTOBUF_LIMIT,
    SAFE_COMPRESSION,
    check_member_name,
    external_tensor,
    sha256,
)
from byoc.errors import BundleError, ByocError
from byoc.frontend import validate
from byoc.frontend.loader import shapes_relaxed
from byoc.passes.simplify import drop_legacy_initializer_inputs

#: zip bookkeeping allowed on top of the contents when checking a file's size against the budget
ARCHIVE_SLACK = 1 << 20


class Reader:
    """The verified members of one bundle file."""

    def __init__(self, path: Path, budget: Budget):
        self.path = path
        self.origin = str(path)
        self.budget = budget
        self.members: dict[str, bytes] = {}
        self.manifest: dict[str, Any] = {}
        #: bytes that references to artifact bytes copied so far (every member together, budgeted)
        self.spent = [0]
        #: the weight pool (``weights.bin``) of a bundle with specialisations, set by the loader
        self.pool: bytes | None = None

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
            if size > self.budget.max_total_bytes + ARCHIVE_SLACK:
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
            if info.compress_type not in SAFE_COMPRESSION:
                raise self.error(f"member {name!r} uses compression method {info.compress_type}; "
                                 f"byoc bundles use only {sorted(SAFE_COMPRESSION.values())}")
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
            digest = sha256(data)
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
        m = parse_json(data, MANIFEST, self.origin)
        need = (MANIFEST, m)
        if m.get("format") != FORMAT:
            raise self.error(f"member {MANIFEST!r}: format is {m.get('format')!r}, expected {FORMAT!r}")
        version = m.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise self.error(f"member {MANIFEST!r}: format_version missing or not an integer")
        if version > FORMAT_VERSION or version < 1:
            raise self.error(f"member {MANIFEST!r}: bundle format version {version}, this byoc reads version "
                             f"{FORMAT_VERSION}; upgrade byoc")
        require(need, "byoc_version", str, self.origin)
        require(need, "hook_api_version", int, self.origin)
        plugins = require(need, "plugins", dict, self.origin)
        for target, entry in plugins.items():
            where = f"plugins[{target!r}]"
            if not isinstance(entry, dict):
                raise self.error(f"member {MANIFEST!r}: {where} is not an object")
            for key in ("plugin", "distribution", "version"):
                if not isinstance(entry.get(key), str):
                    raise self.error(f"member {MANIFEST!r}: {where}.{key} missing or not a string")
        members = require(need, "members", dict, self.origin)
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


def parse_json(data: bytes, name: str, origin: str) -> dict[str, Any]:
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


def require(where: tuple[str, Mapping[str, Any]], key: str, kind: type, origin: str):
    name, obj = where
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BundleError(f"{origin}: member {name!r}: {key!r} missing or not a {kind.__name__}")
    return value



def parse_onnx(data: bytes, name: str, origin: str, budget: Budget, artifact: bytes | None = None,
               spent: list[int] | None = None, pool: bytes | None = None) -> ir.Model:
    """Parse an ONNX member with the frontend's structural checks; external data is refused,
    except references to ``artifact`` (a region subgraph's weights kept once, in its artifact
    member: :mod:`byoc.bundle.shared`), whose bytes are put back first, within ``budget``
    (``spent``: the bytes references of earlier members of the same bundle copied)."""
    def fail(msg: str) -> BundleError:
        return BundleError(f"{origin}: member {name!r}: {msg}")

    if not data:
        raise fail("empty, not an ONNX model")
    if len(data) > PROTOBUF_LIMIT:
        raise fail("over the 2 GiB protobuf limit")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:
        raise fail(f"not a readable ONNX protobuf: {type(exc).__name__}: {exc}") from None
    if not proto.HasField("graph"):
        raise fail("the protobuf holds no graph")
    # checked; the bytes return after the checks: copied for odd types, else as read-only views
    # over the artifact/pool bytes (no copy of a region's weights for its host fallback)
    held = shared.detach(proto.graph, artifact, fail, budget, spent, pool, views=True)
    check_onnx(proto, name, origin, budget)
    shared.attach(proto.graph, held)
    try:
        model = ir.from_proto(proto)
    except Exception as exc:
        raise fail(f"cannot convert to byoc's IR: {type(exc).__name__}: {exc}") from None
    for _, t in held:
        arr = shared.view_of(t, artifact, pool)
        value = model.graph.initializers.get(t.name) if arr is not None else None
        if value is not None:
            value.const_value = ir.Tensor(arr, name=t.name, doc_string=t.doc_string or None)
    # every reference is now a view (or was copied back): nothing may be left to read from a file
    for value in model.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            raise fail(f"initializer {value.name!r} refers to external data; a bundle holds all its data")
    # a model of IR version < 4 is written with its initializers listed as inputs (its own IR's
    # rule, see byoc.bundle.writer): read them as the constants they are
    drop_legacy_initializer_inputs(model)
    return model


def _weightless(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` for the ONNX checker whose large main-graph initializers are
    one-element stand-ins of the same type and rank (the checker serialises the model and
    inspects a tensor's name, type and rank; sizes were checked by byoc's structural checks)."""
    light = onnx.ModelProto()
    _copy_fields(proto, light, skip="graph")
    _copy_fields(proto.graph, light.graph, skip="initializer")
    for t in proto.graph.initializer:
        if t.HasField("raw_data") and validate.raw_nbytes(t.data_type, math.prod(t.dims)) > 4096:
            stand_in = light.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
            validate.one_element_stand_in(stand_in)
        else:
            light.graph.initializer.add().CopyFrom(t)
    return light


def _copy_fields(src, dst, skip: str) -> None:
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(dst, field.name).extend(value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def check_onnx(proto: onnx.ModelProto, name: str, origin: str, budget: Budget) -> None:
    """What the loader requires of an ONNX member (references to the region's artifact already
    swapped for stand-ins by :func:`byoc.bundle.shared.detach`); ``save`` applies the same
    checks to what it writes."""
    def fail(msg: str) -> BundleError:
        return BundleError(f"{origin}: member {name!r}: {msg}")

    external = external_tensor(proto.graph)
    if external is not None:
        raise fail(f"{external} refers to external data; a bundle holds all its data")
    try:
        # the frontend's structural checks (text, budgets on declared sizes, names, cycles; sorts)
        validate.check_text(proto, origin=f"{origin}:{name}")
        validate.check_structure(proto, budget=budget)
    except ByocError as exc:
        raise fail(f"{type(exc).__name__}: {exc}") from None
    except RecursionError:
        raise fail("subgraphs nested too deeply") from None
    try:
        # the checker rule the frontend relaxes (inputs/outputs of unknown rank) is relaxed here too:
        # a region's boundary is an intermediate value of the user's model, where unknown rank is legal
        light = _weightless(proto)
        with shapes_relaxed(light):
            onnx.checker.check_model(light)
    except Exception as exc:
        raise fail(f"the ONNX checker rejects it: {str(exc).strip() or type(exc).__name__}") from None


__all__ = ["Reader", "check_onnx", "parse_json", "parse_onnx", "require"]
