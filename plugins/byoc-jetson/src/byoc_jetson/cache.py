"""The content-addressed TensorRT engine cache.

An engine is only valid for the exact subgraph, TensorRT version, GPU compute capability,
precision and builder options it was built with, so the cache key is the SHA-256 of all of
them; changing any part is a miss and a rebuild. Each entry is two files in the cache folder:

* ``<key>.engine``: the serialised engine (``IHostMemory`` bytes), written atomically;
* ``<key>.json``: what the key was made of, plus the engine's SHA-256, checked on every read
  (a truncated or altered engine is a miss and gets rebuilt, never handed to TensorRT).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

#: bump when the key's composition changes
KEY_VERSION = 1


@dataclass(frozen=True)
class EngineKey:
    subgraph_sha256: str
    tensorrt_version: str
    compute_capability: str
    precision: str
    builder_options: tuple[tuple[str, Any], ...]

    @classmethod
    def make(cls, subgraph_sha256: str, tensorrt_version: str, compute_capability: str, precision: str,
             builder_options: Mapping[str, Any]) -> "EngineKey":
        return cls(subgraph_sha256, str(tensorrt_version), str(compute_capability), precision,
                   tuple(sorted((k, v) for k, v in builder_options.items() if k != "precision")))

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["builder_options"] = dict(self.builder_options)
        d["key_version"] = KEY_VERSION
        return d

    @property
    def digest(self) -> str:
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


class EngineCache:
    """Engines on disk under ``folder``, addressed by :class:`EngineKey`."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.hits = 0
        self.misses = 0

    def paths(self, key: EngineKey) -> tuple[Path, Path]:
        digest = key.digest
        return self.folder / f"{digest}.engine", self.folder / f"{digest}.json"

    def load(self, key: EngineKey) -> bytes | None:
        """The cached engine for ``key``, or ``None`` (missing, or its recorded hash does not match)."""
        engine_path, meta_path = self.paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            data = engine_path.read_bytes()
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("engine_sha256") != hashlib.sha256(data).hexdigest():
            return None
        if meta.get("key") != key.describe():
            return None
        return data

    def store(self, key: EngineKey, engine: bytes) -> Path:
        engine_path, meta_path = self.paths(key)
        self.folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(engine_path, engine)
        meta = {"key": key.describe(), "engine_sha256": hashlib.sha256(engine).hexdigest(), "bytes": len(engine)}
        _atomic_write(meta_path, json.dumps(meta, sort_keys=True, indent=1).encode())
        return engine_path

    def get_or_build(self, key: EngineKey, build: Callable[[], bytes]) -> bytes:
        cached = self.load(key)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        engine = build()
        if not isinstance(engine, (bytes, bytearray)) or not engine:
            raise RuntimeError("the TensorRT builder returned no engine")
        engine = bytes(engine)
        self.store(key, engine)
        return engine


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["EngineCache", "EngineKey", "KEY_VERSION"]
