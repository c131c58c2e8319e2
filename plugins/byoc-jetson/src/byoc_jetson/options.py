"""The jetson target's options: declarations, and which runtime path is active.

Options reach the plugin through ``byoc.compile(..., target_options={"jetson": {...}})``; byoc
validates them against :data:`OPTIONS` (unknown keys and bad values raise
:class:`byoc.OptionError`) and hands every hook the full set, defaults filled in.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from byoc.contract import environment as _env
from byoc.contract import Option, Target, option_defaults, resolve_options

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
    Option("device", 0, type=int, minimum=0, machine_local=True,
           doc="the CUDA device index engines are built and run on (cudaSetDevice in every thread that builds or runs)"),
    Option("profile_shapes", None, type=list, check=lambda v: _profile_shapes_problem(v),
           doc="expected input shapes, a list of {input name: shape}: one exact TensorRT optimisation profile each"),
    Option("max_engines", 4, type=int, minimum=0,
           doc="extra engines a region may build for shapes beyond every profile; past that the region runs on the host"),
    Option("pin_after_runs", 3, type=int, minimum=0,
           doc="after this many runs a region stages feeds and results in pinned host buffers; 0: never"),
]

#: ``{name: default}``
DEFAULT_OPTIONS: dict[str, Any] = option_defaults(OPTIONS)

PRECISIONS = ("fp32", "fp16")
RUNTIMES = ("auto", "tensorrt", "emulation")


def validate_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The full option set (defaults filled in), validated as byoc does (:class:`byoc.OptionError`).

    Hooks receive options byoc already validated; this is for code and tests that call the
    plugin's pieces directly.
    """
    return resolve_options(Target("jetson", options=OPTIONS), options)


def _profile_shapes_problem(value: Any) -> str | None:
    ok = all(
        isinstance(e, Mapping) and e and all(
            isinstance(k, str) and isinstance(v, (list, tuple))
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)
            for k, v in e.items())
        for e in value)
    return None if ok else "must be a list of {input name: [dims >= 0]} (one optimisation profile each)"


def cache_dir(options: Mapping[str, Any]) -> Path:
    """The engine cache folder the options select."""
    chosen = options.get("cache_dir")
    if chosen:
        return Path(chosen)
    env = _env.get("BYOC_JETSON_CACHE", None)
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
    "PRECISIONS",
    "GpuProbe",
    "cache_dir",
    "gpu_available",
    "gpu_probe",
    "registered_runtime_path",
    "reset_probes",
    "runtime_note",
    "runtime_path",
    "tensorrt_available",
    "tensorrt_probe",
    "validate_options",
]
