"""A test double for ``tensorrt`` (10.x and 11.x) and cuda-python's ``cuda.bindings.runtime``.

It checks the plugin's plumbing, not TensorRT's numerics: the "builder" parses the ONNX it is
given (``onnx``), checks what TensorRT checks before building (parser input, profiles for
every dynamic input, min <= opt <= max, static dims), and serialises an "engine" that holds the
network; the "runtime" refuses engines built by another TensorRT version or for another GPU,
and an execution context "runs" the network with onnxruntime (onnx.reference when onnxruntime
has no kernel, e.g. for float16) when its stream is synchronised.

The API surface follows the documented Python APIs:

* TensorRT 10: ``BuilderFlag.FP16``/``TF32``, ``create_network(flags)`` weakly typed unless
  ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``; TensorRT 11: no ``FP16`` (nor INT8, BF16,
  FP8, ...) builder flag, every network strongly typed.
* ``Builder``, ``IBuilderConfig.set_memory_pool_limit``/``set_flag``/``clear_flag``/
  ``add_optimization_profile``, ``IOptimizationProfile.set_shape``, ``OnnxParser.parse``/
  ``num_errors``/``get_error``, ``build_serialized_network`` (``None`` on failure),
  ``Runtime.deserialize_cuda_engine`` (``None`` when refused), ``ICudaEngine.num_io_tensors``/
  ``get_tensor_name``/``get_tensor_mode``/``get_tensor_dtype``/``get_tensor_shape``/
  ``num_optimization_profiles``/``get_tensor_profile_shape``/``create_execution_context``,
  ``IExecutionContext.set_optimization_profile_async``/``set_input_shape``/
  ``set_tensor_address``/``get_tensor_shape``/``execute_async_v3`` (bool results), ``nptype``.
* cudart: every call returns a tuple ``(cudaError_t, value...)``; ``cudaMalloc``, ``cudaFree``,
  ``cudaMallocHost``, ``cudaFreeHost``, ``cudaMemcpyAsync`` (kinds checked against where the
  pointers live), ``cudaStreamCreate``/``Destroy``/``Synchronize``, ``cudaSetDevice``/
  ``cudaGetDevice``/``cudaGetDeviceCount``/``cudaGetDeviceProperties``. Device memory is numpy
  buffers keyed by the pointers handed out; copies and inference are queued per stream and done
  at ``cudaStreamSynchronize``, so a missing synchronise or a buffer freed too early shows.
  ``driver="too-old"`` makes every call fail with ``cudaErrorInsufficientDriver`` (cuda-python 13
  on a CUDA 12 driver).
"""

from __future__ import annotations

import ctypes
import enum
import json
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

MAGIC = b"FAKE-TRT-PLAN\n"

# -- cuda.bindings.runtime ------------------------------------------------------------------------


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStream_t:
    def __init__(self, handle: int):
        self._handle = handle

    def __int__(self) -> int:
        return self._handle

    def getPtr(self) -> int:
        return self._handle


@dataclass
class cudaDeviceProp:
    name: bytes
    major: int
    minor: int
    totalGlobalMem: int = 80 << 30


@dataclass
class FakeGPU:
    """The simulated machine behind the fake cudart: devices, memory, streams, and call records."""

    devices: list[tuple[str, int, int]] = field(default_factory=lambda: [("NVIDIA H100 80GB HBM3", 9, 0)])
    driver: str = "ok"  # "ok" | "too-old" | "no-device"
    device_memory: dict[int, np.ndarray] = field(default_factory=dict)
    host_memory: dict[int, np.ndarray] = field(default_factory=dict)
    streams: dict[int, list] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    set_device_threads: dict[int, int] = field(default_factory=dict)  # thread id -> device
    pageable_copies: int = 0
    pinned_copies: int = 0
    streams_created: int = 0
    streams_destroyed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def current_device(self) -> int:
        return self.set_device_threads.get(threading.get_ident(), 0)


