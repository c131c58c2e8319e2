"""What the conformance suite may assume about a target: subclass to open or close capabilities.

Like the requirements of SQLAlchemy's third-party dialect suite: the shared suite asks, the
vendor answers. Every capability is open by default; a vendor closes one by setting it to
``False`` (the suite skips it with the reason given in :attr:`Requirements.reasons`)::

    from byoc.testing.suite import *  # noqa: F401,F403
    from byoc.testing import Requirements as Base

    class Requirements(Base):
        target = "mychip"
        examples = 20
        skip_operators = {"Resize": "cubic resize lands in v2"}
        fault_behaviour = False
        reasons = {"fault_behaviour": "the simulator aborts on a bad shape; fixed in sim 3.1"}

This module imports nothing heavy: it is read when pytest collects a vendor's tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from byoc.contract import Target
    from byoc.plugins import Registry

#: capability attribute -> what it checks (the suites of :mod:`byoc.testing.conformance`)
CAPABILITIES: dict[str, str] = {
    "registration": "the target is declared sanely and the plugin registered without faults",
    "operator_numerics": "random instances of every claimed operator match the host reference",
    "pattern_numerics": "random models matching each registered pattern match the host reference",
    "partition_invariants": "random graphs partition into a DAG, every node placed once, outputs equal",
    "bundle_round_trip": "save -> load -> run gives bit-identical outputs",
    "deterministic_artifacts": "compiling twice gives byte-identical artifacts and bundles",
    "fault_behaviour": "the runtime answers wrong shapes and arity with a ByocError",
    "cost_estimates": "byoc_cost returns None or a finite, non-negative number of seconds",
}


class Requirements:
    """Defaults for every target; a plugin's test module overrides attributes in a subclass."""

    #: the target under test; ``None``: taken from ``pytest --byoc-target=NAME``
    target: str | None = None
    #: random instances per operator / pattern / suite (``--byoc-examples`` overrides)
    examples: int = 10
    #: instances for the whole-graph suites (partition, bundle, determinism); ``None``: ``examples``
    graph_examples: int | None = None
    #: the Hypothesis seed: runs are reproducible (``--byoc-seed`` overrides)
    seed: int = 0
    #: ``target_options`` for ``byoc.compile`` (``{"precision": "fp32"}``)
    target_options: Mapping[str, Any] = {}
    #: in-process plugins ``[(name, plugin)]`` instead of the installed entry points
    plugins: Sequence[tuple[str, object]] | None = None
    #: check only these operators (``None``: every operator the target claims)
    operators: Collection[str] | None = None
    #: operator -> reason: claimed, but not checked (a known gap)
    skip_operators: Mapping[str, str] = {}
    #: pattern name -> reason
    skip_patterns: Mapping[str, str] = {}
    #: when the target's partition rules drop the region of an instance (a "needs a MAC op" rule
    #: keeps a lone Relu on the host), the operator, pattern, bundle and fault suites compile it
    #: again without the rules, so it is checked all the same; a region that then fails to
    #: compile or run alone counts as rejected (the rules keep it from the code generator), wrong
    #: numbers as a failure. ``False``: rule-dropped instances are only counted as rejected
    bypass_rules: bool = True
    #: the largest finite magnitude the target computes (65504 for float16): where the host
    #: reference is beyond it, an infinity of the same sign passes. ``None``: no such limit
    float_range: float | None = None
    #: random calibration samples the kit generates for a ``needs_calibration`` target
    calibration_samples: int = 8
    #: the share of operator instances drawn with a 0 in some dimension (batch, channels, K of a
    #: product, reduced axes, ...: :func:`byoc.testing.cases.op_cases`); the target computes them
    #: or its support check refuses them (the host runs them). 0: none
    zero_dims: float = 0.2

    # capabilities: True = open (checked), False = closed (skipped with ``reasons[name]``)
    registration: bool = True
    operator_numerics: bool = True
    pattern_numerics: bool = True
    partition_invariants: bool = True
    bundle_round_trip: bool = True
    deterministic_artifacts: bool = True
    fault_behaviour: bool = True
    cost_estimates: bool = True
    #: capability -> why it is closed
    reasons: Mapping[str, str] = {}

    def __init__(self, **overrides: Any) -> None:
        for key, value in overrides.items():
            if not hasattr(type(self), key):
                raise TypeError(f"Requirements has no attribute {key!r}")
            setattr(self, key, value)

    def registry(self) -> "Registry":
        """The registry the suite uses: :attr:`plugins` in-process, else the installed plugins."""
        from byoc.plugins import build_registry, get_registry

        if self.plugins is not None:
            return build_registry(list(self.plugins), entry_points=False)
        return get_registry()

    def tolerance(self, target: "Target", label: str) -> tuple[float, float]:
        """``(rtol, atol)`` for checking ``label`` (an operator type or a pattern name) on ``target``.

        Default: the target's declared ``Target.rtol``/``Target.atol``. Override to widen it for
        one operator with a documented reason; the report shows the tolerance used.
        """
        return float(target.rtol), float(target.atol)

    def is_open(self, capability: str) -> bool:
        if capability not in CAPABILITIES:
            raise KeyError(f"unknown capability {capability!r}; known: {sorted(CAPABILITIES)}")
        return bool(getattr(self, capability))

    def reason(self, capability: str) -> str:
        return self.reasons.get(capability) or f"{capability} closed by {type(self).__qualname__}"


__all__ = ["CAPABILITIES", "Requirements"]
