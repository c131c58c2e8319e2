"""The TensorRT path: build an engine from the region's ONNX, cache it, run it on the GPU.

Everything GPU-related is imported lazily (``tensorrt``, ``cuda-python`` or ``torch``), so this
module imports on any machine, and nothing touches CUDA before a region is compiled or run.
It follows the TensorRT 10 and 11 Python APIs:

* build: ``Builder`` -> ``create_network(0)`` -> ``OnnxParser.parse`` ->
  ``BuilderConfig.set_memory_pool_limit(WORKSPACE, ...)`` -> optimisation profiles
  (``create_optimization_profile``/``set_shape``/``add_optimization_profile``) ->
  ``build_serialized_network``. Precision fp16: TensorRT 10 builds a weakly typed network with
  ``BuilderFlag.FP16``; TensorRT 11 removed that flag and every network is strongly typed, so
  the parser gets the region in float16 (:func:`byoc_jetson.codegen.fp16_network`). fp32
  clears ``BuilderFlag.TF32`` where it exists.
* run: ``Runtime.deserialize_cuda_engine`` -> ``create_execution_context`` -> (checked I/O
  modes) -> ``set_optimization_profile_async`` / ``set_input_shape`` / ``set_tensor_address``
  -> ``execute_async_v3(stream)``, with device buffers, pinned host buffers and a stream from
  cuda-python (``cudart``, whose calls return ``(err, value...)`` tuples) or, failing that, torch.

Every thread that builds or runs calls ``cudaSetDevice(device)`` first (option ``device``).
Engines are kept in the :class:`~byoc_jetson.cache.EngineCache`; one the runtime refuses is
evicted and rebuilt. :func:`get_backend` is the one seam to the library: tests swap the
``tensorrt`` and ``cuda`` modules for a test double (``tests/fake_trt``).
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from byoc.contract import Artifact, ByocError, InputError
from byoc_jetson.cache import EngineCache, EngineKey
from byoc_jetson.codegen import (
    ProfileError,
    builder_config,
    fp16_network,
    optimisation_profiles,
    profile_covers,
    subgraph_hash,
)
from byoc_jetson.options import _cudart, cache_dir, tensorrt_probe


class TensorRTError(ByocError, RuntimeError):
    """TensorRT or CUDA refused something, or is unusable here; the message says what."""


# -- device memory: cuda-python first, torch second -------------------------------------------


class _CudartMemory:
    """Device buffers, pinned host buffers and streams through cuda-python's runtime API."""

    def __init__(self, cudart: Any):
        self.rt = cudart
        self._local = threading.local()

    def _check(self, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            raise TensorRTError(f"{what} failed: {name} ({int(err)})")
        if isinstance(result, tuple) and len(result) > 1:
            return result[1]
        return None

    def set_device(self, device: int) -> None:
        # the current device is per thread: every building or running thread sets it
        if getattr(self._local, "device", None) != device:
            self._check(self.rt.cudaSetDevice(int(device)), f"cudaSetDevice({device})")
            self._local.device = device

    def new_stream(self) -> Any:
        return self._check(self.rt.cudaStreamCreate(), "cudaStreamCreate")

    def destroy_stream(self, stream: Any) -> None:
        self._check(self.rt.cudaStreamDestroy(stream), "cudaStreamDestroy")

    def handle(self, stream: Any) -> int:
        return int(stream)

    def alloc(self, nbytes: int) -> int:
        return int(self._check(self.rt.cudaMalloc(max(int(nbytes), 1)), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self._check(self.rt.cudaFree(ptr), "cudaFree")

    def alloc_host(self, nbytes: int) -> tuple[int, np.ndarray]:
        """A pinned host buffer: (pointer, a uint8 numpy view of it)."""
        ptr = int(self._check(self.rt.cudaMallocHost(max(int(nbytes), 1)), "cudaMallocHost"))
        view = np.ctypeslib.as_array((ctypes.c_ubyte * max(int(nbytes), 1)).from_address(ptr))
        return ptr, view

    def free_host(self, ptr: int) -> None:
        self._check(self.rt.cudaFreeHost(ptr), "cudaFreeHost")

    def to_device(self, ptr: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes:
            kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
            self._check(self.rt.cudaMemcpyAsync(ptr, src, nbytes, kind, stream), "cudaMemcpyAsync H2D")

    def to_host(self, dst: int, ptr: int, nbytes: int, stream: Any) -> None:
        if nbytes:
            kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
            self._check(self.rt.cudaMemcpyAsync(dst, ptr, nbytes, kind, stream), "cudaMemcpyAsync D2H")

    def synchronize(self, stream: Any) -> None:
        self._check(self.rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def device_count(self) -> int:
        return int(self._check(self.rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))

    def properties(self, device: int) -> tuple[str, str]:
        """(device name, compute capability) of ``device``."""
        prop = self._check(self.rt.cudaGetDeviceProperties(int(device)), f"cudaGetDeviceProperties({device})")
        name = prop.name
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).split(b"\0", 1)[0].decode("utf-8", "replace")
        return str(name).strip(), f"{int(prop.major)}.{int(prop.minor)}"


class _TorchMemory:  # pragma: no cover - needs torch with CUDA; the cudart path is the tested one
    """Device buffers, pinned host buffers and a stream through torch (when cuda-python is missing)."""

    def __init__(self, torch: Any):
        self.torch = torch
        self._tensors: dict[int, Any] = {}

    def set_device(self, device: int) -> None:
        self.torch.cuda.set_device(int(device))

    def new_stream(self) -> Any:
        return self.torch.cuda.Stream()

    def destroy_stream(self, stream: Any) -> None:
        pass  # torch owns its streams

    def handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def alloc(self, nbytes: int) -> int:
        t = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, device="cuda")
        ptr = int(t.data_ptr())
        self._tensors[ptr] = t
        return ptr

    def free(self, ptr: int) -> None:
        self._tensors.pop(ptr, None)

    def alloc_host(self, nbytes: int) -> tuple[int, np.ndarray]:
        t = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, pin_memory=True)
        ptr = int(t.data_ptr())
        self._tensors[ptr] = t
        return ptr, t.numpy()

    def free_host(self, ptr: int) -> None:
        self._tensors.pop(ptr, None)

    def _host(self, ptr: int, nbytes: int) -> Any:
        arr = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))
        return self.torch.from_numpy(arr)

    def to_device(self, ptr: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes:
            with self.torch.cuda.stream(stream):
                self._tensors[ptr][:nbytes].copy_(self._host(src, nbytes), non_blocking=True)

    def to_host(self, dst: int, ptr: int, nbytes: int, stream: Any) -> None:
        if nbytes:
            with self.torch.cuda.stream(stream):
                self._host(dst, nbytes).copy_(self._tensors[ptr][:nbytes], non_blocking=True)

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def device_count(self) -> int:
        return int(self.torch.cuda.device_count())

    def properties(self, device: int) -> tuple[str, str]:
        prop = self.torch.cuda.get_device_properties(int(device))
        return str(prop.name), f"{prop.major}.{prop.minor}"


def device_memory() -> _CudartMemory | _TorchMemory:
    cudart = _cudart()
    if cudart is not None:
        return _CudartMemory(cudart)
    try:
        import torch
    except ImportError:
        raise TensorRTError("device buffers need cuda-python (pip install 'byoc-jetson[cu12]') or torch") from None
    return _TorchMemory(torch)  # pragma: no cover - needs torch


# -- the TensorRT library -----------------------------------------------------------------------


class TensorRTBackend:
    """The TensorRT library (10 or 11): version, GPU, engine building and loading."""

    def __init__(self) -> None:
        probe = tensorrt_probe()
        if not probe.ok:
            raise TensorRTError(f"jetson runtime='tensorrt' cannot run here: {probe.reason}")
        import tensorrt as trt

        self.trt = trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        self._memory: Any = None
        self._props: dict[int, tuple[str, str]] = {}

    @property
    def memory(self) -> Any:
        if self._memory is None:
            self._memory = device_memory()
        return self._memory

    def version(self) -> str:
        return str(self.trt.__version__)

    @property
    def strongly_typed(self) -> bool:
        """TensorRT 11 and later: no precision builder flags, the network's types decide."""
        return not hasattr(self.trt.BuilderFlag, "FP16")

    def _device(self, device: int) -> tuple[str, str]:
        if device not in self._props:
            count = self.memory.device_count()
            if not 0 <= device < count:
                raise TensorRTError(f"jetson option 'device' is {device}, but this machine has {count} CUDA device(s)")
            self._props[device] = self.memory.properties(device)
        return self._props[device]

    def device_name(self, device: int = 0) -> str:
        return self._device(device)[0]

    def compute_capability(self, device: int = 0) -> str:
        return self._device(device)[1]

    def build(self, onnx_bytes: bytes, config: Mapping[str, Any], device: int = 0,
              extra_shapes: Sequence[Mapping[str, Sequence[int]]] = ()) -> bytes:
        """Parse the region's ONNX and build a serialised engine with ``config`` on ``device``."""
        trt = self.trt
        self.memory.set_device(device)  # the builder targets the calling thread's current device
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)
        fp16 = config["precision"] == "fp16"
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse(fp16_network(onnx_bytes) if fp16 and self.strongly_typed else onnx_bytes):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TensorRTError(f"TensorRT's ONNX parser rejected the region: {errors}")
        bconf = builder.create_builder_config()
        bconf.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(config["workspace"]))
        if fp16 and not self.strongly_typed:
            bconf.set_flag(trt.BuilderFlag.FP16)
        elif not fp16 and hasattr(trt.BuilderFlag, "TF32"):
            # fp32 means float32 arithmetic: no TF32 tensor-core shortcut (on by default on Ampere and later)
            bconf.clear_flag(trt.BuilderFlag.TF32)
        inputs = []
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            inputs.append((tensor.name, [int(d) for d in tensor.shape]))
        try:
            profiles = optimisation_profiles(inputs, config, extra_shapes)
        except ProfileError as exc:
            raise TensorRTError(f"no optimisation profile for the region: {exc}") from None
        for shapes in profiles:
            profile = builder.create_optimization_profile()
            for name, (lo, opt, hi) in shapes.items():
                profile.set_shape(name, lo, opt, hi)
            if bconf.add_optimization_profile(profile) < 0:
                raise TensorRTError(f"TensorRT refused the optimisation profile {shapes}")
        serialized = builder.build_serialized_network(network, bconf)
        if serialized is None:
            raise TensorRTError("TensorRT could not build an engine for the region (see the TensorRT log)")
        return bytes(serialized)

    def load(self, engine: bytes, input_names: Sequence[str], output_names: Sequence[str], device: int = 0,
             pin_after_runs: int = 0) -> "TensorRTRunner":
        return TensorRTRunner(self, engine, input_names, output_names, device, pin_after_runs)


