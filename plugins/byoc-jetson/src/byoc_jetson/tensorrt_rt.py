"""The TensorRT path: build an engine from the region's ONNX, cache it, run it on the GPU.

Everything GPU-related is imported lazily (``tensorrt``, ``cuda-python`` or ``torch``), so this
module imports on any machine. It uses the TensorRT 10 Python API:

* build: ``Builder`` -> ``create_network(0)`` (explicit batch is the only mode in TensorRT 10)
  -> ``OnnxParser.parse`` -> ``BuilderConfig.set_memory_pool_limit(WORKSPACE, ...)``,
  ``BuilderFlag.FP16`` for precision fp16, an optimisation profile when the batch dimension is
  dynamic -> ``build_serialized_network``;
* run: ``Runtime.deserialize_cuda_engine`` -> ``create_execution_context`` ->
  ``set_input_shape``/``set_tensor_address`` per I/O tensor -> ``execute_async_v3(stream)``,
  with device buffers from cuda-python (``cudart``) or, failing that, torch.

Engines are kept in the :class:`~byoc_jetson.cache.EngineCache` under a key made of the
subgraph hash, the TensorRT version, the GPU's compute capability, the precision and the builder
options. :class:`TensorRTBackend` is the one seam to the library: tests swap it for a fake.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from byoc.contract import Artifact
from byoc_jetson.cache import EngineCache, EngineKey
from byoc_jetson.codegen import builder_config, subgraph_hash
from byoc_jetson.options import _cudart, cache_dir


class TensorRTError(RuntimeError):
    """TensorRT or CUDA refused something; the message says what."""


# -- device memory: cuda-python first, torch second -------------------------------------------


class _CudartMemory:
    """Device buffers and a stream through cuda-python's runtime API."""

    def __init__(self, cudart: Any):
        self.rt = cudart

    def _check(self, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise TensorRTError(f"{what} failed: {err}")
        if isinstance(result, tuple) and len(result) > 1:
            return result[1]
        return None

    def new_stream(self) -> Any:
        return self._check(self.rt.cudaStreamCreate(), "cudaStreamCreate")

    def handle(self, stream: Any) -> int:
        return int(stream)

    def alloc(self, nbytes: int) -> int:
        return int(self._check(self.rt.cudaMalloc(max(int(nbytes), 1)), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self.rt.cudaFree(ptr)

    def to_device(self, ptr: int, arr: np.ndarray, stream: Any) -> None:
        if arr.nbytes:
            kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
            self._check(self.rt.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, kind, stream), "cudaMemcpyAsync H2D")

    def to_host(self, arr: np.ndarray, ptr: int, stream: Any) -> None:
        if arr.nbytes:
            kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
            self._check(self.rt.cudaMemcpyAsync(arr.ctypes.data, ptr, arr.nbytes, kind, stream), "cudaMemcpyAsync D2H")

    def synchronize(self, stream: Any) -> None:
        self._check(self.rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def compute_capability(self) -> str:
        dev = self._check(self.rt.cudaGetDevice(), "cudaGetDevice")
        attr = self.rt.cudaDeviceAttr
        major = self._check(self.rt.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMajor, dev), "attribute")
        minor = self._check(self.rt.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMinor, dev), "attribute")
        return f"{major}.{minor}"


class _TorchMemory:
    """Device buffers and a stream through torch (when cuda-python is missing)."""

    def __init__(self, torch: Any):
        self.torch = torch
        self._tensors: dict[int, Any] = {}

    def new_stream(self) -> Any:
        return self.torch.cuda.Stream()

    def handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def alloc(self, nbytes: int) -> int:
        t = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, device="cuda")
        ptr = int(t.data_ptr())
        self._tensors[ptr] = t
        return ptr

    def free(self, ptr: int) -> None:
        self._tensors.pop(ptr, None)

    def _bytes(self, arr: np.ndarray) -> Any:
        return self.torch.from_numpy(arr.reshape(-1).view(np.uint8))

    def to_device(self, ptr: int, arr: np.ndarray, stream: Any) -> None:
        if arr.nbytes:
            with self.torch.cuda.stream(stream):
                self._tensors[ptr][: arr.nbytes].copy_(self._bytes(arr))

    def to_host(self, arr: np.ndarray, ptr: int, stream: Any) -> None:
        if arr.nbytes:
            with self.torch.cuda.stream(stream):
                self._bytes(arr).copy_(self._tensors[ptr][: arr.nbytes])

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def compute_capability(self) -> str:
        major, minor = self.torch.cuda.get_device_capability()
        return f"{major}.{minor}"