class _Cudart(types.ModuleType):
    """cuda.bindings.runtime over a :class:`FakeGPU`."""

    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaStream_t = cudaStream_t
    cudaDeviceProp = cudaDeviceProp

    def __init__(self, gpu: FakeGPU):
        super().__init__("cuda.bindings.runtime")
        self.gpu = gpu
        self._next = 0x7F0000000000

    def _fail(self) -> cudaError_t | None:
        if self.gpu.driver == "too-old":
            return cudaError_t.cudaErrorInsufficientDriver
        if self.gpu.driver == "no-device":
            return cudaError_t.cudaErrorNoDevice
        return None

    def cudaGetDeviceCount(self):
        self.gpu.calls.append(("cudaGetDeviceCount", None))
        err = self._fail()
        return (err, 0) if err else (cudaError_t.cudaSuccess, len(self.gpu.devices))

    def cudaSetDevice(self, device):
        self.gpu.calls.append(("cudaSetDevice", device))
        err = self._fail()
        if err:
            return (err,)
        if not 0 <= int(device) < len(self.gpu.devices):
            return (cudaError_t.cudaErrorInvalidDevice,)
        self.gpu.set_device_threads[threading.get_ident()] = int(device)
        return (cudaError_t.cudaSuccess,)

    def cudaGetDevice(self):
        err = self._fail()
        return (err, 0) if err else (cudaError_t.cudaSuccess, self.gpu.current_device())

    def cudaGetDeviceProperties(self, device):
        err = self._fail()
        if err:
            return (err, None)
        if not 0 <= int(device) < len(self.gpu.devices):
            return (cudaError_t.cudaErrorInvalidDevice, None)
        name, major, minor = self.gpu.devices[int(device)]
        return (cudaError_t.cudaSuccess, cudaDeviceProp(name.encode() + b"\0" * (256 - len(name)), major, minor))

    def _alloc(self, table: dict[int, np.ndarray], size: int) -> tuple:
        err = self._fail()
        if err:
            return (err, 0)
        buf = np.zeros(int(size), np.uint8)
        with self.gpu.lock:
            table[buf.ctypes.data] = buf
        return (cudaError_t.cudaSuccess, buf.ctypes.data)

    def cudaMalloc(self, size):
        return self._alloc(self.gpu.device_memory, size)

    def cudaMallocHost(self, size):
        return self._alloc(self.gpu.host_memory, size)

    def cudaFree(self, ptr):
        with self.gpu.lock:
            ok = self.gpu.device_memory.pop(int(ptr), None) is not None
        return (cudaError_t.cudaSuccess if ok else cudaError_t.cudaErrorInvalidValue,)

    def cudaFreeHost(self, ptr):
        with self.gpu.lock:
            ok = self.gpu.host_memory.pop(int(ptr), None) is not None
        return (cudaError_t.cudaSuccess if ok else cudaError_t.cudaErrorInvalidValue,)

    def cudaStreamCreate(self):
        err = self._fail()
        if err:
            return (err, None)
        self._next += 0x100
        with self.gpu.lock:
            self.gpu.streams[self._next] = []
            self.gpu.streams_created += 1
        return (cudaError_t.cudaSuccess, cudaStream_t(self._next))

    def cudaStreamDestroy(self, stream):
        with self.gpu.lock:
            ok = self.gpu.streams.pop(int(stream), None) is not None
            self.gpu.streams_destroyed += ok
        return (cudaError_t.cudaSuccess if ok else cudaError_t.cudaErrorInvalidResourceHandle,)

    def enqueue(self, stream: Any, op) -> bool:
        with self.gpu.lock:
            queue = self.gpu.streams.get(int(stream))
            if queue is None:
                return False
            queue.append(op)
        return True

    def cudaStreamSynchronize(self, stream):
        with self.gpu.lock:
            queue = self.gpu.streams.get(int(stream))
            if queue is None:
                return (cudaError_t.cudaErrorInvalidResourceHandle,)
            ops, queue[:] = list(queue), []
        for op in ops:
            op()
        return (cudaError_t.cudaSuccess,)

    def device_view(self, ptr: int, nbytes: int) -> np.ndarray | None:
        """The device bytes [ptr, ptr+nbytes) if they lie inside one allocation."""
        for base, buf in self.gpu.device_memory.items():
            if base <= ptr and ptr + nbytes <= base + buf.nbytes:
                return buf[ptr - base:ptr - base + nbytes]
        return None

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        dst, src, count = int(dst), int(src), int(count)
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            dev, host = self.device_view(dst, count), src
        elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            dev, host = self.device_view(src, count), dst
        else:
            return (cudaError_t.cudaErrorInvalidValue,)
        if dev is None or self.device_view(host, 1) is not None:
            return (cudaError_t.cudaErrorInvalidValue,)  # wrong side, or outside an allocation
        pinned = any(b <= host < b + buf.nbytes for b, buf in self.gpu.host_memory.items())
        with self.gpu.lock:
            if pinned:
                self.gpu.pinned_copies += 1
            else:
                self.gpu.pageable_copies += 1

        def op():
            if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
                ctypes.memmove(dev.ctypes.data, host, count)
            else:
                ctypes.memmove(host, dev.ctypes.data, count)

        return (cudaError_t.cudaSuccess,) if self.enqueue(stream, op) else (cudaError_t.cudaErrorInvalidResourceHandle,)


