"""Suites on what the target claims: registration, operator numerics, pattern numerics."""

from __future__ import annotations

import json
import math
from typing import Any


from byoc.errors import ByocError
from byoc.testing.cases import GraphCase, op_cases
from byoc.testing.patterns import pattern_cases
from byoc.testing.conformance.results import (
    FAIL,
    REJECTED,
    SKIPPED,
    UNTESTED,
    CheckResult,
)
from byoc.testing.conformance.runner import Outcome, Runner, _exc


class ClaimSuites(Runner):
    """registration, operators, patterns."""

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
        strategy = op_cases(op_type, zero_dims=self.req.zero_dims)
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
