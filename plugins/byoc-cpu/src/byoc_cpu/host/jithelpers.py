"""Helper processes that compile a first run's Numba kernels in parallel.

Numba compiles one function at a time per process (under its compiler lock and the interpreter
lock), and a model's first run after a fresh install spends most of its time there. On Linux,
when a first run starts, :func:`first_run` forks ``BYOC_JIT_HELPERS`` helper processes (default:
with at least four usable cores, the free ones, at most 3; none with fewer) that run the same plan *ahead* of the parent, without executing any
byoc kernel: each kernel call a helper meets is claimed (one claim file per kernel and
signature, created with ``O_EXCL`` in a private temporary folder) and compiled into Numba's
on-disk cache, or, when another process holds the claim, skipped. The parent runs the plan for
real; a kernel it needs that a helper is compiling is waited for and then loaded from the cache,
one nobody claimed yet it claims and compiles itself. So the compilations spread over the cores,
the parent's results are computed as without helpers, and the cache ends up as a sequential
first run would leave it.

A helper's view of the tensors is garbage after the first skipped kernel (it never executes
one), so it may stop early (an error, a data-dependent shape) or wander; it runs at low
priority, its output goes nowhere, and the parent stops it when its own run ends. Helpers are
used on a process's first first run, and on later ones only while first runs still find kernels
to compile. ``BYOC_JIT_HELPERS=0`` turns them off; they are never used where ``fork`` is unsafe
(other platforms), with one core, or where Numba cannot write its cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator
from byoc.contract import environment as _env
from byoc_cpu.tuning import THREADS

#: the fewest usable cores with which first runs use helpers by default
MIN_CORES = THREADS["jit_helpers_min_cores"]
#: the longest the parent waits for a helper's compilation of one kernel before compiling it itself
WAIT_LIMIT_S = 30.0
_POLL_S = 0.005

_lock = threading.Lock()
_state: dict[str, Any] = {"enabled": True, "session": None, "patched": None, "helper_compiled": 0}


def helper_count() -> int:
    """How many helper processes a first run forks now (0: none)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 0
    env = _env.get("BYOC_JIT_HELPERS")
    if env:
        try:
            return min(max(0, int(env)), 64)
        except ValueError:
            return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        cores = os.cpu_count() or 1
    # a helper also runs the plan's glue (and BLAS) on its own: on two cores it measured slower
    # than no helper on a busy machine (docs/startup.md), so helpers start from four cores
    return min(cores - 1, 3) if cores >= MIN_CORES else 0


