"""Suites on the target's behaviour at its edges: faults (bad calls to its runtime) and cost estimates."""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np

from byoc.codegen import RegionOutputError
from byoc.errors import ByocError
from byoc.testing.cases import GraphCase, OpCase
from byoc.testing.conformance.results import (
    FAIL,
    REJECTED,
    UNTESTED,
    CheckResult,
)
from byoc.testing.conformance.runner import Runner, _exc, _outputs


class EdgeSuites(Runner):
    """faults, cost."""

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
                except RegionOutputError as exc:  # byoc's own check caught what the runtime let through
                    problems.append(f"{case.label}: {what}: the runtime returned outputs instead of raising an error "
                                    f"({exc})")
                    continue
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