def _name(value: Any) -> str:
    return str(getattr(value, "name", value))


class EngineRefused(TensorRTError):
    """The TensorRT runtime would not deserialise an engine (built elsewhere, or damaged)."""


class TensorRTRunner:
    """One deserialised engine with its execution context, device buffers and stream."""

    def __init__(self, backend: TensorRTBackend, engine: bytes, input_names: Sequence[str],
                 output_names: Sequence[str], device: int = 0, pin_after_runs: int = 0):
        trt = backend.trt
        self.memory = backend.memory
        self.device = int(device)
        self.memory.set_device(self.device)
        self.runtime = trt.Runtime(backend.logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine)
        if self.engine is None:
            raise EngineRefused("TensorRT could not deserialise the engine (see the TensorRT log)")
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        modes = {}
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            modes[name] = self.engine.get_tensor_mode(name)
        for names, mode in ((self.input_names, trt.TensorIOMode.INPUT), (self.output_names, trt.TensorIOMode.OUTPUT)):
            for name in names:
                if name not in modes:
                    raise TensorRTError(f"the engine has no tensor {name!r} (its tensors: {sorted(modes)})")
                if modes[name] != mode:
                    raise TensorRTError(f"engine tensor {name!r} is {_name(modes[name])}, expected {_name(mode)}")
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in modes}
        self.profiles = self._read_profiles()
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise TensorRTError("TensorRT could not create an execution context (out of device memory?)")
        self.stream: Any = self.memory.new_stream()
        self.profile = 0
        self.pin_after_runs = int(pin_after_runs)
        self.runs = 0
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (capacity, device pointer)
        self._pinned: dict[str, tuple[int, int, np.ndarray]] = {}  # name -> (capacity, pointer, view)
        self._lock = threading.Lock()  # an execution context runs one inference at a time
        self.closed = False

    def _read_profiles(self) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
        out = []
        for p in range(int(self.engine.num_optimization_profiles)):
            shapes = {}
            for name in self.input_names:
                if any(int(d) < 0 for d in self.engine.get_tensor_shape(name)):
                    lo, opt, hi = self.engine.get_tensor_profile_shape(name, p)
                    shapes[name] = (tuple(map(int, lo)), tuple(map(int, opt)), tuple(map(int, hi)))
            out.append(shapes)
        return out

    def covers(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        """The index of the first profile that admits ``shapes`` (-1: no profile needed), else None."""
        static = True
        for name in self.input_names:
            dims = tuple(int(d) for d in self.engine.get_tensor_shape(name))
            s = shapes[name]
            if len(dims) != len(s) or any(d >= 0 and d != x for d, x in zip(dims, s)):
                return None
            static = static and all(d >= 0 for d in dims)
        if static:
            return -1
        for i, profile in enumerate(self.profiles):
            if profile_covers(profile, shapes):
                return i
        return None

    def _buffer(self, name: str, nbytes: int) -> int:
        capacity, ptr = self._buffers.get(name, (0, 0))
        if nbytes > capacity or not ptr:
            if ptr:
                self.memory.free(ptr)
                del self._buffers[name]
            ptr = self.memory.alloc(nbytes)
            self._buffers[name] = (max(nbytes, 1), ptr)
        return ptr

    def _staging(self, name: str, nbytes: int) -> tuple[int, np.ndarray]:
        capacity, ptr, view = self._pinned.get(name, (0, 0, np.empty(0, np.uint8)))
        if nbytes > capacity or not ptr:
            if ptr:
                self.memory.free_host(ptr)
                del self._pinned[name]
            ptr, view = self.memory.alloc_host(nbytes)
            self._pinned[name] = (max(nbytes, 1), ptr, view)
        return ptr, view[:nbytes]

    def feed(self, name: str, x: Any) -> np.ndarray:
        """``x`` as the engine's dtype for input ``name``: as is, or converted only when lossless."""
        arr = np.asarray(x)
        want = self.dtypes[name]
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, "safe"):
                with np.errstate(all="ignore"):
                    conv = arr.astype(want)
                    back = conv.astype(arr.dtype)
                same = back == arr
                if arr.dtype.kind in "fc":
                    same |= np.isnan(arr) & np.isnan(back)
                if not np.all(same):
                    raise InputError(f"jetson region input {name!r}: the engine takes {want}, the feed is "
                                     f"{arr.dtype} and does not convert exactly (cast it first)")
                arr = conv
            else:
                arr = arr.astype(want)
        # not np.ascontiguousarray: that makes a 0-d (scalar) input 1-d
        return arr if arr.flags.c_contiguous else arr.copy(order="C")

    def __call__(self, *inputs: Any, profile: int = 0) -> list[np.ndarray]:
        if len(inputs) != len(self.input_names):
            raise TensorRTError(f"expected {len(self.input_names)} inputs, got {len(inputs)}")
        feeds = [self.feed(name, x) for name, x in zip(self.input_names, inputs)]
        with self._lock:
            if self.closed:
                raise TensorRTError("the TensorRT runner is closed")
            self.memory.set_device(self.device)
            stream = self.memory.handle(self.stream)
            if profile >= 0 and profile != self.profile:
                if not self.context.set_optimization_profile_async(profile, stream):
                    raise TensorRTError(f"TensorRT refused optimisation profile {profile}")
                self.profile = profile
            self.runs += 1
            pinned = self.pin_after_runs > 0 and self.runs > self.pin_after_runs
            staged = []
            for name, arr in zip(self.input_names, feeds):
                if not self.context.set_input_shape(name, tuple(arr.shape)):
                    raise TensorRTError(f"input {name!r}: shape {list(arr.shape)} is outside the engine's profile")
                ptr = self._buffer(name, arr.nbytes)
                if pinned:
                    src, view = self._staging(name, arr.nbytes)
                    view[...] = arr.reshape(-1).view(np.uint8)
                else:
                    src = arr.ctypes.data
                self.memory.to_device(ptr, src, arr.nbytes, self.stream)
                if not self.context.set_tensor_address(name, ptr):
                    raise TensorRTError(f"TensorRT refused the address of input {name!r}")
                staged.append(arr)  # alive until the stream is synchronised
            outputs = []
            for name in self.output_names:
                shape = tuple(int(d) for d in self.context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise TensorRTError(f"output {name!r} has a data-dependent shape {list(shape)}; not supported")
                host = np.empty(shape, dtype=self.dtypes[name])
                ptr = self._buffer(name, host.nbytes)
                if not self.context.set_tensor_address(name, ptr):
                    raise TensorRTError(f"TensorRT refused the address of output {name!r}")
                outputs.append((name, host, ptr))
            if not self.context.execute_async_v3(stream):
                raise TensorRTError("execute_async_v3 failed (see the TensorRT log)")
            views = []
            for name, host, ptr in outputs:
                if pinned:
                    dst, view = self._staging(name, host.nbytes)
                    views.append(view)
                else:
                    dst = host.ctypes.data
                    views.append(None)
                self.memory.to_host(dst, ptr, host.nbytes, self.stream)
            self.memory.synchronize(self.stream)
            del staged
            for (_, host, _), view in zip(outputs, views):
                if view is not None:
                    host.reshape(-1).view(np.uint8)[...] = view
            return [host for _, host, _ in outputs]

    def close(self) -> None:
        """Free the device and pinned buffers and destroy the stream (idempotent)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.memory.set_device(self.device)
            for _, ptr in self._buffers.values():
                self.memory.free(ptr)
            for _, ptr, _ in self._pinned.values():
                self.memory.free_host(ptr)
            self._buffers.clear()
            self._pinned.clear()
            self.context = None
            self.memory.destroy_stream(self.stream)

    def __del__(self) -> None:
        if getattr(self, "_lock", None) is not None and not self.closed:
            try:
                self.close()
            except Exception:
                pass


_backend: TensorRTBackend | None = None
_backend_lock = threading.Lock()


def get_backend() -> TensorRTBackend:
    """The process-wide backend (tests reset ``_backend`` after swapping the library)."""
    global _backend
    with _backend_lock:
        if _backend is None:
            _backend = TensorRTBackend()
        return _backend


class TensorRTRegion:
    """The callable byoc runs for one region on the TensorRT path.

    The engine for the region's profiles comes from the cache (built on a miss) at
    construction when the option ``precompile`` is set, else on the first call. A feed whose
    shapes no profile admits gets an engine of its own (exact profile, cached too), up to
    ``max_engines`` of them; past that, or when such a build fails, that call runs on the host
    (byoc's kernels on the region's ONNX), with a warning the first time.
    """

    runtime_path = "tensorrt"

    def __init__(self, artifact: Artifact, options: Mapping[str, Any], backend: Any = None,
                 cache: EngineCache | None = None):
        self.data = artifact.data
        self.name = str(artifact.metadata.get("region", "")) or "region"
        self.input_names = list(artifact.metadata.get("inputs", []))
        self.output_names = list(artifact.metadata.get("outputs", []))
        self.config = builder_config(options)
        self.device = int(options.get("device", 0))
        self.max_engines = int(options.get("max_engines", 4))
        self.pin_after_runs = int(options.get("pin_after_runs", 0))
        self.backend = backend if backend is not None else get_backend()
        self.cache = cache if cache is not None else EngineCache(cache_dir(options))
        self.key = self._key(())
        self.runners: list[Any] = []
        self.extra_shapes: list[dict[str, list[int]]] = []
        self._host: Any = None
        self._warned = False
        self._lock = threading.Lock()
        if options.get("precompile"):
            try:
                self.prepare()
            except TensorRTError as exc:
                if "no optimisation profile" not in str(exc):
                    raise
                # dynamic dimensions beyond the batch and no expected shape: built at the first run

    def _key(self, extra: Sequence[Mapping[str, Sequence[int]]]) -> EngineKey:
        config = dict(self.config)
        if extra:
            config["extra_shapes"] = [dict(e) for e in extra]
        return EngineKey.make(subgraph_hash(self.data), self.backend.version(),
                              self.backend.compute_capability(self.device), self.config["precision"], config,
                              device_name=self.backend.device_name(self.device))

    def _engine(self, extra: Sequence[Mapping[str, Sequence[int]]]) -> Any:
        """Load (or build and store) the engine for ``extra`` shapes; a refused cached engine is rebuilt."""
        key = self._key(extra)

        def build() -> bytes:
            return self.backend.build(self.data, self.config, self.device, extra)

        engine, cached = self.cache.get_or_build(key, build)
        try:
            return self.backend.load(engine, self.input_names, self.output_names, self.device, self.pin_after_runs)
        except EngineRefused:
            if not cached:
                raise
        # it passed the cache's hash checks yet TensorRT refused it: evict, rebuild, store
        self.cache.evict(key)
        engine, _ = self.cache.get_or_build(key, build)
        return self.backend.load(engine, self.input_names, self.output_names, self.device, self.pin_after_runs)

    def prepare(self) -> None:
        """Load the engine for the region's profiles from the cache, building it on a miss."""
        with self._lock:
            if not self.runners:
                self.runners.append(self._engine(()))

    def _runner_for(self, shapes: dict[str, tuple[int, ...]]) -> tuple[Any, int] | None:
        for runner in self.runners:
            index = runner.covers(shapes)
            if index is not None:
                return runner, index
        return None

    def _fallback(self, shapes: Mapping[str, tuple[int, ...]], why: str) -> Any:
        if not self._warned:
            self._warned = True
            warnings.warn(f"jetson region {self.name!r}: input shapes {dict(shapes)} run on the host ({why})",
                          RuntimeWarning, stacklevel=3)
        if self._host is None:
            from byoc_jetson.emulation import EmulatedRegion

            try:
                self._host = EmulatedRegion(self.data, "fp32")
            except Exception as exc:
                raise TensorRTError(f"jetson region {self.name!r}: {why}, and the host cannot run it: {exc}") from exc
        return self._host

    def __call__(self, *inputs: Any) -> list[np.ndarray]:
        shapes = {n: tuple(np.shape(x)) for n, x in zip(self.input_names, inputs)}
        with self._lock:
            if not self.runners:
                try:
                    self.runners.append(self._engine(()))
                except TensorRTError as exc:
                    if "no optimisation profile" not in str(exc):
                        raise
            found = self._runner_for(shapes)
            if found is None:
                if len(self.extra_shapes) >= self.max_engines:
                    host = self._fallback(shapes, f"beyond every optimisation profile and max_engines="
                                                  f"{self.max_engines} extra engines")
                    return list(host(*inputs))
                extra = self.extra_shapes + [{n: list(s) for n, s in shapes.items()}]
                try:
                    runner = self._engine(extra[-1:])
                except TensorRTError as exc:
                    return list(self._fallback(shapes, f"no engine for these shapes: {exc}")(*inputs))
                self.extra_shapes = extra
                self.runners.append(runner)
                found = self._runner_for(shapes)
                if found is None:
                    return list(self._fallback(shapes, "the engine built for these shapes does not admit them")(*inputs))
        runner, profile = found
        return list(runner(*inputs, profile=profile))

    def close(self) -> None:
        for runner in self.runners:
            runner.close()
        self.runners = []


__all__ = [
    "EngineRefused",
    "TensorRTBackend",
    "TensorRTError",
    "TensorRTRegion",
    "TensorRTRunner",
    "get_backend",
]
