"""The jetson target's options: defaults, validation, and which runtime path is active.

Options reach the plugin through ``byoc.compile(..., target_options={"jetson": {...}})``; the
core rejects unknown keys, this module rejects bad values (:class:`byoc.errors.OptionError`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Mapping

from byoc.errors import OptionError

#: the default options (JSON values only: they travel in bundles)
DEFAULT_OPTIONS: dict[str, Any] = {
    # "fp16" lets TensorRT pick half-precision kernels (BuilderFlag.FP16); "fp32" keeps float32
    "precision": "fp16",
    # builder workspace (IBuilderConfig.set_memory_pool_limit(WORKSPACE, ...)), in bytes
    "workspace": 1 << 30,
    # engine cache folder; None: $BYOC_JETSON_CACHE, else ~/.cache/byoc/jetson
    "cache_dir": None,
    # build the TensorRT engine while compiling instead of on the first run
    "precompile": False,
    # a region needs at least this many nodes (and always at least one Conv/ConvTranspose/Gemm/MatMul)
    "min_subgraph_size": 1,
    # at most this many regions (engines) per model, the first ones in graph order; None: no limit
    "max_regions": None,
    # the optimisation profile's largest batch for regions whose batch dimension is dynamic
    "max_batch_size": 8,
    # "auto": TensorRT when the tensorrt package and a CUDA GPU are present, else "emulation"
    "runtime": "auto",
}

PRECISIONS = ("fp32", "fp16")
RUNTIMES = ("auto", "tensorrt", "emulation")


def _int_option(opts: Mapping[str, Any], key: str, low: int, allow_none: bool = False) -> None:
    value = opts[key]
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        more = " or None" if allow_none else ""
        raise OptionError(f"jetson option {key!r} must be an integer >= {low}{more}, got {value!r}")


def validate_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The full option set (defaults filled in), or :class:`OptionError` naming the bad option."""
    opts = dict(DEFAULT_OPTIONS)
    for key, value in (options or {}).items():
        if key not in DEFAULT_OPTIONS:
            raise OptionError(f"jetson has no option {key!r}; its options: {sorted(DEFAULT_OPTIONS)}")
        opts[key] = value
    if opts["precision"] not in PRECISIONS:
        raise OptionError(f"jetson option 'precision' must be one of {list(PRECISIONS)}, got {opts['precision']!r}")
    if opts["runtime"] not in RUNTIMES:
        raise OptionError(f"jetson option 'runtime' must be one of {list(RUNTIMES)}, got {opts['runtime']!r}")
    _int_option(opts, "workspace", 1 << 20)
    _int_option(opts, "min_subgraph_size", 1)
    _int_option(opts, "max_regions", 1, allow_none=True)
    _int_option(opts, "max_batch_size", 1)
    if not isinstance(opts["precompile"], bool):
        raise OptionError(f"jetson option 'precompile' must be True or False, got {opts['precompile']!r}")
    cache_dir = opts["cache_dir"]
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise OptionError(f"jetson option 'cache_dir' must be a folder path or None, got {cache_dir!r}")
    return opts


@functools.lru_cache(maxsize=64)
def _validate_cached(frozen: str) -> str | None:
    try:
        validate_options(json.loads(frozen))
    except OptionError as exc:
        return str(exc)
    return None


def option_problem(options: Mapping[str, Any] | None) -> str | None:
    """The validation error message for ``options``, or ``None`` (cached: support checks call this per node)."""
    try:
        frozen = json.dumps(dict(options or {}), sort_keys=True, default=str)
    except TypeError as exc:  # pragma: no cover - default=str makes everything serialisable
        return f"jetson options are not JSON values: {exc}"
    return _validate_cached(frozen)


def cache_dir(options: Mapping[str, Any]) -> Path:
    """The engine cache folder the options select."""
    chosen = options.get("cache_dir")
    if chosen:
        return Path(chosen)
    env = os.environ.get("BYOC_JETSON_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "byoc" / "jetson"


# -- which runtime path is active -------------------------------------------------------------


def _cudart():
    """The CUDA runtime bindings of ``cuda-python`` (either module layout), or ``None``."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6

        return cudart
    except ImportError:
        pass
    try:
        from cuda import cudart  # older cuda-python

        return cudart
    except ImportError:
        return None


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """A CUDA GPU is visible through cuda-python or torch (whichever is installed)."""
    cudart = _cudart()
    if cudart is not None:
        try:
            err, count = cudart.cudaGetDeviceCount()
            if int(err) == 0 and count > 0:
                return True
        except Exception:
            pass
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            return bool(torch.cuda.is_available())
        except Exception:
            return False
    return False


@functools.lru_cache(maxsize=1)
def tensorrt_available() -> bool:
    """The ``tensorrt`` package is installed and a CUDA GPU is visible."""
    if importlib.util.find_spec("tensorrt") is None:
        return False
    return gpu_available()


def runtime_path(options: Mapping[str, Any] | None = None) -> str:
    """``"tensorrt"`` or ``"emulation"``: the path regions compiled with ``options`` run on."""
    chosen = (options or {}).get("runtime", "auto")
    if chosen == "emulation":
        return "emulation"
    if chosen == "tensorrt":
        return "tensorrt"
    return "tensorrt" if tensorrt_available() else "emulation"


__all__ = [
    "DEFAULT_OPTIONS",
    "PRECISIONS",
    "cache_dir",
    "gpu_available",
    "option_problem",
    "runtime_path",
    "tensorrt_available",
    "validate_options",
]
