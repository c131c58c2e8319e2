"""The plugin manager: hook specs, entry points (group ``byoc``), scoped calls, fault isolation.

``get_registry()`` is the one place that builds everything byoc knows about vendors. It loads
every entry point of the group ``byoc`` (``BYOC_PLUGINS=a,b`` restricts which, by entry-point
or distribution name; ``BYOC_PLUGINS=`` loads none), asks each plugin for its targets,
operators, patterns and rules, and records every fault instead of crashing: a plugin that fails
to import, two plugins claiming one target, a plugin built for another hook API version, a
hook wrapper. ``BYOC_TRACE=1`` logs every hook call through the ``byoc.plugins`` logger.

Target-scoped calls: a hook about one target runs only in the plugin that registered the
target and in plugins that declared ``extend(target)`` (pluggy's ``subset_hook_caller``).
Implementations run one at a time, in pluggy's own order (last registered first,
``tryfirst``/``trylast`` honoured), so a fault names its plugin and a slow hook can time out.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

from byoc.contract import environment as _env
from byoc.contract import hookspecs
from byoc.contract.faults import PluginFault
from byoc.contract.host import HostExecutor
from byoc.contract.types import Pattern, Rule, Target
from byoc.errors import PluginError

logger = logging.getLogger("byoc.plugins")

ENTRY_POINT_GROUP = "byoc"


#: modules of hook API 1 that API 2 removed: a plugin importing one was built for API 1
_API1_MODULES = ("byoc.partition.types", "byoc.partition.patterns", "byoc.hookspecs")


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
    #: target name -> the plugins whose target-scoped hooks it calls (owner first, then extenders)
    scopes: dict[str, list[str]] = field(default_factory=dict)
    #: CPU executors for the host's nodes, highest priority first
    executors: list[HostExecutor] = field(default_factory=list)
    _callers: dict[tuple[str, str | None], Any] = field(default_factory=dict, repr=False)

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

    def hookimpls(self, hook_name: str, target: str | None = None) -> list[pluggy.HookImpl]:
        """The implementations of ``hook_name`` in the order pluggy calls them.

        With ``target``: only those of the plugins in the target's scope (the plugin that
        registered it and the plugins that extend it).
        """
        key = (hook_name, target)
        caller = self._callers.get(key)
        if caller is None:
            if target is None:
                caller = getattr(self.pm.hook, hook_name)
            else:
                scope = set(self.scopes.get(target, ()))
                others = [p for name, p in self.pm.list_name_plugin() if name not in scope and p is not None]
                caller = self.pm.subset_hook_caller(hook_name, others)
                if not scope:  # nobody owns it: no implementation at all
                    caller = None
            self._callers[key] = caller
        if caller is None:
            return []
        # pluggy keeps [trylast.., plain.., tryfirst.., wrappers..] and calls them in reverse
        return [impl for impl in reversed(caller.get_hookimpls()) if not (impl.hookwrapper or impl.wrapper)]

    def call_each(self, hook_name: str, *, timeout: float | None = None,
                  **kwargs: Any) -> Iterable[tuple[str, Any, BaseException | None]]:
        """Call every implementation of ``hook_name``; yields ``(plugin, result, exception)``.

        A ``target=`` keyword scopes the call to that target's plugins; implementations run in
        pluggy's order. With ``timeout``, an implementation that does not return in time yields
        a :class:`HookTimeout` (its thread is left to finish in the background).
        """
        for impl in self.hookimpls(hook_name, kwargs.get("target")):
            args = {k: kwargs[k] for k in impl.argnames if k in kwargs}
            if _TRACE:
                logger.info("call %s.%s(%s)", impl.plugin_name, hook_name, ", ".join(args))
            try:
                if timeout is None:
                    result = impl.function(**args)
                else:
                    result = _call_with_timeout(impl.function, args, timeout, f"{impl.plugin_name}.{hook_name}")
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # the plugin's fault (sys.exit() too), reported by the caller
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


_TRACE = _env.get("BYOC_TRACE") not in ("", "0")
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
        env = _env.get("BYOC_PLUGINS", None)
        allow = None if env is None else {s.strip() for s in env.split(",") if s.strip()}
        for ep in _entry_points():
            if not _allowed(ep, allow):
                continue
            dist = ep.dist.name if ep.dist is not None else ""
            version = ep.dist.version if ep.dist is not None else ""
            try:
                module = ep.load()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                fault = _import_fault(ep.name, exc, dist, version)
                reg.faults.append(fault)
                warnings.warn(str(fault), stacklevel=2)
                continue
            _register(reg, ep.name, module, dist, version)
    for name, plugin in plugins:
        _register(reg, name, plugin, "", "")
    _collect(reg)
    return reg


def _import_fault(name: str, exc: BaseException, dist: str, version: str) -> PluginFault:
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing in _API1_MODULES:
        return PluginFault(name, "import", f"was built for hook API version 1 (it imports {missing}, which hook "
                           f"API version {hookspecs.HOOK_API_VERSION} replaced by byoc.contract); the plugin is not "
                           "used: upgrade it", "api-version", dist, version)
    return PluginFault(name, "import", f"failed to import: {type(exc).__name__}: {exc}", "import", dist, version)


def _register(reg: Registry, name: str, plugin: object, dist: str, version: str) -> None:
    try:
        reg.pm.register(plugin, name=name)
    except Exception as exc:  # pluggy validates hook signatures here
        fault = PluginFault(name, "register", f"{type(exc).__name__}: {exc}", "error", dist, version)
        reg.faults.append(fault)
        warnings.warn(str(fault), stacklevel=3)
        return
    wrappers = sorted(c.name for c in reg.pm.get_hookcallers(plugin) or []
                      for impl in c.get_hookimpls() if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper))
    if wrappers:
        reg.pm.unregister(plugin)
        fault = PluginFault(name, wrappers[0], f"hook wrappers (hookwrapper=True / wrapper=True) are not supported: "
                            f"byoc calls each implementation on its own so that a fault names its plugin; "
                            f"use plain hooks (tryfirst/trylast are honoured). Wrapped hooks: {', '.join(wrappers)}; "
                            "the plugin is not used", "error", dist, version)
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
    extends: dict[str, list[str]] = {}
    for plugin, _, exc in _each_target(reg, claimed, extends):
        if exc is not None:
            _fault(reg, plugin, "byoc_register_targets", f"raised {type(exc).__name__}: {exc}")
    order = {name: i for i, name in enumerate(reg.distributions)}  # registration order
    for name, owners in claimed.items():
        owners.sort(key=lambda t: order.get(t.plugin, 0))
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
        reg.scopes[name] = [t.plugin] + [p for p in extends.get(name, []) if p != t.plugin]
    _collect_executors(reg)
    for name in reg.targets:
        reg.operators[name] = {}
        reg.patterns[name] = []
        reg.rules[name] = []
        _collect_for_target(reg, name)


def _collect_executors(reg: Registry) -> None:
    current = {"plugin": ""}

    def register(executor: HostExecutor) -> None:
        if not isinstance(executor, HostExecutor):
            raise TypeError(f"register() expects a byoc.contract.HostExecutor, got {type(executor).__name__}")
        executor.plugin = current["plugin"]
        reg.executors.append(executor)

    for impl in reg.hookimpls("byoc_register_host_executor"):
        current["plugin"] = impl.plugin_name
        try:
            impl.function(**({"register": register} if "register" in impl.argnames else {}))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            _fault(reg, impl.plugin_name, "byoc_register_host_executor", f"raised {type(exc).__name__}: {exc}")
    reg.executors.sort(key=lambda e: (-e.priority, e.name))


def host_executor(choice: str | None = None, registry: Registry | None = None) -> HostExecutor | None:
    """The CPU executor for the host's nodes: ``choice`` (an executor's name, or
    ``"reference"`` for byoc's reference kernels alone), else ``BYOC_HOST_EXECUTOR``, else the
    installed executor with the highest priority (``None``: the reference kernels)."""
    choice = choice or _env.get("BYOC_HOST_EXECUTOR") or None
    if choice == "reference":
        return None
    executors = (registry if registry is not None else get_registry()).executors
    if choice is None:
        return executors[0] if executors else None
    for executor in executors:
        if executor.name == choice:
            return executor
    names = ", ".join(repr(e.name) for e in executors) or "none installed"
    raise PluginError(f"host executor {choice!r} is not installed (installed: {names}; 'reference' runs byoc's "
                      "reference kernels)")


def host_name(executor: HostExecutor | None) -> str:
    """The name a compiled model records for its host executor (``"reference"``: none)."""
    return "reference" if executor is None else executor.name


def recorded_host(name: Any, registry: Registry | None = None) -> HostExecutor | None:
    """The host executor a bundle recorded (:func:`host_name`), where this process has it, so that
    a loaded model computes what the compiled one did; else (a bundle from before the record, or
    an executor not installed here) the one :func:`host_executor` picks."""
    if isinstance(name, str) and name:
        try:
            return host_executor(name, registry)
        except PluginError:
            pass
    return host_executor(None, registry)


def _each_target(reg: Registry, claimed: dict[str, list[Target]], extends: dict[str, list[str]]):
    current = {"plugin": ""}

    def extend(name: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"extend() expects a target name, got {name!r}")
        if current["plugin"] not in extends.setdefault(name, []):
            extends[name].append(current["plugin"])

    def register(target: Target) -> None:
        if not isinstance(target, Target):
            raise TypeError(f"register() expects a byoc.Target, got {type(target).__name__}")
        dist, version = reg.distributions.get(current["plugin"], ("", ""))
        target.plugin = current["plugin"]
        target.distribution = target.distribution or dist
        claimed.setdefault(target.name, []).append(target)

    for impl in reg.hookimpls("byoc_register_targets"):
        current["plugin"] = impl.plugin_name
        args = {k: v for k, v in (("register", register), ("extend", extend)) if k in impl.argnames}
        try:
            impl.function(**args)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
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
            raise TypeError(f"register() expects a byoc.contract.Pattern, got {type(pattern).__name__}")
        if not pattern.name.startswith(target + "."):
            raise ValueError(f"pattern {pattern.name!r} must be named '{target}.<pattern>'")
        reg.patterns[target].append((current["plugin"], pattern))

    def add_rule(rule: Rule) -> None:
        if not isinstance(rule, Rule):
            raise TypeError(f"register() expects a byoc.contract.Rule, got {type(rule).__name__}")
        reg.rules[target].append((current["plugin"], rule))

    for hook_name, register in (
        ("byoc_register_operators", add_op),
        ("byoc_register_patterns", add_pattern),
        ("byoc_register_rules", add_rule),
    ):
        for impl in reg.hookimpls(hook_name, target):
            current["plugin"] = impl.plugin_name
            args = {k: v for k, v in (("target", target), ("register", register)) if k in impl.argnames}
            try:
                impl.function(**args)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
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
