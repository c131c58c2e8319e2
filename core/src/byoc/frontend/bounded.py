"""onnx's checker, version converter and shape inference, run where a time limit can stop them.

These are C++ code that byoc hands an untrusted model to, and some models send them into an
endless loop (an ``Einsum`` equation with two ellipses in one term) or crash them. On Linux they
run in a helper process: forked from byoc's process on the first call, it serves requests over a
pair of pipes. A request names an :func:`operation` (a module-level function registered when
byoc is imported) and carries bytes, usually a serialised model; the parent waits at most until
the compile's deadline (``Budget.max_compile_seconds``, set by :func:`time_limit`), then kills
the helper, so a hang costs the user a :class:`~byoc.errors.CompileTimeoutError` naming the step
and a crash an error naming the signal, never a hung or dead process. The next call forks a new
helper. A helper exits after :data:`IDLE_SECONDS` without a request (it holds on to the pages its
parent had when it was forked). A request costs the model's serialisation and a pipe round trip
(well under a millisecond for small models); a fork costs 5-60 ms, growing with the process's
memory.

Elsewhere (no ``fork``, or a platform where forking a threaded process is unsafe) the
operations run in-process, unbounded.
"""

from __future__ import annotations

import contextlib
import contextvars
import faulthandler
import gc
import os
import select
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator

from byoc.budget import DEFAULT_BUDGET
from byoc.errors import CompileTimeoutError

_UNSET = -1.0
#: the monotonic time calls must end by; ``None``: no limit; unset: the default budget's, per call
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("byoc_compile_deadline", default=_UNSET)

#: whether operations run in a helper process here
FORKS = hasattr(os, "fork") and sys.platform.startswith("linux")

#: a helper with no request for this long exits: it keeps the pages the parent had when it was
#: forked (weights the parent has freed since, say) for as long as it lives
IDLE_SECONDS = 10.0
_RETIRED = 3  # the helper's exit status when it retires idle
_REQUEST = struct.Struct("<IQ")  # operation name length, payload length
_REPLY = struct.Struct("<BQ")  # 0: result, 1: "kind\nmessage"; payload length
_OPERATIONS: dict[str, Callable[[bytes], bytes]] = {}


