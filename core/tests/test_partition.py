"""Partitioning invariants, as properties.

* :func:`byoc.partition.regions.form_regions` on random index DAGs with random candidate masks:
  every candidate unit is placed exactly once, the contracted graph stays a DAG (checked here by
  an independent Kahn sort), regions are connected, and chains/diamonds get the obvious answer.
* ``byoc.compile`` (placement "priority", "cost" or "measure") on random ONNX DAGs (diamonds, shared outputs) with two or three in-process
  targets that support random sets of nodes: the partitioned graph is a DAG, every node is placed
  exactly once, outputs equal the host-only run bit for bit, and compiling twice gives identical
  artifacts.
"""

from __future__ import annotations

import os
import warnings
from collections import defaultdict

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import byoc
from byoc.kernels import supported_ops
from byoc.contract import Pattern, Rule, any_value, op
from byoc.partition.regions import CycleError, form_regions, is_acyclic, unit_graph
from byoc.plugins import build_registry
from byoc.contract import host_callable, region_model_bytes
from byoc.testing.graphs import contracted, graph_is_dag, index_dags, kahn_acyclic
from byoc.testing.graphs import onnx_dags as _onnx_dags

# the random graphs and the independent acyclicity checks live in the conformance kit
# (byoc.testing.graphs), shared with vendors' partition tests

# -- form_regions on index graphs -------------------------------------------------------------


def check_regions(n, preds, unit_of, n_units, candidate, regions):
    placed = [u for r in regions for u in r]
    # every candidate unit exactly once, nothing else
    assert sorted(placed) == [u for u in range(n_units) if candidate[u]]
    assert all(regions), "empty region"
    region_of = {u: k for k, r in enumerate(regions) for u in r}
    group_of = [("r", region_of[unit_of[i]]) if unit_of[i] in region_of else ("u", unit_of[i]) for i in range(n)]
    assert kahn_acyclic(contracted(n, preds, group_of))
    # the library's own check agrees
    region_unit = [region_of.get(unit_of[i], -1) for i in range(n)]
    ids = {}
    flat = [ids.setdefault(("r", r) if r >= 0 else ("u", unit_of[i]), len(ids)) for i, r in enumerate(region_unit)]
    assert is_acyclic(n, preds, flat, len(ids))
    # connected, and units in an order consistent with the edges between them
    upreds = defaultdict(set)
    for c in range(n):
        for p in preds[c]:
            if unit_of[p] != unit_of[c]:
                upreds[unit_of[c]].add(unit_of[p])
    for r in regions:
        pos = {u: k for k, u in enumerate(r)}
        adj = defaultdict(set)
        for u in r:
            for p in upreds[u]:
                if p in pos:
                    assert pos[p] < pos[u], "units of a region out of topological order"
                    adj[u].add(p)
                    adj[p].add(u)
        seen, stack = {r[0]}, [r[0]]
        while stack:
            for v in adj[stack.pop()] - seen:
                seen.add(v)
                stack.append(v)
        assert seen == set(r), f"region {r} is not connected"


@settings(max_examples=300)
@given(index_dags())
def test_form_regions_properties(case):
    n, preds, unit_of, n_units, candidate = case
    regions = form_regions(n, preds, unit_of, n_units, candidate)
    check_regions(n, preds, unit_of, n_units, candidate, regions)


@settings(max_examples=100)
@given(index_dags())
def test_all_candidates_gives_connected_components(case):
    """With every unit a candidate nothing blocks a merge: regions are the weak components."""
    n, preds, unit_of, n_units, _ = case
    regions = form_regions(n, preds, unit_of, n_units, [True] * n_units)
    parent = list(range(n_units))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for c in range(n):
        for p in preds[c]:
            a, b = find(unit_of[p]), find(unit_of[c])
            if a != b:
                parent[max(a, b)] = min(a, b)
    components = defaultdict(set)
    for u in range(n_units):
        components[find(u)].add(u)
    assert sorted(map(sorted, regions)) == sorted(map(sorted, components.values()))


def test_chain_is_one_region():
    n = 50
    preds = [[]] + [[i - 1] for i in range(1, n)]
    assert form_regions(n, preds, list(range(n)), n, [True] * n) == [list(range(n))]


def test_chain_broken_by_host_node():
    preds = [[], [0], [1], [2], [3]]
    assert form_regions(5, preds, list(range(5)), 5, [True, True, False, True, True]) == [[0, 1], [3, 4]]


