"""The ONNX frontend: every kind of bad input gets one clear byoc error naming where it is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc import (
    Budget,
    ByocError,
    ExternalDataError,
    ModelLoadError,
    ModelValidationError,
    ResourceLimitError,
    UnsupportedOperatorError,
)
from byoc.frontend import CANONICAL_OPSET, bounded, load_model
from byoc.frontend.loader import ModelConversionWarning

# --------------------------------------------------------------------------------------------
# model builders


def _vi(name, shape, dtype=T.FLOAT):
    return h.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=CANONICAL_OPSET, extra_opsets=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [h.make_opsetid("", opset)] + [h.make_opsetid(d, v) for d, v in extra_opsets]
    return h.make_model(graph, opset_imports=opsets)


def _relu(opset=CANONICAL_OPSET):
    return _model([h.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", [2, 3])], [_vi("y", [2, 3])],
                  opset=opset)


def _conv(opset=CANONICAL_OPSET):
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    b = nh.from_array(rng.standard_normal(4).astype(np.float32), "B")
    k = nh.from_array(np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1), "k")
    nodes = [
        h.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Constant", [], ["kc"], name="kconst", value=k),
        h.make_node("Add", ["c", "kc"], ["y"], name="add"),
    ]
    return _model(nodes, [_vi("x", [1, 3, 5, 5])], [_vi("y", [1, 4, 5, 5])], [w, b], opset=opset)


def _if_model(then_nodes, then_out, else_nodes=None, else_out=None, outer=()):
    """A main graph with one If whose branches may read the outer value ``x``."""
    then_g = h.make_graph(then_nodes, "then", [], [_vi(then_out, [2])])
    else_nodes = else_nodes or [h.make_node("Identity", ["x"], ["e"], name="eid")]
    else_g = h.make_graph(else_nodes, "else", [], [_vi(else_out or "e", [2])])
    nodes = [*outer, h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    return _model(nodes, [_vi("x", [2]), _vi("cond", [], T.BOOL)], [_vi("y", [2])])


def _load(model, **kw):
    kw.setdefault("require_kernels", False)
    return load_model(model, **kw)


# --------------------------------------------------------------------------------------------
# accepted inputs, conversion, the checker


def test_accepts_path_bytes_proto_and_ir(tmp_path):
    proto = _conv()
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, path)
    data = proto.SerializeToString()
    for given in (path, str(path), data, bytearray(data), memoryview(data), proto, ir.from_proto(proto)):
        model = _load(given)
        assert isinstance(model, ir.Model)
        assert [n.op_type for n in model.graph] == ["Conv", "Constant", "Add"]
        np.testing.assert_array_equal(model.graph.initializers["W"].const_value.numpy(), nh.to_array(proto.graph.initializer[0]))


def test_unsupported_input_type():
    with pytest.raises(ModelLoadError, match="int"):
        _load(42)


def test_old_opset_is_converted_to_the_canonical_one():
    model = _load(_relu(opset=9))
    assert model.opset_imports[""] == CANONICAL_OPSET


def test_opset_at_or_above_canonical_is_kept():
    assert _load(_relu(opset=23)).opset_imports[""] == 23


def test_clip_attributes_become_inputs_when_converting():
    nodes = [h.make_node("Clip", ["x"], ["y"], name="clip", min=-1.0, max=1.0)]
    model = _load(_model(nodes, [_vi("x", [3])], [_vi("y", [3])], opset=6))
    clip = next(n for n in model.graph if n.op_type == "Clip")
    assert len(clip.inputs) == 3 and not clip.attributes


def test_version_converter_failure_is_a_warning(monkeypatch):
    monkeypatch.setattr(bounded, "FORKS", False)  # the replaced converter runs in this process

    def boom(*a, **k):
        raise RuntimeError("no adapter")

    monkeypatch.setattr(onnx.version_converter, "convert_version", boom)
    with pytest.warns(ModelConversionWarning, match="no adapter"):
        model = _load(_relu(opset=11))
    assert model.opset_imports[""] == 11


def test_converter_output_failing_the_structural_checks_is_a_warning(monkeypatch):
    # the ONNX checker runs once, before the converter; its output gets byoc's own checks
    monkeypatch.setattr(bounded, "FORKS", False)  # the replaced converter runs in this process

    def broken(proto, version):
        out = onnx.ModelProto()
        out.CopyFrom(proto)
        out.opset_import[0].version = version
        out.graph.node[0].input.append("nowhere")
        return out

    monkeypatch.setattr(onnx.version_converter, "convert_version", broken)
    with pytest.warns(ModelConversionWarning, match="converted model is invalid.*nowhere"):
        model = _load(_relu(opset=11))
    assert model.opset_imports[""] == 11


def test_the_checker_runs_once(monkeypatch):
    monkeypatch.setattr(bounded, "FORKS", False)  # count the calls in this process
    calls = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert _load(_relu(opset=9)).opset_imports[""] == CANONICAL_OPSET
    assert len(calls) == 1


def test_checker_failure_is_model_validation_error():
    node = h.make_node("Relu", ["x"], ["y"], name="relu", bogus=3)
    with pytest.raises(ModelValidationError, match="checker.*bogus"):
        _load(_model([node], [_vi("x", [2])], [_vi("y", [2])]))


def test_checker_failure_on_wrong_input_count():
    node = h.make_node("Relu", ["x", "x"], ["y"], name="relu")
    with pytest.raises(ModelValidationError, match="checker"):
        _load(_model([node], [_vi("x", [2])], [_vi("y", [2])]))


def test_checker_skipped_with_check_false():
    node = h.make_node("Relu", ["x"], ["y"], name="relu", bogus=3)
    _load(_model([node], [_vi("x", [2])], [_vi("y", [2])]), check=False)


def test_check_false_never_feeds_a_rejected_model_to_the_converter():
    node = h.make_node("Relu", ["x"], ["y"], name="relu", bogus=3)
    with pytest.warns(ModelConversionWarning, match="not converting"):
        model = _load(_model([node], [_vi("x", [2])], [_vi("y", [2])], opset=9), check=False)
    assert model.opset_imports[""] == 9


def test_outputs_of_unknown_rank_are_accepted():
    model = _load(_model([h.make_node("Relu", ["x"], ["y"])], [_vi("x", None)], [_vi("y", None)]))
    assert [v.name for v in model.graph.outputs] == ["y"]


def test_given_model_proto_is_not_modified():
    nodes = [h.make_node("Relu", ["a"], ["y"], name="second"), h.make_node("Relu", ["x"], ["a"], name="first")]
    proto = _model(nodes, [_vi("x", [2])], [_vi("y", [2])], opset=13)
    before = proto.SerializeToString()
    model = _load(proto)
    assert [n.name for n in model.graph] == ["first", "second"]  # sorted
    assert proto.SerializeToString() == before


def test_attribute_type_mismatch_is_refused_even_without_the_checker():
    # onnx's C++ version converter dereferences the wrong field here and crashes the process
    node = h.make_node("Unsqueeze", ["x"], ["y"], name="unsq", axes=[0])
    node.attribute[0].type = onnx.AttributeProto.TYPE_PROTO
    proto = _model([node], [_vi("x", [3])], [_vi("y", [1, 3])], opset=11)
    for check in (True, False):
        with pytest.raises(ModelValidationError, match=r"attribute 'axes' of node 'unsq'.*TYPE_PROTO.*ints"):
            _load(proto, check=check)


def test_converter_crash_input_stays_in_process(tmp_path):
    """The input that segfaults onnx.version_converter gets a byoc error, and the process lives."""
    node = h.make_node("Unsqueeze", ["x"], ["y"], name="unsq", axes=[0])
    node.attribute[0].type = onnx.AttributeProto.TYPE_PROTO
    path = tmp_path / "crash.onnx"
    path.write_bytes(_model([node], [_vi("x", [3])], [_vi("y", [1, 3])], opset=11).SerializeToString())
    code = textwrap.dedent(f"""
        import byoc
        from byoc.frontend import load_model
        try:
            load_model({str(path)!r}, check=False, require_kernels=False)
        except byoc.ByocError as exc:
            print(type(exc).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ModelValidationError"


def test_attribute_reference_outside_a_function():
    node = h.make_node("Relu", ["x"], ["y"], name="relu")
    attr = node.attribute.add()
    attr.name, attr.ref_attr_name, attr.type = "alpha", "outer_alpha", onnx.AttributeProto.FLOAT
    with pytest.raises(ModelValidationError, match="'alpha' of node 'relu'.*outer_alpha"):
        _load(_model([node], [_vi("x", [2])], [_vi("y", [2])]), check=False)


# --------------------------------------------------------------------------------------------
# unreadable files and bytes


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        _load(tmp_path / "nope.onnx")


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        _load(tmp_path)


def test_empty_file(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        _load(tmp_path / "e.onnx")
    with pytest.raises(ModelLoadError, match="empty"):
        _load(b"")


@pytest.mark.parametrize("cut", [1, 7, 0.5, -1, -5])
def test_truncated_file(tmp_path, cut):
    data = _conv().SerializeToString()
    n = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    (tmp_path / "t.onnx").write_bytes(data[:n])
    with pytest.raises(ModelLoadError, match=r"t\.onnx"):
        _load(tmp_path / "t.onnx")


def test_garbage_bytes():
    with pytest.raises(ModelLoadError, match="not a readable ONNX protobuf"):
        _load(b"\xff" * 64)


def test_protobuf_without_graph():
    with pytest.raises(ModelLoadError, match="no graph"):
        _load(h.make_opsetid("", 21).SerializeToString())  # parses as a ModelProto with no graph


def test_nul_byte_in_path():
    with pytest.raises(ModelLoadError, match="NUL"):
        _load("model\x00.onnx")


def test_fifo_is_not_read(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    os.mkfifo(tmp_path / "pipe.onnx")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        _load(tmp_path / "pipe.onnx")


# --------------------------------------------------------------------------------------------
# invalid UTF-8


def _with_bad_utf8(proto, marker: str) -> bytes:
    data = proto.SerializeToString()
    assert marker.encode() in data
    bad = b"\xff\xfe" + marker.encode()[2:]  # same length, so the protobuf framing stays valid
    return data.replace(marker.encode(), bad)


def test_invalid_utf8_in_node_name():
    proto = _model([h.make_node("Relu", ["x"], ["y"], name="NODENAME")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ModelLoadError, match=r"graph<'g'>\.node\[0\]<Relu>\.name is not valid UTF-8"):
        _load(_with_bad_utf8(proto, "NODENAME"))


def test_invalid_utf8_in_tensor_name():
    w = nh.from_array(np.ones(2, np.float32), "WEIGHTNAME")
    nodes = [h.make_node("Add", ["x", "WEIGHTNAME"], ["y"], name="add")]
    proto = _model(nodes, [_vi("x", [2])], [_vi("y", [2])], [w])
    with pytest.raises(ModelLoadError, match=r"not valid UTF-8") as info:
        _load(_with_bad_utf8(proto, "WEIGHTNAME"))
    assert "node[0]<Add 'add'>.input[1]" in str(info.value) or "initializer[0]" in str(info.value)


def test_invalid_utf8_in_subgraph_value_name():
    proto = _if_model([h.make_node("Neg", ["x"], ["THENOUT"], name="neg")], "THENOUT")
    with pytest.raises(ModelLoadError, match=r"node\[0\]<If 'if'>\.attribute\[\d\].*not valid UTF-8"):
        _load(_with_bad_utf8(proto, "THENOUT"))


def test_invalid_utf8_in_bytes_input_names_the_origin(tmp_path):
    proto = _model([h.make_node("Relu", ["x"], ["y"], name="NODENAME")], [_vi("x", [2])], [_vi("y", [2])])
    path = tmp_path / "bad.onnx"
    path.write_bytes(_with_bad_utf8(proto, "NODENAME"))
    with pytest.raises(ModelLoadError, match=r"bad\.onnx.*UTF-8"):
        _load(path)


# --------------------------------------------------------------------------------------------
# graph structure: cycles, dangling values, duplicate names


def test_cycle_names_the_nodes():
    nodes = [
        h.make_node("Relu", ["x"], ["a"], name="start"),
        h.make_node("Add", ["a", "c"], ["b"], name="add"),
        h.make_node("Relu", ["b"], ["c"], name="back"),
        h.make_node("Relu", ["b"], ["y"], name="out"),
    ]
    with pytest.raises(ModelValidationError, match="cycle") as info:
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    msg = str(info.value)
    assert "'add'" in msg and "'back'" in msg and "'start'" not in msg


def test_self_loop():
    nodes = [h.make_node("Add", ["x", "y"], ["y"], name="selfish")]
    with pytest.raises(ModelValidationError, match="cycle.*'selfish'"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_cycle_through_a_subgraph_implicit_input():
    # the If's branch reads 'z', which is computed from the If's own output
    then_nodes = [h.make_node("Identity", ["z"], ["t"], name="tid")]
    outer = [h.make_node("Relu", ["y"], ["z"], name="after")]
    with pytest.raises(ModelValidationError, match="cycle.*'if'.*'after'|cycle.*'after'.*'if'"):
        _load(_if_model(then_nodes, "t", outer=outer), check=False)


def test_unsorted_nodes_are_sorted():
    nodes = [h.make_node("Relu", ["a"], ["y"], name="second"), h.make_node("Relu", ["x"], ["a"], name="first")]
    model = _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    assert [n.name for n in model.graph] == ["first", "second"]


def test_subgraph_nodes_are_sorted_and_may_read_outer_values():
    then_nodes = [h.make_node("Neg", ["m"], ["t"], name="t2"), h.make_node("Relu", ["x"], ["m"], name="t1")]
    model = _load(_if_model(then_nodes, "t"))
    then = next(iter(model.graph)).attributes["then_branch"].value
    assert [n.name for n in then] == ["t1", "t2"]


def test_dangling_input_names_node_and_value():
    nodes = [h.make_node("Add", ["x", "ghost"], ["a"], name="add"), h.make_node("Relu", ["phantom"], ["y"], name="r")]
    with pytest.raises(ModelValidationError) as info:
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    msg = str(info.value)
    assert "2 node input(s)" in msg
    assert "node 'add' (Add) reads 'ghost'" in msg and "node 'r' (Relu) reads 'phantom'" in msg


def test_dangling_input_in_subgraph():
    with pytest.raises(ModelValidationError, match=r"subgraph 'then_branch' of node 'if'.*node 'neg' \(Neg\) reads 'nowhere'"):
        _load(_if_model([h.make_node("Neg", ["nowhere"], ["t"], name="neg")], "t"))


def test_duplicate_output_names():
    nodes = [h.make_node("Relu", ["x"], ["y"], name="one"), h.make_node("Neg", ["x"], ["y"], name="two")]
    with pytest.raises(ModelValidationError, match="'y' is produced twice.*'one'.*'two'"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_node_overwriting_a_graph_input():
    nodes = [h.make_node("Relu", ["x"], ["x"], name="inplace"), h.make_node("Relu", ["x"], ["y"], name="r")]
    with pytest.raises(ModelValidationError, match="'inplace'.*writes 'x'.*graph input"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_duplicate_initializers():
    w = nh.from_array(np.ones(2, np.float32), "w")
    nodes = [h.make_node("Add", ["x", "w"], ["y"], name="add")]
    with pytest.raises(ModelValidationError, match="initializer 'w' is defined twice"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])], [w, w]))


def test_graph_output_not_produced():
    nodes = [h.make_node("Relu", ["x"], ["a"], name="r")]
    with pytest.raises(ModelValidationError, match="graph output 'y'.*not produced"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_duplicate_graph_output():
    nodes = [h.make_node("Relu", ["x"], ["y"], name="r")]
    with pytest.raises(ModelValidationError, match="graph output 'y' is listed twice"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", [2]), _vi("y", [2])]))


def test_negative_dimension_in_declared_input_shape():
    with pytest.raises(ModelValidationError, match="graph input 'x'.*negative dimension -3"):
        _load(_model([h.make_node("Relu", ["x"], ["y"])], [_vi("x", [-3])], [_vi("y", None)]))


# --------------------------------------------------------------------------------------------
# budgets


def _huge_tensor(name, dims, dtype=T.FLOAT):
    """A tensor that declares ``dims`` but carries only 4 bytes: no real data is ever made."""
    t = T()
    t.name, t.data_type = name, dtype
    t.dims.extend(dims)
    t.raw_data = b"\0\0\0\0"
    return t


def test_initializer_over_budget_is_refused_before_its_data_is_looked_at():
    w = _huge_tensor("W", [1 << 20, 1 << 20])  # declares 4 TiB
    nodes = [h.make_node("Add", ["x", "W"], ["y"], name="add")]
    with pytest.raises(ResourceLimitError, match=r"initializer 'W'.*4\.0 TiB.*max_tensor_bytes"):
        _load(_model(nodes, [_vi("x", [2])], [_vi("y", None)], [w]))


def test_configurable_tensor_budget():
    w = nh.from_array(np.zeros((100, 100), np.float32), "W")  # 40 000 bytes of real data
    proto = _model([h.make_node("Add", ["x", "W"], ["y"], name="add")], [_vi("x", [100])], [_vi("y", [100, 100])], [w])
    _load(proto)
    _load(proto, budget=Budget(max_tensor_bytes=40_000))
    with pytest.raises(ResourceLimitError, match="initializer 'W'.*shape \\[100, 100\\] of FLOAT"):
        _load(proto, budget=Budget(max_tensor_bytes=39_999))


def test_budget_reaches_byoc_compile():
    w = _huge_tensor("W", [1 << 16, 1 << 16])
    proto = _model([h.make_node("Add", ["x", "W"], ["y"], name="add")], [_vi("x", [2])], [_vi("y", None)], [w])
    with pytest.raises(ResourceLimitError, match="initializer 'W'"):
        byoc.compile(proto, targets=[])
    small = nh.from_array(np.zeros(1000, np.float32), "W")
    proto = _model([h.make_node("Add", ["x", "W"], ["y"], name="add")], [_vi("x", [1000])], [_vi("y", [1000])], [small])
    with pytest.raises(ResourceLimitError, match="initializer 'W'"):
        byoc.compile(proto, targets=[], budget=Budget(max_tensor_bytes=100))


def test_constant_node_tensor_over_budget():
    node = h.make_node("Constant", [], ["y"], name="bigconst", value=_huge_tensor("", [1 << 40]))
    with pytest.raises(ResourceLimitError, match=r"tensor attribute 'value' of node 'bigconst' \(Constant\)"):
        _load(_model([node], [], [_vi("y", None)]))


def test_constant_of_shape_value_attribute_over_budget():
    node = h.make_node("ConstantOfShape", ["s"], ["y"], name="cos", value=_huge_tensor("", [1 << 40]))
    with pytest.raises(ResourceLimitError, match="attribute 'value' of node 'cos'"):
        _load(_model([node], [_vi("s", [1], T.INT64)], [_vi("y", None)]))


def test_tensor_inside_a_subgraph_over_budget():
    then_nodes = [h.make_node("Constant", [], ["t"], name="deep", value=_huge_tensor("", [1 << 40]))]
    with pytest.raises(ResourceLimitError, match="node 'deep'.*in subgraph 'then_branch' of node 'if'"):
        _load(_if_model(then_nodes, "t"))


def test_sparse_initializer_budgets_its_dense_size():
    values = nh.from_array(np.ones(1, np.float32), "sp")
    indices = nh.from_array(np.zeros(1, np.int64), "sp_idx")
    sparse = h.make_sparse_tensor(values, indices, [1 << 40])
    proto = _model([h.make_node("Add", ["x", "sp"], ["y"], name="add")], [_vi("x", [1])], [_vi("y", None)])
    proto.graph.sparse_initializer.append(sparse)
    with pytest.raises(ResourceLimitError, match="sparse initializer 'sp'"):
        _load(proto)


def test_total_bytes_budget():
    inits = [nh.from_array(np.zeros(100, np.float32), f"w{i}") for i in range(3)]
    nodes = [h.make_node("Sum", ["x", "w0", "w1", "w2"], ["y"], name="sum")]
    proto = _model(nodes, [_vi("x", [100])], [_vi("y", [100])], inits)
    _load(proto, budget=Budget(max_total_bytes=1200))
    with pytest.raises(ResourceLimitError, match="max_total_bytes"):
        _load(proto, budget=Budget(max_total_bytes=1199))


def test_node_count_budget_counts_subgraphs():
    proto = _if_model([h.make_node("Neg", ["x"], ["a"]), h.make_node("Neg", ["a"], ["t"])], "t")
    _load(proto, budget=Budget(max_nodes=4))  # If + 2 + 1
    with pytest.raises(ResourceLimitError, match="max_nodes=3"):
        _load(proto, budget=Budget(max_nodes=3))


def _nested_ifs(depth: int):
    body = h.make_graph([h.make_node("Identity", ["x"], ["o0"], name="leaf")], "b0", [], [_vi("o0", [2])])
    for level in range(1, depth + 1):
        node = h.make_node("If", ["cond"], [f"o{level}"], name=f"if{level}", then_branch=body, else_branch=body)
        body = h.make_graph([node], f"b{level}", [], [_vi(f"o{level}", [2])])
    return _model(list(body.node), [_vi("x", [2]), _vi("cond", [], T.BOOL)], [_vi(f"o{depth}", [2])])


def test_nesting_budget():
    proto = _nested_ifs(5)  # the leaf graph is 5 levels below the main graph
    _load(proto, budget=Budget(max_nesting=5))
    with pytest.raises(ResourceLimitError, match=r"nested 5 levels deep.*max_nesting=4"):
        _load(proto, budget=Budget(max_nesting=4))


# --------------------------------------------------------------------------------------------
# tensor payloads that do not match dims/dtype


def test_raw_data_length_mismatch_names_the_tensor():
    w = nh.from_array(np.ones((2, 3), np.float32), "W")
    w.raw_data = w.raw_data[:-4]
    with pytest.raises(ModelValidationError, match=r"initializer 'W': raw_data holds 20 bytes.*\[2, 3\].*24 bytes"):
        _load(_model([h.make_node("Add", ["x", "W"], ["y"], name="a")], [_vi("x", [3])], [_vi("y", [2, 3])], [w]))


def test_raw_data_length_mismatch_in_constant_attribute():
    t = nh.from_array(np.ones(4, np.int64))
    t.raw_data += b"\0"
    node = h.make_node("Constant", [], ["y"], name="c", value=t)
    with pytest.raises(ModelValidationError, match="attribute 'value' of node 'c'.*raw_data holds 33 bytes"):
        _load(_model([node], [], [_vi("y", [4], T.INT64)]))


def test_packed_int4_raw_data_size():
    t = T()
    t.name, t.data_type = "q", T.INT4
    t.dims.extend([3])
    t.raw_data = b"\x12\x03"  # 3 four-bit values fit in 2 bytes
    node = h.make_node("Constant", [], ["y"], name="c", value=t)
    _load(_model([node], [], [_vi("y", [3], T.INT4)]))
    t.raw_data = b"\x12"
    node = h.make_node("Constant", [], ["y"], name="c", value=t)
    with pytest.raises(ModelValidationError, match="raw_data holds 1 bytes.*INT4 needs 2"):
        _load(_model([node], [], [_vi("y", [3], T.INT4)]))


def test_typed_field_count_mismatch():
    w = h.make_tensor("W", T.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    del w.float_data[-1]
    with pytest.raises(ModelValidationError, match="initializer 'W': float_data holds 3 value.*needs 4"):
        _load(_model([h.make_node("Add", ["x", "W"], ["y"], name="a")], [_vi("x", [2])], [_vi("y", [2, 2])], [w]))


def test_values_in_the_wrong_field():
    w = h.make_tensor("W", T.FLOAT, [2], [1, 2])
    w.ClearField("float_data")
    w.int64_data.extend([1, 2])
    with pytest.raises(ModelValidationError, match="FLOAT values must be stored in float_data or raw_data"):
        _load(_model([h.make_node("Add", ["x", "W"], ["y"], name="a")], [_vi("x", [2])], [_vi("y", [2])], [w]))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.dims.append(-2), "negative dimension"),
        (lambda t: setattr(t, "data_type", 0), "UNDEFINED"),
        (lambda t: setattr(t, "data_type", 99), "unknown element type 99"),
        (lambda t: t.ClearField("raw_data"), "holds no data"),
        (lambda t: t.float_data.extend([1.0, 2.0]), "several fields"),
    ],
)
def test_malformed_tensors(mutate, message):
    w = nh.from_array(np.ones(2, np.float32), "W")
    mutate(w)
    proto = _model([h.make_node("Add", ["x", "W"], ["y"], name="a")], [_vi("x", [2])], [_vi("y", None)], [w])
    with pytest.raises(ModelValidationError, match=f"initializer 'W'.*{message}"):
        _load(proto)


# --------------------------------------------------------------------------------------------
# unsupported operators


def test_every_unsupported_node_is_listed_once():
    then_nodes = [h.make_node("Frobnicate", ["x"], ["t"], name="deep_unknown")]
    outer = [
        h.make_node("Relu", ["x"], ["r"], name="fine"),
        h.make_node("NotAnOnnxOp", ["r"], ["u1"], name="unknown1"),
        h.make_node("Custom", ["u1"], ["u2"], name="custom", domain="com.example"),
    ]
    proto = _if_model(then_nodes, "t", outer=outer)
    proto.opset_import.append(h.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperatorError) as info:
        load_model(proto)
    err = info.value
    names = {n for n, _, _ in err.nodes}
    assert {"unknown1", "custom", "deep_unknown"} <= names
    assert "fine" not in names
    assert ("custom", "com.example", "Custom") in err.nodes
    msg = str(err)
    assert "NotAnOnnxOp (not an ONNX operator)" in msg and "com.example::Custom" in msg
    assert "node 'deep_unknown' (Frobnicate) in subgraph 'then_branch' of node 'if' (If)" in msg
    assert "supported_ops()" in msg


def test_unsupported_ops_are_allowed_without_require_kernels():
    proto = _model([h.make_node("Custom", ["x"], ["y"], name="c", domain="com.example")], [_vi("x", [2])],
                   [_vi("y", [2])], extra_opsets=[("com.example", 1)])
    model = load_model(proto, require_kernels=False)
    assert next(iter(model.graph)).domain == "com.example"


# --------------------------------------------------------------------------------------------
# external data


def _save_external(model, folder, location="weights.bin", convert_attribute=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())  # onnx.save_model edits its argument
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0, convert_attribute=convert_attribute)
    return path


def _rewrite(path, edit):
    """Change the external data entries of the first external tensor (initializer W)."""
    proto = onnx.load_model(path, load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.name == "W")
    entries = {e.key: e.value for e in tensor.external_data}
    edit(entries)
    tensor.ClearField("external_data")
    for key, value in entries.items():
        e = tensor.external_data.add()
        e.key, e.value = key, value
    path.write_bytes(proto.SerializeToString())
    return path


def test_external_data_is_loaded(tmp_path):
    proto = _conv()
    path = _save_external(proto, tmp_path / "m", location="data/w.bin", convert_attribute=True)
    model = _load(path)
    for t in proto.graph.initializer:
        np.testing.assert_array_equal(model.graph.initializers[t.name].const_value.numpy(), nh.to_array(t))
    const = next(n for n in model.graph if n.op_type == "Constant")
    np.testing.assert_array_equal(const.attributes["value"].value.numpy(),
                                  nh.to_array(proto.graph.node[1].attribute[0].t))


def test_external_data_from_old_opset_model_is_converted(tmp_path):
    path = _save_external(_conv(opset=11), tmp_path)
    model = _load(path)
    assert model.opset_imports[""] == CANONICAL_OPSET
    np.testing.assert_array_equal(model.graph.initializers["B"].const_value.numpy(),
                                  nh.to_array(_conv().graph.initializer[1]))


def test_external_data_via_onnx_ir_model(tmp_path):
    path = _save_external(_conv(), tmp_path)
    model = _load(ir.load(path))
    assert model.graph.initializers["W"].const_value.numpy().shape == (4, 3, 3, 3)


def test_external_data_in_memory_needs_base_dir(tmp_path):
    path = _save_external(_conv(), tmp_path)
    data = path.read_bytes()
    with pytest.raises(ExternalDataError, match="initializer 'W'.*weights.bin.*base_dir="):
        _load(data)
    assert _load(data, base_dir=tmp_path).graph.initializers["W"].const_value.numpy().shape == (4, 3, 3, 3)


def test_external_data_compiles(tmp_path):
    path = _save_external(_conv(), tmp_path)
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 5)).astype(np.float32)
    expected = byoc.compile(_conv(), targets=[]).run({"x": x})["y"]
    np.testing.assert_array_equal(byoc.compile(path, targets=[]).run({"x": x})["y"], expected)


