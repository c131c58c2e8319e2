"""Every environment variable byoc and its plugins read, in one place.

Code reads a variable through :func:`get` (or :func:`num_threads`), never through ``os.environ``
directly, so that this table stays the whole list (a test checks it). A plugin adds its own
variables to :data:`VARIABLES` under its prefix (``BYOC_CPU_*``), documented here too.
"""

from __future__ import annotations

import os
from pathlib import Path

#: name -> what it does (``docs/user-guide.md`` prints this table)
VARIABLES: dict[str, str] = {
    # the core
    "BYOC_NUM_THREADS": "threads a CPU engine uses (default: the usable cores)",
    "BYOC_HOST_EXECUTOR": "what runs the host's nodes: an executor's name, or 'reference' for byoc's "
                          "reference kernels (default: the installed executor with the highest priority)",
    "BYOC_PLUGINS": "comma-separated entry-point names: load only these plugins",
    "BYOC_TRACE": "1: log every hook call (pluggy's tracing)",
    "BYOC_DEBUG": "1: the command line prints tracebacks",
    "BYOC_CACHE_DIR": "folder of byoc's own caches (placement figures; default ~/.cache/byoc)",
    "BYOC_JIT_HELPERS": "helper processes that compile a first run's kernels (0: none)",
    "BYOC_JIT_EARLY_INIT": "0: do not initialise Numba's compiler while the model loads",
    "BYOC_WAIT": "1: byoc.compile's default is wait=True (no first tier: every run on the compiled code)",
    "BYOC_ISOLATION_WORKER": "set (to 1) by byoc inside an isolation worker (isolation='process'); read-only",
    # byoc-cpu
    "BYOC_THREAD_POLICY": "byoc-cpu's thread policy: 'blas' (OpenBLAS threads per GEMM) or 'off'",
    "BYOC_OWN_GEMM": "byoc-cpu: 1/0 forces its own float32 GEMM on/off (default: on with AVX-512)",
    "BYOC_BLOCKED_CONV": "byoc-cpu: 0 turns the channel-blocked convolution kernel off",
    "BYOC_CPU_CACHE": "byoc-cpu: folder of its generated-code cache",
    "BYOC_CPU_CACHE_MAX_MODULES": "byoc-cpu: most generated modules kept in its cache",
    "BYOC_CPU_NATIVE": "byoc-cpu: 1/0 compiles generated code for this CPU's features or a portable baseline",
    "BYOC_CPU_PROFILE": "byoc-cpu: the tuning profile to use (a name from byoc_cpu/tuning/)",
    # byoc-openvino
    "BYOC_OPENVINO_CACHE": "byoc-openvino: folder of compiled blobs ('' for none; default ~/.cache/byoc/openvino)",
    "BYOC_OPENVINO_VERBOSE": "byoc-openvino: 1 prints one line per compile, import and call on stderr",
    # byoc-jetson
    "BYOC_JETSON_CACHE": "byoc-jetson: folder of built TensorRT engines",
}


def get(name: str, default: str | None = "") -> str | None:
    """The variable's value, stripped (``default`` when unset); ``name`` must be in :data:`VARIABLES`."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a documented byoc environment variable (byoc.contract.environment)")
    value = os.environ.get(name)
    return default if value is None else value.strip()


def cache_root() -> Path:
    """byoc's own cache folder: ``BYOC_CACHE_DIR``, else ``~/.cache/byoc``."""
    return Path(get("BYOC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "byoc"))


def num_threads() -> int:
    """``BYOC_NUM_THREADS``, else the cores this process may run on."""
    value = get("BYOC_NUM_THREADS")
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover
        return max(1, os.cpu_count() or 1)


__all__ = ["VARIABLES", "cache_root", "get", "num_threads"]
