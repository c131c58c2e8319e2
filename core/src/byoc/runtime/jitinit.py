"""Numba's once-per-process start-up, begun early on a background thread.

The first Numba kernel a process runs, compiled or loaded from the on-disk cache, first makes
Numba install its typing and lowering registries (``BaseContext.refresh``: imports of its
``numba.np`` modules and about 1,300 function templates): 0.5-0.6 s on the development machine,
most of a warm first run after ``byoc warmup`` and of loading a byoc-cpu bundle (issue 19,
docs/startup.md). :func:`start` does that work on a daemon thread, under Numba's compiler lock
(so it never interleaves with a compilation), while the caller reads files, checks and hashes
weights and parses protobufs, much of which runs without the interpreter lock.

Idempotent and best effort: if it fails, the first kernel call does the same work, as without
it. ``BYOC_JIT_EARLY_INIT=0`` turns it off.
"""

from __future__ import annotations

import threading
from byoc.contract import environment as _env

_lock = threading.Lock()
_thread: threading.Thread | None = None


def _init() -> None:
    try:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        with global_compiler_lock:
            cpu_target.target_context.refresh()  # installs the typing context's registries too
    except Exception:  # noqa: BLE001 - best effort (see the module documentation)
        pass


def start() -> threading.Thread | None:
    """Begin Numba's registry set-up on a background thread (once per process); returns the
    thread (``None`` when turned off)."""
    global _thread
    if _env.get("BYOC_JIT_EARLY_INIT", "1") == "0":
        return None
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_init, name="byoc-numba-init", daemon=True)
            _thread.start()
        return _thread


__all__ = ["start"]
