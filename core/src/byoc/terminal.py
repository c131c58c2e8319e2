"""Showing :mod:`byoc.progress` on stderr: rich progress bars on a terminal, plain lines otherwise.

Used by the ``byoc`` command and ``examples/demo.py``; the core never imports it.
:func:`show_progress` is quiet (attaches nothing) unless stderr is a terminal or ``force`` is set,
so pipes and CI logs stay clean.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator, TextIO

from byoc.progress import Task, listen


def wanted(flag: bool | None, stream: TextIO | None = None) -> bool:
    """``--progress`` (True) / ``--no-progress`` (False) / neither: only on an interactive terminal."""
    if flag is not None:
        return flag
    stream = stream or sys.stderr
    if os.environ.get("TERM") == "dumb" or os.environ.get("CI"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class LineListener:
    """One line when a step starts and one when it ends (for logs: ``--progress`` into a pipe)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def start(self, task: Task) -> None:
        size = f" ({task.total} step{'' if task.total == 1 else 's'})" if task.total else ""
        self._write(f"[byoc] {task.label}{size} ...")

    def update(self, task: Task) -> None:
        pass

    def finish(self, task: Task) -> None:
        self._write(f"[byoc] {task.label}: done in {task.elapsed:.2f} s")


class RichListener:
    """Live bars (rich) while steps run; a finished step leaves one line with its time."""

    def __init__(self, stream: TextIO):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(file=stream, stderr=stream is sys.stderr, highlight=False)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            TextColumn("[dim]{task.fields[detail]}"),
            console=self.console,
            transient=True,
            # print() to stdout goes above the bars only when stdout is a terminal too: output
            # redirected to a file must stay in that file
            redirect_stdout=_isatty(sys.stdout),
        )
        self._ids: dict[int, object] = {}

    def __enter__(self) -> "RichListener":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    @staticmethod
    def _count(task: Task) -> str:
        return f"{task.completed}/{task.total}" if task.total else ""

    def start(self, task: Task) -> None:
        from rich.markup import escape

        self._ids[id(task)] = self.progress.add_task(escape(task.label), total=task.total, count=self._count(task), detail="")

    def update(self, task: Task) -> None:
        from rich.markup import escape

        tid = self._ids.get(id(task))
        if tid is not None:
            detail = task.detail if len(task.detail) <= 48 else task.detail[:45] + "..."
            self.progress.update(tid, completed=task.completed, count=self._count(task), detail=escape(detail))

    def finish(self, task: Task) -> None:
        from rich.markup import escape

        tid = self._ids.pop(id(task), None)
        if tid is None:
            return
        self.progress.remove_task(tid)
        self.console.print(f"[green]done[/] {escape(task.label)} [dim]{task.elapsed:.2f} s[/]", markup=True,
                           highlight=False)


@contextlib.contextmanager
def show_progress(flag: bool | None = None, stream: TextIO | None = None) -> Iterator[None]:
    """Show the progress the core reports inside the block (see :func:`wanted` for when)."""
    stream = stream or sys.stderr
    if not wanted(flag, stream):
        yield
        return
    interactive = False
    try:
        interactive = stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        pass
    if not interactive:
        with listen(LineListener(stream)):
            yield
        return
    with RichListener(stream) as listener, listen(listener):
        yield


__all__ = ["LineListener", "RichListener", "show_progress", "wanted"]
