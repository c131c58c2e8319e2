"""Partition invariants with the cpu target: a DAG, every node placed once, only supported
nodes on cpu (each rejection with a reason), outputs equal to the host's."""

from __future__ import annotations

import numpy as np
from cpu_helpers import REGISTRY, assert_close, compile_cpu, make_model, run_both
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import byoc
from byoc_cpu.plugin import has_compute

#: operators the host runs but the cpu target does not take (so regions get cut around them)
HOST_ONLY = ["Cos", "Sin"]
CPU_OPS = ["Relu", "Sigmoid", "Neg", "Tanh", "Add", "Mul", "Max"]


@st.composite
def mixed_dags(draw):
    """A random DAG of cpu and host-only operators over one shape (every value may feed later nodes)."""
    shape = (2, 3)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    values, nodes = ["x", "z"], []
    for i in range(draw(st.integers(2, 9))):
        op = draw(st.sampled_from(CPU_OPS + HOST_ONLY))
        arity = 2 if op in ("Add", "Mul", "Max") else 1
        args = [draw(st.sampled_from(values)) for _ in range(arity)]
        nodes.append(helper.make_node(op, args, [f"v{i}"], name=f"n{i}"))
        values.append(f"v{i}")
    used = {a for n in nodes for a in n.input}
    outputs = [v for v in values[2:] if v not in used] or [values[-1]]
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "z": rng.standard_normal(shape).astype(np.float32)}
    return make_model(nodes, {"x": shape, "z": shape}, outputs), feeds


@settings(max_examples=20)
@given(mixed_dags())
def test_partition_invariants(case):
    model, feeds = case
    cpu, got, want = run_both(model, feeds)
    assert_close(got, want, rtol=1e-6, atol=1e-6)
    # every node (after the shared passes) is placed exactly once, with a cpu verdict
    for rec in cpu.records.values():
        assert rec.device in ("cpu", "host")
        if rec.op_type in HOST_ONLY:
            assert rec.device == "host" and "not supported by cpu" in rec.verdicts["cpu"]
        if rec.device == "cpu":
            assert rec.verdicts["cpu"] is None and rec.region is not None
    region_nodes = [n.name for cr in cpu.regions for n in cr.region.nodes]
    assert sorted(region_nodes) == sorted(n for n, r in cpu.records.items() if r.device == "cpu")
    # the partitioned graph is a DAG in topological order: every input is defined before use
    defined = {v.name for v in cpu.model.graph.inputs} | set(cpu.model.graph.initializers)
    for node in cpu.model.graph:
        for v in node.inputs:
            assert v is None or v.name in defined, (node.name, v.name)
        defined.update(v.name for v in node.outputs)


def test_rejections_have_reasons():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    model = make_model([
        helper.make_node("Conv", ["x", "wv"], ["c"], name="conv_weight_input"),  # weight is a graph input
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["i"], to=7, name="cast"),
        helper.make_node("Cast", ["i"], ["f"], to=1, name="back"),
        helper.make_node("Conv", ["f", "w"], ["y"], name="conv_ok"),
    ], {"x": (1, 3, 6, 6), "wv": (2, 3, 3, 3)}, ["y"], {"w": np.concatenate([w, w], axis=1)[:, :2]})
    cm = compile_cpu(model)
    rec = cm.records
    assert "weight must be a constant" in rec["conv_weight_input"].verdicts["cpu"]
    assert "not supported by cpu" in rec["cast"].verdicts["cpu"]
    assert rec["relu"].device == "cpu" and rec["conv_ok"].device == "cpu"
    assert rec["conv_weight_input"].device == "host" and rec["cast"].device == "host"


def test_patterns_name_the_fusions():
    rng = np.random.default_rng(0)
    model = make_model([
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "x"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
        helper.make_node("Gemm", ["f", "g"], ["o"], name="gemm", transB=1),
        helper.make_node("Sigmoid", ["o"], ["p"], name="sig"),
    ], {"x": (1, 3, 4, 4), "f": (2, 5)}, ["y", "p"],
        {"w": rng.standard_normal((3, 3, 3, 3)).astype(np.float32), "b": np.zeros(3, np.float32),
         "g": rng.standard_normal((4, 5)).astype(np.float32)})
    cm = compile_cpu(model)
    assert {cm.records[n].pattern for n in ("conv", "add", "relu")} == {"cpu.conv_residual_act"}
    assert {cm.records[n].pattern for n in ("gemm", "sig")} == {"cpu.gemm_bias_act"}


