"""The one place that talks to OpenVINO: the Core, compile/export/import, the blob cache.

Every ``compile_model`` and ``import_model`` the plugin makes goes through :func:`compile_blob`
and :func:`import_blob`, which count them in :data:`STATS` (tests assert that loading a bundle
imports its blobs without compiling; ``BYOC_OPENVINO_VERBOSE=1`` also prints one line per call on
stderr, e.g. for ``byoc run m.byoc``).

**Determinism.** OpenVINO's exported blob is not byte-reproducible: the CPU plugin names the nodes
its transformations create from a process-wide counter (``Constant_1715``), and the names are in
the blob. So the same region compiled twice in one process gives blobs that differ in a few
bytes. byoc requires identical artifacts for identical compiles, so a compiled blob is kept,
keyed by what decides it (the region's ONNX bytes, the settings, OpenVINO's version and the
device): in memory for this process (up to :data:`MEMO_BYTES`) and in the cache folder
(``cache_dir``) across processes. A second compile of the same region gets the first blob back
(an import check is not needed: the blob is the one OpenVINO produced for exactly that key).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import threading
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

from byoc.contract.folders import atomic_write
from byoc.contract import environment as _env

#: calls made in this process: compile_model (region -> device code), import_model (blob -> device
#: code), blobs served from the in-memory memo or the cache folder instead of compiling
STATS = {"compiles": 0, "imports": 0, "memo_hits": 0, "cache_hits": 0, "queries": 0}

_lock = threading.Lock()
_core = None

#: the in-memory blob memo's size limit (bytes)
MEMO_BYTES = 512 << 20
_memo: "OrderedDict[str, bytes]" = OrderedDict()
_memo_bytes = 0

#: cached blobs kept per cache folder (the oldest go first)
MAX_CACHED = 64


def ov():
    """The ``openvino`` module (imported on first use)."""
    import openvino

    return openvino


def core():
    """The process's one ``openvino.Core`` (thread-safe for compile/import/query)."""
    global _core
    if _core is None:
        with _lock:
            if _core is None:
                _core = ov().Core()
    return _core


def version() -> str:
    """OpenVINO's full version (``2026.4.1-22982-...``): blobs are tied to it."""
    return str(ov().get_version())


def release(full: str) -> str:
    """``2026.4.1`` from a full version string."""
    return full.split("-")[0]


def available_devices() -> list[str]:
    """``Core().available_devices`` (``["CPU"]``, ``["CPU", "GPU.0", "GPU.1"]``, ...)."""
    return list(core().available_devices)


def available() -> bool:
    """OpenVINO imports and offers at least one device."""
    return bool(available_devices())


def resolve_device(chosen: str) -> str:
    """The concrete device for an option value: ``AUTO`` is the first of GPU, NPU, CPU present."""
    devices = available_devices()
    families = {d.split(".")[0] for d in devices}
    if chosen == "AUTO":
        for fam in ("GPU", "NPU", "CPU"):
            if fam in families:
                return fam
        raise RuntimeError(f"OpenVINO offers no device here (available_devices = {devices})")
    if chosen not in families:
        raise RuntimeError(f"OpenVINO device {chosen!r} is not available here (available_devices = {devices})")
    return chosen


def device_facts(device: str) -> dict[str, str]:
    """What a blob compiled on ``device`` depends on, as OpenVINO reports it."""
    facts = {}
    for prop in ("FULL_DEVICE_NAME", "DEVICE_ARCHITECTURE"):
        try:
            facts[prop.lower()] = str(core().get_property(device, prop))
        except Exception:  # not every device reports every property
            pass
    return facts


def blob_header(blob: bytes) -> dict[str, str]:
    """The ``key=value;...`` header OpenVINO's CPU plugin writes at the start of a blob
    (``meta=1.0;ov=2026.4.1;isa=Intel AVX-512 ...``): the version and the instruction set the
    blob's kernels need. ``{}`` when there is none (other devices)."""
    head = blob[:1024]
    start = head.find(b"meta=")
    if start < 8:
        return {}
    # the text is preceded by its length (uint64, little-endian)
    length = int.from_bytes(head[start - 8:start], "little")
    if not 0 < length <= len(head) - start:
        return {}
    out = {}
    for part in head[start:start + length].decode("ascii", "replace").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _trace(message: str) -> None:
    if _env.get("BYOC_OPENVINO_VERBOSE") not in ("", "0"):
        print(f"byoc-openvino: {message}", file=sys.stderr, flush=True)


def read_onnx(onnx_bytes: bytes):
    """An ``openvino.Model`` from ONNX bytes (OpenVINO's ONNX frontend)."""
    return core().read_model(onnx_bytes)


