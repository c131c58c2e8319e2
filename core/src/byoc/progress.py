"""Progress of long steps: the core reports, a front end shows.

``byoc.compile`` (frontend, passes, partitioning, code generation per region), calibration, the
first run of a :class:`~byoc.CompiledModel` (Numba compiles its kernels then) and the ``byoc``
command's bundle loading and conformance runs report what they are doing here. Nothing listens by
default: each report is then one context-variable lookup and nothing is shown. A front end (the
``byoc`` command, ``examples/demo.py``) attaches a :class:`Listener` with :func:`listen`; the
core itself never prints progress.

Two ways to report::

    with progress.phase("calibration", total=len(samples)) as task:
        for sample in samples:
            ...
            task.advance()

    stages = progress.stages("compile")      # one line per step, nothing to indent
    stages.next("shared passes")
    ...
    stages.next("codegen", total=len(regions))
    for region in regions:
        stages.item(region.name)         # the previous region is done
        ...
    stages.finish()
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from typing import Callable, Iterator, Protocol


class Task:
    """One reported step: ``label``, ``total`` units (``None``: unknown), ``completed`` so far."""

    __slots__ = ("label", "total", "completed", "detail", "started", "_listener", "finished")

    def __init__(self, label: str, total: int | None, listener: "Listener | None"):
        self.label = label
        self.total = total
        self.completed = 0
        self.detail = ""
        self.started = time.perf_counter()
        self.finished = False
        self._listener = listener

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def advance(self, n: int = 1, detail: str | None = None) -> None:
        """``n`` more units done; ``detail`` says what is being worked on now."""
        if self._listener is None:
            return
        self.completed += n
        if detail is not None:
            self.detail = detail
        _safe(self._listener.update, self)

    def finish(self) -> None:
        """The step is over (idempotent)."""
        if self._listener is None or self.finished:
            return
        self.finished = True
        _safe(self._listener.finish, self)


class Listener(Protocol):
    """What a front end implements to show progress (e.g. :mod:`byoc.terminal`)."""

    def start(self, task: Task) -> None: ...

    def update(self, task: Task) -> None: ...

    def finish(self, task: Task) -> None: ...


def _safe(fn: Callable[[Task], None], task: Task) -> None:
    # a display problem must never break a compile or a run
    try:
        fn(task)
    except Exception:  # noqa: BLE001 - the listener is the front end's, not the core's
        pass


_LISTENER: ContextVar["Listener | None"] = ContextVar("byoc_progress_listener", default=None)
_TICKER: ContextVar["tuple[object, Stages] | None"] = ContextVar("byoc_progress_ticker", default=None)
_NULL = Task("", None, None)


def active() -> bool:
    """Whether a front end listens (lets a caller skip building labels)."""
    return _LISTENER.get() is not None


def start(label: str, total: int | None = None) -> Task:
    """Start a step; call :meth:`Task.finish` at its end (or use :func:`phase`)."""
    listener = _LISTENER.get()
    if listener is None:
        return _NULL
    task = Task(label, total, listener)
    _safe(listener.start, task)
    return task


@contextlib.contextmanager
def phase(label: str, total: int | None = None) -> Iterator[Task]:
    """A step around a ``with`` block; the task is finished when the block ends, also on error."""
    task = start(label, total)
    try:
        yield task
    finally:
        task.finish()


class Stages:
    """Consecutive steps of one job: :meth:`next` finishes the current one and starts another."""

    __slots__ = ("prefix", "current", "_items")

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.current = _NULL
        self._items = 0

    def next(self, label: str, total: int | None = None) -> Task:
        self.current.finish()
        self._items = 0
        self.current = start(f"{self.prefix}: {label}" if self.prefix else label, total)
        return self.current

    def advance(self, n: int = 1, detail: str | None = None) -> None:
        self.current.advance(n, detail)

    def item(self, detail: str) -> None:
        """The current step starts its next unit (``detail`` names it); the previous one is done."""
        self.current.advance(1 if self._items else 0, detail)
        self._items += 1

    def finish(self) -> None:
        self.current.finish()
        self.current = _NULL


def stages(prefix: str = "") -> Stages:
    """Report a job as a sequence of steps (see the module docstring)."""
    return Stages(prefix if active() else "")


@contextlib.contextmanager
def listen(listener: Listener | None) -> Iterator[None]:
    """Send the progress reported inside the block (in this thread / context) to ``listener``."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


# -- per-step ticks of a plan's run (the first run of a compiled model) -----------------------------


@contextlib.contextmanager
def ticking(owner: object, task: Task) -> Iterator[None]:
    """While inside, each step ``owner`` runs (see :func:`ticker`) is a unit of ``task``."""
    if task is _NULL:
        yield
        return
    units = Stages("")
    units.current = task
    token = _TICKER.set((owner, units))
    try:
        yield
    finally:
        _TICKER.reset(token)


def ticker(owner: object) -> "Stages | None":
    """What ``owner`` calls ``item(step name)`` on before each step it runs, else ``None`` (cheap)."""
    current = _TICKER.get()
    if current is None or current[0] is not owner:
        return None
    return current[1]


__all__ = ["Listener", "Stages", "Task", "active", "listen", "phase", "stages", "start", "ticker", "ticking"]