# -- tensorrt -------------------------------------------------------------------------------------


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    INT64 = 8


_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32,
       DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT64: np.int64}
_FROM_ONNX = {TensorProto.FLOAT: DataType.FLOAT, TensorProto.FLOAT16: DataType.HALF, TensorProto.INT8: DataType.INT8,
              TensorProto.INT32: DataType.INT32, TensorProto.BOOL: DataType.BOOL, TensorProto.UINT8: DataType.UINT8,
              TensorProto.INT64: DataType.INT64}


def nptype(dt: DataType) -> type:
    return _NP[DataType(dt)]


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0  # deprecated and ignored since TensorRT 10
    STRONGLY_TYPED = 5


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class Logger:
    Severity = _Severity
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = (_Severity.INTERNAL_ERROR, _Severity.ERROR, _Severity.WARNING,
                                                      _Severity.INFO, _Severity.VERBOSE)

    def __init__(self, min_severity: _Severity = _Severity.WARNING):
        self.min_severity = min_severity
        self.messages: list[tuple[_Severity, str]] = []

    def log(self, severity: _Severity, msg: str) -> None:
        self.messages.append((severity, msg))


class ITensor:
    def __init__(self, name: str, shape: tuple[int, ...], dtype: DataType):
        self.name, self.shape, self.dtype = name, shape, dtype


class INetworkDefinition:
    def __init__(self, strongly_typed: bool):
        self.strongly_typed = strongly_typed
        self.model: onnx.ModelProto | None = None
        self.inputs: list[ITensor] = []
        self.outputs: list[ITensor] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_input(self, i: int) -> ITensor:
        return self.inputs[i]

    def get_output(self, i: int) -> ITensor:
        return self.outputs[i]


def _tensor(v: onnx.ValueInfoProto) -> ITensor:
    tt = v.type.tensor_type
    dims = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    return ITensor(v.name, dims, _FROM_ONNX[tt.elem_type])


class _ParserError:
    def __init__(self, desc: str):
        self._desc = desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return self._desc


