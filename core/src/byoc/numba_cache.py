"""Numba's on-disk cache, kept where only this user (or the system's owner) can write.

Numba stores compiled kernels with an index file that is a pickle, and unpickles it before any
check: an index another user could plant would run their code in this process. ``import byoc``
calls :func:`secure` before any of byoc's Numba functions exists (each fixes its cache folder
when it is made):

* ``NUMBA_CACHE_DIR`` set: used where it is private (:mod:`byoc.contract.folders`), else
  replaced by a private temporary folder, with one warning;
* unset: Numba's default place, ``__pycache__`` beside each source file, where byoc's installed
  package folders belong to this user or to root and nobody else may write them (a plugin's
  generated modules live in the plugin's own private folder); else byoc's own
  ``<cache root>/numba`` (``~/.cache/byoc/numba``).

A damaged entry (a truncated or garbled index or data file) is a cache miss: the kernel is
compiled again and the entry replaced.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from byoc.contract.environment import cache_root
from byoc.contract.folders import private_folder


def secure(sources: Iterable[Path] | None = None) -> Path | None:
    """Point Numba's cache at a trusted place (see the module); returns the folder it set, or
    ``None`` where Numba's default place beside ``sources`` (byoc's package folders) is trusted."""
    from numba.core import caching, config

    _damaged_entries_miss(caching.IndexDataCacheFile)
    if config.CACHE_DIR:
        preferred = Path(config.CACHE_DIR)
    elif all(_trusted(folder) for folder in (sources if sources is not None else _package_folders())):
        return None
    else:
        preferred = cache_root() / "numba"
    folder = private_folder(preferred, "Numba cache")
    config.CACHE_DIR = str(folder)
    return folder


def _package_folders() -> list[Path]:
    """The folders of byoc's installed package (and their ``__pycache__``), and the one holding it."""
    root = Path(__file__).resolve().parent
    folders = [root.parent]
    for folder in (root, *(p for p in root.rglob("*") if p.is_dir())):
        folders.append(folder)
    return folders


def _trusted(folder: Path) -> bool:
    """A real folder (or none yet) owned by this user or root that no one else may write."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return True  # Numba makes it (with this user's umask) when it first writes
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    owner_ok = not hasattr(os, "getuid") or st.st_uid in (os.getuid(), 0)
    return owner_ok and not st.st_mode & 0o022


def _damaged_entries_miss(cls: type) -> None:
    """Make an index or data file that cannot be read a miss, as a missing one is."""
    if getattr(cls, "_byoc_damage_is_a_miss", False):
        return
    load_index, load = cls._load_index, cls.load

    def _load_index(self):
        try:
            return load_index(self)
        except Exception:  # garbled or truncated: compiled again, and the save replaces it
            return {}

    def _load(self, key):
        try:
            return load(self, key)
        except Exception:
            return None

    cls._load_index, cls.load = _load_index, _load
    cls._byoc_damage_is_a_miss = True
