"""Numba kernels must not copy one array slice into another (``a[i:j] = b[k:l]``, ``a[:] = b``).

Numba compiles such an assignment with a shape check whose error path formats a message: that
pulls its string machinery (``str``/``repr`` of integers, concatenation) into the kernel and costs
3-5 s of compilation on a first run (issue 19). An element loop copies the same values without it.
A slice filled with a scalar (``a[i:j] = 0``) has no shape check and is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import byoc

# byoc-cpu's fixed kernels too, read from this checkout (the core's test environment does not
# install the plugin)
_CPU = Path(__file__).resolve().parents[2] / "plugins" / "byoc-cpu" / "src" / "byoc_cpu"
FILES = sorted((Path(byoc.__file__).parent / "kernels").glob("*.py")) + \
    [p for p in (_CPU / "kernels.py", _CPU / "blas.py") if p.is_file()]


def _jitted(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) or "_inline" in ast.unparse(d) for d in fn.decorator_list)


def _is_slice(node: ast.AST) -> bool:
    if not isinstance(node, ast.Subscript):
        return False
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return any(isinstance(p, ast.Slice) for p in parts)


def _array_copies(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not _jitted(fn):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(_is_slice(t) for t in node.targets):
                value = node.value
                if isinstance(value, (ast.Constant, ast.UnaryOp, ast.BinOp, ast.Call, ast.IfExp)):
                    continue  # a scalar (or a scalar expression / conversion)
                if isinstance(value, ast.Subscript) and not _is_slice(value):
                    continue  # a single element
                if isinstance(value, ast.Name) and value.id not in _array_names(fn):
                    continue
                found.append(f"{path.name}:{node.lineno} in {fn.name}: {ast.unparse(node)}")
    return found


def _array_names(fn: ast.FunctionDef) -> set[str]:
    """Names bound in ``fn`` to a slice of an array (a cheap approximation: parameters count as scalars)."""
    return {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign) and _is_slice(node.value)
            for t in node.targets if isinstance(t, ast.Name)}


def test_kernels_copy_no_array_slices() -> None:
    found = [hit for path in FILES for hit in _array_copies(path)]
    assert not found, "slice-to-slice copies in Numba kernels (use an element loop):\n" + "\n".join(found)


def test_the_check_finds_a_slice_copy(tmp_path: Path) -> None:
    bad = tmp_path / "k.py"
    bad.write_text("@_jit\ndef k(a, b, n):\n    a[0:n] = b[1:n + 1]\n    a[:n] = 0\n"
                   "    c = b[2:]\n    a[1:] = c\n    a[:1] = n\n")
    assert len(_array_copies(bad)) == 2
