"""A small dataflow pattern language for composite patterns.

Patterns are trees matched backwards from a root node::

    from byoc.contract import op, any_value, const, alt, tail

    conv = op("Conv", any_value(), const(), const().optional(), label="conv")
    conv_bias_act = tail(conv, "Relu", "Clip", "LeakyRelu")       # optional activation tail
    gemm_or_matmul = alt(op("Gemm", any_value(), const()), op("MatMul", any_value(), const()))

* ``op(types, *inputs, label=None)``: a node whose ``op_type`` is one of ``types`` (a string or
  a tuple), whose first ``len(inputs)`` inputs match the given sub-patterns; extra inputs are
  unconstrained.
* ``any_value()``: any value (a wildcard), flowing in from outside the match.
* ``const()``: a compile-time constant (initializer that is not a graph input).
* ``.optional()`` on an input pattern: the input may also be absent.
* ``alt(p1, p2, ...)``: the first alternative that matches.
* ``tail(base, *types)``: ``base`` optionally followed by a single-input node of one of ``types``.

A match holds every node it covers; its interior nodes (all but the root) must feed nothing
outside the match and no graph output, so the composite is a closed unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import onnx_ir as ir


@dataclass(frozen=True)
class PatternExpr:
    def optional(self) -> "PatternExpr":
        return _Optional(self)

    def size(self) -> int:
        return 0


@dataclass(frozen=True)
class _Any(PatternExpr):
    pass


@dataclass(frozen=True)
class _Const(PatternExpr):
    pass


@dataclass(frozen=True)
class _Optional(PatternExpr):
    inner: PatternExpr

    def size(self) -> int:
        return self.inner.size()


@dataclass(frozen=True)
class _Op(PatternExpr):
    types: tuple[str, ...]
    inputs: tuple[PatternExpr, ...]
    label: str | None = None
    domain: str = ""

    def size(self) -> int:
        return 1 + sum(i.size() for i in self.inputs)


@dataclass(frozen=True)
class _Alt(PatternExpr):
    options: tuple[PatternExpr, ...]

    def size(self) -> int:
        return max(o.size() for o in self.options)


def op(types: str | Sequence[str], *inputs: PatternExpr, label: str | None = None, domain: str = "") -> PatternExpr:
    return _Op(tuple([types] if isinstance(types, str) else types), tuple(inputs), label, domain)


def any_value() -> PatternExpr:
    return _Any()


def const() -> PatternExpr:
    return _Const()


def alt(*options: PatternExpr) -> PatternExpr:
    return _Alt(tuple(options))


def tail(base: PatternExpr, *types: str, label: str | None = None) -> PatternExpr:
    """``base`` optionally followed by one node of ``types`` (longest first)."""
    return _Alt((op(types, base, label=label), base))


@dataclass
class Match:
    """Nodes covered by one pattern match; ``root`` produces the composite's output."""

    root: ir.Node
    nodes: list[ir.Node] = field(default_factory=list)
    labels: dict[str, ir.Node] = field(default_factory=dict)

    def __getitem__(self, label: str) -> ir.Node:
        return self.labels[label]


def _is_const(v: ir.Value | None) -> bool:
    return v is not None and v.const_value is not None and not v.is_graph_input()


def _match_value(expr: PatternExpr, value: ir.Value | None, m: Match, allowed) -> bool:
    if isinstance(expr, _Optional):
        if value is None:
            return True
        return _match_value(expr.inner, value, m, allowed)
    if value is None:
        return False
    if isinstance(expr, _Any):
        return True
    if isinstance(expr, _Const):
        return _is_const(value)
    if isinstance(expr, _Alt):
        for option in expr.options:
            trial = Match(m.root, list(m.nodes), dict(m.labels))
            if _match_value(option, value, trial, allowed):
                m.nodes[:], m.labels = trial.nodes, trial.labels
                return True
        return False
    if isinstance(expr, _Op):
        node = value.producer()
        if node is None or not allowed(node):
            return False
        # an interior node must feed only the match: one use, not a graph output
        if value.is_graph_output() or len(value.uses()) != 1 or len(node.outputs) != 1:
            return False
        return _match_node(expr, node, m, allowed)
    raise TypeError(f"not a pattern expression: {expr!r}")


def _match_node(expr: _Op, node: ir.Node, m: Match, allowed) -> bool:
    if node.op_type not in expr.types or (node.domain or "") != expr.domain:
        return False
    if len(expr.inputs) > len(node.inputs) and not all(isinstance(e, _Optional) for e in expr.inputs[len(node.inputs):]):
        return False
    trial = Match(m.root, list(m.nodes) + [node], dict(m.labels))
    if expr.label:
        trial.labels[expr.label] = node
    for i, sub in enumerate(expr.inputs):
        value = node.inputs[i] if i < len(node.inputs) else None
        if not _match_value(sub, value, trial, allowed):
            return False
    m.nodes[:], m.labels = trial.nodes, trial.labels
    return True


def match_at(expr: PatternExpr, root: ir.Node, allowed=lambda n: True) -> Match | None:
    """Match ``expr`` with ``root`` as the composite's output node, or ``None``.

    ``allowed(node)`` restricts which interior nodes may be covered (e.g. not yet placed).
    """
    m = Match(root)
    if isinstance(expr, _Alt):
        for option in expr.options:
            found = match_at(option, root, allowed)
            if found is not None:
                return found
        return None
    if not isinstance(expr, _Op):
        raise TypeError("a pattern's root must be op(...) or alt(...) of ops")
    if not allowed(root) or not _match_node(expr, root, m, allowed):
        return None
    return m
