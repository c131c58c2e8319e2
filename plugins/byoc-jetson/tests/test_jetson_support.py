"""Operator support: TensorRT's ONNX parser limits, each rejection with its reason."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jetson_helpers import make_model, verdicts
from onnx import TensorProto, helper

import byoc
from byoc.contract import OptionError
from byoc_jetson import support
from byoc_jetson.options import validate_options
from byoc_jetson.support import OPERATORS

FLOAT = TensorProto.FLOAT


def conv_model(x_shape, w_shape, const_w=True, **attrs):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(w_shape).astype(np.float32)
    inputs = {"x": (FLOAT, x_shape)}
    inits = {}
    if const_w:
        inits["w"] = w
    else:
        inputs["w"] = (FLOAT, w_shape)
    return make_model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], inputs, ["y"], inits)


def test_conv_2d_and_3d_accepted():
    assert verdicts(conv_model([1, 3, 8, 8], [4, 3, 3, 3]))["Conv"] is None
    assert verdicts(conv_model([1, 2, 4, 6, 6], [4, 2, 3, 3, 3]))["Conv"] is None


def test_conv_1d_rejected_with_reason():
    reason = verdicts(conv_model([1, 3, 16], [4, 3, 3]))["Conv"]
    assert "1-D convolution" in reason and "2-D and 3-D" in reason


def test_conv_weights_must_be_initializers():
    reason = verdicts(conv_model([1, 3, 8, 8], [4, 3, 3, 3], const_w=False))["Conv"]
    assert "weights W" in reason and "initializer" in reason


def test_conv_kernel_volume_limit():
    reason = verdicts(conv_model([1, 1, 50, 50, 50], [1, 1, 50, 50, 50]))["Conv"]
    assert "kernel 50x50x50" in reason and str(support.MAX_KERNEL_VOLUME) in reason


def test_grouped_conv_accepted():
    assert verdicts(conv_model([1, 4, 8, 8], [4, 1, 3, 3], group=4))["Conv"] is None


def pool_model(op, x_shape, n_outputs=1, **attrs):
    outs = ["y", "idx"][:n_outputs]
    return make_model([helper.make_node(op, ["x"], outs, **attrs)], {"x": (FLOAT, x_shape)}, outs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_limits(op):
    ok = pool_model(op, [1, 2, 8, 8], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=1)
    assert verdicts(ok)[op] is None
    assert verdicts(pool_model(op, [1, 2, 4, 4, 4], kernel_shape=[2, 2, 2]))[op] is None
    bad_pads = verdicts(pool_model(op, [1, 2, 8, 8], kernel_shape=[2, 2], pads=[2, 0, 0, 0]))[op]
    assert "not smaller than the window" in bad_pads
    one_d = verdicts(pool_model(op, [1, 2, 8], kernel_shape=[2]))[op]
    assert "2-D or 3-D" in one_d


def test_maxpool_dilations_and_indices_rejected():
    dil = verdicts(pool_model("MaxPool", [1, 2, 8, 8], kernel_shape=[2, 2], dilations=[2, 2]))["MaxPool"]
    assert "dilations" in dil
    idx = verdicts(pool_model("MaxPool", [1, 2, 8, 8], n_outputs=2, kernel_shape=[2, 2]))["MaxPool"]
    assert "Indices" in idx


def binary_model(op, dtype, shape=(2, 3)):
    return make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": (dtype, shape), "b": (dtype, shape)}, ["y"])


def test_no_int64_compute():
    reason = verdicts(binary_model("Add", TensorProto.INT64))["Add"]
    assert "INT64" in reason and "no int64 compute" in reason
    assert "DOUBLE" in verdicts(binary_model("Add", TensorProto.DOUBLE))["Add"]
    assert verdicts(binary_model("Add", TensorProto.INT32))["Add"] is None


def test_constant_int64_shape_inputs_are_fine():
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": (FLOAT, [2, 6])}, ["y"],
                   {"s": np.array([3, 4], dtype=np.int64)})
    assert verdicts(m)["Reshape"] is None
    dyn = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                     {"x": (FLOAT, [2, 6]), "s": (TensorProto.INT64, [2])}, ["y"])
    assert "INT64" in verdicts(dyn)["Reshape"]


UNARY_F = sorted(op for op, (types, check) in OPERATORS.items()
                 if check is None and op in ("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Erf",
                                             "Softsign", "Softplus", "Elu", "Floor", "Sin"))
DTYPES = {TensorProto.FLOAT: support.DT.FLOAT, TensorProto.FLOAT16: support.DT.FLOAT16,
          TensorProto.INT32: support.DT.INT32, TensorProto.INT64: support.DT.INT64,
          TensorProto.DOUBLE: support.DT.DOUBLE}


@settings(max_examples=40)
@given(op=st.sampled_from(UNARY_F), dtype=st.sampled_from(sorted(DTYPES)),
       shape=st.lists(st.integers(1, 4), min_size=0, max_size=4))
def test_unary_type_support_property(op, dtype, shape):
    """Accepted exactly when the tensor type is one TensorRT computes the op in; else a reason naming both."""
    m = make_model([helper.make_node(op, ["x"], ["y"])], {"x": (dtype, shape)}, ["y"])
    reason = verdicts(m)[op]
    allowed, _ = OPERATORS[op]
    if DTYPES[dtype] in allowed:
        assert reason is None
    else:
        assert isinstance(reason, str) and reason.startswith(op) and DTYPES[dtype].name in reason


def test_static_shapes_except_batch():
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    assert verdicts(make_model(relu, {"x": (FLOAT, ["N", 3, 8, 8])}, ["y"]))["Relu"] is None
    reason = verdicts(make_model(relu, {"x": (FLOAT, [1, 3, "H", "W"])}, ["y"]))["Relu"]
    assert "dimension 2" in reason and "batch" in reason


def resize_model(x_shape, scales, **attrs):
    return make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)], {"x": (FLOAT, x_shape)},
                      ["y"], {"scales": np.array(scales, dtype=np.float32)}, opset=19)


def test_resize_modes():
    assert verdicts(resize_model([1, 2, 4, 4], [1, 1, 2, 2], mode="nearest"))["Resize"] is None
    assert verdicts(resize_model([1, 2, 4, 4], [1, 1, 2, 2], mode="linear",
                                 coordinate_transformation_mode="align_corners"))["Resize"] is None
    assert "cubic" in verdicts(resize_model([1, 2, 4, 4], [1, 1, 2, 2], mode="cubic"))["Resize"]
    crop = verdicts(resize_model([1, 2, 4, 4], [1, 1, 2, 2], coordinate_transformation_mode="half_pixel_symmetric"))
    assert "coordinate_transformation_mode" in crop["Resize"]
    assert "antialias" in verdicts(resize_model([1, 2, 4, 4], [1, 1, 2, 2], mode="linear", antialias=1))["Resize"]
    inner = verdicts(resize_model([1, 2, 2, 4, 4], [1, 2, 2, 2, 2], mode="linear"))["Resize"]
    assert "3 innermost" in inner


def test_lrn_window_limit():
    def lrn(size):
        return make_model([helper.make_node("LRN", ["x"], ["y"], size=size)], {"x": (FLOAT, [1, 32, 4, 4])}, ["y"])

    assert verdicts(lrn(5))["LRN"] is None
    assert "[1, 15]" in verdicts(lrn(17))["LRN"]


def test_cast_to_int64_rejected():
    m = make_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64)], {"x": (FLOAT, [4])}, ["y"])
    assert "INT64" in verdicts(m)["Cast"]


def test_unknown_operator_reason():
    m = make_model([helper.make_node("Mod", ["a", "b"], ["y"])],
                   {"a": (TensorProto.INT32, [3]), "b": (TensorProto.INT32, [3])}, ["y"])
    assert verdicts(m)["Mod"] == "Mod: not supported by TensorRT's ONNX parser"


def test_clip_bounds_must_be_constant():
    m = make_model([helper.make_node("Clip", ["x", "lo"], ["y"])], {"x": (FLOAT, [4]), "lo": (FLOAT, [])}, ["y"])
    assert "min" in verdicts(m)["Clip"]


def test_invalid_options_are_refused_by_the_core():
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (FLOAT, [4])}, ["y"])
    with pytest.raises(OptionError, match="target 'jetson': option 'precision' = 'int8'.*one of 'fp32', 'fp16'"):
        byoc.compile(m, targets=["jetson"], target_options={"jetson": {"precision": "int8"}})


def test_emulation_needs_a_host_kernel(monkeypatch):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (FLOAT, [4])}, ["y"])
    monkeypatch.setattr(support, "host_kernel_available", lambda op, domain="": False)
    reason = verdicts(m, validate_options({"runtime": "emulation"}))["Relu"]
    assert "emulation" in reason and "host kernel" in reason
    # on the TensorRT path the host kernels do not matter
    assert verdicts(m, validate_options({"runtime": "tensorrt"}))["Relu"] is None
