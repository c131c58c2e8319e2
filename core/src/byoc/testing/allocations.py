"""Where kernel code allocates with numpy directly instead of through the budget (``spec.alloc``).

For byoc's own tests and a plugin's: kernels size their buffers from model data and feeds, so
each allocation must be checked against the :class:`byoc.Budget` first. This scan lists the
direct numpy allocator calls in a module's Python (Numba-compiled functions are sized by their
Python caller), each with its function, line and call, for a test to compare with its allow-list.
"""

from __future__ import annotations

import ast
from pathlib import Path

#: numpy calls that allocate an array whose size they work out themselves
ALLOCATORS = frozenset({
    "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "pad", "tile",
    "repeat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack", "arange", "einsum",
    "nonzero", "argwhere", "flatnonzero", "take", "take_along_axis", "kron", "outer", "indices", "eye",
    "identity", "linspace", "meshgrid", "resize", "broadcast_arrays", "tri", "triu", "tril", "insert", "append",
})


def _jitted(fn: ast.FunctionDef) -> bool:
    return any(k in ast.unparse(d) for d in fn.decorator_list for k in ("jit", "_inline", "intrinsic", "overload"))


def direct_allocations(path: Path) -> list[tuple[str, int, str]]:
    """``(function, line, numpy call)`` for every direct numpy allocation in ``path``'s Python
    (``function`` is dotted for nested ones, ``""`` at module level)."""
    found = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _jitted(node):
                return
            scope = scope + [node.name]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("np", "numpy")
                and node.func.attr in ALLOCATORS):
            found.append((".".join(scope), node.lineno, node.func.attr))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(Path(path).read_text(encoding="utf-8")), [])
    return found


__all__ = ["ALLOCATORS", "direct_allocations"]
