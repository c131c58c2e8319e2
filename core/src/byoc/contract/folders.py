"""Folders byoc and its plugins cache code and figures in: one policy for every reader and writer.

A folder is *private* when it is a real folder (not a link), owned by this user and writable by
nobody else (group and others). Cached code, engines and figures are read only from private
folders: what someone else could write is never loaded. A folder that is not private is replaced
by a private temporary one (:func:`private_folder`, with one warning). Files are written to an
exclusively created temporary file in the same folder and renamed into place (:func:`atomic_write`),
and read only when they are regular files, not links, FIFOs or devices, of a bounded size
(:func:`read_regular`).
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

_lock = threading.Lock()
_fallbacks: dict[str, Path] = {}


def check_private(folder: Path) -> None:
    """Raise ``PermissionError`` unless ``folder`` is a real folder owned by this user that no one
    else may write to."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{str(folder)!r} is not a folder (or is a symbolic link)")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"{str(folder)!r} is owned by uid {st.st_uid}, not by this user ({os.getuid()})")
    if st.st_mode & 0o022:
        raise PermissionError(f"{str(folder)!r} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def is_private(folder: Path) -> bool:
    """Whether ``folder`` exists and is private (see :func:`check_private`)."""
    try:
        check_private(folder)
    except OSError:
        return False
    return True


def ensure_private(folder: Path) -> None:
    """Make ``folder`` (mode 0700, parents as needed) where it is missing, then
    :func:`check_private` it."""
    if not os.path.lexists(folder):
        folder.mkdir(mode=0o700, parents=True)
    check_private(folder)


def private_folder(preferred: Path, what: str) -> Path:
    """``preferred``, made (mode 0700) where it is missing, if it is private; else a private
    temporary folder for ``what`` (one per process, not kept), and one warning saying why."""
    try:
        ensure_private(preferred)
        return preferred
    except OSError as exc:
        with _lock:
            fallback = _fallbacks.get(what)
            if fallback is None:
                fallback = _fallbacks[what] = Path(tempfile.mkdtemp(prefix=f"byoc-{what}-"))
                warnings.warn(f"byoc: {what} folder {str(preferred)!r} cannot be used ({exc}); using "
                              f"{str(fallback)!r}, which is not kept", stacklevel=2)
        return fallback


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``: an exclusively created temporary file in the same folder (never
    following a link planted there), then an atomic rename over ``path``."""
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


def read_private(path: Path, limit: int) -> bytes | None:
    """:func:`read_regular` of ``path`` where its folder is private, else ``None``."""
    return read_regular(path, limit) if is_private(path.parent) else None


def read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link, FIFO or device) of at most
    ``limit`` bytes, else ``None``."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(limit + 1)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


__all__ = ["atomic_write", "check_private", "ensure_private", "is_private", "private_folder", "read_private",
           "read_regular"]
