"""Tiered first runs: a compiled model answers at once while its fast code compiles.

A JIT engine (a target or host executor with ``jit=True``, such as byoc-cpu) compiles its code
on its first run: on a fresh install, seconds to a minute. Until that is done a model answers
from a *first tier*: the same graph with every region and host node on byoc's reference kernels.
The first run that succeeds starts the full plan's first run on a background thread, with a
copy of its feeds; when that completes, later runs use the full plan (a run in flight finishes on the plan it
started on). A failure there is warned about once and the first tier keeps serving.
``byoc.compile(..., wait=True)`` builds no first tier: the first run compiles, as benchmarks want.

The thread is a daemon: a process that exits after its first answer does not wait for the
compile (Numba and byoc-cpu write their caches atomically, so an interrupted compile leaves
nothing half-written); a process that lives on gets full speed.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from byoc.runtime.plan import Plan


class Tiers:
    """The first tier of a compiled model and the background first run of its full plan."""

    def __init__(self, first: Plan, full_first_run: Callable[[dict[str, np.ndarray]], Any]):
        self.first = first
        self._full_first_run = full_first_run
        #: ``"first"`` (nothing started), ``"compiling"``, ``"full"`` or ``"failed"``
        self.state = "first"
        self.error: str | None = None
        #: seconds from the first run's start until the full plan was ready
        self.ready_after_s: float | None = None
        self._started = 0.0
        self._thread: threading.Thread | None = None
        self._claimed = False  # a run holds the right to start the thread
        self._lock = threading.Lock()

    @property
    def full(self) -> bool:
        return self.state == "full"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on the first tier; the first run that succeeds then starts the full plan's compile
        (after its own answer: Numba compiles one function at a time, and the first tier's answer
        comes first). A run that fails (bad feeds, a model that cannot run them) starts nothing,
        so the compiled code is never judged by feeds that no plan can run."""
        with self._lock:
            claimed = self._thread is None and not self._claimed
            if claimed:
                self._claimed = True
                copies = {name: np.array(value, copy=True) for name, value in feeds.items()}
        try:
            out = self.first.execute(feeds)
        except BaseException:
            if claimed:
                self._claimed = False
            raise
        if claimed:
            with self._lock:
                self._started = time.perf_counter()
                self.state = "compiling"
                self._thread = threading.Thread(target=self._compile, args=(copies,), name="byoc-full-tier", daemon=True)
                self._thread.start()
        return out

    def _compile(self, feeds: dict[str, np.ndarray]) -> None:
        try:
            self._full_first_run(feeds)
        except BaseException as exc:  # noqa: BLE001 - reported once; the first tier keeps serving
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = "failed"
            warnings.warn(f"byoc: the compiled code failed on its first run ({self.error}); this model keeps "
                          "running on byoc's reference kernels", RuntimeWarning, stacklevel=1)
            return
        self.ready_after_s = time.perf_counter() - self._started
        self.state = "full"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background compile (if one started); whether the full plan serves now."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.full

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, "ready_after_s": self.ready_after_s, "error": self.error}


__all__ = ["Tiers"]
