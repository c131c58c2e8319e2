"""Time limits and cancellation for runs.

``CompiledModel.run(feeds, timeout=2.0)`` or ``run(feeds, cancel=handle)`` installs a
:class:`RunControl` for the calling thread (a context variable, so concurrent runs in other
threads are unaffected). The plan checks it between steps and the Loop/Scan kernels on every
iteration, so a runaway loop stops within one iteration of the limit. A single kernel call is
not interrupted.
"""

from __future__ import annotations

import contextvars
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from byoc.errors import RunCancelledError, RunTimeoutError


class CancelHandle:
    """Pass to ``run(..., cancel=handle)``; ``handle.cancel()`` from any thread stops the run."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class RunControl:
    __slots__ = ("deadline", "handle", "timeout")

    def __init__(self, timeout: float | None, handle: CancelHandle | None):
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.handle = handle

    def check(self, where: str) -> None:
        if self.handle is not None and self.handle.cancelled:
            raise RunCancelledError(f"run cancelled at {where}")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise RunTimeoutError(f"run exceeded its timeout of {self.timeout:g} s at {where}")


_current: contextvars.ContextVar[RunControl | None] = contextvars.ContextVar("byoc_run_control", default=None)


def current() -> RunControl | None:
    return _current.get()


def check(where: str) -> None:
    """Raise if the current run is cancelled or out of time (no-op outside a controlled run)."""
    ctrl = _current.get()
    if ctrl is not None:
        ctrl.check(where)


@contextmanager
def inside(where: str) -> Iterator[None]:
    """Name the enclosing Loop/Scan iteration when a limit fires inside its body."""
    try:
        yield
    except (RunTimeoutError, RunCancelledError) as exc:
        if where in str(exc):
            raise
        raise type(exc)(f"{exc}, inside {where}") from None


@contextmanager
def controlled(timeout: float | None, handle: CancelHandle | None) -> Iterator[None]:
    if timeout is None and handle is None:
        yield
        return
    if timeout is not None and not timeout > 0:
        from byoc.errors import OptionError

        raise OptionError(f"timeout must be a positive number of seconds, got {timeout!r}")
    token = _current.set(RunControl(timeout, handle))
    try:
        yield
    finally:
        _current.reset(token)