def device_memory() -> _CudartMemory | _TorchMemory:
    cudart = _cudart()
    if cudart is not None:
        return _CudartMemory(cudart)
    try:
        import torch
    except ImportError:
        raise TensorRTError("device buffers need cuda-python (pip install cuda-python) or torch") from None
    return _TorchMemory(torch)


# -- the TensorRT library -----------------------------------------------------------------------


class TensorRTBackend:
    """The TensorRT 10 library: version, GPU, engine building and loading."""

    def __init__(self) -> None:
        try:
            import tensorrt as trt
        except ImportError:
            raise TensorRTError("the tensorrt package is not installed") from None
        self.trt = trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        self._memory: Any = None

    @property
    def memory(self) -> Any:
        if self._memory is None:
            self._memory = device_memory()
        return self._memory

    def version(self) -> str:
        return str(self.trt.__version__)

    def compute_capability(self) -> str:
        return self.memory.compute_capability()

    def build(self, onnx_bytes: bytes, config: Mapping[str, Any]) -> bytes:
        """Parse the region's ONNX and build a serialised engine with ``config``."""
        trt = self.trt
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse(onnx_bytes):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TensorRTError(f"TensorRT's ONNX parser rejected the region: {errors}")
        bconf = builder.create_builder_config()
        bconf.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(config["workspace"]))
        if config["precision"] == "fp16":
            bconf.set_flag(trt.BuilderFlag.FP16)
        elif hasattr(trt.BuilderFlag, "TF32"):
            # fp32 means float32 arithmetic: no TF32 tensor-core shortcut (on by default on Ampere and later)
            bconf.clear_flag(trt.BuilderFlag.TF32)
        dynamic = []
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = [int(d) for d in tensor.shape]
            if any(d < 0 for d in shape[1:]):
                raise TensorRTError(f"input {tensor.name!r} has a dynamic non-batch dimension {shape}")
            if shape and shape[0] < 0:
                dynamic.append((tensor.name, shape[1:]))
        if dynamic:
            # dynamic batch: one optimisation profile from 1 to max_batch_size
            batch = int(config["max_batch_size"])
            profile = builder.create_optimization_profile()
            for name, rest in dynamic:
                profile.set_shape(name, (1, *rest), (batch, *rest), (batch, *rest))
            bconf.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, bconf)
        if serialized is None:
            raise TensorRTError("TensorRT could not build an engine for the region (see the TensorRT log)")
        return bytes(serialized)

    def load(self, engine: bytes, input_names: Sequence[str], output_names: Sequence[str]) -> "TensorRTRunner":
        return TensorRTRunner(self, engine, input_names, output_names)


