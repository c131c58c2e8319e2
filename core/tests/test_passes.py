"""Each shared pass on small graphs: what it changes, and that numerics hold."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.frontend import load_model
from byoc.passes import DEFAULT_PASSES, run_passes
from byoc.testing.oracle import run_onnxruntime


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def _ops(model):
    return [n.op_type for n in model.graph]


def _info(name, shape, dtype=T.FLOAT):
    return h.make_tensor_value_info(name, dtype, shape)


def _run_only(proto, names):
    model = load_model(proto)
    changed = run_passes(model, names)
    return model, changed


def test_constant_folding_replaces_constant_subgraph_with_initializer():
    a = nh.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "a")
    b = nh.from_array(np.ones((2, 3), np.float32), "b")
    nodes = [h.make_node("Add", ["a", "b"], ["c"], name="fold_me"), h.make_node("Mul", ["x", "c"], ["y"], name="keep")]
    proto = _model(nodes, [_info("x", [2, 3])], [_info("y", [2, 3])], [a, b])
    model, changed = _run_only(proto, ["constant_folding"])
    assert "constant_folding" in changed
    assert _ops(model) == ["Mul"]
    folded = model.graph.node(0).inputs[1]
    np.testing.assert_array_equal(folded.const_value.numpy(), np.arange(6).reshape(2, 3) + 1)


def test_constant_folding_sees_through_static_shape_arithmetic():
    nodes = [
        h.make_node("Shape", ["x"], ["s"], name="shape"),
        h.make_node("Reshape", ["x", "s"], ["y"], name="reshape"),
    ]
    proto = _model(nodes, [_info("x", [2, 3, 4])], [_info("y", [2, 3, 4])])
    model, _ = _run_only(proto, ["shape_inference", "constant_folding"])
    assert _ops(model) == ["Reshape"]
    np.testing.assert_array_equal(model.graph.node(0).inputs[1].const_value.numpy(), [2, 3, 4])


def test_constant_folding_keeps_graph_output_names():
    a = nh.from_array(np.full((2,), 3.0, np.float32), "a")
    nodes = [h.make_node("Neg", ["a"], ["y"], name="neg"), h.make_node("Relu", ["x"], ["z"], name="relu")]
    proto = _model(nodes, [_info("x", [2])], [_info("y", [2]), _info("z", [2])], [a])
    out = byoc.compile(proto, targets=[]).run({"x": np.array([-1.0, 1.0], np.float32)})
    assert list(out) == ["y", "z"]
    np.testing.assert_array_equal(out["y"], [-3.0, -3.0])


def test_constant_folding_refuses_huge_constant_of_shape_before_allocating():
    # a ~100-byte model whose ConstantOfShape asks for 8 GiB: refused at compile time
    shape = nh.from_array(np.array([2, 1024, 1024, 1024], np.int64), "shape")
    nodes = [h.make_node("ConstantOfShape", ["shape"], ["big"], name="huge"), h.make_node("Add", ["x", "big"], ["y"])]
    proto = _model(nodes, [_info("x", [1])], [_info("y", None)], [shape])
    assert len(proto.SerializeToString()) < 300
    with pytest.raises(byoc.ResourceLimitError, match="huge"):
        byoc.compile(proto, targets=[])


def test_initializer_listed_as_input_is_not_folded_and_can_be_fed():
    w = nh.from_array(np.full((2,), 2.0, np.float32), "w")
    nodes = [h.make_node("Mul", ["x", "w"], ["y"], name="mul")]
    proto = _model(nodes, [_info("x", [2]), _info("w", [2])], [_info("y", [2])], [w])
    compiled = byoc.compile(proto, targets=[])
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], [2.0, 4.0])
    np.testing.assert_array_equal(compiled.run({"x": x, "w": np.full((2,), 3.0, np.float32)})["y"], [3.0, 6.0])


def test_cse_merges_identical_nodes():
    nodes = [
        h.make_node("Relu", ["x"], ["a"], name="r1"),
        h.make_node("Relu", ["x"], ["b"], name="r2"),
        h.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    proto = _model(nodes, [_info("x", [4])], [_info("y", [4])])
    model, changed = _run_only(proto, ["cse"])
    assert "cse" in changed
    assert _ops(model) == ["Relu", "Add"]


def test_dead_code_removes_unused_nodes():
    nodes = [h.make_node("Relu", ["x"], ["y"], name="used"), h.make_node("Neg", ["x"], ["unused"], name="dead")]
    proto = _model(nodes, [_info("x", [4])], [_info("y", [4])])
    model, changed = _run_only(proto, ["dead_code"])
    assert changed == ["dead_code"]
    assert _ops(model) == ["Relu"]


@pytest.mark.parametrize("output_is_dropout", [False, True])
def test_identity_and_dropout_removal(output_is_dropout):
    nodes = [
        h.make_node("Identity", ["x"], ["i"], name="id"),
        h.make_node("Relu", ["i"], ["r"], name="relu"),
        h.make_node("Dropout", ["r"], ["y"], name="drop", ratio=0.5) if output_is_dropout else
        h.make_node("Dropout", ["r"], ["d"], name="drop"),
    ]
    if not output_is_dropout:
        nodes.append(h.make_node("Neg", ["d"], ["y"], name="neg"))
    proto = _model(nodes, [_info("x", [4])], [_info("y", [4])], opset=11)
    model, changed = _run_only(proto, ["identity_removal"])
    assert "Dropout" not in _ops(model)
    assert [v.name for v in model.graph.outputs] == ["y"]
    x = np.array([-1, 0, 1, 2], np.float32)
    out = byoc.compile(proto, targets=[]).run({"x": x})["y"]
    np.testing.assert_array_equal(out, np.maximum(x, 0) * (1 if output_is_dropout else -1))


def _bn_inits(rng, c, prefix="bn"):
    return [
        nh.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}_s"),
        nh.from_array(rng.uniform(-0.5, 0.5, c).astype(np.float32), f"{prefix}_b"),
        nh.from_array(rng.uniform(-0.5, 0.5, c).astype(np.float32), f"{prefix}_m"),
        nh.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}_v"),
    ]


@pytest.mark.parametrize("with_bias", [False, True])
def test_bn_folds_into_conv(with_bias):
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")] + _bn_inits(rng, 4)
    conv_in = ["x", "W"]
    if with_bias:
        inits.append(nh.from_array(rng.standard_normal(4).astype(np.float32), "B"))
        conv_in.append("B")
    nodes = [
        h.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"], name="bn", epsilon=1e-3),
    ]
    proto = _model(nodes, [_info("x", [2, 3, 8, 8])], [_info("y", [2, 4, 8, 8])], inits)
    model, changed = _run_only(proto, ["bn_folding"])
    assert changed == ["bn_folding"]
    assert _ops(model) == ["Conv"]
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    folded = onnx.shape_inference.infer_shapes(byoc.frontend.to_proto(model))
    np.testing.assert_allclose(run_onnxruntime(folded, {"x": x})[0], run_onnxruntime(proto, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_bn_folds_into_gemm(trans_b):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 6) if trans_b else (6, 5)).astype(np.float32)
    inits = [nh.from_array(w, "W"), nh.from_array(rng.standard_normal(5).astype(np.float32), "C")] + _bn_inits(rng, 5)
    nodes = [
        h.make_node("Gemm", ["x", "W", "C"], ["g"], name="gemm", transB=trans_b, alpha=0.5, beta=2.0),
        h.make_node("BatchNormalization", ["g", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"], name="bn"),
    ]
    proto = _model(nodes, [_info("x", [3, 6])], [_info("y", [3, 5])], inits)
    model, changed = _run_only(proto, ["bn_folding"])
    assert _ops(model) == ["Gemm"]
    x = rng.standard_normal((3, 6)).astype(np.float32)
    folded = byoc.frontend.to_proto(model)
    np.testing.assert_allclose(run_onnxruntime(folded, {"x": x})[0], run_onnxruntime(proto, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_bn_not_folded_when_conv_output_has_another_consumer():
    rng = np.random.default_rng(2)
    inits = [nh.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "W")] + _bn_inits(rng, 4)
    nodes = [
        h.make_node("Conv", ["x", "W"], ["c"], name="conv"),
        h.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"], name="bn"),
        h.make_node("Relu", ["c"], ["z"], name="other"),
    ]
    proto = _model(nodes, [_info("x", [1, 3, 4, 4])], [_info("y", None), _info("z", None)], inits)
    model, changed = _run_only(proto, ["bn_folding"])
    assert changed == []
    assert sorted(_ops(model)) == ["BatchNormalization", "Conv", "Relu"]


_SHAPES = {"channel": (4, 1, 1), "channel4": (1, 4, 1, 1), "scalar": (), "one": (1,), "spatial": (1, 1, 6, 6),
           "full": (2, 4, 6, 6)}


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["Mul", "Add"]), st.sampled_from(sorted(_SHAPES)), st.booleans()),
                    min_size=1, max_size=3),
       with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_per_channel_mul_and_add_fold_into_the_conv(ops, with_bias, seed):
    # BatchNormalization written out as Mul and Add (the model zoo's Inception v2): a per-channel
    # (or scalar) constant folds into the weights and bias, a spatial one does not; either input order
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")]
    conv_in = ["x", "W"]
    if with_bias:
        inits.append(nh.from_array(rng.standard_normal(4).astype(np.float32), "B"))
        conv_in.append("B")
    nodes = [h.make_node("Conv", conv_in, ["t0"], name="conv", pads=[1, 1, 1, 1])]
    foldable = True
    expected = ["Conv"]
    for i, (op, shape, swap) in enumerate(ops):
        inits.append(nh.from_array(rng.uniform(0.5, 2.0, _SHAPES[shape]).astype(np.float32), f"k{i}"))
        args = [f"k{i}", f"t{i}"] if swap else [f"t{i}", f"k{i}"]
        nodes.append(h.make_node(op, args, [f"t{i + 1}"], name=f"{op.lower()}{i}"))
        foldable = foldable and shape in ("channel", "channel4", "scalar", "one")
        if not foldable:
            expected.append(op)
    nodes.append(h.make_node("Identity", [f"t{len(ops)}"], ["y"], name="out"))
    proto = _model(nodes, [_info("x", [2, 3, 6, 6])], [_info("y", None)], inits)
    model, _ = _run_only(proto, ["bn_folding"])
    assert _ops(model) == expected + ["Identity"]
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    folded = byoc.frontend.to_proto(model)
    np.testing.assert_allclose(run_onnxruntime(folded, {"x": x})[0], run_onnxruntime(proto, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def test_mul_not_folded_into_a_conv_with_another_consumer_or_variable_weights():
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "W"),
             nh.from_array(np.full((4, 1, 1), 2.0, np.float32), "s")]
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], name="conv"), h.make_node("Mul", ["c", "s"], ["y"], name="mul"),
             h.make_node("Relu", ["c"], ["z"], name="other")]
    proto = _model(nodes, [_info("x", [1, 3, 4, 4])], [_info("y", None), _info("z", None)], inits)
    model, changed = _run_only(proto, ["bn_folding"])
    assert changed == [] and sorted(_ops(model)) == ["Conv", "Mul", "Relu"]
    # the weights are a graph input: a feed may change them, so nothing is folded
    nodes = [h.make_node("Conv", ["x", "Wv"], ["c"], name="conv"), h.make_node("Mul", ["c", "s"], ["y"], name="mul")]
    proto = _model(nodes, [_info("x", [1, 3, 4, 4]), _info("Wv", [4, 3, 1, 1])], [_info("y", None)], inits[1:])
    model, changed = _run_only(proto, ["bn_folding"])
    assert changed == [] and _ops(model) == ["Conv", "Mul"]


def test_passes_can_be_switched_off_and_unknown_names_are_refused():
    nodes = [h.make_node("Identity", ["x"], ["i"], name="id"), h.make_node("Relu", ["i"], ["y"], name="relu")]
    proto = _model(nodes, [_info("x", [4])], [_info("y", [4])])
    model, changed = _run_only(proto, [])
    assert changed == [] and _ops(model) == ["Identity", "Relu"]
    compiled = byoc.compile(proto, targets=[], passes=[])
    assert compiled.run({"x": np.ones(4, np.float32)})["y"].tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="unknown pass"):
        byoc.compile(proto, targets=[], passes=["no_such_pass"])
    assert set(DEFAULT_PASSES) >= {"constant_folding", "cse", "dead_code", "bn_folding", "identity_removal"}



def test_ceil_mode_pool_shapes_follow_the_operator_not_onnx_inference():
    """ONNX shape inference keeps a ceil_mode window that starts in the trailing padding; the
    operator (onnxruntime, byoc's kernels) drops it. The declared shapes must say what runs, and
    values computed from the pool lose their (wrongly inferred) static dims."""
    pool = h.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 1], strides=[3, 1], pads=[0, 0, 1, 0],
                       ceil_mode=1, name="pool")
    relu = h.make_node("Relu", ["p"], ["y"], name="relu")
    graph = h.make_graph([pool, relu], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, 3, 1])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(model)
    assert [d.dim_value for d in inferred.graph.value_info[0].type.tensor_type.shape.dim] == [1, 1, 2, 1]  # the trap

    ir_model = load_model(model)
    run_passes(ir_model, ["shape_inference"])
    pool_out = next(n for n in ir_model.graph if n.name == "pool").outputs[0]
    relu_out = next(n for n in ir_model.graph if n.name == "relu").outputs[0]
    assert list(pool_out.shape) == [1, 1, 1, 1]
    assert relu_out.shape is None or not any(isinstance(d, int) for d in relu_out.shape)

    x = np.arange(3, dtype=np.float32).reshape(1, 1, 3, 1)
    for targets in ([], None):
        got = byoc.compile(model, targets=targets).run({"x": x})["y"]
        np.testing.assert_array_equal(got, run_onnxruntime(model, {"x": x})[0])


def test_shapes_are_inferred_again_after_folding():
    # BERT's position ids: a Slice of a large table up to Shape(ids)[1]; once input_shapes fixes the
    # dims and folding makes the slice a constant, what follows it gets its static shape too
    from byoc.budget import DEFAULT_BUDGET
    from byoc.frontend.shapes import fix_input_shapes

    emb = nh.from_array(np.random.default_rng(0).standard_normal((512, 8)).astype(np.float32), "emb")
    table = nh.from_array(np.arange(512, dtype=np.int64).reshape(1, 512), "table")
    nodes = [h.make_node("Shape", ["ids"], ["s"]), h.make_node("Gather", ["s", "one"], ["n"], axis=0),
             h.make_node("Slice", ["table", "zero", "n", "one"], ["pos"]),
             h.make_node("Gather", ["emb", "ids"], ["a"]), h.make_node("Gather", ["emb", "pos"], ["b"]),
             h.make_node("Add", ["a", "b"], ["y"], name="add")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", T.INT64, ["B", "S"])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [emb, table, nh.from_array(np.array([1], np.int64), "one"),
                          nh.from_array(np.array([0], np.int64), "zero")])
    model = load_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    fix_input_shapes(model, {"ids": [1, 16]}, DEFAULT_BUDGET)
    run_passes(model)
    add = next(n for n in model.graph if n.name == "add")
    assert list(add.outputs[0].shape) == [1, 16, 8]
