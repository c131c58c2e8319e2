"""The conformance runner: "is my plugin correct?", answered per operator, pattern and invariant.

:class:`Conformance` runs the suites against one target and returns :class:`CheckResult` rows;
:func:`run_conformance` runs them all into a :class:`Report` (what ``byoc conformance NAME``
prints and ``--json`` writes). The pytest suite (:mod:`byoc.testing.suite`) calls the same
checks one test each.

Suites (``Requirements`` capability in brackets):

* registration [registration]: sane ``Target`` fields, no plugin fault, claimed operators the
  host can also run;
* operator numerics [operator_numerics]: for every claimed operator, random instances
  (:mod:`byoc.testing.cases`) compiled for the target match the host reference within the
  target's tolerance (:mod:`byoc.testing.tolerance`). An instance the target's support check
  rejects is not a failure: it is counted as *rejected*, with its reason. For an integer
  target (``needs_calibration``) the kit generates the calibration samples, and the reference
  is byoc's simulation of the quantised regions (:meth:`Conformance.quantised_reference`);
* pattern numerics [pattern_numerics]: random models matching each registered pattern
  (:mod:`byoc.testing.patterns`);
* partition invariants [partition_invariants]: random layer DAGs (:mod:`byoc.testing.graphs`)
  through the full pipeline, rules included: the partitioned graph is a DAG, every node placed
  exactly once and only where accepted, outputs equal the host's, compiling twice places the
  same way;
* bundle round trip [bundle_round_trip]: save -> load -> run is bit-identical to the compiled model;
* deterministic artifacts [deterministic_artifacts]: compiling twice gives byte-identical
  artifacts and bundles;
* fault behaviour [fault_behaviour]: the target's runtime called with one input too few or too
  many, or with shapes that cannot be right, raises a :class:`byoc.ByocError` (a plugin's own
  exception is wrapped as a :class:`byoc.PluginError`); it must never return outputs;
* cost estimates [cost_estimates]: ``byoc_cost`` returns ``None`` or a finite number >= 0.

Each randomised check is a Hypothesis search with a fixed seed: a failure is shrunk to the
smallest failing instance Hypothesis finds, and that instance is what the report shows.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed, settings
from hypothesis import errors as hyp_errors
from hypothesis import strategies as st

import byoc
from byoc.errors import ByocError
from byoc.contract import Target
from byoc.plugins import Registry
from byoc.runtime.subgraph import host_callable
from byoc.testing.cases import GENERATORS, GraphCase, OpCase, op_cases
from byoc.testing.graphs import LAYERS, contracted, graph_is_dag, kahn_acyclic, layer_dags
from byoc.testing.patterns import pattern_cases
from byoc.testing.requirements import CAPABILITIES, Requirements
from byoc.testing.tolerance import (
    LOW_PRECISIONS,
    Comparison,
    compare,
    envelope_accepts,
    magnitude_model,
    perturbed_model,
    rounded_model,
)

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


# -- one instance ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # PASS, REJECTED, FAIL, "invalid"
    reason: str = ""
    max_error: float | None = None
    max_ratio: float | None = None


class _Failed(Exception):
    """Raised inside a Hypothesis test so it shrinks the instance."""


def _tally(result: CheckResult, outcome: Outcome) -> None:
    if outcome.kind == PASS:
        result.passed += 1
    elif outcome.kind == REJECTED:
        result.rejected += 1
        result.reasons[outcome.reason] += 1
    elif outcome.kind == FAIL:
        result.failed += 1
    else:
        result.invalid += 1
    if outcome.max_error is not None and outcome.kind in (PASS, REJECTED):
        result.max_error = max(result.max_error or 0.0, outcome.max_error)
        result.max_ratio = max(result.max_ratio or 0.0, outcome.max_ratio or 0.0)


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _outputs(cm, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
    out = cm.run(dict(feeds))
    return [out[n] for n in names]


def _bit_identical(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"output {i}: {y.dtype}{list(y.shape)} vs {x.dtype}{list(x.shape)}"
        if x.tobytes() != y.tobytes():
            diff = np.argwhere(x.reshape(-1).view(np.uint8) != y.reshape(-1).view(np.uint8))
            return f"output {i}: bytes differ (first at byte {int(diff[0][0]) if len(diff) else '?'})"
    if len(a) != len(b):
        return f"{len(b)} outputs vs {len(a)}"
    return None


# -- the runner -----------------------------------------------------------------------------------------


class Conformance:
    """The suites for one target. Each ``check_*`` method returns :class:`CheckResult` rows."""

    def __init__(self, target: str, *, registry: Registry | None = None, requirements: Requirements | None = None,
                 examples: int | None = None, seed: int | None = None):
        self.req = requirements if requirements is not None else Requirements()
        self.registry = registry if registry is not None else self.req.registry()
        self.target: Target = self.registry.target(target)
        self.name = self.target.name
        self.examples = int(examples if examples is not None else self.req.examples)
        self.graph_examples = int(self.req.graph_examples or self.examples)
        self.seed = int(seed if seed is not None else self.req.seed)
        from byoc.compiler import resolve_options

        self.target_options = {self.name: dict(self.req.target_options)} if self.req.target_options else None
        self.options = resolve_options([self.target], self.target_options)[self.name]
        # the same plugins without this target's partition rules: the node under test is placed
        rules = dict(self.registry.rules)
        rules[self.name] = []
        self.bypass_registry = dataclasses.replace(self.registry, rules=rules)
        self._compile_params = set(inspect.signature(byoc.compile).parameters)

    # -- what the target claims -----------------------------------------------------------------

    def claimed_operators(self) -> list[str]:
        """Operator types (default domain) the target registered, sorted; custom domains as ``domain::op``."""
        ops = []
        for domain, op_type in self.registry.operators.get(self.name, {}):
            ops.append(op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}")
        return sorted(set(ops))

    def operators_to_check(self) -> list[str]:
        ops = self.claimed_operators()
        if self.req.operators is not None:
            wanted = set(self.req.operators)
            ops = [o for o in ops if o in wanted]
        return ops

    def patterns(self) -> list[tuple[str, Any]]:
        """``(label, Pattern)`` for every registered pattern; repeated names get ``[k]`` suffixes."""
        pats = [p for _, p in self.registry.patterns.get(self.name, [])]
        names = Counter(p.name for p in pats)
        seen: Counter = Counter()
        out = []
        for p in pats:
            seen[p.name] += 1
            out.append((p.name if names[p.name] == 1 else f"{p.name}[{seen[p.name]}]", p))
        return out

    # -- compiling and running -------------------------------------------------------------------

    def calibration(self, feeds: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Random calibration samples around ``feeds`` (which is the first sample)."""
        rng = np.random.default_rng(self.seed)
        samples = [dict(feeds)]
        for _ in range(max(0, self.req.calibration_samples - 1)):
            s = {}
            for k, v in feeds.items():
                v = np.asarray(v)
                finite = v[np.isfinite(v)] if v.dtype.kind == "f" else None
                if finite is not None and finite.size:
                    lo, hi = float(finite.min()), float(finite.max())
                    s[k] = rng.uniform(lo, hi, size=v.shape).astype(v.dtype) if hi > lo else v.copy()
                else:
                    s[k] = v.copy()
            samples.append(s)
        return samples

    def compile(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, rules: bool = True,
                strict: bool = True):
        """``byoc.compile`` for this target alone (:data:`KIT_PASSES`; strict: any plugin fault raises)."""
        kwargs: dict[str, Any] = dict(targets=[self.name], registry=self.registry if rules else self.bypass_registry,
                                      passes=list(KIT_PASSES), strict=strict)
        if self.target_options:
            kwargs["target_options"] = self.target_options
        if getattr(self.target, "needs_calibration", False):
            if "calibration" not in self._compile_params:
                raise ByocError(f"target {self.name!r} needs calibration but this byoc.compile takes no calibration=")
            kwargs["calibration"] = self.calibration(feeds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return byoc.compile(model, **kwargs)

    def compile_placing(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]):
        """Compile with the target's rules; if a rule dropped every region, again without them.

        :returns: ``(compiled, None)``, or ``(None, reason)`` when the region the rules drop
            does not compile alone (not the plugin's fault: its rules keep it from that).
        """
        cm = self.compile(model, feeds, rules=True)
        if cm.regions or self.req.bypass_rules is False:
            return cm, None
        dropped = sorted({rec.rule for rec in cm.records.values() if rec.rule})
        if not dropped:
            return cm, None
        try:
            return self.compile(model, feeds, rules=False), None
        except Exception as exc:
            return None, f"dropped by rule {', '.join(dropped)}; alone, the region does not compile: {_exc(exc)}"

    @staticmethod
    def host(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        """The host reference: byoc's kernels, no target, :data:`KIT_PASSES`."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _outputs(byoc.compile(model, targets=[], passes=list(KIT_PASSES)), feeds, names)

    @property
    def quantised(self) -> bool:
        return bool(getattr(self.target, "needs_calibration", False))

    @staticmethod
    def quantised_reference(cm, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        """``cm`` with every region run as byoc's simulation of its quantised body (QDQ on host kernels).

        For an integer target this is what its code generator was asked to compute: the region
        body after :mod:`byoc.quantize`, with the scales calibration chose (saturation included).
        """
        from byoc.runtime.plan import build_plan

        sims = {cr.region.name: host_callable(cr.region.model) for cr in cm.regions}

        def step_factory(node, spec):
            return sims.get(node.name) if node.domain == "byoc" else None

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = build_plan(cm.model.graph, budget=cm.budget, step_factory=step_factory)
            out = plan.execute(dict(feeds))
        return [out[n] for n in names]

    def reference_for(self, cm, feeds: Mapping[str, np.ndarray], names: Sequence[str],
                      want: list[np.ndarray]) -> list[np.ndarray]:
        """What the target's outputs are compared with: the host reference, or for an integer target
        (``needs_calibration``) with regions, :meth:`quantised_reference`."""
        if self.quantised and cm.regions:
            return self.quantised_reference(cm, feeds, names)
        return want

    #: perturbed reference runs for the ill-conditioning check (:func:`envelope_accepts`)
    PERTURBATIONS = 4

    def _compare(self, label: str, model: onnx.ModelProto, feeds, got, want, names) -> Comparison:
        """Plain tolerance; then with the magnitude bound; then accepting ill-conditioned elements."""
        rtol, atol = self.req.tolerance(self.target, label)
        fr = self.req.float_range
        quantised = bool(getattr(self.target, "needs_calibration", False))
        cmp = compare(got, want, rtol=rtol, atol=atol, names=names, float_range=fr, range_relative=quantised)
        if cmp.ok or rtol <= 0 or quantised:
            return cmp
        bound = None
        mag = magnitude_model(model)
        if mag is not None:
            try:
                bound = self.host(mag, feeds, names)
            except Exception:  # the bound is a courtesy; without it the plain comparison stands
                bound = None
            if bound is not None:
                cmp = compare(got, want, rtol=rtol, atol=atol, magnitude=bound, names=names, float_range=fr,
                              range_relative=quantised)
                if cmp.ok:
                    return cmp
        rng = np.random.default_rng(self.seed)
        runs = [want]
        for _ in range(self.PERTURBATIONS):
            try:
                pm, pf = perturbed_model(model, feeds, rtol, rng)
                runs.append(self.host(pm, pf, names))
            except Exception:
                continue
        for to, roundoff in LOW_PRECISIONS:
            if rtol >= roundoff:
                try:
                    runs.append(self.host(rounded_model(model, to), feeds, names))
                except Exception:
                    continue
        accept = envelope_accepts(got, runs, rtol=rtol, atol=atol)
        again = compare(got, want, rtol=rtol, atol=atol, magnitude=bound, names=names, float_range=fr, accept=accept,
                        range_relative=quantised)
        return again if again.ok else cmp

    def run_case(self, case: GraphCase, *, rules: bool = False, pattern: str | None = None) -> Outcome:
        """Compile ``case`` for the target and compare it with the host reference.

        ``rules=False`` (the operator and pattern suites): the case is compiled with the
        target's partition rules; if a rule drops its region, it is compiled again without the
        rules, so that a lone ``Relu`` on a target whose rule wants a ``Conv`` in every region is
        checked all the same. Wrong numbers are a failure either way; but a region the rules keep
        from the code generator may fail to compile or run alone: that is reported as rejected
        ("dropped by rule ...; alone, ..."), not as a failure.
        """
        try:
            model = case.model()
        except Exception as exc:
            return Outcome("invalid", f"not a valid ONNX model: {_exc(exc)}")
        names = list(case.outputs)
        try:
            want = self.host(model, case.feeds, names)
        except Exception as exc:
            return Outcome("invalid", f"host reference: {_exc(exc)}")
        node_names = [n.name for n in case.nodes]
        try:
            cm = self.compile(model, case.feeds, rules=True)
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile for {self.name!r} raised {_exc(exc)}")
        dropped_by = sorted({cm.records[n].rule for n in node_names if n in cm.records and cm.records[n].rule})
        rule_note = ""
        if dropped_by and not rules:
            rule_note = f"dropped by rule {', '.join(dropped_by)}"
            try:
                cm = self.compile(model, case.feeds, rules=False)
            except Exception as exc:
                return Outcome(REJECTED, f"{rule_note}; alone, the region does not compile: {_exc(exc)}")
        placed = [n for n in node_names if cm.records.get(n) is not None and cm.records[n].device == self.name]
        reason = ""
        if len(placed) < len(node_names):
            rec = next(cm.records[n] for n in node_names if n not in placed and n in cm.records)
            reason = (rec.verdicts.get(self.name) or (f"dropped by rule {rec.rule}" if rec.rule else "")
                      or rec.fallback or f"{rec.op_type}: not placed (placed on {rec.device})")
        if pattern is not None and placed:
            off = {cm.records[n].pattern for n in node_names if cm.records[n].pattern != pattern}
            if off:
                reason = reason or f"placed as {', '.join(sorted(str(p) for p in off))}, not {pattern}"
        try:
            got = _outputs(cm, case.feeds, names)
        except Exception as exc:
            if rule_note and placed:
                return Outcome(REJECTED, f"{rule_note}; alone, the region does not run: {_exc(exc)}")
            where = "on the target" if placed else "on the host"
            return Outcome(FAIL, f"running the compiled model ({where}) raised {_exc(exc)}")
        try:
            ref = self.reference_for(cm, case.feeds, names, want)
        except Exception as exc:
            return Outcome(FAIL, f"simulating the quantised regions raised {_exc(exc)}")
        cmp = self._compare(pattern or case.label, model, case.feeds, got, ref, names)
        if not cmp.ok:
            if not placed:
                return Outcome("invalid", f"host fallback differs from the host reference: {cmp.message}")
            return Outcome(FAIL, cmp.message, cmp.max_error, cmp.max_ratio)
        if reason:
            return Outcome(REJECTED, reason, cmp.max_error if placed else None, cmp.max_ratio if placed else None)
        return Outcome(PASS, "", cmp.max_error, cmp.max_ratio)

    # -- the Hypothesis driver ----------------------------------------------------------------------

    #: extra rounds (new seeds) while fewer than half the instances were accepted by the target
    EXTRA_ROUNDS = 2

    def _explore(self, result: CheckResult, strategy: st.SearchStrategy, check: Callable[[Any], Outcome],
                 describe: Callable[[Any], tuple[str, dict | None]], examples: int | None = None) -> CheckResult:
        """Search ``strategy`` for a failing instance; tally every outcome into ``result``.

        An instance the target rejects still counts as an example; while fewer than half of
        them passed, up to :attr:`EXTRA_ROUNDS` more rounds run with other seeds.
        """
        n = examples or self.examples
        t0 = time.perf_counter()
        state: dict[str, Any] = {"frozen": False, "last": None}
        for round_ in range(1 + self.EXTRA_ROUNDS):
            self._round(result, strategy, check, n, self.seed + 7919 * round_, state)
            if state["last"] is not None or result.passed * 2 >= n or not result.rejected:
                break
        if state["last"] is not None:
            case, outcome = state["last"]
            result.status = FAIL
            result.failed = max(result.failed, 1)
            result.message = outcome.reason
            result.example, result.example_json = describe(case)
        elif result.passed:
            result.status = PASS
        elif result.rejected:
            result.status = REJECTED
        else:
            result.status = UNTESTED
            result.message = result.message or "no valid instance could be generated"
        result.seconds = time.perf_counter() - t0
        return result

    def _round(self, result: CheckResult, strategy: st.SearchStrategy, check: Callable[[Any], Outcome], n: int,
               seed_: int, state: dict[str, Any]) -> None:
        @settings(max_examples=n, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate, Phase.shrink),
                  verbosity=Verbosity.quiet, print_blob=False, report_multiple_bugs=False)
        @seed(seed_)
        @given(strategy)
        def explore(case):
            outcome = check(case)
            if not state["frozen"]:
                _tally(result, outcome)
            if outcome.kind == "invalid":
                reject()
            if outcome.kind == FAIL:
                state["frozen"] = True
                state["last"] = (case, outcome)
                raise _Failed(outcome.reason)

        try:
            explore()
        except _Failed:
            pass
        except hyp_errors.Unsatisfiable:
            pass
        except Exception as exc:  # Flaky and friends: keep the last failing instance we saw
            if state["last"] is None:
                raise
            result.notes.append(f"note: Hypothesis reported {type(exc).__name__} (the failure did not reproduce "
                                "every time)")

    @staticmethod
    def _describe_graph(case: GraphCase) -> tuple[str, dict | None]:
        return case.describe(), case.to_json()

    # -- suites --------------------------------------------------------------------------------------

    def _closed(self, suite: str, name: str) -> CheckResult | None:
        cap = SUITES[suite]
        if not self.req.is_open(cap):
            return CheckResult(suite, name, SKIPPED, message=self.req.reason(cap))
        return None

    def check_registration(self) -> CheckResult:
        from byoc.contract import HOOK_API_VERSION
        from byoc.kernels import is_supported

        closed = self._closed("registration", self.name)
        if closed:
            return closed
        t = self.target
        r = CheckResult("registration", self.name)
        problems = []
        if not t.version:
            problems.append("Target.version is empty (bundles record it)")
        for attr in ("rtol", "atol"):
            v = getattr(t, attr)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                problems.append(f"Target.{attr} = {v!r}: expected a finite number >= 0")
        if t.api_version != HOOK_API_VERSION:
            problems.append(f"Target.api_version {t.api_version} != byoc's hook API version {HOOK_API_VERSION}")
        try:
            json.dumps(t.defaults, sort_keys=True)
        except (TypeError, ValueError) as exc:
            problems.append(f"Target option defaults are not JSON-serialisable (bundles store them): {exc}")
        for o in t.options:
            if o.problem(o.default):
                problems.append(f"Target option {o.name!r}: its default {o.default!r} is not allowed: "
                                f"{o.problem(o.default)}")
        if getattr(t, "needs_calibration", False):
            try:
                from byoc.quantize.scheme import QuantScheme

                QuantScheme.from_dict(getattr(t, "quantization", {}) or {})
            except ImportError:  # pragma: no cover - quantisation not available
                pass
            except ByocError as exc:
                problems.append(f"Target.quantization is invalid: {exc}")
        faults = [f for f in self.registry.faults if f.plugin == t.plugin]
        problems.extend(f"plugin fault: {f}" for f in faults)
        no_host = [op for op in self.claimed_operators() if "::" not in op and not is_supported(op, "")]
        if no_host:
            r.notes.append(f"note: no host kernel for {', '.join(no_host)}: these cannot be checked against the host "
                           "and cannot fall back to it")
        r.passed = 1 if not problems else 0
        if problems:
            r.status, r.failed, r.message = FAIL, len(problems), "; ".join(problems)
        return r

    def check_operator(self, op_type: str) -> CheckResult:
        from byoc.kernels import is_supported

        closed = self._closed("operators", op_type)
        if closed:
            return closed
        r = CheckResult("operators", op_type)
        r.rtol, r.atol = self.req.tolerance(self.target, op_type)
        if op_type in self.req.skip_operators:
            r.status, r.message = SKIPPED, str(self.req.skip_operators[op_type])
            return r
        if "::" in op_type:
            r.status, r.message = UNTESTED, "custom-domain operator: the kit has no generator for it"
            return r
        if not is_supported(op_type, ""):
            r.status, r.message = UNTESTED, "byoc has no host kernel for it (no reference to compare with)"
            return r
        strategy = op_cases(op_type)
        if strategy is None:
            r.status, r.message = UNTESTED, "the kit has no generator for it yet"
            return r
        return self._explore(r, strategy, lambda c: self.run_case(c.graph(), rules=not self.req.bypass_rules),
                             lambda c: self._describe_graph(c.graph()))

    def check_pattern(self, label: str, pattern: Any = None) -> CheckResult:
        from byoc.frontend import load_model
        from byoc.contract.patterns import match_at
        from byoc.contract import SupportContext

        closed = self._closed("patterns", label)
        if closed:
            return closed
        if pattern is None:
            pattern = dict(self.patterns())[label]
        r = CheckResult("patterns", label)
        r.rtol, r.atol = self.req.tolerance(self.target, pattern.name)
        for key in (label, pattern.name):
            if key in self.req.skip_patterns:
                r.status, r.message = SKIPPED, str(self.req.skip_patterns[key])
                return r
        strategy = pattern_cases(pattern.expr, label=pattern.name)
        if strategy is None:
            r.status, r.message = UNTESTED, "the kit cannot build a model for this pattern (operators without a generator)"
            return r
        ctx = SupportContext(self.name, self.options)

        def check(case: GraphCase) -> Outcome:
            try:
                model = case.model()
                ir_model = load_model(model, require_kernels=False)
            except Exception as exc:
                return Outcome("invalid", f"not a valid model: {_exc(exc)}")
            root = list(ir_model.graph)[-1]
            m = match_at(pattern.expr, root)
            if m is None:
                return Outcome("invalid", "the synthesised model does not match (kit limitation)")
            if pattern.check is not None:
                try:
                    ok = pattern.check(m, ctx)
                except Exception as exc:
                    return Outcome(FAIL, f"the pattern's check raised {_exc(exc)}")
                if not (ok is None or ok is True):
                    outcome = self.run_case(case, rules=not self.req.bypass_rules)
                    if outcome.kind == FAIL:
                        return outcome
                    return Outcome(REJECTED, ok if isinstance(ok, str) else "the pattern's check returned False")
            return self.run_case(case, rules=not self.req.bypass_rules, pattern=pattern.name)

        return self._explore(r, strategy, check, self._describe_graph)

    # -- whole graphs -----------------------------------------------------------------------------

    def layer_ops(self) -> list[str]:
        from byoc.kernels import is_supported

        return [o for o in self.claimed_operators() if o in LAYERS and is_supported(o, "")]

    def graph_strategy(self) -> st.SearchStrategy | None:
        """Random layer DAGs of the operators the target claims, with feeds: ``(model, feeds)``."""
        ops = self.layer_ops()
        if not ops:
            return None
        # a few host-only layers too, so regions have neighbours on the host
        from byoc.kernels import is_supported

        extra = [o for o in ("Relu", "Add", "Mul", "Sigmoid") if o not in ops and is_supported(o, "")][:2]

        @st.composite
        def models(draw):
            model = draw(layer_dags(ops + extra))
            rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
            feeds = {}
            for vi in model.graph.input:
                shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                feeds[vi.name] = rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)
            return model, feeds

        return models()

    @staticmethod
    def _describe_model(item) -> tuple[str, dict | None]:
        model, feeds = item
        lines = []
        for n in model.graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            attrs_text = ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()))
            lines.append(f"{n.name}: {n.op_type}({', '.join(n.input)}){' {' + attrs_text + '}' if attrs_text else ''}")
        lines.append("outputs: " + ", ".join(o.name for o in model.graph.output))
        return "\n".join(lines), {"nodes": lines[:-1], "outputs": [o.name for o in model.graph.output],
                                  "inputs": {k: list(v.shape) for k, v in feeds.items()}}

    def _partition_outcome(self, item) -> Outcome:
        model, feeds = item
        names = [o.name for o in model.graph.output]
        try:
            want = self.host(model, feeds, names)
        except Exception as exc:
            return Outcome("invalid", f"host reference: {_exc(exc)}")
        try:
            cm = self.compile(model, feeds, rules=True)
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile raised {_exc(exc)}")
        node_names = [n.name for n in model.graph.node]
        if not graph_is_dag(cm.model.graph):
            return Outcome(FAIL, "the partitioned graph has a cycle")
        producer = {o: i for i, node in enumerate(model.graph.node) for o in node.output}
        preds = [[producer[v] for v in node.input if v in producer] for node in model.graph.node]
        group_of = [cm.records[n].region or n for n in node_names]
        if not kahn_acyclic(contracted(len(node_names), preds, group_of)):
            return Outcome(FAIL, "contracting the regions of the original graph gives a cycle")
        if sorted(cm.records) != sorted(node_names):
            return Outcome(FAIL, f"placement records {sorted(cm.records)} != nodes {sorted(node_names)}")
        in_regions = [n.name for cr in cm.regions for n in cr.region.nodes]
        on_host = [n.name for n in cm.model.graph if n.domain != "byoc"]
        if sorted(in_regions + on_host) != sorted(node_names):
            dup = [n for n, k in Counter(in_regions + on_host).items() if k > 1]
            return Outcome(FAIL, f"nodes not placed exactly once (repeated: {dup})")
        for cr in cm.regions:
            for node in cr.region.nodes:
                rec = cm.records[node.name]
                if (rec.device, rec.region) != (cr.region.target, cr.region.name):
                    return Outcome(FAIL, f"node {node.name}: record says {rec.device}/{rec.region}, region is "
                                         f"{cr.region.target}/{cr.region.name}")
                if rec.verdicts.get(self.name) is not None and not (rec.pattern or "").startswith(self.name + "."):
                    return Outcome(FAIL, f"node {node.name} ({rec.op_type}) placed on {self.name} although its "
                                         f"support check said: {rec.verdicts[self.name]}")
        try:
            got = _outputs(cm, feeds, names)
        except Exception as exc:
            return Outcome(FAIL, f"running the partitioned model raised {_exc(exc)}")
        try:
            ref = self.reference_for(cm, feeds, names, want)
        except Exception as exc:
            return Outcome(FAIL, f"simulating the quantised regions raised {_exc(exc)}")
        cmp = self._compare("partition", model, feeds, got, ref, names)
        if not cmp.ok:
            return Outcome(FAIL, f"outputs differ from the host reference: {cmp.message}", cmp.max_error, cmp.max_ratio)
        try:
            again = self.compile(model, feeds, rules=True)
        except Exception as exc:
            return Outcome(FAIL, f"the second byoc.compile raised {_exc(exc)}")
        if again.placement() != cm.placement():
            return Outcome(FAIL, "compiling twice placed the nodes differently")
        placed = sum(1 for rec in cm.records.values() if rec.device == self.name)
        if not placed:
            return Outcome(REJECTED, "no node placed on the target", cmp.max_error, cmp.max_ratio)
        return Outcome(PASS, "", cmp.max_error, cmp.max_ratio)

    def check_partition(self) -> CheckResult:
        closed = self._closed("partition", "random layer DAGs")
        if closed:
            return closed
        r = CheckResult("partition", "random layer DAGs")
        r.rtol, r.atol = self.req.tolerance(self.target, "partition")
        strategy = self.graph_strategy()
        if strategy is None:
            r.status, r.message = UNTESTED, (f"the target claims none of the layer operators ({', '.join(sorted(LAYERS))})")
            return r
        return self._explore(r, strategy, self._partition_outcome, self._describe_model, self.graph_examples)

    def _bundle_outcome(self, item) -> Outcome:
        model, feeds = item
        names = [o.name for o in model.graph.output]
        try:
            cm, why = self.compile_placing(model, feeds)
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile raised {_exc(exc)}")
        if cm is None:
            return Outcome(REJECTED, why or "")
        if not cm.regions:
            return Outcome(REJECTED, "no region placed on the target")
        try:
            first = _outputs(cm, feeds, names)
        except Exception as exc:
            return Outcome(FAIL, f"running the compiled model raised {_exc(exc)}")
        with tempfile.TemporaryDirectory(prefix="byoc-conformance-") as tmp:
            path = Path(tmp) / "model.byoc"
            try:
                cm.save(path)
                loaded = byoc.load(path, registry=self.bypass_registry)
            except Exception as exc:
                return Outcome(FAIL, f"save/load raised {_exc(exc)}")
            if [cr.region.name for cr in loaded.regions] != [cr.region.name for cr in cm.regions]:
                return Outcome(FAIL, "the loaded bundle has other regions than the compiled model")
            try:
                second = _outputs(loaded, feeds, names)
            except Exception as exc:
                return Outcome(FAIL, f"running the loaded bundle raised {_exc(exc)}")
            diff = _bit_identical(first, second)
            if diff:
                return Outcome(FAIL, f"save -> load -> run is not bit-identical: {diff}")
            try:
                third = _outputs(cm, feeds, names)
            except Exception as exc:
                return Outcome(FAIL, f"running the compiled model a second time raised {_exc(exc)}")
            diff = _bit_identical(first, third)
            if diff:
                return Outcome(FAIL, f"running the same compiled model twice is not bit-identical: {diff}")
        return Outcome(PASS)

    def _determinism_outcome(self, item) -> Outcome:
        model, feeds = item
        try:
            a, why = self.compile_placing(model, feeds)
            b = self.compile_placing(model, feeds)[0] if a is not None else None
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile raised {_exc(exc)}")
        if a is None or b is None:
            return Outcome(REJECTED, why or "")
        if not a.regions:
            return Outcome(REJECTED, "no region placed on the target")
        if len(a.regions) != len(b.regions):
            return Outcome(FAIL, f"{len(a.regions)} regions, then {len(b.regions)}")
        for x, y in zip(a.regions, b.regions):
            ax, ay = x.artifact, y.artifact
            if ax.format != ay.format:
                return Outcome(FAIL, f"region {x.region.name}: artifact format {ax.format!r}, then {ay.format!r}")
            if ax.metadata != ay.metadata:
                keys = sorted(k for k in set(ax.metadata) | set(ay.metadata) if ax.metadata.get(k) != ay.metadata.get(k))
                return Outcome(FAIL, f"region {x.region.name}: artifact metadata differs in {keys}")
            if ax.data != ay.data:
                return Outcome(FAIL, f"region {x.region.name}: artifact data differs ({len(ax.data)} vs "
                                     f"{len(ay.data)} bytes; sha256 {ax.sha256[:12]} vs {ay.sha256[:12]})")
        with tempfile.TemporaryDirectory(prefix="byoc-conformance-") as tmp:
            pa, pb = Path(tmp) / "a.byoc", Path(tmp) / "b.byoc"
            try:
                a.save(pa)
                b.save(pb)
            except Exception as exc:
                return Outcome(FAIL, f"saving raised {_exc(exc)}")
            if pa.read_bytes() != pb.read_bytes():
                return Outcome(FAIL, "two compiles of the same model give bundles that differ")
        return Outcome(PASS)

    def _graph_items(self) -> st.SearchStrategy | None:
        """Models for the bundle and determinism suites: layer DAGs, else one-operator instances."""
        s = self.graph_strategy()
        if s is not None:
            return s
        ops = [o for o in self.operators_to_check() if o in GENERATORS]
        if not ops:
            return None

        @st.composite
        def items(draw):
            case: OpCase = draw(op_cases(draw(st.sampled_from(ops))))
            g = case.graph()
            return g.model(), g.feeds

        return items()

    def check_bundle(self) -> CheckResult:
        closed = self._closed("bundle", "save -> load -> run")
        if closed:
            return closed
        r = CheckResult("bundle", "save -> load -> run")
        s = self._graph_items()
        if s is None:
            r.status, r.message = UNTESTED, "no model the kit can build places anything on the target"
            return r
        return self._explore(r, s, self._bundle_outcome, self._describe_model, self.graph_examples)

    def check_determinism(self) -> CheckResult:
        closed = self._closed("determinism", "artifacts and bundles")
        if closed:
            return closed
        r = CheckResult("determinism", "artifacts and bundles")
        s = self._graph_items()
        if s is None:
            r.status, r.message = UNTESTED, "no model the kit can build places anything on the target"
            return r
        return self._explore(r, s, self._determinism_outcome, self._describe_model, self.graph_examples)

    # -- faults --------------------------------------------------------------------------------------

    def fault_cases(self) -> list[tuple[GraphCase, list[np.ndarray]]]:
        """``(case, bad inputs)`` pairs: one-node regions and inputs whose shapes cannot be right."""
        ops = set(self.claimed_operators())
        rng = np.random.default_rng(self.seed)

        def f(*shape):
            return rng.uniform(-1, 1, size=shape).astype(np.float32)

        cases = []
        for op in ("Add", "Mul", "Sub", "Max", "Min", "Div"):
            if op in ops:
                c = OpCase(op, [f(2, 3), f(2, 3) + (3.0 if op == "Div" else 0.0)])
                cases.append((c.graph(), [f(2, 3), f(4, 5)]))
                break
        if "Conv" in ops:
            c = OpCase("Conv", [f(1, 2, 5, 5), f(3, 2, 3, 3)], {"pads": [1, 1, 1, 1]}, const=frozenset({1}))
            cases.append((c.graph(), [f(1, 3, 5, 5)]))
        if "MatMul" in ops:
            c = OpCase("MatMul", [f(2, 3), f(3, 4)], const=frozenset({1}))
            cases.append((c.graph(), [f(2, 5)]))
        if "Gemm" in ops:
            c = OpCase("Gemm", [f(2, 3), f(3, 4)], const=frozenset({1}))
            cases.append((c.graph(), [f(2, 5)]))
        for op in ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Identity"):
            if op in ops:
                cases.append((OpCase(op, [f(2, 3)]).graph(), []))
                break
        return cases

    def check_faults(self) -> CheckResult:
        closed = self._closed("faults", "wrong shapes and arity")
        if closed:
            return closed
        r = CheckResult("faults", "wrong shapes and arity")
        t0 = time.perf_counter()
        problems: list[str] = []
        native: Counter = Counter()
        exercised = 0
        for case, bad in self.fault_cases():
            try:
                model = case.model()
                cm, why = self.compile_placing(model, case.feeds)
            except Exception as exc:
                problems.append(f"{case.label}: byoc.compile raised {_exc(exc)}")
                continue
            if cm is None:
                r.rejected += 1
                r.reasons[why or "not placed"] += 1
                continue
            if not cm.regions:
                rec = cm.records[case.nodes[0].name]
                r.rejected += 1
                r.reasons[rec.verdicts.get(self.name) or "not placed"] += 1
                continue
            exercised += 1
            cr = cm.regions[0]
            good = [case.feeds[n] for n in cr.artifact.input_names]
            calls = [("one input too few", good[:-1])]
            if bad:
                calls.append((f"inputs of shapes {[list(a.shape) for a in bad]} (the region takes "
                              f"{[list(a.shape) for a in good]})", bad))
            for what, args in calls:
                try:
                    cr.fn(*args)
                except ByocError as exc:
                    r.passed += 1
                    cause = exc.__cause__
                    native[type(cause).__name__ if cause is not None else type(exc).__name__] += 1
                    continue
                except Exception as exc:  # pragma: no cover - byoc wraps every plugin exception
                    problems.append(f"{case.label}: {what}: raised {_exc(exc)}, not a ByocError")
                    continue
                problems.append(f"{case.label}: {what}: the runtime returned outputs instead of raising an error")
            # the runtime still works after the errors
            try:
                want = self.reference_for(cm, case.feeds, case.outputs,
                                          self.host(model, case.feeds, case.outputs))
                got = _outputs(cm, case.feeds, case.outputs)
                cmp = self._compare(case.label, model, case.feeds, got, want, case.outputs)
                if not cmp.ok:
                    problems.append(f"{case.label}: after the errors, a correct call gives wrong results: {cmp.message}")
            except Exception as exc:
                problems.append(f"{case.label}: after the errors, a correct call raised {_exc(exc)}")
        if native:
            r.notes.append("the runtime's own exceptions (byoc wraps non-ByocError ones as PluginError): "
                           + ", ".join(f"{k} x{n}" for k, n in native.most_common()))
        r.seconds = time.perf_counter() - t0
        if problems:
            r.status, r.failed, r.message = FAIL, len(problems), "; ".join(problems)
        elif not exercised:
            r.status = REJECTED if r.rejected else UNTESTED
            r.message = "no fault case was placed on the target" if r.rejected else \
                "the target claims none of Add/Mul/Sub/Max/Min/Div, Conv, MatMul, Gemm, Relu/Sigmoid/Tanh/Neg/Abs/Identity"
        return r

    # -- cost ----------------------------------------------------------------------------------------

    def check_cost(self) -> CheckResult:
        closed = self._closed("cost", "byoc_cost")
        if closed:
            return closed
        r = CheckResult("cost", "byoc_cost")
        t0 = time.perf_counter()
        problems = []
        estimates = 0
        for case, _ in self.fault_cases():
            try:
                cm, _ = self.compile_placing(case.model(), case.feeds)
            except Exception:
                continue  # reported by the fault suite
            if cm is None:
                continue
            for cr in cm.regions:
                plugin, value, faults = self.registry.call_first("byoc_cost", target=self.name, region=cr.region,
                                                                 options=self.options)
                problems.extend(f"region {cr.region.name}: {fault}" for fault in faults)
                if value is None:
                    r.rejected += 1
                    r.reasons["no estimate (None)"] += 1
                    continue
                estimates += 1
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or value < 0:
                    problems.append(f"region {cr.region.name} ({case.label}): byoc_cost returned {value!r}; expected "
                                    "None or a finite number of seconds >= 0")
                else:
                    r.passed += 1
        r.seconds = time.perf_counter() - t0
        if problems:
            r.status, r.failed, r.message = FAIL, len(problems), "; ".join(problems)
        elif not estimates:
            r.status = UNTESTED
            r.message = "byoc_cost gave no estimate (it is optional)"
        return r

    # -- everything ------------------------------------------------------------------------------------

    def run(self, suites: Iterable[str] | None = None,
            progress: Callable[[CheckResult], None] | None = None) -> Report:
        """Run ``suites`` (default: all, in :data:`SUITES` order) into a :class:`Report`."""
        suites = list(SUITES) if suites is None else list(suites)
        unknown = [s for s in suites if s not in SUITES]
        if unknown:
            raise byoc.OptionError(f"unknown conformance suite(s) {unknown}; known: {', '.join(SUITES)}")
        t = self.target
        report = Report(
            target={"name": t.name, "version": t.version, "plugin": t.plugin, "distribution": t.distribution,
                    "device": t.device, "rtol": t.rtol, "atol": t.atol,
                    "needs_calibration": bool(getattr(t, "needs_calibration", False)),
                    "operators": self.claimed_operators(), "patterns": [label for label, _ in self.patterns()]},
            examples=self.examples, seed=self.seed)
        t0 = time.perf_counter()

        def add(res: CheckResult) -> None:
            report.results.append(res)
            if progress is not None:
                progress(res)

        for suite in SUITES:
            if suite not in suites:
                continue
            if suite == "registration":
                add(self.check_registration())
            elif suite == "operators":
                for op in self.operators_to_check():
                    add(self.check_operator(op))
            elif suite == "patterns":
                for label, pattern in self.patterns():
                    add(self.check_pattern(label, pattern))
            elif suite == "partition":
                add(self.check_partition())
            elif suite == "bundle":
                add(self.check_bundle())
            elif suite == "determinism":
                add(self.check_determinism())
            elif suite == "faults":
                add(self.check_faults())
            elif suite == "cost":
                add(self.check_cost())
        report.seconds = time.perf_counter() - t0
        return report


def run_conformance(target: str, *, registry: Registry | None = None, requirements: Requirements | None = None,
                    examples: int | None = None, seed: int | None = None, suites: Iterable[str] | None = None,
                    operators: Sequence[str] | None = None,
                    progress: Callable[[CheckResult], None] | None = None) -> Report:
    """Run the conformance suites against ``target``; see the module docstring."""
    req = requirements if requirements is not None else Requirements()
    if operators is not None:
        req.operators = list(operators)
    return Conformance(target, registry=registry, requirements=req, examples=examples, seed=seed).run(suites, progress)


__all__ = [
    "CAPABILITIES",
    "CheckResult",
    "Conformance",
    "Report",
    "SUITES",
    "format_report",
    "run_conformance",
]
