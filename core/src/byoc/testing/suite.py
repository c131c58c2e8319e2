"""The conformance suite as pytest tests, for a plugin's own test suite.

Two ways to run it:

* ``pytest --byoc-target=NAME``: the pytest plugin (entry point ``pytest11``, module
  :mod:`pytest_byoc`) adds this module to the collection and checks target ``NAME``;
* one import in the plugin's own tests, e.g. ``tests/test_conformance.py``::

      from byoc.testing.suite import *  # noqa: F401,F403

      class Requirements(Requirements):  # noqa: F405
          target = "mychip"
          skip_operators = {"Resize": "cubic lands in v2"}

  The module's ``Requirements`` subclass (:class:`byoc.testing.Requirements`) names the target
  and opens or closes capabilities; ``--byoc-target`` is the fallback when it names none.

Tests: ``test_registration``, ``test_operator_numerics[<op>]`` (one per claimed operator),
``test_pattern_numerics[<pattern>]``, ``test_partition_invariants``, ``test_bundle_round_trip``,
``test_deterministic_artifacts``, ``test_fault_behaviour``, ``test_cost_estimates``. A failure
prints the smallest failing instance Hypothesis found; an operator whose every instance the
target rejects, and a closed capability, are skips with the reason (``pytest -rs`` lists them).
"""

from __future__ import annotations

from typing import Any

import pytest

from byoc.testing.requirements import Requirements

_CACHE = pytest.StashKey[dict]()


def _requirements_for(module: Any, config: pytest.Config) -> Requirements:
    cls = getattr(module, "Requirements", Requirements) if module is not None else Requirements
    if not (isinstance(cls, type) and issubclass(cls, Requirements)):
        cls = Requirements
    req = cls()
    if req.target is None:
        req.target = config.getoption("byoc_target", default=None)
    examples = config.getoption("byoc_examples", default=None)
    if examples:
        req.examples = int(examples)
    seed = config.getoption("byoc_seed", default=None)
    if seed is not None:
        req.seed = int(seed)
    return req


def _conformance_for(config: pytest.Config, module: Any):
    """The :class:`~byoc.testing.conformance.Conformance` of ``module`` (``None``: no target)."""
    cache = config.stash.setdefault(_CACHE, {})
    key = getattr(module, "__name__", "")
    if key not in cache:
        req = _requirements_for(module, config)
        if req.target is None:
            cache[key] = None
        else:
            from byoc.testing.conformance import Conformance

            cache[key] = Conformance(req.target, requirements=req)
    return cache[key]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.fixturenames
    if "byoc_operator" not in names and "byoc_pattern" not in names:
        return
    conf = _conformance_for(metafunc.config, metafunc.module)
    if "byoc_operator" in names:
        ops = conf.operators_to_check() if conf is not None else []
        metafunc.parametrize("byoc_operator", ops, ids=ops)
    if "byoc_pattern" in names:
        labels = [label for label, _ in conf.patterns()] if conf is not None else []
        metafunc.parametrize("byoc_pattern", labels, ids=labels)


@pytest.fixture(scope="module")
def byoc_conformance(request: pytest.FixtureRequest):
    """The conformance runner for this module's target."""
    conf = _conformance_for(request.config, request.module)
    if conf is None:
        pytest.skip("no byoc target: pass --byoc-target=NAME or set Requirements.target")
    return conf


@pytest.fixture(scope="module")
def byoc_requirements(byoc_conformance) -> Requirements:
    """The :class:`Requirements` in force for this module."""
    return byoc_conformance.req


def check(result) -> None:
    """Turn a :class:`~byoc.testing.conformance.CheckResult` into a pass, a failure or a skip."""
    from byoc.testing.conformance import FAIL, PASS

    if result.status == FAIL:
        pytest.fail(result.summary(), pytrace=False)
    if result.status != PASS:
        why = result.message or (result.reasons.most_common(1)[0][0] if result.reasons else result.status)
        pytest.skip(f"{result.status}: {why}")


def test_registration(byoc_conformance) -> None:
    check(byoc_conformance.check_registration())


def test_operator_numerics(byoc_conformance, byoc_operator: str) -> None:
    check(byoc_conformance.check_operator(byoc_operator))


def test_pattern_numerics(byoc_conformance, byoc_pattern: str) -> None:
    check(byoc_conformance.check_pattern(byoc_pattern))


def test_partition_invariants(byoc_conformance) -> None:
    check(byoc_conformance.check_partition())


def test_bundle_round_trip(byoc_conformance) -> None:
    check(byoc_conformance.check_bundle())


def test_deterministic_artifacts(byoc_conformance) -> None:
    check(byoc_conformance.check_determinism())


def test_fault_behaviour(byoc_conformance) -> None:
    check(byoc_conformance.check_faults())


def test_cost_estimates(byoc_conformance) -> None:
    check(byoc_conformance.check_cost())


# in the order the suites run (pytest collects a star-imported module's tests in this order)
__all__ = [
    "Requirements",
    "byoc_conformance",
    "byoc_requirements",
    "pytest_generate_tests",
    "test_registration",
    "test_operator_numerics",
    "test_pattern_numerics",
    "test_partition_invariants",
    "test_bundle_round_trip",
    "test_deterministic_artifacts",
    "test_fault_behaviour",
    "test_cost_estimates",
]