class TensorRTRunner:
    """One deserialised engine with its execution context, device buffers and stream."""

    def __init__(self, backend: TensorRTBackend, engine: bytes, input_names: Sequence[str],
                 output_names: Sequence[str]):
        trt = backend.trt
        self.memory = backend.memory
        self.runtime = trt.Runtime(backend.logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine)
        if self.engine is None:
            raise TensorRTError("TensorRT could not deserialise the cached engine")
        self.context = self.engine.create_execution_context()
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        names = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        missing = [n for n in self.input_names + self.output_names if n not in names]
        if missing:
            raise TensorRTError(f"the engine has no tensor(s) {missing}")
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.stream = self.memory.new_stream()
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (capacity, device pointer)
        self._lock = threading.Lock()  # an execution context runs one inference at a time

    def _buffer(self, name: str, nbytes: int) -> int:
        capacity, ptr = self._buffers.get(name, (0, 0))
        if nbytes > capacity:
            if ptr:
                self.memory.free(ptr)
            ptr = self.memory.alloc(nbytes)
            self._buffers[name] = (nbytes, ptr)
        return ptr

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if len(inputs) != len(self.input_names):
            raise TensorRTError(f"expected {len(self.input_names)} inputs, got {len(inputs)}")
        with self._lock:
            staged = []
            for name, x in zip(self.input_names, inputs):
                arr = np.ascontiguousarray(x, dtype=self.dtypes[name])
                if not self.context.set_input_shape(name, tuple(arr.shape)):
                    raise TensorRTError(f"input {name!r}: shape {list(arr.shape)} is outside the engine's profile")
                ptr = self._buffer(name, arr.nbytes)
                self.memory.to_device(ptr, arr, self.stream)
                self.context.set_tensor_address(name, ptr)
                staged.append(arr)  # alive until the stream is synchronised
            outputs = []
            for name in self.output_names:
                host = np.empty(tuple(self.context.get_tensor_shape(name)), dtype=self.dtypes[name])
                ptr = self._buffer(name, host.nbytes)
                self.context.set_tensor_address(name, ptr)
                outputs.append((host, ptr))
            if not self.context.execute_async_v3(self.memory.handle(self.stream)):
                raise TensorRTError("execute_async_v3 failed")
            for host, ptr in outputs:
                self.memory.to_host(host, ptr, self.stream)
            self.memory.synchronize(self.stream)
            del staged
            return [host for host, _ in outputs]

    def __del__(self) -> None:  # pragma: no cover - needs a GPU
        for _, ptr in getattr(self, "_buffers", {}).values():
            try:
                self.memory.free(ptr)
            except Exception:
                pass


_backend: TensorRTBackend | None = None
_backend_lock = threading.Lock()


def get_backend() -> TensorRTBackend:
    """The process-wide backend (tests monkeypatch this function to inject a fake)."""
    global _backend
    with _backend_lock:
        if _backend is None:
            _backend = TensorRTBackend()
        return _backend


class TensorRTRegion:
    """The callable byoc runs for one region on the TensorRT path.

    The engine comes from the cache (built on a miss) at construction when the option
    ``precompile`` is set, else on the first call.
    """

    runtime_path = "tensorrt"

    def __init__(self, artifact: Artifact, options: Mapping[str, Any], backend: Any = None,
                 cache: EngineCache | None = None):
        self.data = artifact.data
        self.input_names = list(artifact.metadata.get("inputs", []))
        self.output_names = list(artifact.metadata.get("outputs", []))
        self.config = builder_config(options)
        self.backend = backend if backend is not None else get_backend()
        self.cache = cache if cache is not None else EngineCache(cache_dir(options))
        self.key = EngineKey.make(subgraph_hash(self.data), self.backend.version(),
                                  self.backend.compute_capability(), self.config["precision"], self.config)
        self._runner: Any = None
        self._lock = threading.Lock()
        if options.get("precompile"):
            self.prepare()

    def prepare(self) -> None:
        """Load the engine from the cache, building it on a miss."""
        with self._lock:
            if self._runner is None:
                engine = self.cache.get_or_build(self.key, lambda: self.backend.build(self.data, self.config))
                self._runner = self.backend.load(engine, self.input_names, self.output_names)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if self._runner is None:
            self.prepare()
        return list(self._runner(*inputs))


__all__ = ["TensorRTBackend", "TensorRTError", "TensorRTRegion", "TensorRTRunner", "get_backend"]
