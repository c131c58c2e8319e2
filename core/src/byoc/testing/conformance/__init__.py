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

The code is split by suite: :mod:`~byoc.testing.conformance.results` (rows, report, text),
:mod:`~byoc.testing.conformance.runner` (compile/run/compare one instance, the Hypothesis
driver), and the suites in :mod:`~byoc.testing.conformance.claims` (registration, operators,
patterns), :mod:`~byoc.testing.conformance.whole_graphs` (partition, bundle, determinism) and
:mod:`~byoc.testing.conformance.edges` (faults, cost).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import byoc
from byoc.plugins import Registry
from byoc.testing.conformance.claims import ClaimSuites
from byoc.testing.conformance.edges import EdgeSuites
from byoc.testing.conformance.results import (
    FAIL,
    KIT_PASSES,
    PASS,
    REJECTED,
    SKIPPED,
    SUITES,
    UNTESTED,
    CheckResult,
    Report,
    format_report,
)
from byoc.testing.conformance.runner import Outcome
from byoc.testing.conformance.whole_graphs import GraphSuites
from byoc.testing.requirements import CAPABILITIES, Requirements


class Conformance(ClaimSuites, GraphSuites, EdgeSuites):
    """The suites for one target. Each ``check_*`` method returns :class:`CheckResult` rows."""

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
    "FAIL",
    "KIT_PASSES",
    "PASS",
    "REJECTED",
    "SKIPPED",
    "SUITES",
    "UNTESTED",
    "CheckResult",
    "Conformance",
    "Outcome",
    "Report",
    "format_report",
    "run_conformance",
]
