"""Placement by cost and honest default targets (issue 13).

* ``Target.available``: ``targets=None`` compiles only for targets whose device is present
  (a callable is evaluated lazily, at compile); an unavailable target runs when named.
* :func:`byoc.partition.placement.solve` on random DAGs (hypothesis) with random per-device
  costs, support sets, bandwidths and launch overheads equals the exhaustive optimum.
* Two in-test plugins, one fast at Conv and one at MatMul, with known costs:
  ``placement="cost"`` gives a lower end-to-end cost than either alone and than ``"priority"``
  in both orders, and its outputs equal the host's.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.contract import host_callable, region_model_bytes
from byoc.errors import OptionError
from byoc.partition.costs import model_cost, value_bytes
from byoc.partition.placement import Problem, evaluate, host_throughput, solve
from byoc.plugins import build_registry
from byoc.testing.graphs import index_dags


class Chip:
    """A target that runs regions on the host kernels, with fixed per-operator costs."""

    def __init__(self, name, costs, *, priority=0, available=True, bandwidth=None, launch=0.0):
        self.name, self.costs, self.priority = name, dict(costs), priority
        self.available, self.bandwidth, self.launch = available, bandwidth, launch

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version="1.0", device="npu", priority=self.priority,
                             available=self.available, bandwidth=self.bandwidth, launch_overhead=self.launch))

    @byoc.hookimpl
    def byoc_register_operators(self, register):
        for o in self.costs:
            register(o)

    @byoc.hookimpl
    def byoc_codegen(self, region):
        return byoc.Artifact(self.name, "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, artifact):
        return host_callable(artifact.data)

    @byoc.hookimpl
    def byoc_cost(self, region):
        return sum(self.costs[n.op_type] for n in region.nodes)


def registry(*chips):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_registry([(c.name, c) for c in chips], entry_points=False)


def chain_model():
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="n0"), helper.make_node("Relu", ["a"], ["y"], name="n1")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# -- honest defaults ----------------------------------------------------------------------------


def test_targets_none_takes_only_available_targets():
    calls = []

    def probe():
        calls.append(1)
        return False

    emu = Chip("emu", {"Neg": 1.0, "Relu": 1.0}, priority=10, available=probe)
    real = Chip("real", {"Relu": 1.0})
    reg = registry(emu, real)
    assert calls == []  # registration does not probe the device
    cm = byoc.compile(chain_model(), registry=reg)
    assert calls, "the availability probe runs when targets=None must decide"
    assert {r.region.target for r in cm.regions} == {"real"}
    assert cm.options["targets"] == ["real"]
    assert "emu" in cm.options["skipped_targets"] and "name it" in cm.options["skipped_targets"]["emu"]
    # named: the emulation runs
    named = byoc.compile(chain_model(), targets=["emu"], registry=reg)
    assert {r.region.target for r in named.regions} == {"emu"}
    x = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)}
    np.testing.assert_array_equal(named.run(x)["y"], cm.run(x)["y"])


def test_available_callable_that_raises_means_absent():
    def broken():
        raise RuntimeError("driver missing")

    t = byoc.Target("t", available=broken)
    assert t.is_available() is False
    assert byoc.Target("u").is_available() is True
    assert byoc.Target("v", available=False).is_available() is False


def test_unknown_placement_is_a_clear_error():
    with pytest.raises(OptionError, match="placement='fastest'"):
        byoc.compile(chain_model(), targets=[], placement="fastest")


# -- the search is exact -------------------------------------------------------------------------


def brute_force(problem: Problem) -> float:
    choices = [problem.allowed(i) for i in range(problem.n)]
    return min(evaluate(problem, a) for a in itertools.product(*choices))


@st.composite
def problems(draw, max_nodes=12):
    n, preds, _, _, _ = draw(index_dags(max_nodes=max_nodes))
    k = draw(st.integers(1, 2))  # targets besides the host
    costs = st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0, 8.0])
    cost = []
    for _ in range(n):
        row = [draw(costs)]
        for _ in range(k):
            row.append(draw(costs) if draw(st.booleans()) else math.inf)
        cost.append(row)
    edge_bytes = {(p, c): float(draw(st.integers(0, 4))) for c in range(n) for p in preds[c]}
    in_bytes = [float(draw(st.integers(0, 3))) for _ in range(n)]
    out_bytes = [float(draw(st.integers(0, 3))) for _ in range(n)]
    bandwidth = [None] + [draw(st.sampled_from([None, 1.0, 2.0])) for _ in range(k)]
    launch = [0.0] + [draw(st.sampled_from([0.0, 0.5, 2.0])) for _ in range(k)]
    return Problem(["host"] + [f"t{j}" for j in range(k)], preds, cost, edge_bytes, in_bytes, out_bytes,
                   bandwidth, launch)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_solve_equals_exhaustive_optimum(problem):
    assume(math.prod(len(problem.allowed(i)) for i in range(problem.n)) <= 5000)
    assign, total = solve(problem)
    assert len(assign) == problem.n
    assert all(problem.cost[i][d] < math.inf for i, d in enumerate(assign))
    assert total == pytest.approx(evaluate(problem, assign))
    assert total == pytest.approx(brute_force(problem))
    # deterministic
    assert solve(problem) == (assign, total)


def test_solve_is_linear_on_a_long_chain():
    import time

    n = 10_000
    preds = [[]] + [[i - 1] for i in range(1, n)]
    cost = [[1.0, 0.5 if i % 3 else math.inf, 0.7] for i in range(n)]
    problem = Problem(["host", "a", "b"], preds, cost, {(i - 1, i): 1.0 for i in range(1, n)},
                      bandwidth=[None, 4.0, 2.0], launch=[0.0, 0.1, 0.1])
    t0 = time.perf_counter()
    assign, total = solve(problem)
    assert time.perf_counter() - t0 < 10
    assert total == pytest.approx(evaluate(problem, assign))


# -- two plugins with different strengths -------------------------------------------------------

FAST, SLOW = 1e-9, 1e-2
CONVCHIP = {"Conv": FAST, "MatMul": SLOW, "Relu": FAST}
MMCHIP = {"Conv": SLOW, "MatMul": FAST, "Relu": FAST}
BANDWIDTH = 1e12


def conv_mm_model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             [("w1", (4, 3, 3, 3)), ("w2", (4, 4, 3, 3)), ("m1", (256, 16)), ("m2", (16, 8)), ("shape", None)]
             if s is not None]
    inits.append(numpy_helper.from_array(np.array([1, 256], np.int64), "shape"))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Reshape", ["r2", "shape"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "m1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "m2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(nodes, "convmm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def end_to_end_cost(cm) -> float:
    """The test's own account of a compiled model: each node's known cost on its device (the
    host's from byoc's FLOPs/bytes model), plus bytes over the bandwidth of each non-host end of
    every edge between devices (graph inputs start and outputs end on the host)."""
    table = {"convchip": CONVCHIP, "mmchip": MMCHIP}
    device = {name: rec.device for name, rec in cm.records.items()}
    flops, bw = host_throughput()
    graph = cm.model.graph
    total = 0.0
    nodes = {}
    for node in graph:
        if node.domain != "byoc":
            nodes[node.name] = node
    for cr in cm.regions:
        nodes.update({n.name: n for n in cr.region.nodes})
    assert set(nodes) == set(device)
    for name, node in nodes.items():
        dev = device[name]
        total += model_cost(node, flops, bw) if dev == "host" else table[dev][node.op_type]
        for v in node.inputs:
            if v is None or (v.const_value is not None and not v.is_graph_input()):
                continue
            producer = v.producer()
            src = device.get(producer.name, "host") if producer is not None and producer.name in device else "host"
            if src != dev:
                total += value_bytes(v) / BANDWIDTH * ((src != "host") + (dev != "host"))
        for v in node.outputs:
            if v.name == "y" and dev != "host":
                total += value_bytes(v) / BANDWIDTH
    return total


def test_cost_placement_beats_each_alone_and_priority_in_both_orders():
    m = conv_mm_model()
    reg = registry(Chip("convchip", CONVCHIP, bandwidth=BANDWIDTH), Chip("mmchip", MMCHIP, bandwidth=BANDWIDTH))
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    host = byoc.compile(m, targets=[]).run(x)["y"]
    cost = byoc.compile(m, targets=["convchip", "mmchip"], registry=reg, placement="cost")
    assert cost.options["placement"] == "cost"
    where = {name: rec.device for name, rec in cost.records.items()}
    assert where["conv1"] == where["conv2"] == "convchip"
    assert where["mm1"] == where["mm2"] == "mmchip"
    np.testing.assert_allclose(cost.run(x)["y"], host, rtol=1e-5, atol=1e-5)
    best = end_to_end_cost(cost)
    others = {
        "convchip alone": byoc.compile(m, targets=["convchip"], registry=reg),
        "mmchip alone": byoc.compile(m, targets=["mmchip"], registry=reg),
        "priority convchip, mmchip": byoc.compile(m, targets=["convchip", "mmchip"], registry=reg),
        "priority mmchip, convchip": byoc.compile(m, targets=["mmchip", "convchip"], registry=reg),
    }
    for label, cm in others.items():
        assert best < end_to_end_cost(cm), label


def test_nodes_a_rule_drops_under_cost_go_where_they_are_next_cheapest():
    class Picky(Chip):
        """The cheapest chip, whose rule keeps only regions with a Conv."""

        @byoc.hookimpl
        def byoc_register_rules(self, register):
            register(byoc.Rule("needs_conv", lambda r, ctx: any(n.op_type == "Conv" for n in r.nodes) or "no Conv"))

    m = conv_mm_model()
    cheap = {op: 1e-12 for op in ("Conv", "Relu", "MatMul")}  # not Reshape: picky's regions are two
    fair = {op: 1e-10 for op in ("Conv", "Relu", "MatMul", "Reshape")}
    reg = registry(Picky("picky", cheap), Chip("fair", fair))
    cm = byoc.compile(m, targets=["picky", "fair"], registry=reg, placement="cost")
    where = {name: rec.device for name, rec in cm.records.items()}
    # the MatMul half has no Conv: picky's rule drops it, and it goes to fair, not to the host
    assert where["conv1"] == where["conv2"] == "picky"
    assert where["mm1"] == where["mm2"] == where["relu3"] == "fair"
    assert cm.records["mm1"].rule.startswith("picky:needs_conv")
    x = {"x": np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_allclose(cm.run(x)["y"], byoc.compile(m, targets=[]).run(x)["y"], rtol=1e-5, atol=1e-5)


def test_cost_placement_without_cost_hooks_uses_the_model_and_matches_host():
    class NoCost(Chip):
        byoc_cost = None

    m = conv_mm_model()
    reg = registry(NoCost("plain", {"Conv": 0, "MatMul": 0, "Relu": 0}, bandwidth=1e9, launch=1e-5))
    x = {"x": np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    cm = byoc.compile(m, targets=["plain"], registry=reg, placement="cost")
    assert not cm.faults
    np.testing.assert_allclose(cm.run(x)["y"], byoc.compile(m, targets=[]).run(x)["y"], rtol=1e-5, atol=1e-5)


# -- the report ---------------------------------------------------------------------------------


def test_report_lists_each_regions_alternatives(monkeypatch, tmp_path, capsys):
    import json
    from importlib import resources

    import onnx

    import byoc.plugins
    from byoc.cli import main

    m = conv_mm_model()
    reg = registry(Chip("convchip", CONVCHIP, bandwidth=BANDWIDTH), Chip("mmchip", MMCHIP, bandwidth=BANDWIDTH))
    cm = byoc.compile(m, targets=["convchip", "mmchip"], registry=reg, placement="cost")
    est = cm.options["placement_estimates"]
    assert est["total_s"] > 0
    data = cm.report_data()
    for region in data["regions"]:
        alts = region["estimated_s"]
        assert set(alts) == {"host", "convchip", "mmchip"}
        # the chosen target is the cheapest for its region here (transfers are negligible)
        assert alts[region["target"]] == min(v for v in alts.values() if v is not None)
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(resources.files("byoc.report").joinpath("schema.json").read_text())
    jsonschema.validate(data, schema)
    # priority placement: no estimates
    assert "estimated_s" not in byoc.compile(m, targets=["convchip"], registry=reg).report_data()["regions"][0]
    # the command line
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    monkeypatch.setattr(byoc.plugins, "_registry", reg)
    assert main(["explain", str(path), "-t", "convchip", "-t", "mmchip", "--placement", "cost", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["target"] for r in doc["regions"]} == {"convchip", "mmchip"}
    assert all("estimated_s" in r for r in doc["regions"])


def test_host_throughput_is_measured_once_per_machine_and_cached(monkeypatch, tmp_path):
    import json

    from byoc.partition import placement

    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(placement, "_HOST", None)
    calls = []
    monkeypatch.setattr(placement, "_measure_host", lambda: calls.append(1) or (2e10, 3e10))
    assert placement.host_throughput() == (2e10, 3e10) and calls == [1]
    table = json.loads((tmp_path / "host-throughput.json").read_text())
    assert table == {placement.machine_fingerprint(): [2e10, 3e10]}
    monkeypatch.setattr(placement, "_HOST", None)  # a new process: read from disk, nothing measured
    assert placement.host_throughput() == (2e10, 3e10) and calls == [1]
    (tmp_path / "host-throughput.json").write_text('{"%s": ["x", -1]}' % placement.machine_fingerprint())
    monkeypatch.setattr(placement, "_HOST", None)  # a damaged entry is measured again
    assert placement.host_throughput() == (2e10, 3e10) and calls == [1, 1]


@pytest.mark.parametrize("bad", [-1.0, "fast", math.nan])
def test_a_wrong_cost_is_the_plugins_fault(bad):
    class Bad(Chip):
        @byoc.hookimpl
        def byoc_cost(self, region):
            return bad

    reg = registry(Bad("badchip", {"Neg": 0.0, "Relu": 0.0}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = byoc.compile(chain_model(), targets=["badchip"], registry=reg, placement="cost")
    assert cm.faults and all(f.plugin == "badchip" and f.hook == "byoc_cost" for f in cm.faults)
    assert "node 'n0'" in cm.faults[0].message
    with pytest.raises(byoc.PluginError, match="byoc_cost"):
        byoc.compile(chain_model(), targets=["badchip"], registry=reg, placement="cost", strict=True)


def test_a_bundle_of_an_emulated_target_saves_and_loads(tmp_path):
    emu = Chip("emu", {"Neg": 1.0, "Relu": 1.0}, available=lambda: False, bandwidth=1e9, launch=1e-6)
    reg = registry(emu)
    cm = byoc.compile(chain_model(), targets=["emu"], registry=reg, placement="cost")
    path = tmp_path / "m.byoc"
    cm.save(path)  # the availability probe is this machine's business: not written
    again = byoc.load(path, registry=reg)
    x = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)}
    np.testing.assert_array_equal(again.run(x)["y"], cm.run(x)["y"])
