"""Conformance results: one :class:`CheckResult` per check, a :class:`Report` per run, and its text form."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


import byoc


#: the suites in the order they run; name -> Requirements capability
SUITES: dict[str, str] = {
    "registration": "registration",
    "operators": "operator_numerics",
    "patterns": "pattern_numerics",
    "partition": "partition_invariants",
    "bundle": "bundle_round_trip",
    "determinism": "deterministic_artifacts",
    "faults": "fault_behaviour",
    "cost": "cost_estimates",
}

#: the shared passes the kit compiles with: shapes and types only, so the graph under test is
#: exactly the one generated (no folding, no removal of Identity nodes, no BatchNorm folding)
KIT_PASSES = ("shape_inference",)

PASS, FAIL, REJECTED, UNTESTED, SKIPPED = "pass", "fail", "rejected", "untested", "skipped"


# -- results ---------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    """One row of the report: one operator, one pattern, or one whole-graph suite."""

    suite: str
    name: str
    status: str = PASS
    passed: int = 0
    rejected: int = 0
    failed: int = 0
    #: instances the kit could not use (the host reference refused them): never the target's fault
    invalid: int = 0
    #: rejection reason -> count
    reasons: Counter = field(default_factory=Counter)
    #: the largest absolute error seen over float outputs
    max_error: float | None = None
    #: the largest error / tolerance ratio seen (<= 1 passes)
    max_ratio: float | None = None
    rtol: float | None = None
    atol: float | None = None
    #: what failed, or why it was not tested
    message: str = ""
    #: the smallest failing instance: human-readable, and as JSON
    example: str = ""
    example_json: dict[str, Any] | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    def summary(self) -> str:
        """One paragraph: status, counts, and for a failure the message and minimal example."""
        head = f"{self.suite} {self.name}: {self.status}"
        counts = f"passed {self.passed}, rejected {self.rejected}, failed {self.failed}"
        lines = [f"{head} ({counts})"]
        if self.message:
            lines.append(self.message)
        if self.example:
            lines.append("smallest failing example:")
            lines.extend("  " + line for line in self.example.splitlines())
        if self.reasons and self.status != FAIL:
            top = "; ".join(f"{r} (x{n})" for r, n in self.reasons.most_common(3))
            lines.append(f"rejected because: {top}")
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["reasons"] = dict(self.reasons.most_common())
        for k in ("max_error", "max_ratio"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


@dataclass
class Report:
    """Every check of one conformance run."""

    target: dict[str, Any]
    results: list[CheckResult] = field(default_factory=list)
    examples: int = 0
    seed: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    def to_json(self) -> dict[str, Any]:
        counts = Counter(r.status for r in self.results)
        return {
            "schema": "byoc-conformance/1",
            "byoc_version": byoc.__version__,
            "target": self.target,
            "examples": self.examples,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "totals": dict(sorted(counts.items())),
            "results": [r.to_json() for r in self.results],
        }

    def format(self, verbose: bool = False) -> str:
        """The per-operator table, the whole-graph suites, then every failure in full."""
        return format_report(self, verbose=verbose)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def format_report(report: Report, verbose: bool = False) -> str:
    t = report.target
    out = [f"byoc conformance: target {t['name']!r} (plugin {t.get('plugin') or '?'} {t.get('version', '')}, "
           f"device {t.get('device', '?')}, rtol {t.get('rtol')}, atol {t.get('atol')}"
           f"{', needs calibration' if t.get('needs_calibration') else ''}); "
           f"{report.examples} examples per check, seed {report.seed}", ""]
    header = ("check", "name", "claimed", "passed", "rejected", "failed", "max error", "err/tol", "status")
    rows = []
    for r in report.results:
        claimed = "yes" if r.suite in ("operators", "patterns") else ""
        note = r.status
        if r.status in (REJECTED, UNTESTED, SKIPPED) and (r.message or r.reasons):
            why = r.message or r.reasons.most_common(1)[0][0]
            note = f"{r.status}: {why}"
            if not verbose and len(note) > 70:
                note = note[:67] + "..."
        rows.append((r.suite, r.name, claimed, str(r.passed), str(r.rejected), str(r.failed), _num(r.max_error),
                     _num(r.max_ratio), note))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join("{:<%d}" % w if i < 3 or i == 8 else "{:>%d}" % w for i, w in enumerate(widths))
    out.append(fmt.format(*header).rstrip())
    out.append(fmt.format(*("-" * w for w in widths)).rstrip())
    for row in rows:
        out.append(fmt.format(*row).rstrip())
    counts = Counter(r.status for r in report.results)
    out.append("")
    out.append(f"{len(report.results)} checks: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
               + f"  ({report.seconds:.1f} s)")
    fails = report.failures
    if fails:
        out.append("")
        out.append(f"FAILURES ({len(fails)})")
        for r in fails:
            out.append("")
            out.append(r.summary())
    if verbose:
        for r in report.results:
            if r.status != FAIL and (r.reasons or r.notes):
                out.append("")
                out.append(r.summary())
    out.append("")
    out.append("conformance: PASS" if report.ok else "conformance: FAIL")
    return "\n".join(out)
