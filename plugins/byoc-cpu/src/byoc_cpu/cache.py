"""byoc-cpu's cache folder: where generated modules and their Numba cache live.

Numba reads its index files back with pickle, so a folder is used only when it is safe: a real
folder owned by this user, writable by nobody else, and made by byoc-cpu; otherwise byoc-cpu
compiles into a private temporary folder and says so once.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Mapping

from byoc.contract.folders import atomic_write, check_private, read_regular
from byoc.contract import environment as _env

_fallback_dir: Path | None = None


def cache_dir(options: Mapping[str, Any] | None = None) -> Path:
    """The folder generated modules and their Numba cache live in."""
    opt = (options or {}).get("cache_dir")
    if opt:
        return Path(os.path.expanduser(str(opt)))
    env = _env.get("BYOC_CPU_CACHE", None)
    if env:
        return Path(os.path.expanduser(env))
    return Path.home() / ".cache" / "byoc" / "cpu"


#: marks a cache folder byoc-cpu made (the only kind whose Numba index files, a pickle format, are read)
MARKER = ".byoc-cpu-cache"
_OWN_NAME = re.compile(r"byoc_(?:cpu|loop)_[0-9a-f]{64}\.py|__pycache__|\.byoc_(?:cpu|loop)_.*\.tmp|\.probe-.*")


def check_cache_dir(folder: Path) -> None:
    """Raise ``PermissionError`` unless ``folder`` is safe to cache in: a real folder (not a link), owned by
    this user, writable by nobody else, and made by byoc-cpu (it holds :data:`MARKER`, or is empty and gets it).
    Numba reads its index files back with pickle, so a folder someone else can write must never be used."""
    for path in (folder, folder / "__pycache__"):
        if path == folder or os.path.lexists(path):
            check_private(path)
    marker = folder / MARKER
    if not marker.is_file():
        foreign = [p.name for p in folder.iterdir() if not _OWN_NAME.fullmatch(p.name)]
        if foreign:
            raise PermissionError(f"{str(folder)!r} was not made by byoc-cpu (no {MARKER} file; it holds "
                                  f"{sorted(foreign)[:3]})")
        marker.write_bytes(b"")


def writable_dir(preferred: Path) -> Path:
    global _fallback_dir
    try:
        if not os.path.lexists(preferred):
            preferred.parent.mkdir(parents=True, exist_ok=True)
            preferred.mkdir(mode=0o700)
        check_cache_dir(preferred)
        probe = preferred / f".probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
        return preferred
    except OSError as exc:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="byoc-cpu-"))
            (_fallback_dir / MARKER).write_bytes(b"")
        warnings.warn(f"byoc-cpu: cache folder {str(preferred)!r} cannot be used ({exc}); compiling into "
                      f"{str(_fallback_dir)!r}, which is not kept", stacklevel=3)
        return _fallback_dir


#: most generated modules a cache folder keeps (``$BYOC_CPU_CACHE_MAX_MODULES``); the oldest go first
DEFAULT_MAX_MODULES = 512


def max_modules() -> int:
    try:
        return max(1, int(_env.get("BYOC_CPU_CACHE_MAX_MODULES") or DEFAULT_MAX_MODULES))
    except ValueError:
        return DEFAULT_MAX_MODULES


#: shared loop files kept per generated module kept (:mod:`byoc_cpu.loops`)
LOOPS_PER_MODULE = 8


def evict(folder: Path, limit: int, keep: set[str] = frozenset(), prefix: str = "byoc_cpu_") -> list[str]:
    """Delete the oldest generated modules (``prefix`` ``byoc_loop_``: shared loop files) and their
    Numba cache files beyond ``limit``, never one in ``keep`` (digests imported by this process);
    returns the digests removed."""
    modules = []
    for path in folder.glob(f"{prefix}*.py"):
        digest = path.stem[len(prefix):]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            continue
        try:
            modules.append((path.stat().st_mtime_ns, digest, path))
        except OSError:
            continue
    removed = []
    for _, digest, path in sorted(modules)[: max(0, len(modules) - limit)]:
        if digest in keep:
            continue
        for victim in [path, *(folder / "__pycache__").glob(f"{prefix}{digest}.*")]:
            try:
                victim.unlink()
            except OSError:
                pass
        removed.append(digest)
    return removed


def write_once(path: Path, data: str) -> Path:
    """``path`` holding ``data``: left alone when it already does (rewriting it would change its mtime
    and invalidate Numba's cache), else written atomically."""
    raw = data.encode("utf-8")
    if read_regular(path, len(raw)) == raw:  # a link, FIFO or other file there is replaced, never read
        return path
    atomic_write(path, raw)
    return path


__all__ = ["DEFAULT_MAX_MODULES", "LOOPS_PER_MODULE", "MARKER", "cache_dir", "check_cache_dir", "evict", "max_modules",
           "writable_dir", "write_once"]
