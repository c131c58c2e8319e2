"""Tuning lives as data: every threshold of the strategy chooser and the thread policy is a value of
a profile table (byoc_cpu/profiles/*.json), none a number written into the code."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import byoc_cpu
from byoc_cpu import tuning

SRC = Path(byoc_cpu.__file__).parent

#: module-level numbers that are structure, not tuning: formats and versions, register tiles the
#: IR is written for, cache policy, fusion limits; a threshold added as a constant fails the test
STRUCTURAL = {
    "__init__.py": {"CODEGEN_VERSION"},
    "artifact.py": {"_ALIGN_BYTES"},
    "blas.py": {"_ADDR_SLOTS"},
    "cache.py": {"DEFAULT_MAX_MODULES", "LOOPS_PER_MODULE"},
    "host/_words.py": {"WORDS"},
    "host/reduce.py": {"_AXES_INPUT_FROM", "_LANES"},  # an opset number; the accumulator width the loop is written for
    "host/jithelpers.py": {"WAIT_LIMIT_S", "_POLL_S"},  # a safety timeout and a polling interval
    "host/gemm.py": {"_KC", "_MCP"},
    "lower.py": {"PROGRAM_VERSION", "ALIGN"},
    "ops.py": {"MAX_FUSED_OPERANDS", "MAX_FUSED_MEMBERS"},
    "strategy.py": {"_WINOGRAD_KERNEL"},
    "verify.py": {"_BIG"},
}


def _numeric(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.Dict):
        return bool(node.values) and all(_numeric(v) for v in node.values)
    return False


def numeric_constants(path: Path) -> set[str]:
    """Names bound to a number (or a dict of numbers) at module level."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None and _numeric(value):
            names.add(target.id)
    return names


def test_no_threshold_outside_the_tables():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for name in sorted(numeric_constants(path) - STRUCTURAL.get(rel, set())):
            found.append(f"{rel}: {name}")
    assert not found, ("numeric thresholds written into the code (put them in byoc_cpu/profiles/*.json and read "
                       "them through byoc_cpu.tuning):\n" + "\n".join(found))


def test_the_chooser_compares_with_table_values_only():
    """byoc_cpu.strategy compares shapes with table values: no literal beyond 0, 1 and 2."""
    tree = ast.parse((SRC / "strategy.py").read_text(encoding="utf-8"))
    literals = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for c in [n.left, *n.comparators] if isinstance(c, ast.Constant)
                and isinstance(c.value, (int, float)) and c.value not in (0, 1, 2)]
    assert not literals, f"thresholds written into the chooser: {literals}"


def test_the_finder_sees_a_new_threshold(tmp_path):
    (tmp_path / "m.py").write_text("A = 1 << 20\nB = {2: 8}\nC = 'x'\nD = compute()\nE: float = 0.5\n")
    assert numeric_constants(tmp_path / "m.py") == {"A", "B", "E"}


def test_every_table_value_is_read_somewhere():
    source = "\n".join(p.read_text(encoding="utf-8") for p in SRC.rglob("*.py"))
    unused = [f"{section}.{key}" for section, entries in tuning.TABLE.items() if isinstance(entries, dict)
              for key in entries if f'"{key}"' not in source]
    assert not unused, f"table entries nothing reads: {unused}"


def test_profiles_hold_the_same_entries():
    profiles = sorted((SRC / "profiles").glob("*.json"))
    assert any(p.name == "default.json" for p in profiles)
    default = json.loads((SRC / "profiles" / "default.json").read_text())
    for path in profiles:
        table = json.loads(path.read_text())
        assert {s: sorted(v) for s, v in table.items() if isinstance(v, dict)} == \
            {s: sorted(v) for s, v in default.items() if isinstance(v, dict)}, path.name


def test_an_unknown_profile_is_refused(monkeypatch):
    from byoc.contract import PluginError

    with pytest.raises(PluginError, match="no tuning profile"):
        tuning.load("nonexistent")
    with pytest.raises(PluginError, match="not a profile name"):
        tuning.load("../etc/passwd")
