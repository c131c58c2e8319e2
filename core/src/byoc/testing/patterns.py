"""Random models that match a composite pattern, synthesised from its expression.

:func:`pattern_cases` walks a :class:`byoc.partition.Pattern`'s expression tree bottom-up:
each ``op(types, *inputs)`` becomes one node drawn from the operator catalogue
(:func:`byoc.testing.cases.op_cases`) with its constrained inputs honoured — a nested ``op``
feeds that input (its output shape and dtype are fixed for the consumer), ``any_value()`` is a
graph input, ``const()`` an initializer, ``.optional()`` present or absent, ``alt``/``tail``
one of the alternatives. Inputs the pattern leaves open are the catalogue's choice.

An operator type without a generator, or an input position a generator cannot take a fixed
shape in, makes that branch unsatisfiable; when no branch can be built the strategy yields
nothing and the kit reports the pattern as untested.
"""

from __future__ import annotations

from typing import Any

import onnx
from hypothesis import assume
from hypothesis import strategies as st
from onnx import helper

from byoc.contract.patterns import PatternExpr, _Alt, _Any, _Const, _Op, _Optional
from byoc.testing.cases import GENERATORS, OPSET, GraphCase, Slots, op_cases


def _unwrap(expr: PatternExpr) -> tuple[PatternExpr, bool]:
    if isinstance(expr, _Optional):
        return expr.inner, True
    return expr, False


def buildable(expr: PatternExpr) -> bool:
    """Whether at least one branch of ``expr`` uses only operators the catalogue can generate."""
    expr, _ = _unwrap(expr)
    if isinstance(expr, _Alt):
        return any(buildable(o) for o in expr.options)
    if isinstance(expr, _Op):
        if expr.domain or not any(t in GENERATORS for t in expr.types):
            return False
        return all(buildable(i) or isinstance(_unwrap(i)[0], (_Any, _Const)) or _unwrap(i)[1] for i in expr.inputs)
    return True


def _buildable_options(expr: _Alt) -> list[PatternExpr]:
    return [o for o in expr.options if buildable(o)]


class _Builder:
    def __init__(self, draw):
        self.draw = draw
        self.nodes: list[onnx.NodeProto] = []
        self.feeds: dict[str, Any] = {}
        self.inits: dict[str, Any] = {}
        self.count = 0

    def op(self, expr: PatternExpr) -> tuple[str, tuple[int, ...], str]:
        """Build ``expr`` (an op or an alt of ops); returns (output name, shape, dtype)."""
        draw = self.draw
        while isinstance(expr, _Alt):
            options = _buildable_options(expr)
            assume(options)
            expr = draw(st.sampled_from(options))
        assert isinstance(expr, _Op)
        types = [t for t in expr.types if t in GENERATORS]
        assume(types and not expr.domain)
        op_type = draw(st.sampled_from(types))
        fixed: dict[int, tuple[tuple[int, ...], str]] = {}
        present, absent, kinds, fed = set(), set(), {}, {}
        for i, sub in enumerate(expr.inputs):
            sub, optional = _unwrap(sub)
            if optional and draw(st.booleans()):
                absent.add(i)
                continue
            while isinstance(sub, _Alt):
                options = [o for o in sub.options if buildable(o) or isinstance(o, (_Any, _Const))]
                assume(options)
                sub = draw(st.sampled_from(options))
            if isinstance(sub, _Op):
                name, shape, dtype = self.op(sub)
                fixed[i] = (shape, dtype)
                fed[i] = name
            elif isinstance(sub, _Any):
                present.add(i)
                kinds[i] = "input"
            elif isinstance(sub, _Const):
                present.add(i)
                kinds[i] = "const"
        case = draw(op_cases(op_type, Slots(fixed, frozenset(present), frozenset(absent))))
        k = self.count
        self.count += 1
        prefix = f"p{k}_"
        names = []
        for i, arr in enumerate(case.inputs):
            if i in fed:
                names.append(fed[i])
                continue
            if arr is None:
                names.append("")
                continue
            name = f"{prefix}in{i}"
            names.append(name)
            kind = kinds.get(i, "const" if i in case.const else "input")
            (self.inits if kind == "const" else self.feeds)[name] = arr
        while names and names[-1] == "":
            names.pop()
        outs = [f"{prefix}out{j}" for j in range(case.n_outputs)]
        self.nodes.append(helper.make_node(op_type, names, outs, name=f"{prefix}{op_type.lower()}", **case.attrs))
        shape, dtype = self._infer(outs[0])
        return outs[0], shape, dtype

    def _infer(self, output: str) -> tuple[tuple[int, ...], str]:
        partial = GraphCase("partial", list(self.nodes), dict(self.feeds), dict(self.inits), [output], OPSET)
        try:
            model = partial.model()
        except Exception:  # an instance shape inference refuses is not valid ONNX
            assume(False)
        vi = {v.name: v for v in list(model.graph.output) + list(model.graph.value_info)}[output]
        tt = vi.type.tensor_type
        assume(tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim))
        shape = tuple(int(d.dim_value) for d in tt.shape.dim)
        dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        return shape, dtype


def pattern_cases(expr: PatternExpr, label: str = "pattern") -> st.SearchStrategy[GraphCase] | None:
    """A strategy of :class:`GraphCase` whose last node roots a match of ``expr`` (``None``: cannot build)."""
    if not buildable(expr):
        return None

    @st.composite
    def cases(draw) -> GraphCase:
        b = _Builder(draw)
        out, _, _ = b.op(expr)
        return GraphCase(label, b.nodes, b.feeds, b.inits, [out], OPSET)

    return cases()


__all__ = ["buildable", "pattern_cases"]
