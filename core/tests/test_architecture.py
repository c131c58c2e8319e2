"""The structure of the code: no import circle in ``byoc`` or a plugin, plugins on byoc's public
API only, nothing of the tuned engine in the core, no function over 100 lines.

Both checks read the source with :mod:`ast` (nothing is imported or executed):

* the import graph of the installed ``byoc`` package: every ``import`` and ``from ... import``
  statement, at module level or inside a function, absolute or relative, is an edge;
  ``from pkg import name`` where ``name`` is a submodule is an edge to that submodule. Imports
  under ``if TYPE_CHECKING:`` are annotations only and do not count. Any cycle fails the test,
  named module by module.
* the same for every package under ``plugins/*/src``, and for ``byoc`` and every plugin with the
  annotation-only imports counted too (a type an upper layer needs belongs lower).
* a plugin imports from ``byoc`` only the public API (:data:`PUBLIC_API`), and no ``_private``
  name.
* ``core/src`` holds no hand-built LLVM IR, intrinsics, C callbacks or atomics: the core is the
  contract, the compiler, the runtime and the plain reference kernels.
* every function (and method) in ``core/src`` and ``plugins/*/src``, outside ``kernels/``
  folders (the numba kernels follow the performance work's own structure), spans at most
  100 lines from its ``def`` (decorators included) to its last line.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

MAX_FUNCTION_LINES = 100
#: the core's size (``core/src``, every line of every Python file): a ratchet on the way to the
#: small-core goal of 20,000 lines; lower it as the core shrinks; a commit that raises it says
#: which feature the lines are for
CORE_MAX_LINES = 25_220

REPO = Path(__file__).resolve().parents[2]

#: functions allowed over the limit for now: "path relative to the repo::qualified name"
KNOWN_LONG_FUNCTIONS: set[str] = {
    "plugins/byoc-cpu/src/byoc_cpu/host/conv.py::make_conv",
    "plugins/byoc-cpu/src/byoc_cpu/host/conv.py::make_conv_transpose",
}

#: the modules of ``byoc`` a plugin may import (and their submodules where the name ends in ".")
PUBLIC_API = ("byoc", "byoc.contract", "byoc.contract.", "byoc.kernels", "byoc.quantize", "byoc.testing",
              "byoc.testing.")


# --------------------------------------------------------------------------- import graph


def _package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"package {name!r} is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    root = _package_root(package)
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _plugin_packages() -> list[tuple[str, Path]]:
    """(import name, source folder) of every package under ``plugins/*/src``."""
    return [(pkg.name, pkg) for src in sorted((REPO / "plugins").glob("*/src"))
            for pkg in sorted(src.iterdir()) if (pkg / "__init__.py").exists()]


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def _import_nodes(tree: ast.AST, type_hints: bool = False):
    """Every Import/ImportFrom in the tree, skipping the bodies of ``if TYPE_CHECKING:`` unless
    ``type_hints``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if not type_hints and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: str = "byoc", type_hints: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (``type_hints``: annotation-only
    imports too)."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _import_nodes(tree, type_hints):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(module, is_package, node)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                # "import byoc.a.b" names byoc.a.b; an attribute path falls back to its module
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:  # Tarjan, recursion depth bounded by the module count
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in components:
        members = set(comp)
        start = comp[0]
        # shortest path back to the start, inside the component
        prev: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append([start, *reversed(path[:-1]), start] if len(path) > 1 else [start, found, start])
    return cycles


def test_cycle_finder_names_the_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_reads_every_kind_of_import(tmp_path, monkeypatch):
    pkg = tmp_path / "archpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import archpkg.top\n"
        "def f():\n    from ..low import X\n    return X\n"
    )
    (pkg / "top.py").write_text("import archpkg.sub.leaf\nfrom archpkg.sub import leaf\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph("archpkg")
    assert graph["archpkg.sub"] == {"archpkg.sub.leaf"}
    assert graph["archpkg.sub.leaf"] == {"archpkg.low"}  # function-level counts, TYPE_CHECKING does not
    assert graph["archpkg.top"] == {"archpkg.sub.leaf"}
    assert find_cycles(graph) == []


def test_no_import_cycle_in_byoc():
    cycles = find_cycles(import_graph("byoc"))
    assert not cycles, "import cycle(s) in byoc:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", ["byoc", *(name for name, _ in _plugin_packages())])
def test_no_import_cycle_even_for_type_hints(package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed here")
    cycles = find_cycles(import_graph(package, type_hints=True))
    assert not cycles, f"import cycle(s) in {package}:\n" + "\n".join(" -> ".join(c) for c in cycles)


def private_imports(folder: Path) -> list[str]:
    """``file:line name`` for every import of ``byoc`` outside :data:`PUBLIC_API` or of a
    ``_private`` name, in the sources under ``folder`` (function-level and annotation imports too)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _import_nodes(tree, type_hints=True):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None) for alias in node.names]
            elif node.level == 0 and node.module:
                pairs = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in pairs:
                if module != "byoc" and not module.startswith("byoc."):
                    continue
                public = any(module == p or (p.endswith(".") and module.startswith(p)) for p in PUBLIC_API)
                private = any(part.startswith("_") for part in module.split(".")) or (name or "").startswith("_")
                if not public or private:
                    found.append(f"{path.relative_to(folder)}:{node.lineno} {module}{'.' + name if name else ''}")
    return found