def _outside_file(tmp_path, nbytes=432):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"S" * nbytes)
    return secret


@pytest.mark.parametrize(
    "location, message",
    [
        ("../secret.bin", r"contains '\.\.'"),
        ("data/../../secret.bin", r"contains '\.\.'"),
        ("..\\secret.bin", r"contains '\.\.'"),
        ("ABSOLUTE", "absolute path"),
        ("/etc/passwd", "absolute path"),
        ("C:\\Windows\\win.ini", "absolute path"),
        ("weights.bin\x00.txt", "NUL byte"),
        ("", "no 'location'"),
        ("./", "names no file"),
    ],
)
def test_external_location_escaping_the_folder(tmp_path, location, message):
    secret = _outside_file(tmp_path)
    path = _save_external(_conv(), tmp_path / "m")
    if location == "ABSOLUTE":
        location = str(secret)
    _rewrite(path, lambda e: e.update(location=location))
    with pytest.raises(ExternalDataError, match=f"initializer 'W'.*{message}"):
        _load(path)


def test_external_data_through_a_symbolic_link(tmp_path):
    secret = _outside_file(tmp_path)
    path = _save_external(_conv(), tmp_path / "m")
    os.symlink(secret, tmp_path / "m" / "link.bin")
    _rewrite(path, lambda e: e.update(location="link.bin", offset="0"))
    with pytest.raises(ExternalDataError, match="initializer 'W'.*symbolic link 'link.bin'"):
        _load(path)