class OnnxParser:
    def __init__(self, network: INetworkDefinition, logger: Logger):
        self.network, self.logger = network, logger
        self.errors: list[_ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> _ParserError:
        return self.errors[i]

    def parse(self, model: bytes, path: str | None = None) -> bool:
        try:
            proto = onnx.ModelProto.FromString(bytes(model))
            onnx.checker.check_model(proto, full_check=True)
        except Exception as exc:
            self.errors.append(_ParserError(f"ModelImporter: {exc}"))
            return False
        inits = {t.name for t in proto.graph.initializer}
        try:
            self.network.inputs = [_tensor(v) for v in proto.graph.input if v.name not in inits]
            self.network.outputs = [_tensor(v) for v in proto.graph.output]
        except KeyError as exc:
            self.errors.append(_ParserError(f"unsupported data type {exc}"))
            return False
        self.network.model = proto
        return True


class IOptimizationProfile:
    def __init__(self):
        self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:  # noqa: A002 - TensorRT's names
        self.shapes[input] = (tuple(map(int, min)), tuple(map(int, opt)), tuple(map(int, max)))

    def get_shape(self, input: str) -> list[tuple[int, ...]]:
        return list(self.shapes[input])


class IBuilderConfig:
    def __init__(self, flag_enum: type):
        self.flag_enum = flag_enum
        self.flags: set[str] = {"TF32"} if hasattr(flag_enum, "TF32") else set()
        self.pools: dict[int, int] = {}
        self.profiles: list[IOptimizationProfile] = []

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.pools[int(pool)] = int(size)

    def set_flag(self, flag: Any) -> None:
        self.flags.add(self.flag_enum(flag).name)

    def clear_flag(self, flag: Any) -> None:
        self.flags.discard(self.flag_enum(flag).name)

    def get_flag(self, flag: Any) -> bool:
        return self.flag_enum(flag).name in self.flags

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class IHostMemory:
    def __init__(self, data: bytes):
        self._data = data

    @property
    def nbytes(self) -> int:
        return len(self._data)

    def __bytes__(self) -> bytes:
        return self._data

    def __buffer__(self, flags: int) -> memoryview:  # Python >= 3.12 buffer protocol
        return memoryview(self._data)


class _State:
    """What the fake tensorrt module shares: version, the cudart it runs on, and records."""

    def __init__(self, version: str, cudart: _Cudart):
        self.version = version
        self.cudart = cudart
        self.builds: list[dict[str, Any]] = []
        self.refuse_next = 0
        self.executions = 0


class Builder:
    _state: _State

    def __init__(self, logger: Logger):
        self.logger = logger

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        major = int(self._state.version.split(".")[0])
        strongly = major >= 11 or bool(int(flags) & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)))
        return INetworkDefinition(strongly)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self._flags)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def _error(self, msg: str) -> None:
        self.logger.log(_Severity.ERROR, msg)

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        gpu = self._state.cudart.gpu
        if network.model is None:
            self._error("network has no layers")
            return None
        if "FP16" in config.flags and network.strongly_typed:
            self._error("BuilderFlag::kFP16 is not allowed with a strongly typed network")
            return None
        dynamic = [t for t in network.inputs if any(d < 0 for d in t.shape)]
        if dynamic and not config.profiles:
            self._error("Network has dynamic or shape inputs, but no optimization profile has been defined.")
            return None
        for p, profile in enumerate(config.profiles):
            for t in dynamic:
                if t.name not in profile.shapes:
                    self._error(f"optimization profile {p} is missing values for input {t.name}")
                    return None
            for name, (lo, opt, hi) in profile.shapes.items():
                t = next((t for t in network.inputs if t.name == name), None)
                if t is None or not (len(lo) == len(opt) == len(hi) == len(t.shape)):
                    self._error(f"profile {p}: bad input {name}")
                    return None
                for d, a, b, c in zip(t.shape, lo, opt, hi):
                    if not (a <= b <= c) or (d >= 0 and not (a == b == c == d)):
                        self._error(f"profile {p}: input {name} min {lo} opt {opt} max {hi} vs dims {t.shape}")
                        return None
        device = gpu.current_device()
        dev_name, major, minor = gpu.devices[device]
        header = {
            "version": self._state.version,
            "device": dev_name,
            "cc": f"{major}.{minor}",
            "strongly_typed": network.strongly_typed,
            "flags": sorted(config.flags),
            "workspace": config.pools.get(int(MemoryPoolType.WORKSPACE)),
            "inputs": [[t.name, list(t.shape), int(t.dtype)] for t in network.inputs],
            "outputs": [[t.name, list(t.shape), int(t.dtype)] for t in network.outputs],
            "profiles": [{n: [list(x) for x in s] for n, s in p.shapes.items()} for p in config.profiles],
        }
        self._state.builds.append({**header, "thread": threading.get_ident(), "build_device": device,
                                   "model": network.model})
        head = json.dumps(header, sort_keys=True).encode()
        return IHostMemory(MAGIC + len(head).to_bytes(8, "little") + head + network.model.SerializeToString())


