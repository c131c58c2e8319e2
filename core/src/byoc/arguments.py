"""Type checks of the public API's arguments, at the boundary of compile, run and load.

A wrongly typed argument (``timeout="5"``, ``budget={}``, ``targets=5``,
``target_options={"cpu": 5}``, ``load(None)``) gets one clear byoc error naming the argument,
instead of a ``TypeError``/``AttributeError`` from deep inside. Only types and obvious ranges
are checked here; the values themselves (target names, option schemas) are checked where they
are used.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from typing import Any

from byoc.budget import Budget
from byoc.errors import BundleError, InputError, OptionError


def _type(value: Any) -> str:
    return type(value).__name__


def _seconds(name: str, value: Any, error=OptionError) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)) or value <= 0:
        raise error(f"{name} must be a positive number of seconds or None, got {value!r} ({_type(value)})")


def _budget(value: Any, error=OptionError) -> None:
    if value is not None and not isinstance(value, Budget):
        raise error(f"budget must be a byoc.Budget or None, got {_type(value)}")


def _names(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise OptionError(f"{name} must be a list of names or None, got {value!r} ({_type(value)})")


def check_compile_args(*, targets: Any = None, passes: Any = None, budget: Any = None,
                       target_options: Any = None, strict: Any = False, hook_timeout: Any = None,
                       calibration: Any = None) -> None:
    """Raise :class:`OptionError` for a wrongly typed argument of :func:`byoc.compile`."""
    if not isinstance(targets, str):  # one target name is accepted as it is
        _names("targets", targets)
    if isinstance(targets, (list, tuple, set, frozenset)):
        bad = [t for t in targets if not isinstance(t, str)]
        if bad:
            raise OptionError(f"targets must be target names (strings), got {bad[0]!r} ({_type(bad[0])})")
    _names("passes", passes)
    _budget(budget)
    _target_options(target_options)
    if not isinstance(strict, bool):
        raise OptionError(f"strict must be True or False, got {strict!r} ({_type(strict)})")
    _seconds("hook_timeout", hook_timeout)
    if calibration is not None and (isinstance(calibration, (str, bytes, Mapping)) or not isinstance(calibration, Iterable)):
        raise OptionError(f"calibration must be an iterable of feed dicts or None, got {_type(calibration)}")


def _target_options(target_options: Any) -> None:
    if target_options is None:
        return
    if not isinstance(target_options, Mapping):
        raise OptionError(f"target_options must be a dict target name -> dict of options, got {_type(target_options)}")
    for key, opts in target_options.items():
        if not isinstance(key, str):
            raise OptionError(f"target_options: keys must be target names, got {key!r} ({_type(key)})")
        if not isinstance(opts, Mapping):
            raise OptionError(f"target_options[{key!r}] must be a dict of options, got {opts!r:.80} ({_type(opts)})")
        bad = [k for k in opts if not isinstance(k, str)]
        if bad:
            raise OptionError(f"target_options[{key!r}]: option names must be strings, got {bad[0]!r}")


def check_run_args(feeds: Any, *, timeout: Any = None, cancel: Any = None) -> None:
    """Raise :class:`InputError` for feeds that are not a dict with string keys,
    :class:`OptionError` for a bad ``timeout`` or ``cancel``, on :meth:`CompiledModel.run`."""
    from byoc.runtime.control import CancelHandle

    if not isinstance(feeds, dict):
        raise InputError(f"feeds must be a dict name -> numpy array, got {_type(feeds)}")
    bad = [k for k in feeds if not isinstance(k, str)]
    if bad:
        raise InputError(f"feed names must be strings, got {', '.join(repr(k) for k in bad[:5])}")
    _seconds("timeout", timeout)
    if cancel is not None and not isinstance(cancel, CancelHandle):
        raise OptionError(f"cancel must be a byoc.CancelHandle or None, got {_type(cancel)}")


def file_path(path: Any, what: str, error: type[Exception]) -> str:
    """``path`` (a ``str`` or ``os.PathLike``) as text, or ``error`` naming ``what``: not a path,
    an ``__fspath__`` that raises or gives bytes, an empty name, a NUL byte."""
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"{what} must be a str or os.PathLike, got {path!r:.80} ({_type(path)})")
    try:
        text = os.fspath(path)
    except Exception as exc:  # a PathLike whose __fspath__ raises
        raise error(f"{what}: its __fspath__ raised {type(exc).__name__}: {exc}") from None
    if not isinstance(text, str):
        raise error(f"{what} must be text, not {_type(text)}")
    if not text:
        raise error(f"{what} is empty")
    if "\x00" in text:
        raise error(f"{what} {text!r} contains a NUL byte")
    return text


def check_load_args(path: Any, *, budget: Any = None, target_options: Any = None) -> None:
    """Raise :class:`BundleError` for a path that is not one, :class:`OptionError` for a bad budget
    or ``target_options``."""
    file_path(path, "the bundle path", BundleError)
    _target_options(target_options)
    _budget(budget)


__all__ = ["check_compile_args", "check_load_args", "check_run_args", "file_path"]
