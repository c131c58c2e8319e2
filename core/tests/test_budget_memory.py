"""Acceptance: every operator with size-computing attributes or inputs, driven to a tensor past
the budget, is refused (naming the node) with peak RSS growth under 2x the budget.

The cases live in ``budget_cases.py``; it runs in a subprocess of its own, so this process's
memory history does not matter. For each case the refused step (the compile for constant-folding
cases, else the run) runs once to warm up, then the peak RSS is reset (``/proc/self/clear_refs``)
and the step runs again, measured by the kernel's high-water mark and by tracemalloc. Other
processes on the machine do not change either figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from budget_cases import BUDGET_BYTES, cases

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def measured() -> dict[str, dict]:
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(HERE / "budget_cases.py")], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["id"]: r for r in rows}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_refused_within_twice_the_budget(case, measured):
    row = measured[case.id]
    assert row["error"] == case.error, row
    assert case.names in row["message"], row
    # the budget that applies: max_total_bytes for the sum of folded constants, else max_tensor_bytes
    limit = 2 * (4 * BUDGET_BYTES if "total" in case.tags else BUDGET_BYTES)
    assert row["traced_peak"] < limit, f"traced peak {row['traced_peak'] >> 20} MiB"
    assert row["rss_growth"] < limit, f"peak RSS grew by {row['rss_growth'] >> 20} MiB"
