"""Vendor code in a worker process: the target option ``isolation="process"``.

With ``target_options={name: {"isolation": "process"}}`` a target's ``byoc_codegen`` and
``byoc_runtime`` hooks and every call of its regions run in a worker process (``python -c``: it
imports the target's plugin modules itself and shares no threads or locks with the user's
process). Tensors travel through one shared-memory segment per worker, described by small
messages (dtype, shape, offset); artifacts and options are plain data. One worker serves each
isolated set of plugins; a region keeps its artifact, so a new worker recreates its runtime.

A worker that dies (segfault, ``abort()``, exit), outlives its deadline (``hook_timeout`` for the
hooks, ``isolation_timeout`` per region call, the run's ``timeout``) or exceeds its memory limit
(``isolation_memory_mb``, ``RLIMIT_DATA``) is stopped and costs one fault naming the plugin, the
region and the kind (``segfault``, ``abort``, ``timeout``, ``memory``, ``killed``, ``exit``):
while compiling or loading, the region falls back as for any hook fault; a region call raises
:class:`PluginError` (``isolation_fallback="host"``: the host's result for that call) and the
fault joins ``CompiledModel.faults`` (the report's faults). The next call starts a new worker.
"""

from __future__ import annotations

import atexit
import importlib
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any, Mapping, Sequence

import numpy as np

from byoc import codegen as cg
from byoc.contract import Artifact, Region
from byoc.contract.faults import PluginFault
from byoc.contract.helpers import region_model_bytes
from byoc.errors import ByocError, PluginError, RunCancelledError, RunTimeoutError
from byoc.plugins import Registry, build_registry
from byoc.runtime import control

#: how long a new worker may take to import byoc and the plugins, seconds
START_TIMEOUT = 120.0
_KINDS = {signal.SIGSEGV: "segfault", signal.SIGBUS: "segfault", signal.SIGABRT: "abort", signal.SIGKILL: "killed"}
_BOOT = ("import sys,json;sys.path[:]=json.loads(sys.argv[1]);"
         "from byoc.runtime.isolation import serve;serve(int(sys.argv[2]))")


