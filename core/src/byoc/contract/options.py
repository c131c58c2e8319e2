"""Typed target options: what a target accepts, and the one place that validates them.

A target declares each option it accepts::

    Target("mychip", options=[
        Option("precision", "fp16", choices=("fp16", "fp32"), doc="arithmetic of the engines"),
        Option("workspace", 1 << 30, type=int, minimum=1 << 20, doc="builder workspace, bytes"),
        Option("cache_dir", None, type=str, machine_local=True, doc="engine cache folder"),
    ])

byoc validates the user's ``target_options`` and the options read from a bundle against these
declarations and raises :class:`byoc.OptionError` naming the target, the option, the value and
what is allowed (an unknown key names the known ones). Hooks receive the full, validated set
(defaults filled in), so a plugin never re-checks them.

Every target also accepts byoc's own options (:data:`GENERIC_OPTIONS`: ``isolation`` and its
settings, see :mod:`byoc.runtime.isolation`); they are in the resolved set only when given.

Options marked ``machine_local`` (cache folders, thread counts, device indices) describe the
machine that runs the model, not the model: a bundle never supplies them, the loading user does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from byoc.errors import OptionError

@dataclass(frozen=True)
class Option:
    """One option of a target.

    :param name: the key in ``target_options={target: {name: value}}``.
    :param default: the value when the user gives none (a JSON value: options travel in bundles).
    :param type: the accepted Python type(s) (``int`` refuses ``bool``; ``float`` accepts ``int``);
        ``None``: any JSON value.
    :param choices: the allowed values, if the option is an enumeration.
    :param minimum: the smallest allowed number (``int``/``float`` options).
    :param nullable: ``None`` is allowed (default: when the default is ``None``).
    :param check: ``check(value) -> None | str``: a further check returning the reason a value
        is refused (e.g. ``"must be a power of two"``).
    :param doc: one line for ``byoc targets --json`` and the docs.
    :param machine_local: the option describes the machine, not the model (a cache folder, a
        thread count, a device index): it is never taken from a bundle.
    """

    name: str
    default: Any = None
    type: type | tuple[type, ...] | None = None
    choices: Sequence[Any] | None = None
    minimum: float | None = None
    nullable: bool | None = None
    check: Callable[[Any], str | None] | None = None
    doc: str = ""
    machine_local: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Option name must be a non-empty string, got {self.name!r}")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        if self.nullable is None:
            object.__setattr__(self, "nullable", self.default is None)

    # -- what is allowed ------------------------------------------------------------------------

    def _types(self) -> tuple[type, ...]:
        if self.type is None:
            return ()
        return self.type if isinstance(self.type, tuple) else (self.type,)

    def type_name(self) -> str:
        """The accepted type(s) as text (``"int"``, ``"str | None"``, ``"any"``)."""
        names = [t.__name__ for t in self._types()] or (
            sorted({type(c).__name__ for c in self.choices}) if self.choices else ["any"])
        if self.nullable and "NoneType" not in names:
            names.append("None")
        return " | ".join(names)

    def allowed(self) -> str:
        """What values are allowed, in words (used in every :class:`OptionError`)."""
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            text = {"bool": "True or False", "int": "an integer", "float": "a number", "str": "a string",
                    "dict": "a dict", "list": "a list"}.get(self.type_name().split(" | ")[0], "a JSON value")
            if len(self._types()) > 1:
                text = " or ".join(t.__name__ for t in self._types())
            if self.minimum is not None:
                text += f" >= {self.minimum:g}" if isinstance(self.minimum, float) else f" >= {self.minimum}"
        if self.nullable:
            text += " or None"
        return text

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed, or ``None``."""
        if value is None:
            return None if self.nullable else f"expected {self.allowed()}"
        if self.choices is not None:
            if not any(value == c and type(value) is type(c) for c in self.choices):
                return f"expected {self.allowed()}"
        types = self._types()
        if types:
            ok = False
            for t in types:
                if t is bool:
                    ok = ok or isinstance(value, bool)
                elif t is int:
                    ok = ok or (isinstance(value, int) and not isinstance(value, bool))
                elif t is float:
                    ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
                else:
                    ok = ok or isinstance(value, t)
            if not ok:
                return f"expected {self.allowed()}"
        if self.minimum is not None and isinstance(value, (int, float)) and value < self.minimum:
            return f"expected {self.allowed()}"
        if self.check is not None:
            reason = self.check(value)
            if reason:
                return str(reason)
        return None

    def describe(self) -> dict[str, Any]:
        """A JSON description (``byoc targets --json``)."""
        return {
            "name": self.name,
            "type": self.type_name(),
            "default": self.default,
            "allowed": self.allowed(),
            "choices": list(self.choices) if self.choices is not None else None,
            "doc": self.doc,
            "machine_local": self.machine_local,
        }