def operation(name: str) -> Callable[[Callable[[bytes], bytes]], Callable[[bytes], bytes]]:
    """Register ``fn(payload) -> bytes`` under ``name`` for :func:`call` (at import time, so that
    the helper, forked later, has it)."""

    def register(fn: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
        _OPERATIONS[name] = fn
        return fn

    return register


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Calls in the block share one deadline ``seconds`` from now (``None``: none). Nested
    limits keep the earlier deadline."""
    current = _deadline.get()
    new = None if seconds is None else time.monotonic() + seconds
    if current is not None and current != _UNSET and (new is None or current < new):
        new = current
    token = _deadline.set(new)
    try:
        yield
    finally:
        _deadline.reset(token)


def remaining() -> float | None:
    """Seconds left before the deadline (``None``: no deadline)."""
    deadline = _deadline.get()
    if deadline == _UNSET:  # outside any compile (a bundle being read): the default budget's limit
        return DEFAULT_BUDGET.max_compile_seconds
    return None if deadline is None else deadline - time.monotonic()


def check(step: str) -> None:
    """Raise :class:`CompileTimeoutError` if the deadline has passed (between steps of byoc's own)."""
    left = remaining()
    if left is not None and left <= 0:
        raise CompileTimeoutError(f"{step}: the compile ran past its time limit (budget.max_compile_seconds)")


class ChildError(RuntimeError):
    """The operation raised in the helper (``kind`` is the exception's type name), or the helper died."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception from :func:`call`, wherever the operation ran."""
    return f"{exc.kind if isinstance(exc, ChildError) else type(exc).__name__}: {exc}"


def call(name: str, payload: bytes, step: str) -> bytes:
    """The registered operation ``name`` applied to ``payload``, in the helper where there is one.

    :raises CompileTimeoutError: the deadline passed first (the helper is killed).
    :raises ChildError: the operation raised in the helper, or the helper died (the signal);
        in-process, whatever the operation raises.
    """
    check(step)
    fn = _OPERATIONS[name]
    if not FORKS:
        return fn(payload)
    if _deadline.get() == _UNSET:
        with time_limit(DEFAULT_BUDGET.max_compile_seconds):
            return call(name, payload, step)
    left = remaining()
    if not _state.lock.acquire(timeout=-1 if left is None else max(left, 0.0)):
        raise CompileTimeoutError(f"{step}: waited for another compile's ONNX call past the compile's time limit "
                                  f"(budget.max_compile_seconds)")
    try:
        for _ in range(2):  # once more when the helper retired (idle) just as this request came
            if _state.helper is None or name not in _state.helper.operations:
                if _state.helper is not None:
                    _state.helper.stop()
                try:
                    _state.helper = _Helper.start()
                except OSError:  # no memory or process slot for a child: run it here, unbounded
                    return fn(payload)
            try:
                return _state.helper.request(name, payload, step)
            except _Retired:
                continue
            finally:
                if not _state.helper.alive:  # timed out, crashed or retired: the next call forks a new one
                    _state.helper = None
        raise ChildError("the helper process ended before answering, twice", "crash")
    finally:
        _state.lock.release()


def stop_helper() -> None:
    """Stop the helper process, if one runs (the next call forks a new one)."""
    with _state.lock:
        if _state.helper is not None:
            _state.helper.stop()
            _state.helper = None


def helper_pid() -> int | None:
    """The helper process's id, while one runs."""
    helper = _state.helper
    return helper.pid if helper is not None and helper.alive else None


class _State:
    def __init__(self) -> None:
        self.lock, self.helper = threading.Lock(), None


_state = _State()


def _forget_helper() -> None:
    """In a forked child: the parent's helper and lock are the parent's (the lock may be held by
    a thread the child does not have); a child that calls onnx forks a helper of its own."""
    global _state
    if _state.helper is not None:
        _state.helper.abandon()
    _state = _State()


if FORKS:
    os.register_at_fork(after_in_child=_forget_helper)


class _Retired(Exception):
    """The helper had retired (idle) before it read the request."""


class _Helper:
    """The helper process and the parent's ends of its two pipes."""

    def __init__(self, pid: int, requests: int, replies: int, operations: frozenset[str]):
        self.pid, self.requests, self.replies, self.operations = pid, requests, replies, operations
        self.alive = True

    @classmethod
    def start(cls) -> _Helper:
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            for fd in (request_r, request_w, reply_r, reply_w):
                os.close(fd)
            raise
        if pid == 0:  # the helper: serves until the parent goes, never returns into the caller's code
            code = 0
            try:
                os.close(request_w)
                os.close(reply_r)
                _serve(request_r, reply_w, parent)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(request_r)
        os.close(reply_w)
        return cls(pid, request_w, reply_r, frozenset(_OPERATIONS))

    def request(self, name: str, payload: bytes, step: str) -> bytes:
        encoded = name.encode()
        try:
            _write_all(self.requests, _REQUEST.pack(len(encoded), len(payload)) + encoded)
            _write_all(self.requests, payload)
            head = self._read(_REPLY.size, step)
            status, length = _REPLY.unpack(head) if len(head) == _REPLY.size else (None, 0)
            data = self._read(length, step) if status is not None else b""
        except BrokenPipeError:
            status, data = None, b""
        if status is None or len(data) < length:
            how = self.stop()
            if how == f"exit status {_RETIRED}":
                raise _Retired()
            raise ChildError(f"crashed on the model ({how})", "crash")
        if status == 1:
            kind, _, message = data.decode("utf-8", "replace").partition("\n")
            raise ChildError(message, kind)
        return data

    def _read(self, n: int, step: str) -> bytes:
        """``n`` bytes of the reply (fewer: the helper died), waiting until the deadline."""
        chunks, got = [], 0
        while got < n:
            left = remaining()
            if not select.select([self.replies], [], [], None if left is None else max(left, 0.0))[0]:
                self.stop()
                raise CompileTimeoutError(f"{step}: still running when the compile's time limit "
                                          f"(budget.max_compile_seconds) ran out; the model was refused")
            chunk = os.read(self.replies, min(n - got, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def stop(self) -> str:
        """Kill and reap the helper; returns how it ended ("signal SIGSEGV", "exit status 1")."""
        if not self.alive:
            return "stopped"
        self.alive = False
        for fd in (self.requests, self.replies):
            os.close(fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
            return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else "killed"

    def abandon(self) -> None:
        """Close the pipes without touching the process (it is not this process's child)."""
        if self.alive:
            self.alive = False
            for fd in (self.requests, self.replies):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int, parent: int, idle: float | None = None) -> bytes | None:
    """``n`` bytes from the parent, or ``None`` once it has gone (end of file, or this process
    was handed to another parent). ``idle``: exit with :data:`_RETIRED` when nothing has come
    for that many seconds."""
    chunks, got = [], 0
    since = time.monotonic()
    while got < n:
        if not select.select([fd], [], [], 1.0)[0]:
            if os.getppid() != parent:
                return None
            if idle is not None and not got and time.monotonic() - since > idle:
                os._exit(_RETIRED)
            continue
        chunk = os.read(fd, min(n - got, 1 << 24))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _serve(requests: int, replies: int, parent: int) -> None:
    faulthandler.disable()  # a crash is the parent's to report, once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops the helper
    # The parent's objects, its unreachable cycles among them, are never collected here: a
    # collection would run their destructors, and one of the parent's thread pools would wait
    # for threads this process does not have. What the operations leave is collected as usual.
    gc.freeze()
    while True:
        head = _read_exactly(requests, _REQUEST.size, parent, IDLE_SECONDS)
        if head is None:
            return
        name_length, length = _REQUEST.unpack(head)
        name = _read_exactly(requests, name_length, parent)
        payload = _read_exactly(requests, length, parent)
        if name is None or payload is None:
            return
        try:
            result, status = _OPERATIONS[name.decode()](payload), 0
        except Exception as exc:
            kind = type(exc).__name__
            result, status = f"{kind}\n{str(exc).strip() or kind}".encode("utf-8", "replace"), 1
        _write_all(replies, _REPLY.pack(status, len(result)))
        _write_all(replies, result)
