"""Exporter quirks onnxruntime tolerates (-1 dims, empty dim_param, unknown dims or rank) and
fixing input shapes (``input_shapes=``); hostile dimensions still refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.errors import ModelValidationError, OptionError, ResourceLimitError
from byoc.frontend.shapes import parse_shape_args
from byoc.testing.oracle import run_onnxruntime


def _vi(name, dims):
    vi = h.make_tensor_value_info(name, T.FLOAT, None)
    if dims is None:
        return vi  # unknown rank
    shape = vi.type.tensor_type.shape
    shape.SetInParent()
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        elif d is not None:
            dim.dim_value = d  # no range check: -1 and worse go through, as exporters write them
    return vi


def _model(in_dims, out_dims=None, value_info_dims=None) -> onnx.ModelProto:
    w = nh.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"], name="mm"), h.make_node("Relu", ["m"], ["y"], name="relu")]
    graph = h.make_graph(nodes, "g", [_vi("x", in_dims)], [_vi("y", out_dims)], [w])
    if value_info_dims is not None:
        graph.value_info.append(_vi("m", value_info_dims))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


QUIRKS = {
    "minus_one": dict(in_dims=[-1, 4]),
    "minus_one_everywhere": dict(in_dims=[-1, -1], out_dims=[-1, 3], value_info_dims=[-1, -1]),
    "empty_dim_param": dict(in_dims=["", 4], out_dims=["", 3]),
    "neither_value_nor_param": dict(in_dims=[None, 4]),
    "unknown_rank": dict(in_dims=None, out_dims=None),
    "named": dict(in_dims=["batch", 4], out_dims=["batch", -1]),
}


@pytest.mark.parametrize("quirk", sorted(QUIRKS))
def test_exporter_dims_run_like_onnxruntime(quirk):
    model = _model(**QUIRKS[quirk])
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)}
    want = run_onnxruntime(model, feeds)[0]
    compiled = byoc.compile(model, targets=[])
    np.testing.assert_allclose(compiled.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
    # another batch size through the same compiled model
    feeds2 = {"x": np.ones((2, 4), np.float32)}
    np.testing.assert_allclose(compiled.run(feeds2)["y"], run_onnxruntime(model, feeds2)[0], rtol=1e-5)


def test_minus_one_becomes_an_unknown_dimension():
    compiled = byoc.compile(_model([-1, 4]), targets=[])
    (x,) = compiled.model.graph.inputs
    assert x.shape[1] == 4 and not isinstance(x.shape[0], int)


@pytest.mark.parametrize("dims, error, match", [
    ([-5, 4], ModelValidationError, r"graph input 'x'.*negative dimension -5"),
    ([-2, 4], ModelValidationError, r"graph input 'x'.*negative dimension -2"),
    ([2**62, 4], ResourceLimitError, r"graph input 'x'.*declared shape \[4611686018427387904, 4\].*max_tensor_bytes"),
    ([-(2**63), 4], ModelValidationError, r"graph input 'x'.*negative dimension"),
])
def test_hostile_dims_still_refused(dims, error, match):
    with pytest.raises(error, match=match):
        byoc.compile(_model(dims), targets=[])


def test_hostile_dims_in_outputs_and_value_info_refused():
    with pytest.raises(ModelValidationError, match="graph output 'y'.*negative dimension -7"):
        byoc.compile(_model([-1, 4], out_dims=[-7, 3]), targets=[])
    with pytest.raises(ModelValidationError, match="value_info 'm'.*negative dimension -3"):
        byoc.compile(_model([-1, 4], value_info_dims=[-3, 3]), targets=[])


# -- input_shapes= -----------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [{"x": [3, 4]}, {"batch": 3}, {"x": [3, -1]}])
def test_input_shapes_fix_the_declared_shape(shapes):
    compiled = byoc.compile(_model(["batch", 4], ["batch", 3]), targets=[], input_shapes=shapes)
    (x,) = compiled.model.graph.inputs
    assert list(x.shape) == [3, 4]
    out = compiled.run({"x": np.ones((3, 4), np.float32)})["y"]
    assert out.shape == (3, 3)
    with pytest.raises(byoc.InputError, match="'x'"):
        compiled.run({"x": np.ones((2, 4), np.float32)})


def test_input_shapes_on_minus_one_and_unknown_rank():
    for dims in ([-1, 4], None):
        compiled = byoc.compile(_model(dims), targets=[], input_shapes={"x": [2, 4]})
        assert list(compiled.model.graph.inputs[0].shape) == [2, 4]


@pytest.mark.parametrize("shapes, match", [
    ({"z": [1]}, r"'z' is neither a graph input nor a symbolic dimension.*inputs: \['x'\].*\['batch'\]"),
    ({"x": [1, 4, 1]}, r"rank 3 .* declared with rank 2"),
    ({"x": [2, 5]}, r"dimension 1 is 5, but input 'x' declares it as 4"),
    ({"batch": -3}, r"must be >= 0"),
    ({"x": [-4, 4]}, r"must be >= 0"),
    ({"x": "2,4"}, r"must be a list of ints"),
    ({"batch": 1.5}, r"must be an integer"),
    ({"batch": True}, r"must be an integer"),
    ({"w": [4, 3]}, r"'w' is neither"),  # an initializer is not an input to fix
])
def test_bad_input_shapes_name_the_problem(shapes, match):
    with pytest.raises(OptionError, match=match):
        byoc.compile(_model(["batch", 4]), targets=[], input_shapes=shapes)


def test_input_shapes_over_budget():
    with pytest.raises(ResourceLimitError, match="input_shapes: input 'x'"):
        byoc.compile(_model(["batch", 4]), targets=[], input_shapes={"batch": 2**40},
                     budget=byoc.Budget(max_tensor_bytes=1 << 20))


def test_parse_shape_args():
    assert parse_shape_args(None) is None
    assert parse_shape_args(["x=1,3,224,224", "batch=1", "y=2x3"]) == {"x": [1, 3, 224, 224], "batch": 1, "y": [2, 3]}
    assert parse_shape_args(["a=b=1"]) == {"a=b": 1}
    for bad in ["x", "=1", "x=", "x=1,a", "x=1.5"]:
        with pytest.raises(OptionError, match="--shape"):
            parse_shape_args([bad])
    with pytest.raises(OptionError, match="given twice"):
        parse_shape_args(["x=1", "x=2"])


@pytest.mark.parametrize("quirk", sorted(QUIRKS))
def test_exporter_dims_roundtrip_through_a_bundle(quirk):
    """Found by the exporter corpus (TorchScript transformer encoder on cpu): a graph input or
    output of unknown rank passed the frontend (which relaxes that one checker rule) and
    ``save``, then the bundle loader's checker refused it. Both paths now check alike."""
    from byoc.testing.roundtrip import assert_roundtrip

    feeds = {"x": np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)}
    assert_roundtrip(_model(**QUIRKS[quirk]), feeds, [], quirk)


@pytest.mark.parametrize("placeholder", ["?", "unk__3", "-1", "None", " "])
def test_anonymous_dim_params_are_independent_unknowns(placeholder):
    # PaddlePaddle writes every unknown dimension as "?": [-1, 3, "?", "?"] takes a 48x192 image
    from onnx import TensorProto, helper, numpy_helper

    from byoc.testing.oracle import run_onnxruntime

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("GlobalAveragePool", ["c"], ["y"])], "cls",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, placeholder, placeholder])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, 1, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(1).standard_normal((2, 3, 48, 192)).astype(np.float32)
    got = byoc.compile(model, targets=[], host="reference").run({"x": x})["y"]
    np.testing.assert_allclose(got, run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_named_dims_that_match_are_still_checked():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    cm = byoc.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), targets=[])
    with pytest.raises(byoc.InputError, match="dimension 'n' is 3 here but 2 in another input"):
        cm.run({"a": np.ones(2, np.float32), "b": np.ones(3, np.float32)})
