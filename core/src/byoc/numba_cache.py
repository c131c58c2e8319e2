"""Numba's on-disk cache, kept where only this user can write.

Numba stores compiled kernels with an index file that is a pickle, and unpickles it before any
check: an index another user could plant would run their code in this process. ``import byoc``
calls :func:`secure` before any of byoc's Numba functions exists (each fixes its cache folder
when it is made), so that every cached kernel of byoc and its plugins is read from a private
folder (:mod:`byoc.contract.folders`): ``NUMBA_CACHE_DIR`` where that folder is private, else
byoc's own ``<cache root>/numba`` (``~/.cache/byoc/numba``), and a folder that is not private is
replaced by a private temporary one, with one warning. A damaged entry (a truncated or garbled
index or data file) is a cache miss: the kernel is compiled again and the entry replaced.
"""

from __future__ import annotations

from pathlib import Path

from byoc.contract.environment import cache_root
from byoc.contract.folders import private_folder


def secure() -> Path:
    """Point Numba's cache at a private folder (see the module); returns the folder."""
    from numba.core import caching, config

    preferred = Path(config.CACHE_DIR) if config.CACHE_DIR else cache_root() / "numba"
    folder = private_folder(preferred, "Numba cache")
    config.CACHE_DIR = str(folder)
    _damaged_entries_miss(caching.IndexDataCacheFile)
    return folder


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