class ICudaEngine:
    def __init__(self, header: dict[str, Any], model: onnx.ModelProto, state: _State):
        self.header, self.model, self._state = header, model, state
        self._io = [(n, tuple(s), DataType(d), TensorIOMode.INPUT) for n, s, d in header["inputs"]]
        self._io += [(n, tuple(s), DataType(d), TensorIOMode.OUTPUT) for n, s, d in header["outputs"]]

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    @property
    def num_optimization_profiles(self) -> int:
        return max(1, len(self.header["profiles"]))

    def get_tensor_name(self, i: int) -> str:
        return self._io[i][0]

    def _find(self, name: str):
        return next((t for t in self._io if t[0] == name), None)

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        t = self._find(name)
        return t[3] if t else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        return self._find(name)[2]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._find(name)[1]

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        return [tuple(x) for x in self.header["profiles"][profile_index][name]]

    def create_execution_context(self) -> "IExecutionContext":
        return IExecutionContext(self)


class IExecutionContext:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine
        self.active_optimization_profile = 0
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self._session: Any = None
        self._out_shapes: dict[tuple, list[tuple[int, ...]]] = {}

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        if not 0 <= profile_index < self.engine.num_optimization_profiles:
            return False
        self.active_optimization_profile = profile_index
        self.shapes.clear()
        return True

    def set_input_shape(self, name: str, shape: Any) -> bool:
        t = self.engine._find(name)
        shape = tuple(int(d) for d in shape)
        if t is None or t[3] != TensorIOMode.INPUT or len(shape) != len(t[1]):
            return False
        if any(d >= 0 and d != s for d, s in zip(t[1], shape)):
            return False
        profiles = self.engine.header["profiles"]
        if any(d < 0 for d in t[1]):
            lo, _, hi = profiles[self.active_optimization_profile][name]
            if any(not (a <= s <= b) for a, s, b in zip(lo, shape, hi)):
                return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, memory: int) -> bool:
        if self.engine._find(name) is None:
            return False
        self.addresses[name] = int(memory)
        return True

    def _inputs(self):
        return [t for t in self.engine._io if t[3] == TensorIOMode.INPUT]

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._session is None:
            try:
                import onnxruntime as ort

                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 1
                sess = ort.InferenceSession(self.engine.model.SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
                self._session = lambda f: sess.run(None, f)
            except Exception:  # e.g. no float16 kernel on the CPU: the ONNX reference evaluator
                from onnx.reference import ReferenceEvaluator

                ref = ReferenceEvaluator(self.engine.model)
                self._session = lambda f: ref.run(None, f)
        return [np.asarray(o) for o in self._session(feeds)]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        t = self.engine._find(name)
        if t[3] == TensorIOMode.INPUT:
            return self.shapes.get(name, t[1])
        if not all(d >= 0 for d in t[1]):
            ins = self._inputs()
            if any(i[0] not in self.shapes for i in ins):
                return t[1]
            key = tuple(self.shapes[i[0]] for i in ins)
            if key not in self._out_shapes:
                zeros = {i[0]: np.zeros(self.shapes[i[0]], nptype(i[2])) for i in ins}
                self._out_shapes[key] = [o.shape for o in self._run(zeros)]
            outs = [o for o in self.engine._io if o[3] == TensorIOMode.OUTPUT]
            return tuple(self._out_shapes[key][[o[0] for o in outs].index(name)])
        return t[1]

    def execute_async_v3(self, stream_handle: int) -> bool:
        cudart = self.engine._state.cudart
        ins = self._inputs()
        outs = [o for o in self.engine._io if o[3] == TensorIOMode.OUTPUT]
        if any(i[0] not in self.shapes and any(d < 0 for d in i[1]) for i in ins):
            return False
        if any(t[0] not in self.addresses for t in ins + outs):
            return False
        shapes = {i[0]: self.shapes.get(i[0], i[1]) for i in ins}
        out_shapes = {o[0]: self.get_tensor_shape(o[0]) for o in outs}
        plan = []
        for name, _, dt, _ in ins:
            nbytes = int(np.prod(shapes[name], dtype=np.int64)) * np.dtype(nptype(dt)).itemsize
            view = cudart.device_view(self.addresses[name], nbytes)
            if view is None:
                return False
            plan.append((name, view, nptype(dt), shapes[name]))
        targets = []
        for name, _, dt, _ in outs:
            nbytes = int(np.prod(out_shapes[name], dtype=np.int64)) * np.dtype(nptype(dt)).itemsize
            view = cudart.device_view(self.addresses[name], nbytes)
            if view is None:
                return False
            targets.append((view, nptype(dt), out_shapes[name]))

        def op():
            feeds = {n: v.view(t).reshape(s).copy() for n, v, t, s in plan}
            results = self._run(feeds)
            for (view, t, s), r in zip(targets, results):
                r = np.asarray(r, dtype=t).reshape(s)
                view[...] = np.ascontiguousarray(r).reshape(-1).view(np.uint8)
            self.engine._state.executions += 1

        return cudart.enqueue(stream_handle, op)


class Runtime:
    _state: _State

    def __init__(self, logger: Logger):
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine: Any) -> ICudaEngine | None:
        data = bytes(serialized_engine)
        if self._state.refuse_next > 0:
            self._state.refuse_next -= 1
            self.logger.log(_Severity.ERROR, "engine plan file is corrupted (fake: refused on request)")
            return None
        if not data.startswith(MAGIC):
            self.logger.log(_Severity.ERROR, "Serialization assertion magicTagRead == kMAGIC_TAG failed")
            return None
        n = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
        start = len(MAGIC) + 8
        header = json.loads(data[start:start + n])
        gpu = self._state.cudart.gpu
        dev_name, major, minor = gpu.devices[gpu.current_device()]
        if header["version"] != self._state.version:
            self.logger.log(_Severity.ERROR, f"engine built by TensorRT {header['version']}, this is {self._state.version}")
            return None
        if header["device"] != dev_name or header["cc"] != f"{major}.{minor}":
            self.logger.log(_Severity.ERROR, f"engine built for {header['device']}, this is {dev_name}")
            return None
        return ICudaEngine(header, onnx.ModelProto.FromString(data[start + n:]), self._state)


