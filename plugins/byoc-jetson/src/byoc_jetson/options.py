"""The jetson target's options: defaults, validation, and which runtime path is active.

Options reach the plugin through ``byoc.compile(..., target_options={"jetson": {...}})``; the
core rejects unknown keys, this module rejects bad values (:class:`byoc.errors.OptionError`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, NamedTuple

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
    # ---- issue 20: new options (to move into the typed option schema at merge) ----------------
    # device: int >= 0, default 0. The CUDA device index engines are built and run on
    #   (cudaSetDevice in every thread that builds or runs). MACHINE-LOCAL: taken from the loading
    #   user, never from a bundle.
    "device": 0,
    # profile_shapes: list of {input name: shape} or None, default None. Expected input shapes:
    #   one exact TensorRT optimisation profile each (part of the build recipe and cache key).
    "profile_shapes": None,
    # max_engines: int >= 0, default 4. Extra engines a region may build for shapes beyond every
    #   profile; past that (or when such a build fails) the region runs on the host, with a warning.
    "max_engines": 4,
    # pin_after_runs: int >= 0, default 3. After this many runs a region stages its feeds and
    #   results in pinned (page-locked) host buffers; 0: never.
    "pin_after_runs": 3,
    # ---- end of issue 20 options -------------------------------------------------------------
}

#: options that describe this machine, not the model: a bundle never chooses them
MACHINE_LOCAL = ("cache_dir", "device")

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
    _int_option(opts, "device", 0)
    _int_option(opts, "max_engines", 0)
    _int_option(opts, "pin_after_runs", 0)
    _check_profile_shapes(opts["profile_shapes"])
    if not isinstance(opts["precompile"], bool):
        raise OptionError(f"jetson option 'precompile' must be True or False, got {opts['precompile']!r}")
    cache_dir = opts["cache_dir"]
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise OptionError(f"jetson option 'cache_dir' must be a folder path or None, got {cache_dir!r}")
    return opts


def _check_profile_shapes(value: Any) -> None:
    if value is None:
        return
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(e, Mapping) and e and all(
            isinstance(k, str) and isinstance(v, (list, tuple))
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)
            for k, v in e.items())
        for e in value)
    if not ok:
        raise OptionError("jetson option 'profile_shapes' must be a list of {input name: [dims >= 0]} "
                          f"(one optimisation profile each) or None, got {value!r}")


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


class GpuProbe(NamedTuple):
    """What the machine offers the TensorRT path: ``ok``, else why not and whether that is a fault.

    ``broken`` is True when the libraries are installed but unusable (a driver older than the
    CUDA runtime needs, a tensorrt that does not import): the user probably meant the GPU to
    run, so ``runtime="auto"`` falls back with a warning and ``runtime="tensorrt"`` raises.
    """

    ok: bool
    reason: str = ""
    broken: bool = False


def _cuda_error_name(err: Any) -> str:
    name = getattr(err, "name", None)
    return f"{name} ({int(err)})" if name else str(err)


#: cudaErrorNoDevice: a working driver and runtime, no GPU
_NO_DEVICE = 100


def _probe_gpu() -> GpuProbe:
    try:
        cudart = _cudart()
    except Exception as exc:  # the bindings exist but do not load (wrong driver/toolkit)
        return GpuProbe(False, f"cuda-python is installed but does not load: {exc}", broken=True)
    if cudart is not None:
        try:
            result = cudart.cudaGetDeviceCount()
        except Exception as exc:
            return GpuProbe(False, f"cudaGetDeviceCount raised {type(exc).__name__}: {exc}", broken=True)
        err, count = result[0], result[1]
        if int(err) == _NO_DEVICE:
            return GpuProbe(False, "no CUDA GPU (cudaErrorNoDevice)")
        if int(err) != 0:
            return GpuProbe(False, f"cudaGetDeviceCount failed with {_cuda_error_name(err)}: the NVIDIA driver is "
                                   "missing or older than this cuda-python needs (cuda-python 13 needs driver >= 580; "
                                   "on a CUDA 12 driver install byoc-jetson[cu12])", broken=True)
        if int(count) < 1:
            return GpuProbe(False, "no CUDA GPU (cudaGetDeviceCount returned 0)")
        return GpuProbe(True)
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            if torch.cuda.is_available():
                return GpuProbe(True)
            return GpuProbe(False, "no CUDA GPU visible to torch (and cuda-python is not installed)")
        except Exception as exc:
            return GpuProbe(False, f"torch.cuda raised {type(exc).__name__}: {exc}", broken=True)
    return GpuProbe(False, "neither cuda-python nor torch is installed")


@functools.lru_cache(maxsize=1)
def gpu_probe() -> GpuProbe:
    """The GPU check (cached per process; initialises CUDA, so only called when compiling or running)."""
    return _probe_gpu()


def gpu_available() -> bool:
    """A usable CUDA GPU is visible through cuda-python or torch (whichever is installed)."""
    return gpu_probe().ok


@functools.lru_cache(maxsize=1)
def tensorrt_probe() -> GpuProbe:
    """Whether the TensorRT path can run here: the tensorrt package imports and a GPU is usable."""
    if importlib.util.find_spec("tensorrt") is None:
        return GpuProbe(False, "the tensorrt package is not installed")
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:
        return GpuProbe(False, f"the tensorrt package is installed but does not import: {exc}", broken=True)
    return gpu_probe()


def tensorrt_available() -> bool:
    """The ``tensorrt`` package imports and a usable CUDA GPU is visible."""
    return tensorrt_probe().ok


def reset_probes() -> None:
    """Forget the cached probes (tests that install or remove a fake library call this)."""
    gpu_probe.cache_clear()
    tensorrt_probe.cache_clear()
    _warned.clear()


_warned: set[str] = set()


def runtime_path(options: Mapping[str, Any] | None = None) -> str:
    """``"tensorrt"`` or ``"emulation"``: the path regions compiled with ``options`` run on.

    With ``"auto"``, a machine whose TensorRT/CUDA is installed but broken runs the emulation
    with a ``RuntimeWarning`` (once per reason and process) that says why; the artifact records
    the reason too (``metadata["runtime_note"]``).
    """
    chosen = (options or {}).get("runtime", "auto")
    if chosen == "emulation":
        return "emulation"
    if chosen == "tensorrt":
        return "tensorrt"
    probe = tensorrt_probe()
    if probe.ok:
        return "tensorrt"
    if probe.broken and probe.reason not in _warned:
        _warned.add(probe.reason)
        warnings.warn(f"jetson: TensorRT is installed but cannot run here, so runtime='auto' falls back to the CPU "
                      f"emulation: {probe.reason}", RuntimeWarning, stacklevel=2)
    return "emulation"


def runtime_note(options: Mapping[str, Any] | None = None) -> str:
    """Why ``runtime="auto"`` did not pick TensorRT ("" when it did, or the path was named)."""
    if (options or {}).get("runtime", "auto") != "auto":
        return ""
    probe = tensorrt_probe()
    return "" if probe.ok else probe.reason


def registered_runtime_path() -> str:
    """The runtime path shown at target registration, found without initialising CUDA.

    Registration happens when the plugin registry is built (often before a user's ``fork()``),
    so it only looks for the package: ``"emulation"`` without tensorrt, else ``"auto"`` (TensorRT
    when a GPU answers at the first compile).
    """
    return "emulation" if importlib.util.find_spec("tensorrt") is None else "auto"


__all__ = [
    "DEFAULT_OPTIONS",
    "MACHINE_LOCAL",
    "PRECISIONS",
    "GpuProbe",
    "cache_dir",
    "gpu_available",
    "gpu_probe",
    "option_problem",
    "registered_runtime_path",
    "reset_probes",
    "runtime_note",
    "runtime_path",
    "tensorrt_available",
    "tensorrt_probe",
    "validate_options",
]