def test_private_import_finder(tmp_path):
    (tmp_path / "m.py").write_text("from byoc.contract import Target\nfrom byoc.kernels.gemm import _table\n"
                                   "def f():\n    import byoc.runtime.plan\n")
    found = [f.split(" ", 1)[1] for f in private_imports(tmp_path)]
    assert sorted(found) == ["byoc.kernels.gemm._table", "byoc.runtime.plan"]


@pytest.mark.parametrize("package", [name for name, _ in _plugin_packages()])
def test_plugins_import_only_the_public_api(package):
    folder = dict(_plugin_packages())[package]
    found = private_imports(folder)
    assert not found, f"{package} imports byoc internals (use byoc.contract):\n" + "\n".join(found)


#: what a plain reference has no use for: hand-built LLVM IR, intrinsics, C callbacks, atomics
ENGINE_MARKERS = ("llvmlite", "@intrinsic", "import intrinsic", "@cfunc", "cfunc(", "atomic_rmw", "cmpxchg", "load_atomic",
                  "store_atomic")


def test_the_core_holds_no_tuned_engine():
    found = [f"{p.relative_to(REPO)}:{i} {marker}"
             for p in sorted((REPO / "core" / "src").rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for marker in ENGINE_MARKERS if marker in line]
    assert not found, "the core is the plain reference (the tuned engine lives in byoc-cpu):\n" + "\n".join(found)


def test_the_core_stays_small():
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (REPO / "core" / "src").rglob("*.py"))
    assert lines <= CORE_MAX_LINES, f"core/src has {lines} lines, over {CORE_MAX_LINES}"


# --------------------------------------------------------------------------- function length


def _source_files() -> list[Path]:
    roots = [REPO / "core" / "src", *sorted((REPO / "plugins").glob("*/src"))]
    return [p for root in roots for p in sorted(root.rglob("*.py")) if "kernels" not in p.relative_to(root).parts]


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function in the file longer than ``limit`` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    lines = child.end_lineno - first + 1
                    if lines > limit:
                        out.append((name, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_long_function_finder(tmp_path):
    src = tmp_path / "m.py"
    body = "".join(f"        x{i} = {i}\n" for i in range(120))
    src.write_text(f"class C:\n    @staticmethod\n    def big():\n{body}        return 1\n\n\ndef small():\n    return 2\n")
    assert long_functions(src) == [("C.big", 123)]  # decorator, def, 120 assignments, return


def test_no_function_over_100_lines():
    assert _source_files(), "no source files found"
    found = []
    for path in _source_files():
        rel = path.relative_to(REPO).as_posix()
        for name, lines in long_functions(path):
            if f"{rel}::{name}" not in KNOWN_LONG_FUNCTIONS:
                found.append(f"{rel}::{name} ({lines} lines)")
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them along their seams):\n" + "\n".join(found)


@pytest.mark.parametrize("entry", sorted(KNOWN_LONG_FUNCTIONS))
def test_known_exceptions_are_still_needed(entry):
    rel, _, name = entry.partition("::")
    path = REPO / rel
    if not path.exists():
        pytest.fail(f"{entry}: the file is gone; remove the exception")
    assert name in {n for n, _ in long_functions(path)}, f"{entry} is no longer over the limit; remove the exception"


def test_every_environment_variable_is_in_the_one_table():
    """byoc and its plugins read ``BYOC_*`` variables through byoc.contract.environment, whose
    table documents each one."""
    import re

    from byoc.contract.environment import VARIABLES

    roots = [REPO / "core" / "src", *sorted((REPO / "plugins").glob("*/src"))]
    undocumented, direct = set(), []
    for path in (p for root in roots for p in sorted(root.rglob("*.py"))):
        text = path.read_text(encoding="utf-8")
        undocumented.update(set(re.findall(r"\bBYOC_[A-Z0-9_]*[A-Z0-9]\b", text)) - set(VARIABLES))
        direct += [f"{path.relative_to(REPO)}: {m}" for m in re.findall(r"environ(?:\.get)?\(\s*[\"']BYOC_\w+", text)]
    assert not undocumented, f"BYOC_* variables missing from byoc.contract.environment.VARIABLES: {sorted(undocumented)}"
    assert not direct, "read BYOC_* variables through byoc.contract.environment.get:\n" + "\n".join(direct)
