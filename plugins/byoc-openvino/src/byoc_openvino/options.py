"""The ``openvino`` target's options, and what they become in OpenVINO's own properties.

byoc validates ``byoc.compile(..., target_options={"openvino": {...}})`` (and a bundle's options)
against :data:`OPTIONS` and hands every hook the full set, defaults filled in. Machine-local
options (``device``, ``threads``, ``cache_dir``) are never taken from a bundle: the loading user's
(or the defaults) apply, so a bundle compiled for a GPU runs on a machine without one (the blob is
then recompiled for the local device, see :mod:`byoc_openvino.runtime`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Mapping

from byoc.contract.folders import ensure_private
from byoc.contract import environment as _env
from byoc.contract import Option, Target, option_defaults, resolve_options

DEVICES = ("CPU", "GPU", "NPU", "AUTO")
PRECISIONS = ("f32", "bf16", "f16")
HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")

OPTIONS = [
    Option("device", "CPU", choices=DEVICES, machine_local=True,
           doc='the OpenVINO device regions compile for; "AUTO": the first of GPU, NPU, CPU this machine has'),
    Option("precision", "f32", choices=PRECISIONS,
           doc="INFERENCE_PRECISION_HINT: f32 (default; OpenVINO's own default is bf16 on CPUs with AMX), bf16 or f16"),
    Option("threads", None, type=int, minimum=1, machine_local=True,
           doc="INFERENCE_NUM_THREADS; None: $BYOC_NUM_THREADS, else os.cpu_count()"),
    Option("performance_hint", "LATENCY", choices=HINTS,
           doc="PERFORMANCE_HINT: LATENCY (one stream: byoc runs a region per call) or THROUGHPUT"),
    Option("cache_dir", None, type=str, machine_local=True,
           doc="where compiled blobs are cached by region and settings (None: $BYOC_OPENVINO_CACHE, else "
               "~/.cache/byoc/openvino; \"\": no cache); must belong to this user and not be group/other-writable"),
]

#: ``{name: default}``
DEFAULTS: dict[str, Any] = option_defaults(OPTIONS)


def validate_options(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The full option set (defaults filled in), validated as byoc does (for tests and tools that
    call the plugin's pieces directly; hooks get validated options)."""
    return resolve_options(Target("openvino", options=OPTIONS), options)


def threads(options: Mapping[str, Any]) -> int:
    """The thread count: the option, else ``$BYOC_NUM_THREADS``, else the usable cores."""
    chosen = options.get("threads")
    if chosen:
        return int(chosen)
    return _env.num_threads()


def compile_config(options: Mapping[str, Any], device: str) -> dict[str, Any]:
    """OpenVINO properties for ``compile_model`` / ``import_model`` on ``device``."""
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": str(options.get("performance_hint", "LATENCY")),
        "INFERENCE_PRECISION_HINT": str(options.get("precision", "f32")),
    }
    if device == "CPU":
        config["INFERENCE_NUM_THREADS"] = threads(options)
        # byoc's own pool runs the host's and byoc-cpu's regions on the same cores: OpenVINO must
        # not pin its threads to cores nor reserve them (it takes turns, region by region)
        config["ENABLE_CPU_PINNING"] = False
        if options.get("performance_hint", "LATENCY") == "LATENCY":
            config["NUM_STREAMS"] = 1
    return config


def portable_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that decide what a compiled blob computes (recorded in the artifact)."""
    return {"precision": options.get("precision", "f32"), "performance_hint": options.get("performance_hint", "LATENCY")}


# -- the blob cache folder ------------------------------------------------------------------------


def cache_dir(options: Mapping[str, Any]) -> Path | None:
    """The blob cache folder the options select, or ``None`` for no cache (``cache_dir=""``)."""
    chosen = options.get("cache_dir")
    if chosen is None:
        chosen = _env.get("BYOC_OPENVINO_CACHE", None)
        if chosen is None:
            return Path.home() / ".cache" / "byoc" / "openvino"
    if not str(chosen).strip():
        return None
    return Path(os.path.expanduser(str(chosen)))


_warned: set[str] = set()


def usable_cache_dir(options: Mapping[str, Any]) -> Path | None:
    """The cache folder if it is safe (made with mode 0700 when missing), else ``None`` with a
    ``RuntimeWarning`` (once per folder and reason): the plugin then compiles without a cache."""
    folder = cache_dir(options)
    if folder is None:
        return None
    try:
        ensure_private(folder)  # blobs are handed to OpenVINO's importer: a folder only this user can write
        return folder
    except OSError as exc:
        why = f"{folder}: {exc}"
        if why not in _warned:
            _warned.add(why)
            warnings.warn(f"byoc-openvino: cache folder {str(folder)!r} is not used ({exc}); blobs are not cached",
                          RuntimeWarning, stacklevel=3)
        return None


__all__ = ["DEFAULTS", "DEVICES", "HINTS", "OPTIONS", "PRECISIONS", "cache_dir",
           "compile_config", "portable_config", "threads", "usable_cache_dir", "validate_options"]
