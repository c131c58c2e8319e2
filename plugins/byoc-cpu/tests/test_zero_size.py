"""byoc-cpu and zero-size tensors (a 0 in some dimension: batch, channels, K of a product, reduced
axes): on the conformance kit's zero-size instances of every operator the cpu target claims,
compiling for ``cpu`` gives the results of byoc's reference kernels (which
core/tests/test_zero_size.py holds to onnxruntime's), or the same ByocError naming the node. The
support check refuses a node with a zero-size tensor (the host runs it) and never raises:
plugin faults fail here (``strict=True``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import byoc
from byoc.errors import ByocError
from byoc.testing.cases import GENERATORS, op_cases
from byoc.testing.oracle import assert_close
from byoc_cpu.ops import OPERATORS
from cpu_helpers import REGISTRY


def _outcome(model, feeds, **options):
    try:
        out = byoc.compile(model, registry=REGISTRY, **options).run(feeds)
    except ByocError as exc:
        return exc
    return [out[o.name] for o in model.graph.output]


@pytest.mark.parametrize("op", sorted(set(OPERATORS) & set(GENERATORS)))
def test_zero_size_instances_for_cpu(op):
    @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(op_cases(op, zero_dims=1.0))
    def check(case):
        g = case.graph()
        model, node = g.model(), g.nodes[0].name
        want = _outcome(model, g.feeds, targets=[], host="reference")
        cm = None
        try:
            cm = byoc.compile(model, targets=["cpu"], registry=REGISTRY, strict=True)
            got = [cm.run(g.feeds)[o] for o in g.outputs]
        except ByocError as exc:
            assert isinstance(want, ByocError), f"the reference runs it; for cpu: {exc!r}"
            assert node in str(exc), f"the error does not name node {node!r}: {exc}"
            return
        assert not isinstance(want, ByocError), f"the reference raises {want!r}; for cpu it ran"
        assert_close(got, want)
        if any(a.size == 0 for a in g.feeds.values()) or any(np.asarray(a).size == 0 for a in g.initializers.values()):
            assert cm.records[node].device != "cpu", "a node with a zero-size tensor was placed on cpu"

    check()