def test_diamond():
    #   0 -> 1 -> 3
    #   0 -> 2 -> 3
    preds = [[], [0], [0], [1, 2]]
    assert form_regions(4, preds, list(range(4)), 4, [True] * 4) == [[0, 1, 2, 3]]
    # one branch on the host: 0 and 3 must not share a region (0 -> 2 -> 3 would leave and re-enter)
    regions = form_regions(4, preds, list(range(4)), 4, [True, True, False, True])
    region_of = {u: k for k, r in enumerate(regions) for u in r}
    assert region_of[0] != region_of[3]
    assert sorted(map(len, regions)) == [1, 2]  # the free branch joins one side (maximal)
    check_regions(4, preds, list(range(4)), 4, [True, True, False, True], regions)


def test_independent_branches_stay_apart():
    # two candidate chains that never meet are two regions (components), not one
    preds = [[], [0], [], [2]]
    assert form_regions(4, preds, list(range(4)), 4, [True] * 4) == [[0, 1], [2, 3]]


def test_cyclic_units_raise():
    # contracting 0 and 2 into one unit around 1 is a cycle
    with pytest.raises(CycleError):
        unit_graph(3, [[], [0], [1]], [0, 1, 0], 2)
    assert not is_acyclic(3, [[], [0], [1]], [0, 1, 0], 2)


# -- byoc.compile on random ONNX DAGs --------------------------------------------------------

SHAPE = [2, 3]
UNARY = [o for o in ("Relu", "Neg", "Sigmoid", "Tanh") if o in supported_ops()]
BINARY = [o for o in ("Add", "Mul") if o in supported_ops()]
needs_kernels = pytest.mark.skipif(len(UNARY) < 2 or not BINARY, reason="elementwise host kernels missing")