class WorkerFault(Exception):
    """The worker died, timed out or ran out of memory (``kind`` says which)."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


class Worker:
    """One worker process (started on demand, again after a fault) and its shared memory."""

    def __init__(self, modules: Sequence[tuple[str, str]], memory_mb: int | None):
        self.modules, self.memory_mb = list(modules), memory_mb
        self.lock = threading.RLock()
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.generation = 0
        self.shm: shared_memory.SharedMemory | None = None

    def _start(self) -> None:
        parent, child = socket.socketpair()
        with child:
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path),
                                          str(child.fileno())], pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        self.conn = Connection(parent.detach())
        self.generation += 1
        limit = self.memory_mb or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 ** 21
        reply = self.request(("init", self.modules, limit), START_TIMEOUT, checked=False)
        if reply[0] != "ready":
            self.stop()
            raise WorkerFault("start", f"the worker process could not load the plugins: {reply[1]}")

    def request(self, msg: tuple, timeout: float | None, checked: bool = True) -> tuple:
        """Send ``msg`` and wait for the answer; a dead, late or cancelled worker is stopped
        (``checked``: an answer saying byoc's side of the worker failed raises :class:`PluginError`)."""
        if self.proc is None:
            self._start()
        try:
            self.conn.send(msg)
        except OSError:
            raise self._died() from None
        deadline = None if timeout is None else time.monotonic() + timeout
        ctrl = control.current()
        while True:
            now = time.monotonic()
            wait = [t - now for t in (deadline, ctrl and ctrl.deadline) if t is not None]
            if ctrl is not None and ctrl.handle is not None:
                wait.append(0.05)
            if self.conn.poll(max(0.0, min(wait)) if wait else None):
                try:
                    reply = self.conn.recv()
                except (EOFError, OSError):
                    raise self._died() from None
                if reply[0] == "memory":
                    self.stop()
                    raise WorkerFault("memory", f"exceeded the worker's memory limit ({reply[1]})")
                if checked and reply[0] == "raised" and msg[0] != "call":
                    raise PluginError(f"the isolation worker failed: {reply[1]}")
                return reply
            now = time.monotonic()
            if ctrl is not None and ctrl.handle is not None and ctrl.handle.cancelled:
                self.stop()
                raise RunCancelledError("run cancelled while an isolated region ran (its worker was stopped)")
            if ctrl is not None and ctrl.deadline is not None and now > ctrl.deadline:
                self.stop()
                raise RunTimeoutError(f"run exceeded its timeout of {ctrl.timeout:g} s in an isolated region "
                                      "(its worker was stopped)")
            if deadline is not None and now >= deadline:
                self.stop()
                raise WorkerFault("timeout", f"did not return within {timeout:g} s (the worker was stopped)")

    def _died(self) -> WorkerFault:
        try:
            rc = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            rc = None
        self.stop()
        if rc is not None and rc < 0:
            sig = signal.Signals(-rc)
            kind = _KINDS.get(sig, "crash")
            hint = " (out of memory?)" if sig == signal.SIGKILL else ""
            return WorkerFault(kind, f"crashed the worker process: {sig.name} ({kind}){hint}")
        return WorkerFault("exit", f"ended the worker process (exit status {rc})")

    def stop(self) -> None:
        proc, conn, self.proc, self.conn = self.proc, self.conn, None, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if conn is not None:
            conn.close()

    def put(self, arrays: Sequence[Any]) -> tuple[list, int]:
        """Copy ``arrays`` into the shared segment: their descriptors and the end offset."""
        descs, offset = [], 0
        arrays = [np.asarray(a) for a in arrays]
        total = sum(_align(a.nbytes) for a in arrays if not a.dtype.hasobject)
        self.ensure_size(2 * total + 4096)
        for a in arrays:
            if a.dtype.hasobject:
                descs.append(("inline", a))
                continue
            np.copyto(_view(self.shm.buf, a.dtype, a.shape, offset), a, casting="no")
            descs.append((a.dtype, a.shape, offset))
            offset += _align(a.nbytes)
        return descs, offset

    def ensure_size(self, size: int) -> None:
        if self.shm is None or self.shm.size < size:
            self.close_shm()
            self.shm = shared_memory.SharedMemory(create=True, size=max(size, 1 << 16))

    def close_shm(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm.unlink()
            self.shm = None

    def close(self) -> None:
        with self.lock:
            self.stop()
            self.close_shm()


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def _view(buf: Any, dtype: np.dtype, shape: tuple, offset: int) -> np.ndarray:
    return np.frombuffer(buf, dtype, int(np.prod(shape, dtype=np.int64)), offset).reshape(shape)


class IsolatedRegion:
    """A region's callable: each call runs in the worker; faults as the module docstring says."""

    def __init__(self, worker: Worker, plugin: str, region: Region, artifact: Artifact, options: Mapping[str, Any]):
        self.worker, self.plugin, self.region, self.artifact = worker, plugin, region, artifact
        self.options = dict(options)
        self.specs = cg.output_specs(region.outputs)
        self.rid: int | None = None
        self.generation = -1
        self.faults: list[PluginFault] = []  # CompiledModel binds its own list (report_faults_to)
        self._host: Any = None

    def report_faults_to(self, faults: list[PluginFault]) -> None:
        self.faults = faults

    def load(self, timeout: float | None) -> tuple[str | None, list[PluginFault]]:
        """Create the runtime in the (current) worker: ``(plugin, hook faults)``; plugin ``None`` on a fault."""
        reply = self.worker.request(("runtime", self.region.name, self.region.target, self.artifact, self.options,
                                     self.specs), timeout)
        plugin, self.rid, faults = reply[1:]
        self.generation = self.worker.generation
        return plugin, faults

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        where = f"the callable for region {self.region.name!r} (target {self.region.target!r})"
        try:
            return self._call(args)
        except WorkerFault as exc:
            fault = PluginFault(self.plugin, "byoc_runtime", f"{where} {exc}; a new worker starts for the next call",
                                exc.kind)
            error = PluginError(str(fault))
        except PluginError as exc:  # the callable raised or returned the wrong outputs: as in-process
            prefix = f"plugin {self.plugin!r}, hook byoc_runtime: "
            fault, error = PluginFault(self.plugin, "byoc_runtime", str(exc).removeprefix(prefix)), exc
        if self.options.get("isolation_fallback") != "host" or self.region.model is None:
            if fault.kind != "error":
                self.faults.append(fault)
            raise error from None
        fault.message += "; the host ran the region for this call (isolation_fallback='host')"
        self.faults.append(fault)
        warnings.warn(str(fault), stacklevel=2)
        if self._host is None:
            from byoc.runtime.subgraph import host_callable

            self._host = host_callable(self.region.model)
        return self._host(*args)

    def _call(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        w, timeout = self.worker, self.options.get("isolation_timeout", 600.0)
        with w.lock:
            if self.generation != w.generation or w.proc is None:
                if w.proc is None:
                    w._start()
                plugin, faults = self.load(timeout)
                if plugin is None:
                    raise PluginError("; ".join(map(str, faults)) or "the runtime could not be recreated")
            descs, end = w.put(args)
            reply = w.request(("call", self.rid, w.shm.name, w.shm.size, descs, end), timeout)
            if reply[0] == "grow":
                w.close_shm()
                w.ensure_size(reply[1] * 2)
                reply = w.request(("into", w.shm.name, w.shm.size), timeout)
            if reply[0] == "raised":
                raise reply[2](reply[1]) if reply[2] else PluginError(
                    f"plugin {self.plugin!r}, hook byoc_runtime: the callable for region {self.region.name!r} "
                    f"(target {self.region.target!r}) raised {reply[1]}")
            return [d[1] if d[0] == "inline" else _view(w.shm.buf, *d).copy() for d in reply[1]]


_workers: dict[tuple, Worker] = {}
_pool_lock = threading.Lock()
_MAX_WORKERS = 4


def _worker_for(registry: Registry, target: str, options: Mapping[str, Any]) -> Worker:
    modules = []
    for name in registry.scopes.get(target, ()):
        plugin = registry.pm.get_plugin(name)
        if not isinstance(plugin, types.ModuleType):
            raise WorkerFault("setup", f"plugin {name!r} is not a module: isolation='process' imports a target's "
                                       "plugins by module name")
        modules.append((name, plugin.__name__))
    key = (tuple(modules), options.get("isolation_memory_mb"), hash(frozenset(os.environ.items())))
    with _pool_lock:
        worker = _workers.pop(key, None) or Worker(modules, options.get("isolation_memory_mb"))
        _workers[key] = worker  # most recently used last
        for old in list(_workers)[:-_MAX_WORKERS]:
            _workers.pop(old).close()  # its regions start it again when called
    return worker


@atexit.register
def _close_all() -> None:
    for w in list(_workers.values()):
        w.close()


def compile_region(registry: Registry, region: Region, options: Mapping[str, Any], faults: Any,
                   artifact: Artifact | None = None,
                   hook_timeout: float | None = cg.HOOK_TIMEOUT) -> cg.CompiledRegion | None:
    """:func:`byoc.codegen.codegen_region`, in a worker where the options say ``isolation="process"``."""
    if options.get("isolation", "none") != "process":
        return cg.codegen_region(registry, region, options, faults, artifact, hook_timeout)
    owner = registry.targets[region.target].plugin if region.target in registry.targets else ""
    hook, suffix = "byoc_codegen", f"(region {region.name!r}; isolation='process': a new worker starts for the next call)"
    try:
        worker = _worker_for(registry, region.target, options)
        with worker.lock:
            if artifact is None:
                if region.model is None:
                    raise WorkerFault("setup", "isolation='process' needs the region's body (Region.model)")
                reply = worker.request(("codegen", region.name, region.target, region_model_bytes(region.model),
                                        dict(region.patterns), dict(options)), hook_timeout)
                artifact = reply[1]
                for f in reply[2]:
                    faults.add(f.plugin, f.hook, f.message)
                if artifact is None:
                    return None
            hook = "byoc_runtime"
            fn = IsolatedRegion(worker, owner, region, artifact, options)
            plugin, hook_faults = fn.load(hook_timeout)
    except WorkerFault as exc:
        faults.add(owner, hook, f"{exc} {suffix}", kind=exc.kind)
        return None
    for f in hook_faults:
        faults.add(f.plugin, f.hook, f.message)
    if plugin is None:
        return None
    fn.plugin = plugin
    return cg.CompiledRegion(region, artifact, plugin, fn)


# -- the worker's side --------------------------------------------------------------------------


class _Collect:
    def __init__(self) -> None:
        self.items: list[PluginFault] = []

    def add(self, plugin: str, hook: str, message: str) -> None:
        if message.startswith("raised MemoryError"):  # a hook refused by the limit: as in a region call
            raise MemoryError(message.removeprefix("raised MemoryError: "))
        self.items.append(PluginFault(plugin, hook, message))


class _Served:
    """What one worker holds: the registry, the runtimes it created, the segment it writes into."""

    def __init__(self, registry: Registry):
        self.registry, self.fns, self.pending = registry, {}, None
        self.maps: dict[str, mmap.mmap] = {}

    def codegen(self, name: str, target: str, body: bytes, patterns: dict, options: dict) -> tuple:
        import onnx
        import onnx_ir as ir

        model = ir.from_proto(onnx.ModelProto.FromString(body))
        region = Region(name, target, list(model.graph), list(model.graph.inputs), list(model.graph.outputs),
                        patterns, model)
        faults = _Collect()
        return "ok", cg.generate_artifact(self.registry, region, options, faults, None), faults.items

    def runtime(self, name: str, target: str, artifact: Artifact, options: dict, specs: list) -> tuple:
        faults = _Collect()
        made = cg.create_runtime(self.registry, Region(name, target, []), artifact, options, faults, None)
        if made is None:
            return "ok", None, None, faults.items
        rid = len(self.fns)
        self.fns[rid] = (made[0], name, made[1], specs)
        return "ok", made[0], rid, faults.items

    def _buf(self, name: str, size: int) -> mmap.mmap:
        if name not in self.maps:
            import _posixshmem

            fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
            try:
                self.maps = {name: mmap.mmap(fd, size)}  # the older segments are unlinked
            finally:
                os.close(fd)
        return self.maps[name]

    def call(self, rid: int, name: str, size: int, descs: list, end: int) -> tuple:
        plugin, region, fn, specs = self.fns[rid]
        buf = self._buf(name, size)
        args = [d[1] if d[0] == "inline" else _view(buf, *d) for d in descs]
        for a in args:
            a.flags.writeable = False
        try:
            outs = cg.check_outputs(fn(*args), specs, plugin, region)
        except ByocError as exc:
            return "raised", str(exc), type(exc)
        except MemoryError:
            raise
        except BaseException as exc:
            return "raised", f"{type(exc).__name__}: {exc}", None
        offset, self.pending = end, []
        for o in outs:
            self.pending.append((o, offset))
            offset += 0 if o.dtype.hasobject else _align(o.nbytes)
        return ("grow", offset) if offset > size else self.into(name, size)

    def into(self, name: str, size: int) -> tuple:
        buf, descs = self._buf(name, size), []
        for o, offset in self.pending:
            if o.dtype.hasobject:
                descs.append(("inline", o))
            else:
                np.copyto(_view(buf, o.dtype, o.shape, offset), o)
                descs.append((o.dtype, o.shape, offset))
        self.pending = None
        return "ok", descs


def serve(fd: int) -> None:
    """The worker's main loop (``python -c``, see :class:`Worker`)."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the user's process's to handle
    os.environ["BYOC_ISOLATION_WORKER"] = "1"
    parent = os.getppid()
    threading.Thread(target=_orphaned, args=(parent,), daemon=True).start()
    conn = Connection(fd)
    _, modules, limit_mb = conn.recv()
    try:
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        limit = limit_mb << 20 if hard == resource.RLIM_INFINITY else min(limit_mb << 20, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
        served = _Served(build_registry([(n, importlib.import_module(m)) for n, m in modules], entry_points=False))
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = getattr(served, msg[0])(*msg[1:])
        except MemoryError as exc:
            conn.send(("memory", f"{limit_mb} MiB: MemoryError {exc}".rstrip()))
            os._exit(70)
        except BaseException as exc:
            reply = ("raised", f"{type(exc).__name__}: {exc}", None)
        conn.send(reply)


def _orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


__all__ = ["IsolatedRegion", "Worker", "WorkerFault", "compile_region"]