_FLAGS_10 = ["FP16", "BF16", "INT8", "REFIT", "DISABLE_TIMING_CACHE", "TF32", "SPARSE_WEIGHTS", "SAFETY_SCOPE",
             "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS", "DIRECT_IO", "FP8", "INT4"]
_REMOVED_IN_11 = {"FP16", "BF16", "INT8", "FP8", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS",
                  "PREFER_PRECISION_CONSTRAINTS", "DIRECT_IO"}


def make_tensorrt(version: str, cudart: _Cudart) -> types.ModuleType:
    """A ``tensorrt`` module for ``version`` ("10.x.y" or "11.x.y") running on ``cudart``'s GPU."""
    major = int(version.split(".")[0])
    names = [n for n in _FLAGS_10 if major < 11 or n not in _REMOVED_IN_11]
    flags = enum.IntEnum("BuilderFlag", {n: i for i, n in enumerate(names)})
    state = _State(version, cudart)
    mod = types.ModuleType("tensorrt")
    mod.__version__ = version
    mod.state = state
    mod.Builder = type("Builder", (Builder,), {"_state": state, "_flags": flags})
    mod.Runtime = type("Runtime", (Runtime,), {"_state": state})
    for obj in (Logger, OnnxParser, DataType, TensorIOMode, MemoryPoolType, NetworkDefinitionCreationFlag, nptype,
                IBuilderConfig, IOptimizationProfile, INetworkDefinition, ICudaEngine, IExecutionContext, IHostMemory):
        setattr(mod, obj.__name__, obj)
    mod.BuilderFlag = flags
    return mod


def make_cudart(gpu: FakeGPU) -> _Cudart:
    return _Cudart(gpu)


__all__ = ["FakeGPU", "MAGIC", "cudaError_t", "make_cudart", "make_tensorrt"]
