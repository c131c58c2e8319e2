"""Testing utilities and the vendor conformance kit.

"Is my plugin correct?" — :func:`run_conformance` (``byoc conformance NAME``) answers per
operator, pattern and invariant; :mod:`byoc.testing.suite` is the same as pytest tests
(``pytest --byoc-target=NAME``, or ``from byoc.testing.suite import *`` in a plugin's tests with
a :class:`Requirements` subclass). Building blocks for properties of your own:
:mod:`byoc.testing.strategies` (tensors, shapes, attributes), :mod:`byoc.testing.cases`
(valid one-operator instances), :mod:`byoc.testing.graphs` (random DAGs),
:mod:`byoc.testing.patterns` (models matching a pattern), :mod:`byoc.testing.tolerance`.
See ``docs/plugin-guide.md``.

Attributes are imported on first use: importing :mod:`byoc.testing` costs nothing.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "run_conformance": "byoc.testing.conformance",
    "Conformance": "byoc.testing.conformance",
    "CheckResult": "byoc.testing.conformance",
    "Report": "byoc.testing.conformance",
    "Requirements": "byoc.testing.requirements",
    "CAPABILITIES": "byoc.testing.requirements",
    "OpCase": "byoc.testing.cases",
    "GraphCase": "byoc.testing.cases",
    "op_cases": "byoc.testing.cases",
    "pattern_cases": "byoc.testing.patterns",
    "compare": "byoc.testing.tolerance",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'byoc.testing' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)


__all__ = sorted(_LAZY)