class MaskTarget:
    """Target ``name`` supporting exactly the nodes named in ``names`` (any op type).

    ``pattern``: a ``<name>.neg_relu`` composite (placed on the pattern alone); ``rule``:
    ``"drop-single"`` drops one-node regions, ``"halve"`` splits a region in two in node order.
    """

    def __init__(self, name, names, pattern=False, rule=None, cost=None):
        self.name, self.names, self.pattern, self.rule = name, frozenset(names), pattern, rule
        self.cost = cost  # byoc_cost per node for placement="cost" (None: byoc's own model)

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version="1", device="npu", rtol=0, atol=0, bandwidth=1e12,
                             launch_overhead=1e-12))

    @byoc.hookimpl
    def byoc_cost(self, region):
        return None if self.cost is None else self.cost * len(region.nodes)

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target != self.name:
            return
        names = self.names

        def check(node, ctx):
            return None if node.name in names else f"{node.op_type}: {node.name} masked out"

        for o in UNARY + BINARY:
            register(o, check)

    @byoc.hookimpl
    def byoc_register_patterns(self, target, register):
        if target == self.name and self.pattern:
            register(Pattern(f"{self.name}.neg_relu", op("Relu", op("Neg", any_value()))))

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        if target != self.name or self.rule is None:
            return
        if self.rule == "drop-single":
            register(Rule("drop_single", lambda r, ctx: len(r.nodes) > 1 or "one node is not worth it"))
        else:
            register(Rule("halve", lambda r, ctx: [r.nodes[: len(r) // 2], r.nodes[len(r) // 2:]] if len(r) > 1 else None))

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == self.name:
            return byoc.Artifact(self.name, "onnx", region_model_bytes(region.model), {"n": len(region.nodes)})

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == self.name:
            return host_callable(artifact.data)


def onnx_dags(max_nodes=14):
    return _onnx_dags(UNARY, BINARY, SHAPE, max_nodes=max_nodes, opset=17)


@st.composite
def setups(draw):
    model = draw(onnx_dags())
    names = [n.name for n in model.graph.node]
    k = draw(st.integers(2, 3))
    targets = []
    for t in range(k):
        mask = draw(st.sets(st.sampled_from(names)))
        targets.append(MaskTarget(f"t{t}", mask, pattern=draw(st.booleans()),
                                  rule=draw(st.sampled_from([None, None, "drop-single", "halve"])),
                                  cost=draw(st.sampled_from([None, 0.0, 1e-9, 1.0]))))
    order = draw(st.permutations([t.name for t in targets]))
    seed = draw(st.integers(0, 2**16))
    placement = draw(st.sampled_from(["priority", "cost", "measure"]))
    return model, targets, list(order), seed, placement


@pytest.fixture(scope="module", autouse=True)
def measure_cache(tmp_path_factory):
    """placement="measure" caches its times: in a folder of this module's own."""
    old = os.environ.get("BYOC_CACHE_DIR")
    os.environ["BYOC_CACHE_DIR"] = str(tmp_path_factory.mktemp("byoc-cache"))
    yield
    if old is None:
        os.environ.pop("BYOC_CACHE_DIR", None)
    else:
        os.environ["BYOC_CACHE_DIR"] = old


def compile_quiet(model, registry, order, placement="priority"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 'halve' split that cuts a composite is refused with a warning
        return byoc.compile(model, targets=order, registry=registry, passes=[], placement=placement)


@needs_kernels
@settings(max_examples=60)
@given(setups())
def test_partition_invariants(setup):
    model, targets, order, seed, placement = setup
    registry = build_registry([(t.name, t) for t in targets], entry_points=False)
    cm = compile_quiet(model, registry, order, placement)
    names = [n.name for n in model.graph.node]
    masks = {t.name: t.names for t in targets}

    # the partitioned graph is a DAG (regions are single byoc::Region nodes), in topological order
    assert graph_is_dag(cm.model.graph)
    # ... and so is the original graph with each region contracted
    producer = {o: i for i, node in enumerate(model.graph.node) for o in node.output}
    preds = [[producer[v] for v in node.input if v in producer] for node in model.graph.node]
    group_of = [cm.records[name].region or name for name in names]
    assert kahn_acyclic(contracted(len(names), preds, group_of))

    # every node placed exactly once
    assert sorted(cm.records) == sorted(names)
    in_regions = [n.name for cr in cm.regions for n in cr.region.nodes]
    on_host = [n.name for n in cm.model.graph if n.domain != "byoc"]
    assert sorted(in_regions + on_host) == sorted(names)
    for cr in cm.regions:
        for node in cr.region.nodes:
            rec = cm.records[node.name]
            assert (rec.device, rec.region) == (cr.region.target, cr.region.name)
            # a target only gets nodes it accepted, or a composite of its own pattern
            assert node.name in masks[rec.device] or rec.pattern == f"{rec.device}.neg_relu"
    for name in on_host:
        assert (cm.records[name].device, cm.records[name].region) == ("host", None)
    assert {n.name for n in cm.model.graph if n.domain == "byoc"} == {cr.region.name for cr in cm.regions}

    # outputs equal the host-only run, bit for bit (the regions run the same host kernels)
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal(SHAPE).astype(np.float32) for i in model.graph.input}
    got = cm.run(feeds)
    want = byoc.compile(model, targets=[], passes=[]).run(feeds)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])

    # compiling twice gives identical artifacts and the same placement
    again = compile_quiet(model, registry, order, placement)

    def arts(c):
        return [(r.region.name, r.artifact.target, r.artifact.format, r.artifact.data, r.artifact.metadata)
                for r in c.regions]

    assert arts(again) == arts(cm)
    assert again.placement() == cm.placement()


@needs_kernels
def test_shared_output_and_diamond_example():
    """x -> a -> (b, c) -> d, with a also a graph output; t0 takes a, b, d; t1 takes c."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Neg", ["a"], ["b"], name="b"),
        helper.make_node("Tanh", ["a"], ["c"], name="c"),
        helper.make_node("Add", ["b", "c"], ["d"], name="d"),
    ]
    graph = helper.make_graph(nodes, "diamond", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info(v, TensorProto.FLOAT, SHAPE) for v in ("a", "d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    reg = build_registry([("t0", MaskTarget("t0", {"a", "b", "d"})), ("t1", MaskTarget("t1", {"c"}))],
                         entry_points=False)
    cm = byoc.compile(model, targets=["t0", "t1"], registry=reg, passes=[])
    # a, b, d cannot share a region: a -> c (t1) -> d would leave and re-enter it
    assert cm.records["a"].region != cm.records["d"].region
    assert {cm.records[n].device for n in "abd"} == {"t0"} and cm.records["c"].device == "t1"
    assert graph_is_dag(cm.model.graph)
    x = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(SHAPE)}
    got, want = cm.run(x), byoc.compile(model, targets=[]).run(x)
    for k in ("a", "d"):
        np.testing.assert_array_equal(got[k], want[k])
    assert isinstance(onnx.ModelProto.FromString(cm.regions[0].artifact.data), onnx.ModelProto)
