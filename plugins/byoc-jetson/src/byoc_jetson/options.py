"""The jetson target's options: declarations, and which runtime path is active.

Options reach the plugin through ``byoc.compile(..., target_options={"jetson": {...}})``; byoc
validates them against :data:`OPTIONS` (unknown keys and bad values raise
:class:`byoc.OptionError`) and hands every hook the full set, defaults filled in.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any, Mapping

from byoc.contract import Option, Target, resolve_options

#: the declared options (JSON values only: they travel in bundles)
OPTIONS = [
    Option("precision", "fp16", choices=("fp32", "fp16"),
           doc='"fp16" lets TensorRT pick half-precision kernels (BuilderFlag.FP16); "fp32" keeps float32'),
    Option("workspace", 1 << 30, type=int, minimum=1 << 20,
           doc="builder workspace (IBuilderConfig.set_memory_pool_limit(WORKSPACE, ...)), in bytes"),
    Option("cache_dir", None, type=str, machine_local=True,
           doc="engine cache folder; None: $BYOC_JETSON_CACHE, else ~/.cache/byoc/jetson"),
    Option("precompile", False, type=bool, doc="build the TensorRT engine while compiling instead of on the first run"),
    Option("min_subgraph_size", 1, type=int, minimum=1,
           doc="a region needs at least this many nodes (and always a Conv/ConvTranspose/Gemm/MatMul)"),
    Option("max_regions", None, type=int, minimum=1,
           doc="at most this many regions (engines) per graph, the first ones in graph order; None: no limit"),
    Option("max_batch_size", 8, type=int, minimum=1,
           doc="the optimisation profile's largest batch for regions whose batch dimension is dynamic"),
    Option("runtime", "auto", choices=("auto", "tensorrt", "emulation"),
           doc='"auto": TensorRT when the tensorrt package and a CUDA GPU are present, else "emulation"'),
]

#: ``{name: default}``
DEFAULT_OPTIONS: dict[str, Any] = {o.name: o.default for o in OPTIONS}

PRECISIONS = ("fp32", "fp16")
RUNTIMES = ("auto", "tensorrt", "emulation")


def validate_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The full option set (defaults filled in), validated as byoc does (:class:`byoc.OptionError`).

    Hooks receive options byoc already validated; this is for code and tests that call the
    plugin's pieces directly.
    """
    return resolve_options(Target("jetson", options=OPTIONS), options)


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
    "runtime_path",
    "tensorrt_available",
    "validate_options",
]