#: options every target accepts (byoc's own: a target may not declare them); see byoc.runtime.isolation
GENERIC_OPTIONS = (
    Option("isolation", "none", choices=("none", "process"),
           doc="'process': the target's codegen, runtime and region calls run in a worker process"),
    Option("isolation_timeout", 600.0, type=float, minimum=0.001, nullable=True,
           doc="seconds one isolated region call may take (None: no limit but the run's timeout)"),
    Option("isolation_memory_mb", None, type=int, minimum=64, machine_local=True,
           doc="the worker's data limit, MiB (RLIMIT_DATA; None: half the physical memory)"),
    Option("isolation_fallback", "error", choices=("error", "host"),
           doc="a faulted isolated region call: 'error' raises PluginError, 'host' returns the host's result"),
)


def normalize_options(target: str, options: Iterable[Option] | Mapping[str, Any] | None) -> list[Option]:
    """A target's declared options as a list of :class:`Option` (a ``{name: default}`` dict: untyped)."""
    if options is None:
        return []
    if isinstance(options, Mapping):
        return [Option(str(k), v, nullable=True) for k, v in options.items()]
    out: list[Option] = []
    for o in options:
        if not isinstance(o, Option):
            raise TypeError(f"target {target!r}: options must be byoc.contract.Option objects, got {type(o).__name__}")
        if any(o.name == b.name for b in GENERIC_OPTIONS):
            raise ValueError(f"target {target!r}: option {o.name!r} is byoc's own (every target accepts it)")
        if any(p.name == o.name for p in out):
            raise ValueError(f"target {target!r}: option {o.name!r} declared twice")
        out.append(o)
    return out


def resolve_options(target: Any, given: Mapping[str, Any] | None, *, source: str = "target_options") -> dict[str, Any]:
    """The full option set of ``target``: its defaults, updated by ``given``, each value validated.

    :param target: a :class:`byoc.contract.Target`.
    :param given: the options to apply (the user's ``target_options[name]``, or a bundle's).
    :param source: where ``given`` came from, for the error message.
    :raises OptionError: naming target, option, value and what is allowed; an unknown key names
        the known ones.
    """
    if given is not None and not isinstance(given, Mapping):
        raise OptionError(f"target {target.name!r}: options ({source}) must be a dict, got {type(given).__name__}")
    declared = {o.name: o for o in target.options}
    out = {name: copy.deepcopy(o.default) for name, o in declared.items()}
    declared.update({o.name: o for o in GENERIC_OPTIONS})
    for key, value in (given or {}).items():
        opt = declared.get(key)
        if opt is None:
            known = ", ".join(sorted(o.name for o in target.options)) or "none"
            raise OptionError(f"target {target.name!r} has no option {key!r} ({source}); its options: {known}")
        reason = opt.problem(value)
        if reason:
            raise OptionError(f"target {target.name!r}: option {key!r} = {value!r} ({source}) is not allowed: "
                              f"{reason}")
        out[key] = value
    return out


def bundle_options(target: Any, stored: Mapping[str, Any] | None, user: Mapping[str, Any] | None,
                   origin: str = "bundle") -> dict[str, Any]:
    """The options a region of a loaded bundle runs with.

    The bundle's options are validated against the installed target's declarations (an unknown
    key or a bad value raises :class:`OptionError`), except machine-local ones, which a bundle
    never chooses: they are dropped, and the loading user's ``user`` options (validated too)
    apply on top.
    """
    if stored is not None and not isinstance(stored, Mapping):
        raise OptionError(f"target {target.name!r}: options ({origin}) must be a dict, got {type(stored).__name__}")
    local = {o.name for o in (*target.options, *GENERIC_OPTIONS) if o.machine_local}
    portable = {k: v for k, v in (stored or {}).items() if k not in local}
    resolved = resolve_options(target, portable, source=origin)
    resolve_options(target, user, source="the loading user's target_options")  # validates them
    resolved.update(user or {})
    return resolved


__all__ = ["GENERIC_OPTIONS", "Option", "bundle_options", "normalize_options", "option_defaults", "resolve_options"]


def option_defaults(options) -> dict:
    """``{option name: default}`` for a list of :class:`Option` declarations."""
    return {o.name: o.default for o in options}
