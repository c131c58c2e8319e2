"""The conformance runner's core: compile and run one instance, compare it, drive Hypothesis."""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

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
from byoc.testing.cases import GraphCase
from byoc.testing.requirements import Requirements
from byoc.testing.tolerance import (
    LOW_PRECISIONS,
    Comparison,
    compare,
    envelope_accepts,
    magnitude_model,
    perturbed_model,
    rounded_model,
)
from byoc.testing.conformance.results import (
    FAIL,
    KIT_PASSES,
    PASS,
    REJECTED,
    SKIPPED,
    SUITES,
    UNTESTED,
    CheckResult,
)


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


class Runner:
    """What every suite uses: the target, its options, compiling, running, comparing, and the
    Hypothesis driver. The suites are mixins on top of it (see :class:`~byoc.testing.conformance.Conformance`)."""

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
            return byoc.compile(model, wait=True, **kwargs)

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
        """The host reference: byoc's reference kernels, no target, :data:`KIT_PASSES`."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _outputs(byoc.compile(model, targets=[], passes=list(KIT_PASSES), host="reference"), feeds, names)

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

        sims = {cr.region.name: host_callable(cr.region.model, reference=True) for cr in cm.regions}

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