def test_external_data_through_a_linked_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"S" * 432)
    path = _save_external(_conv(), tmp_path / "m")
    os.symlink(outside, tmp_path / "m" / "sub")
    _rewrite(path, lambda e: e.update(location="sub/w.bin", offset="0"))
    with pytest.raises(ExternalDataError, match="symbolic link 'sub'"):
        _load(path)


def test_external_data_hard_link(tmp_path):
    secret = _outside_file(tmp_path)
    path = _save_external(_conv(), tmp_path / "m")
    os.link(secret, tmp_path / "m" / "hard.bin")
    _rewrite(path, lambda e: e.update(location="hard.bin", offset="0"))
    with pytest.raises(ExternalDataError, match="initializer 'W'.*'hard.bin' has 2 hard links"):
        _load(path)


def test_external_data_location_is_a_folder(tmp_path):
    path = _save_external(_conv(), tmp_path / "m")
    (tmp_path / "m" / "sub").mkdir()
    _rewrite(path, lambda e: e.update(location="sub"))
    with pytest.raises(ExternalDataError, match="not a regular file"):
        _load(path)


def test_external_data_fifo_is_not_opened(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = _save_external(_conv(), tmp_path / "m")
    os.mkfifo(tmp_path / "m" / "pipe")
    _rewrite(path, lambda e: e.update(location="pipe"))
    with pytest.raises(ExternalDataError, match="not a regular file"):
        _load(path)


def test_external_data_missing_file(tmp_path):
    path = _save_external(_conv(), tmp_path / "m")
    (tmp_path / "m" / "weights.bin").unlink()
    with pytest.raises(ExternalDataError, match="'weights.bin' not found"):
        _load(path)


@pytest.mark.parametrize(
    "edit, error, message",
    [
        (lambda e: e.update(offset="100000"), ExternalDataError, "offset 100000 is beyond the end"),
        (lambda e: e.update(offset="100"), ExternalDataError, "needs bytes 100..532 .* holds only 448 bytes"),
        (lambda e: e.update(length="16"), ExternalDataError, "length is 16 bytes but its shape .* needs 432"),
        (lambda e: e.update(length=str(1 << 40)), ResourceLimitError, "length 1099511627776 .* max_tensor_bytes"),
        (lambda e: e.update(offset="-1"), ExternalDataError, "offset '-1' is not a non-negative integer"),
        (lambda e: e.update(length="12abc"), ExternalDataError, "length '12abc' is not"),
        (lambda e: e.pop("length"), ExternalDataError, "give a 'length' entry"),
    ],
)
def test_external_offset_and_length(tmp_path, edit, error, message):
    path = _save_external(_conv(), tmp_path / "m")
    _rewrite(path, edit)
    with pytest.raises(error, match=f"initializer 'W'.*{message}"):
        _load(path)


def test_external_length_may_be_omitted_when_the_rest_of_the_file_fits(tmp_path):
    proto = _model([h.make_node("Add", ["x", "W"], ["y"], name="a")], [_vi("x", [3])], [_vi("y", [3])],
                   [nh.from_array(np.arange(3, dtype=np.float32), "W")])
    path = _save_external(proto, tmp_path)
    _rewrite(path, lambda e: e.pop("length"))
    np.testing.assert_array_equal(_load(path).graph.initializers["W"].const_value.numpy(), [0, 1, 2])


def test_external_declared_size_over_budget_before_reading(tmp_path):
    path = _save_external(_conv(), tmp_path / "m")
    with pytest.raises(ResourceLimitError, match="initializer 'W'"):
        _load(path, budget=Budget(max_tensor_bytes=400))


def test_failed_external_loads_leave_no_open_files(tmp_path):
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    path = _save_external(_conv(), tmp_path / "m")
    _rewrite(path, lambda e: e.update(offset="100000"))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(ExternalDataError):
            _load(path)
    good = _save_external(_conv(), tmp_path / "ok")
    for _ in range(20):
        _load(good)
    assert len(os.listdir("/proc/self/fd")) <= before


# --------------------------------------------------------------------------------------------
# the frontend side of a tiny model asking for a huge constant


def test_tiny_constant_of_shape_model_loads_without_allocating():
    # ~100 bytes asking for 8 GiB at run/fold time: the frontend must not evaluate it and must not
    # refuse it on declared sizes (they are tiny); byoc.compile's constant folding budgets it
    # (see test_passes.py::test_constant_folding_refuses_huge_constant_of_shape_before_allocating).
    shape = nh.from_array(np.array([2, 1024, 1024, 1024], np.int64), "shape")
    nodes = [h.make_node("ConstantOfShape", ["shape"], ["big"], name="huge")]
    proto = _model(nodes, [], [_vi("big", None)], [shape])
    assert len(proto.SerializeToString()) < 150
    model = _load(proto, budget=Budget(max_tensor_bytes=1 << 20))
    assert [n.op_type for n in model.graph] == ["ConstantOfShape"]


def test_all_errors_share_one_hierarchy():
    for cls in (ModelLoadError, ModelValidationError, ExternalDataError, ResourceLimitError,
                UnsupportedOperatorError):
        assert issubclass(cls, ByocError)
    assert issubclass(ExternalDataError, ModelLoadError)


def test_no_warnings_for_a_clean_model():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _load(_conv())
        _load(_conv(opset=13))


def test_onnxruntime_contrib_operators_are_named_with_what_to_do():
    nodes = [h.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft", name="gelu"),
             h.make_node("SkipLayerNormalization", ["y", "x", "g"], ["z"], domain="com.microsoft", name="sln")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                         [h.make_tensor_value_info("z", T.FLOAT, [2, 4])],
                         [onnx.numpy_helper.from_array(np.ones(4, np.float32), "g")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOperatorError, match="FastGelu, SkipLayerNormalization are onnxruntime's own "
                                                      "operators.*without onnxruntime's optimisation"):
        byoc.compile(model, targets=[])