def query(model: Any, device: str) -> dict[str, str]:
    """``Core.query_model``: friendly name -> device, for the operations ``device`` supports."""
    with _lock:
        STATS["queries"] += 1
    return dict(core().query_model(model, device))


def compile_model(onnx_bytes: bytes, device: str, config: Mapping[str, Any], what: str) -> Any:
    """``compile_model`` of an ONNX region (counted in :data:`STATS`)."""
    t0 = time.perf_counter()
    model = read_onnx(onnx_bytes)
    compiled = core().compile_model(model, device, dict(config))
    with _lock:
        STATS["compiles"] += 1
    _trace(f"{what}: compile_model on {device} in {1e3 * (time.perf_counter() - t0):.1f} ms")
    return compiled


def export(compiled: Any) -> bytes:
    stream = io.BytesIO()
    compiled.export_model(stream)
    return stream.getvalue()


def import_blob(blob: bytes, device: str, config: Mapping[str, Any], what: str) -> Any:
    """``import_model`` of an exported blob (counted in :data:`STATS`); no compile."""
    t0 = time.perf_counter()
    compiled = core().import_model(blob, device, dict(config))
    with _lock:
        STATS["imports"] += 1
    _trace(f"{what}: import_model on {device} ({len(blob)} bytes) in {1e3 * (time.perf_counter() - t0):.1f} ms, "
           "no compile")
    return compiled


# -- blobs: memo and cache folder -----------------------------------------------------------------


def blob_key(onnx_bytes: bytes, device: str, settings: Mapping[str, Any]) -> str:
    """What decides a compiled blob: the region, OpenVINO's version, the device, the settings."""
    h = hashlib.sha256(onnx_bytes)
    h.update(json.dumps({"openvino": version(), "device": device, "settings": dict(settings)},
                        sort_keys=True).encode())
    return h.hexdigest()


def _memo_get(key: str) -> bytes | None:
    with _lock:
        blob = _memo.get(key)
        if blob is not None:
            _memo.move_to_end(key)
        return blob


def _memo_put(key: str, blob: bytes) -> None:
    global _memo_bytes
    if len(blob) > MEMO_BYTES:
        return
    with _lock:
        if key in _memo:
            return
        _memo[key] = blob
        _memo_bytes += len(blob)
        while _memo_bytes > MEMO_BYTES and _memo:
            _, old = _memo.popitem(last=False)
            _memo_bytes -= len(old)


def _cache_read(folder: Path, key: str) -> bytes | None:
    blob_path, meta_path = folder / f"{key}.blob", folder / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        blob = blob_path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(blob).hexdigest():
        return None  # truncated or altered: a miss, never handed to OpenVINO
    try:
        os.utime(meta_path)
    except OSError:
        pass
    return blob


def _cache_write(folder: Path, key: str, blob: bytes) -> None:
    try:
        atomic_write(folder / f"{key}.blob", blob)
        atomic_write(folder / f"{key}.json", json.dumps({"sha256": hashlib.sha256(blob).hexdigest(),
                                                          "bytes": len(blob), "openvino": version()}).encode())
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-MAX_CACHED]:
            for p in (old, old.with_suffix(".blob")):
                try:
                    p.unlink()
                except OSError:
                    pass
    except OSError as exc:
        warnings.warn(f"byoc-openvino: could not store a compiled blob in {str(folder)!r} ({exc}); the next process "
                      "compiles it again", RuntimeWarning, stacklevel=3)


def compiled_blob(onnx_bytes: bytes, device: str, config: Mapping[str, Any], settings: Mapping[str, Any],
                  folder: Path | None, what: str) -> tuple[bytes, Any]:
    """``(blob, compiled model or None)``: the blob for this region and settings, from the memo,
    the cache folder, or a new ``compile_model`` + ``export_model`` (then remembered)."""
    key = blob_key(onnx_bytes, device, settings)
    blob = _memo_get(key)
    if blob is not None:
        with _lock:
            STATS["memo_hits"] += 1
        return blob, None
    if folder is not None:
        blob = _cache_read(folder, key)
        if blob is not None:
            with _lock:
                STATS["cache_hits"] += 1
            _memo_put(key, blob)
            return blob, None
    compiled = compile_model(onnx_bytes, device, config, what)
    blob = export(compiled)
    _memo_put(key, blob)
    if folder is not None:
        _cache_write(folder, key, blob)
    return blob, compiled


__all__ = ["MAX_CACHED", "MEMO_BYTES", "STATS", "available", "available_devices", "blob_header", "blob_key",
           "compile_model", "compiled_blob", "core", "device_facts", "export", "import_blob", "ov", "query",
           "read_onnx", "release", "resolve_device", "version"]
