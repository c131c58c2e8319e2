"""The plugin manager: hook specs, entry points (group ``byoc``), fault isolation, tracing.

``get_registry()`` is the one place that builds everything byoc knows about vendors. It loads
every entry point of the group ``byoc`` (``BYOC_PLUGINS=a,b`` restricts which, by entry-point
or distribution name; ``BYOC_PLUGINS=`` loads none), asks each plugin for its targets,
operators, patterns and rules, and records every fault instead of crashing: a plugin that fails
to import, two plugins claiming one target, a plugin built for another hook API version.
``BYOC_TRACE=1`` logs every hook call through the ``byoc.plugins`` logger.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

from byoc import hookspecs
from byoc.errors import PluginError
from byoc.partition.types import Pattern, Rule, Target

logger = logging.getLogger("byoc.plugins")

ENTRY_POINT_GROUP = "byoc"


@dataclass
class PluginFault:
    """One thing a plugin got wrong, as ``byoc doctor`` reports it."""

    plugin: str
    hook: str
    message: str
    kind: str = "error"  # "import", "duplicate", "api-version", "error"
    distribution: str = ""
    version: str = ""

    def __str__(self) -> str:
        dist = f" ({self.distribution} {self.version})" if self.distribution else ""
        return f"plugin {self.plugin!r}{dist}, hook {self.hook}: {self.message}"


@dataclass
class OperatorEntry:
    plugin: str
    op_type: str
    domain: str
    check: Callable[..., Any] | None


@dataclass
class Registry:
    """Everything the installed plugins registered."""

    pm: pluggy.PluginManager
    targets: dict[str, Target] = field(default_factory=dict)
    operators: dict[str, dict[tuple[str, str], list[OperatorEntry]]] = field(default_factory=dict)
    patterns: dict[str, list[tuple[str, Pattern]]] = field(default_factory=dict)
    rules: dict[str, list[tuple[str, Rule]]] = field(default_factory=dict)
    faults: list[PluginFault] = field(default_factory=list)
    #: target name -> every plugin that claimed it, when more than one did
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    #: targets registered with another hook API version (not usable)
    incompatible: dict[str, Target] = field(default_factory=dict)
    distributions: dict[str, tuple[str, str]] = field(default_factory=dict)

    def ordered_targets(self) -> list[Target]:
        """Usable targets in default priority order (higher priority first, then name)."""
        return sorted(self.targets.values(), key=lambda t: (-t.priority, t.name))

    def target(self, name: str) -> Target:
        if name in self.conflicts:
            raise PluginError(
                f"target {name!r} is registered by several plugins: {', '.join(self.conflicts[name])}; "
                "uninstall one or restrict with BYOC_PLUGINS"
            )
        if name in self.incompatible:
            t = self.incompatible[name]
            raise PluginError(
                f"target {name!r} (plugin {t.plugin!r}) was built for hook API version {t.api_version}, "
                f"byoc provides {hookspecs.HOOK_API_VERSION}"
            )
        if name not in self.targets:
            known = ", ".join(sorted(self.targets)) or "none installed"
            raise PluginError(f"unknown target {name!r}; available targets: {known}")
        return self.targets[name]

    # -- calling hooks one implementation at a time, so a fault names its plugin ------------

    def call_each(self, hook_name: str, *, timeout: float | None = None,
                  **kwargs: Any) -> Iterable[tuple[str, Any, BaseException | None]]:
        """Call every implementation of ``hook_name``; yields ``(plugin, result, exception)``.

        With ``timeout``, an implementation that does not return in time yields a
        :class:`HookTimeout` (its thread is left to finish in the background).
        """
        hook = getattr(self.pm.hook, hook_name)
        for impl in hook.get_hookimpls():  # registration order (entry points sorted by name)
            args = {k: kwargs[k] for k in impl.argnames if k in kwargs}
            if _TRACE:
                logger.info("call %s.%s(%s)", impl.plugin_name, hook_name, ", ".join(args))
            try:
                if timeout is None:
                    result = impl.function(**args)
                else:
                    result = _call_with_timeout(impl.function, args, timeout, f"{impl.plugin_name}.{hook_name}")
            except Exception as exc:  # the plugin's fault, reported by the caller
                yield impl.plugin_name, None, exc
                continue
            if _TRACE:
                logger.info("  %s.%s -> %r", impl.plugin_name, hook_name, result)
            yield impl.plugin_name, result, None

    def call_first(self, hook_name: str, *, timeout: float | None = None,
                   **kwargs: Any) -> tuple[str | None, Any, list[PluginFault]]:
        """Like a ``firstresult`` hook, but a raising plugin is recorded, not fatal."""
        faults = []
        for plugin, result, exc in self.call_each(hook_name, timeout=timeout, **kwargs):
            if exc is not None:
                faults.append(PluginFault(plugin, hook_name, f"raised {type(exc).__name__}: {exc}"))
                continue
            if result is not None:
                return plugin, result, faults
        return None, None, faults


class HookTimeout(Exception):
    """A hook implementation did not return within its time limit."""


def _call_with_timeout(fn: Callable[..., Any], args: dict[str, Any], timeout: float, label: str) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(**args)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=target, name=f"byoc-hook-{label}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise HookTimeout(f"did not return within {timeout:g} s (hook_timeout)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


_TRACE = os.environ.get("BYOC_TRACE", "") not in ("", "0")
_lock = threading.Lock()
_registry: Registry | None = None


def _allowed(ep: md.EntryPoint, allow: set[str] | None) -> bool:
    if allow is None:
        return True
    dist = ep.dist.name if ep.dist is not None else ""
    return ep.name in allow or dist in allow


def _entry_points() -> list[md.EntryPoint]:
    eps = md.entry_points(group=ENTRY_POINT_GROUP)
    return sorted(eps, key=lambda ep: ep.name)


def build_registry(plugins: Iterable[tuple[str, object]] = (), *, entry_points: bool = True) -> Registry:
    """Build a fresh registry from entry points and/or explicit ``(name, plugin)`` pairs."""
    pm = pluggy.PluginManager("byoc")
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm=pm)
    if _TRACE:
        pm.trace.root.setwriter(logger.info)
        pm.enable_tracing()
    if entry_points:
        env = os.environ.get("BYOC_PLUGINS")
        allow = None if env is None else {s.strip() for s in env.split(",") if s.strip()}
        for ep in _entry_points():
            if not _allowed(ep, allow):
                continue
            dist = ep.dist.name if ep.dist is not None else ""
            version = ep.dist.version if ep.dist is not None else ""
            try:
                module = ep.load()
            except Exception as exc:
                fault = PluginFault(ep.name, "import", f"failed to import: {type(exc).__name__}: {exc}", "import",
                                    dist, version)
                reg.faults.append(fault)
                warnings.warn(str(fault), stacklevel=2)
                continue
            _register(reg, ep.name, module, dist, version)
    for name, plugin in plugins:
        _register(reg, name, plugin, "", "")
    _collect(reg)
    return reg


def _register(reg: Registry, name: str, plugin: object, dist: str, version: str) -> None:
    try:
        reg.pm.register(plugin, name=name)
    except Exception as exc:  # pluggy validates hook signatures here
        fault = PluginFault(name, "register", f"{type(exc).__name__}: {exc}", "error", dist, version)
        reg.faults.append(fault)
        warnings.warn(str(fault), stacklevel=3)
        return
    reg.distributions[name] = (dist, version)


def _fault(reg: Registry, plugin: str, hook: str, message: str, kind: str = "error") -> None:
    dist, version = reg.distributions.get(plugin, ("", ""))
    fault = PluginFault(plugin, hook, message, kind, dist, version)
    reg.faults.append(fault)
    warnings.warn(str(fault), stacklevel=3)


def _collect(reg: Registry) -> None:
    claimed: dict[str, list[Target]] = {}
    for plugin, _, exc in _each_target(reg, claimed):
        if exc is not None:
            _fault(reg, plugin, "byoc_register_targets", f"raised {type(exc).__name__}: {exc}")
    for name, owners in claimed.items():
        if len(owners) > 1:
            reg.conflicts[name] = [t.plugin for t in owners]
            _fault(reg, owners[1].plugin, "byoc_register_targets",
                   f"target {name!r} is also registered by plugin {owners[0].plugin!r}", "duplicate")
            continue
        t = owners[0]
        if t.api_version != hookspecs.HOOK_API_VERSION:
            reg.incompatible[name] = t
            _fault(reg, t.plugin, "byoc_register_targets",
                   f"target {name!r} was built for hook API version {t.api_version}, "
                   f"byoc provides {hookspecs.HOOK_API_VERSION}; the target is disabled", "api-version")
            continue
        reg.targets[name] = t
    for name in reg.targets:
        reg.operators[name] = {}
        reg.patterns[name] = []
        reg.rules[name] = []
        _collect_for_target(reg, name)


def _each_target(reg: Registry, claimed: dict[str, list[Target]]):
    current = {"plugin": ""}

    def register(target: Target) -> None:
        if not isinstance(target, Target):
            raise TypeError(f"register() expects a byoc.Target, got {type(target).__name__}")
        dist, version = reg.distributions.get(current["plugin"], ("", ""))
        target.plugin = current["plugin"]
        target.distribution = target.distribution or dist
        claimed.setdefault(target.name, []).append(target)

    hook = reg.pm.hook.byoc_register_targets
    for impl in hook.get_hookimpls():
        current["plugin"] = impl.plugin_name
        try:
            impl.function(register=register)
        except Exception as exc:
            yield impl.plugin_name, None, exc
            continue
        yield impl.plugin_name, None, None


def _collect_for_target(reg: Registry, target: str) -> None:
    current = {"plugin": ""}

    def add_op(op_type: str, check: Callable[..., Any] | None = None, domain: str = "") -> None:
        if not isinstance(op_type, str) or (check is not None and not callable(check)):
            raise TypeError("register(op_type: str, check: callable | None = None, domain: str = '')")
        entry = OperatorEntry(current["plugin"], op_type, domain or "", check)
        reg.operators[target].setdefault((domain or "", op_type), []).append(entry)

    def add_pattern(pattern: Pattern) -> None:
        if not isinstance(pattern, Pattern):
            raise TypeError(f"register() expects a byoc.partition.Pattern, got {type(pattern).__name__}")
        if not pattern.name.startswith(target + "."):
            raise ValueError(f"pattern {pattern.name!r} must be named '{target}.<pattern>'")
        reg.patterns[target].append((current["plugin"], pattern))

    def add_rule(rule: Rule) -> None:
        if not isinstance(rule, Rule):
            raise TypeError(f"register() expects a byoc.partition.Rule, got {type(rule).__name__}")
        reg.rules[target].append((current["plugin"], rule))

    for hook_name, register in (
        ("byoc_register_operators", add_op),
        ("byoc_register_patterns", add_pattern),
        ("byoc_register_rules", add_rule),
    ):
        hook = getattr(reg.pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            current["plugin"] = impl.plugin_name
            args = {k: v for k, v in (("target", target), ("register", register)) if k in impl.argnames}
            try:
                impl.function(**args)
            except Exception as exc:
                _fault(reg, impl.plugin_name, hook_name, f"raised {type(exc).__name__}: {exc} (target {target!r})")


def get_registry(*, reload: bool = False) -> Registry:
    """The process-wide registry, built on first use from the installed entry points."""
    global _registry
    with _lock:
        if _registry is None or reload:
            _registry = build_registry()
        return _registry


def list_targets() -> list[Target]:
    """Installed, usable targets in default priority order."""
    return get_registry().ordered_targets()
