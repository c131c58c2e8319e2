"""Fault-injection plugins for byoc's integration tests; inert unless ``BYOC_FAULT`` is set."""

from __future__ import annotations

import os

__version__ = "0.1.0"


def modes() -> set[str]:
    """The faults switched on by ``BYOC_FAULT`` (comma-separated), read at call time."""
    return {m.strip() for m in os.environ.get("BYOC_FAULT", "").split(",") if m.strip()}


def active(mode: str | None = None) -> bool:
    """Whether any fault is on (``mode=None``) or ``mode`` is."""
    current = modes()
    return bool(current) if mode is None else mode in current
