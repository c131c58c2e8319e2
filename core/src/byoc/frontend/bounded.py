"""onnx's checker, version converter and shape inference, run where a time limit can stop them.

These are C++ code that byoc hands an untrusted model to, and some models send them into an
endless loop (an ``Einsum`` equation with two ellipses in one term) or crash them. On Linux each
call runs in a forked child process: the parent waits at most until the compile's deadline
(``Budget.max_compile_seconds``, set by :func:`time_limit`) and then kills the child, so a hang
costs the user a :class:`~byoc.errors.CompileTimeoutError` naming the step, and a crash an error
naming the signal, never a hung or dead process. Forking costs about 5 ms. Elsewhere (no
``fork``, or a platform where forking a threaded process is unsafe) the calls run in-process.

The child receives the model through the fork (nothing is serialised on the way in) and returns
bytes through a pipe: an error message, or what the call produced.
"""

from __future__ import annotations

import contextlib
import contextvars
import faulthandler
import gc
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator

from byoc.budget import DEFAULT_BUDGET
from byoc.errors import CompileTimeoutError

_UNSET = -1.0
#: the monotonic time calls must end by; ``None``: no limit; unset: the default budget's, per call
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("byoc_compile_deadline", default=_UNSET)

#: whether calls run in a child process here
FORKS = hasattr(os, "fork") and sys.platform.startswith("linux")


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
    """``fn`` raised in the child (``kind`` is the exception's type name), or the child died."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception from :func:`call`, wherever ``fn`` ran."""
    return f"{exc.kind if isinstance(exc, ChildError) else type(exc).__name__}: {exc}"


def call(fn: Callable[[], bytes], step: str) -> bytes:
    """``fn()``, in a child process where one can be forked.

    :raises CompileTimeoutError: the deadline passed first (the child is killed).
    :raises ChildError: ``fn`` raised in the child, or the child died (the signal); in-process,
        whatever ``fn`` raises.
    """
    check(step)
    if not FORKS:
        return fn()
    if _deadline.get() == _UNSET:
        with time_limit(DEFAULT_BUDGET.max_compile_seconds):
            return call(fn, step)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no memory or process slot for a child: run it here, unbounded
        os.close(r)
        os.close(w)
        return fn()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            os.close(r)
            faulthandler.disable()  # a crash is the parent's to report, once
            gc.disable()  # no destructors here: one of the parent's thread pools would wait for its threads forever
            try:
                payload = b"0" + fn()
            except BaseException as exc:
                kind = type(exc).__name__
                payload = b"1" + f"{kind}\n{str(exc).strip() or kind}".encode("utf-8", "replace")
            view = memoryview(payload)
            while view:
                view = view[os.write(w, view):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = _read_until_deadline(r, pid, step)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if not data:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        why = f"signal {signal.Signals(sig).name}" if sig else f"exit status {os.WEXITSTATUS(status)}"
        raise ChildError(f"crashed on the model ({why})", "crash")
    if data[:1] == b"1":
        kind, _, message = data[1:].decode("utf-8", "replace").partition("\n")
        raise ChildError(message, kind)
    return data[1:]


def _read_until_deadline(fd: int, pid: int, step: str) -> bytes:
    chunks = []
    while True:
        left = remaining()
        ready = select.select([fd], [], [], None if left is None else max(left, 0.0))[0]
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise CompileTimeoutError(f"{step}: still running when the compile's time limit "
                                      f"(budget.max_compile_seconds) ran out; the model was refused")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