class _Session:
    def __init__(self, folder: str):
        self.folder = folder
        self.helper = False  # True in a helper process
        self.pids: list[int] = []
        self.mine: set[str] = set()
        self.compiled_here = 0  # kernels this process compiled (not loaded)

    def path(self, key: str, suffix: str) -> str:
        return os.path.join(self.folder, key + suffix)

    def claim(self, key: str) -> bool:
        try:
            os.close(os.open(self.path(key, ".claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
        self.mine.add(key)
        return True

    def mark(self, key: str, suffix: str) -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(self.path(key, suffix), os.O_CREAT | os.O_WRONLY, 0o600))

    def done(self, key: str) -> bool:
        return os.path.exists(self.path(key, ".done"))

    def helpers_alive(self) -> bool:
        alive = False
        for pid in self.pids:
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    alive = True
            except ChildProcessError:
                pass
        return alive

    def wait(self, key: str) -> None:
        """Until the helper that claimed ``key`` has stored it (or died, or took too long)."""
        end = time.monotonic() + WAIT_LIMIT_S
        while not self.done(key) and time.monotonic() < end:
            if not self.helpers_alive():
                return
            time.sleep(_POLL_S)

    def cold_kernels(self) -> int:
        try:
            return sum(1 for n in os.listdir(self.folder) if n.endswith(".cold"))
        except OSError:  # pragma: no cover
            return 0


def _key(disp, argtypes: tuple) -> str:
    text = f"{disp.py_func.__module__}.{disp.py_func.__qualname__}{argtypes}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@contextlib.contextmanager
def _function_lock(session: _Session, disp) -> Iterator[None]:
    """One process at a time stores signatures of one function (Numba rewrites its index file)."""
    name = hashlib.sha256(f"{disp.py_func.__module__}.{disp.py_func.__qualname__}".encode()).hexdigest()[:32]
    fd = os.open(os.path.join(session.folder, name + ".lock"), os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ours(disp) -> bool:
    from numba.core.caching import NullCache

    module = getattr(getattr(disp, "py_func", None), "__module__", "") or ""
    return module.split(".")[0].startswith("byoc") and not isinstance(getattr(disp, "_cache", None), NullCache)


def _compile(session: _Session, disp, argtypes: tuple, key: str) -> None:
    misses = sum(disp._cache_misses.values())
    try:
        with _function_lock(session, disp):
            disp.compile(argtypes)
    finally:
        if sum(disp._cache_misses.values()) > misses:
            session.mark(key, ".cold")
            session.compiled_here += 1
        session.mark(key, ".done")


def _skip(*args, **kws) -> None:
    return None


def _patched(original: Callable) -> Callable:
    def compile_for_args(self, *args, **kws):
        session = _state["session"]
        if session is None or kws or not _ours(self):
            return original(self, *args, **kws)
        try:
            argtypes = tuple(self.typeof_pyval(a) for a in args)
        except Exception:
            return original(self, *args, **kws)
        key = _key(self, argtypes)
        if session.helper:
            # compile into the cache and never execute: the helper's tensors mean nothing
            if session.claim(key):
                with contextlib.suppress(Exception):
                    _compile(session, self, argtypes, key)
                self._clear()  # a later call comes back here instead of running the kernel
            return _skip
        if session.claim(key):
            with contextlib.suppress(Exception):
                _compile(session, self, argtypes, key)
        elif key not in session.mine:
            session.wait(key)
        return original(self, *args, **kws)  # loads from the cache; compiles what a helper did not store

    return compile_for_args


def _start_helper(session: _Session, run: Callable[[], Any]) -> None:
    """In the forked child: run the plan ahead of the parent, then leave without cleanup."""
    code = 0
    try:
        session.helper = True
        session.pids = []
        _forget_loaded()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        import warnings

        warnings.simplefilter("ignore")
        try:
            run()
        except BaseException:  # a helper only explores; anything may go wrong on its garbage tensors
            code = 1
    finally:
        os._exit(code)


def _forget_loaded() -> None:
    """In a helper: drop the kernels the parent had loaded, so that the helper executes none."""
    from numba.core.dispatcher import Dispatcher

    for name, module in list(sys.modules.items()):
        if not name.split(".")[0].startswith("byoc") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher) and value.overloads:
                with contextlib.suppress(Exception):
                    value._clear()


def _install() -> None:
    from numba.core.dispatcher import Dispatcher

    if _state["patched"] is None:
        _state["patched"] = Dispatcher._compile_for_args
        Dispatcher._compile_for_args = _patched(Dispatcher._compile_for_args)


def _uninstall() -> None:
    from numba.core.dispatcher import Dispatcher

    if _state["patched"] is not None:
        Dispatcher._compile_for_args = _state["patched"]
        _state["patched"] = None


def _stop(session: _Session) -> None:
    for pid in session.pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def _fork() -> int:
    """``os.fork()`` while holding Numba's compiler lock: no other thread is mid-compilation, so
    the helper does not inherit a lock held by a thread it does not have."""
    import warnings

    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
        return os.fork()


def first_run(run: Callable[[], Any]) -> Any:
    """``run()`` (a plan's first execution), with helper processes compiling its kernels."""
    n = helper_count() if _state["enabled"] else 0
    if n <= 0 or threading.current_thread().name.startswith("byoc-worker") or not _lock.acquire(blocking=False):
        return run()
    try:
        if _state["session"] is not None:  # pragma: no cover - the lock guards this
            return run()
        try:
            import numba  # noqa: F401
            from numba.core import config
        except ImportError:  # pragma: no cover
            return run()
        if config.DISABLE_JIT:
            return run()
        session = _Session(tempfile.mkdtemp(prefix="byoc-jit-"))
        _state["session"] = session
        _install()
        try:
            for _ in range(n):
                pid = _fork()
                if pid == 0:
                    _start_helper(session, run)
                session.pids.append(pid)
            return run()
        finally:
            _stop(session)
            _state["session"] = None
            _uninstall()
            # while first runs keep finding kernels to compile, keep helping
            cold = session.cold_kernels()
            _state["enabled"] = cold > 0
            _state["helper_compiled"] += max(0, cold - session.compiled_here)
            shutil.rmtree(session.folder, ignore_errors=True)
    finally:
        _lock.release()


def reset() -> None:
    """Use helpers again on the next first run (after a cache was emptied, in tests)."""
    _state["enabled"] = True


def helper_compiled() -> int:
    """Kernels (signatures) helper processes compiled into the cache so far in this process."""
    return int(_state["helper_compiled"])


__all__ = ["MIN_CORES", "WAIT_LIMIT_S", "first_run", "helper_compiled", "helper_count", "reset"]