def test_regions_of_views_only_are_dropped():
    model = make_model([
        helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
        helper.make_node("Cos", ["r"], ["c"], name="cos"),
        helper.make_node("Flatten", ["c"], ["y"], name="flatten"),
    ], {"x": (2, 6)}, ["y"], {"s": np.array([3, 4], dtype=np.int64)})
    cm = compile_cpu(model)
    assert not cm.regions
    assert cm.records["reshape"].rule == "cpu:has_compute (only reshapes: nothing to compute)"
    region = byoc.contract.Region("r", "cpu", [n for n in cm.model.graph])
    assert has_compute(region, None) is True  # Cos is compute (the rule only looks at op types)


def test_default_priority_is_after_accelerators():
    [target] = [t for t in REGISTRY.ordered_targets() if t.name == "cpu"]
    assert target.priority < 0 and target.device == "cpu" and target.shape_policy == "static"


def test_symbolic_batch_is_specialised_per_shape():
    rng = np.random.default_rng(2)
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])],
                       {"x": ("N", 4)}, ["y"], {"k": rng.standard_normal(4).astype(np.float32)})
    cm = compile_cpu(model)
    for n in (1, 3):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(cm.run({"x": x})["y"], np.maximum(x, 0) * model_k(model), rtol=1e-6)


def model_k(model):
    from onnx import numpy_helper

    return numpy_helper.to_array(model.graph.initializer[0])


def test_a_region_of_only_views_compiles_when_asked_directly():
    """The has_compute rule keeps such regions away, but the code generator still handles one:
    a view of the region's input returned as its output is copied into an output buffer."""
    import onnx_ir as ir

    from byoc.contract import Region
    from byoc_cpu import runtime
    from byoc_cpu.codegen import generate

    model = ir.from_proto(make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": (2, 6)}, ["y"],
                                     {"s": np.array([3, 4], dtype=np.int64)}))
    artifact = generate(Region("views", "cpu", list(model.graph), model=model), {})
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    [y] = runtime.load(artifact, {})(x)
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    assert not np.shares_memory(y, x)


def test_many_inputs_to_one_node_compile_in_linear_time():
    # a 480 KB model: one Sum of 160,000 copies of x (per-input work that was quadratic took minutes)
    import time

    from onnx import TensorProto

    n = 160_000
    graph = helper.make_graph([helper.make_node("Sum", ["x"] * n, ["y"], name="sum")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    t0 = time.monotonic()
    cm = byoc.compile(model, wait=True, registry=REGISTRY)
    assert time.monotonic() - t0 < 60  # linear: a few seconds; quadratic: minutes
    np.testing.assert_allclose(cm.run({"x": np.array([1.0, -2.0], np.float32)})["y"], [n, -2.0 * n])


def test_report_of_a_symbolic_model_names_the_static_target_and_each_specialisation():
    from onnx import TensorProto

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    cm = byoc.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), registry=REGISTRY,
                      wait=True)
    assert "Static-shape targets (cpu) take part per input shape" in cm.report()
    assert "Specialisations compiled: 0" in cm.report()
    for n in (2, 3):
        cm.run({"x": np.ones((n, 4), np.float32)})
    data = cm.report_data()["specialisations"]
    assert [s["shapes"] for s in data["compiled"]] == [{"x": [2, 4]}, {"x": [3, 4]}]
    assert all(s["nodes"] == {"cpu": 2} and s["regions"] == 1 for s in data["compiled"])
    assert "x=[3, 4]: 1 region(s); nodes: cpu 2" in cm.report()


def test_explain_of_a_symbolic_model_previews_byoc_cpus_regions(tmp_path, capsys):
    """No input shapes given: the report previews where byoc-cpu would place the model at assumed
    shapes (batch 1, other symbolic dims 256), before any run."""
    from onnx import TensorProto, save

    from byoc.cli import main

    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    path = tmp_path / "sym.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["explain", str(path), "-t", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Placement at assumed input shapes x=[1, 3, 256, 256]" in out and "nodes: cpu 2" in out
    assert "cpu_0 -> cpu: 2 node(s), " in out
    cm = byoc.compile(str(path), registry=REGISTRY, wait=True)
    preview = cm.report_data()["specialisations"]["preview"]
    assert preview["nodes"] == {"cpu": 2} and preview["error"] is None
    assert cm.report_data()["specialisations"]["compiled"] == []  # a preview compiles nothing
