"""Plugin faults: what a plugin got wrong, as ``byoc doctor`` and the placement report show it.

A vendor never raises these; byoc records one whenever a hook raises, returns the wrong type,
times out, or claims nodes that would form a cycle, and falls back (``strict=True`` raises
:class:`byoc.PluginError` with the same text instead).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PluginFault:
    """One thing a plugin got wrong.

    :param plugin: the plugin's entry-point name.
    :param hook: the hook (or ``"import"``/``"register"``) where it happened.
    :param message: what went wrong, naming the node, region or target.
    :param kind: ``"import"``, ``"duplicate"``, ``"api-version"`` or ``"error"``.
    """

    plugin: str
    hook: str
    message: str
    kind: str = "error"  # "import", "duplicate", "api-version", "error"
    distribution: str = ""
    version: str = ""

    def __str__(self) -> str:
        dist = f" ({self.distribution} {self.version})" if self.distribution else ""
        return f"plugin {self.plugin!r}{dist}, hook {self.hook}: {self.message}"


__all__ = ["PluginFault"]
