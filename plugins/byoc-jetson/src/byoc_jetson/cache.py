"""The content-addressed TensorRT engine cache.

An engine is only valid for the exact subgraph, TensorRT version, GPU model (NVIDIA documents
engines as tied to the device type: an H100 and an H200 share compute capability 9.0 but not
engines), compute capability, precision, builder options and build recipe
(:data:`byoc_jetson.codegen.RECIPE_VERSION`) it was built with, so the cache key is the SHA-256
of all of them; changing any part is a miss and a rebuild. Each entry is two files in the cache
folder:

* ``<key>.engine``: the serialised engine (``IHostMemory`` bytes), written atomically;
* ``<key>.json``: what the key was made of, plus the engine's SHA-256, checked on every read
  (a truncated or altered engine is a miss and gets rebuilt, never handed to TensorRT).

An engine that passes those checks but that TensorRT still refuses to deserialise is evicted
(:meth:`EngineCache.evict`) and rebuilt by the caller. Stores are best effort: a read-only or
full cache folder costs the next process a rebuild, never this one its engine (a
``RuntimeWarning`` says so).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from byoc.contract.folders import atomic_write, ensure_private, read_private

#: bump when the key's composition changes
KEY_VERSION = 2


@dataclass(frozen=True)
class EngineKey:
    subgraph_sha256: str
    tensorrt_version: str
    compute_capability: str
    precision: str
    builder_options: tuple[tuple[str, Any], ...]
    device_name: str = ""
    recipe_version: int = 0

    @classmethod
    def make(cls, subgraph_sha256: str, tensorrt_version: str, compute_capability: str, precision: str,
             builder_options: Mapping[str, Any], device_name: str = "", recipe_version: int | None = None
             ) -> "EngineKey":
        from byoc_jetson.codegen import RECIPE_VERSION

        recipe = RECIPE_VERSION if recipe_version is None else int(recipe_version)
        options = tuple(sorted((k, _frozen(v)) for k, v in builder_options.items() if k not in ("precision", "recipe")))
        return cls(subgraph_sha256, str(tensorrt_version), str(compute_capability), precision, options,
                   str(device_name), recipe)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["builder_options"] = json.loads(json.dumps(dict(self.builder_options)))
        d["key_version"] = KEY_VERSION
        return d

    @property
    def digest(self) -> str:
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


#: the largest engine file read back from the cache
MAX_ENGINE_BYTES = 8 << 30


class EngineCache:
    """Engines on disk under ``folder``, addressed by :class:`EngineKey`."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.store_errors: list[str] = []

    def paths(self, key: EngineKey) -> tuple[Path, Path]:
        digest = key.digest
        return self.folder / f"{digest}.engine", self.folder / f"{digest}.json"

    def load(self, key: EngineKey) -> bytes | None:
        """The cached engine for ``key``, or ``None`` (missing, or its recorded hash does not match)."""
        engine_path, meta_path = self.paths(key)
        # an engine is loaded as code: never from a folder others can write
        raw_meta, data = read_private(meta_path, 1 << 16), read_private(engine_path, MAX_ENGINE_BYTES)
        try:
            meta = json.loads(raw_meta) if raw_meta is not None and data is not None else None
        except (ValueError, RecursionError):
            return None
        if not isinstance(meta, dict) or meta.get("engine_sha256") != hashlib.sha256(data).hexdigest():
            return None
        if meta.get("key") != key.describe():
            return None
        return data

    def store(self, key: EngineKey, engine: bytes) -> Path | None:
        """Write the entry; best effort: on a read-only/full folder, warn and return ``None``."""
        engine_path, meta_path = self.paths(key)
        try:
            ensure_private(self.folder)  # engines are loaded as code: a folder only this user can write
            # the engine first, its metadata (which vouches for it) last
            atomic_write(engine_path, engine)
            meta = {"key": key.describe(), "engine_sha256": hashlib.sha256(engine).hexdigest(), "bytes": len(engine)}
            atomic_write(meta_path, json.dumps(meta, sort_keys=True, indent=1).encode())
        except OSError as exc:
            message = (f"jetson: could not store the TensorRT engine in the cache folder {str(self.folder)!r} "
                       f"({exc.strerror or exc}); it is used from memory, the next process builds it again")
            self.store_errors.append(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return None
        return engine_path

    def evict(self, key: EngineKey) -> None:
        """Remove the entry for ``key`` (TensorRT refused it); missing files are fine."""
        self.evictions += 1
        for path in self.paths(key)[::-1]:  # metadata first: a half-removed entry is a miss
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                warnings.warn(f"jetson: could not remove the refused engine {str(path)!r}: {exc}", RuntimeWarning,
                              stacklevel=2)

    def get_or_build(self, key: EngineKey, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """``(engine, from_cache)``: the cached engine, or a new one from ``build()`` (then stored)."""
        cached = self.load(key)
        if cached is not None:
            self.hits += 1
            return cached, True
        self.misses += 1
        engine = build()
        if not isinstance(engine, (bytes, bytearray)) or not engine:
            raise RuntimeError("the TensorRT builder returned no engine")
        engine = bytes(engine)
        self.store(key, engine)
        return engine, False


def _frozen(value: Any) -> Any:
    """A hashable, JSON-shaped form of an option value (lists -> tuples, dicts -> sorted pairs)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


__all__ = ["EngineCache", "EngineKey", "KEY_VERSION"]
