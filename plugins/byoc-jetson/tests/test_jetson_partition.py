"""Patterns and partition rules through ``byoc.compile``."""

from __future__ import annotations


import numpy as np
import pytest
from jetson_helpers import assert_fp16_close, compile_jetson, make_model, require_kernels
from onnx import TensorProto, helper

from byoc.contract import OptionError
from byoc.testing.oracle import run_onnxruntime

FLOAT = TensorProto.FLOAT


def _w(*shape, seed=0, scale=0.5):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _conv(x, y, w, b=None, k=3):
    ins = [x, w] + ([b] if b else [])
    return helper.make_node("Conv", ins, [y], pads=[k // 2] * 4, name=f"conv_{y}")


def by_name(cm):
    return cm.records


def _check_outputs(cm, model, feeds):
    want = run_onnxruntime(model, feeds)
    got = cm.run(feeds)
    for (name, g), w in zip(got.items(), want):
        assert_fp16_close(g, w, what=name)


def test_conv_bias_act_pattern(registry):
    require_kernels("Conv")
    model = make_model(
        [_conv("x", "c", "w", "b"), helper.make_node("Relu", ["c"], ["y"], name="relu")],
        {"x": (FLOAT, [1, 2, 5, 5])}, ["y"], {"w": _w(3, 2, 3, 3), "b": _w(3)},
    )
    cm = compile_jetson(registry, model)
    assert {r.pattern for r in cm.records.values()} == {"jetson.conv2d_bias_act"}
    assert {r.device for r in cm.records.values()} == {"jetson"}
    _check_outputs(cm, model, {"x": _w(1, 2, 5, 5, seed=1)})


def test_conv_add_bias_pattern_and_residual_chain(registry):
    """conv + Add(bias) + Relu is one conv pattern; the residual Add + Relu after it is an elementwise chain,
    which never steals the convolution's activation."""
    require_kernels("Conv")
    model = make_model(
        [
            _conv("x", "c", "w"),
            helper.make_node("Add", ["c", "b"], ["cb"], name="bias"),
            helper.make_node("Relu", ["cb"], ["r"], name="relu1"),
            helper.make_node("Add", ["r", "x"], ["s"], name="residual"),
            helper.make_node("Relu", ["s"], ["y"], name="relu2"),
        ],
        {"x": (FLOAT, [1, 2, 4, 4])}, ["y"], {"w": _w(2, 2, 3, 3), "b": _w(1, 2, 1, 1)},
    )
    # the shared bn_folding pass would fold the constant Add into the convolution's bias first
    from byoc.passes import DEFAULT_PASSES

    cm = compile_jetson(registry, model, min_subgraph_size=1, passes=[p for p in DEFAULT_PASSES if p != "bn_folding"])
    rec = cm.records
    assert rec["conv_c"].pattern == rec["bias"].pattern == rec["relu1"].pattern == "jetson.conv2d_bias_act"
    assert rec["residual"].pattern == rec["relu2"].pattern == "jetson.elementwise_chain"
    assert len(cm.regions) == 1
    _check_outputs(cm, model, {"x": _w(1, 2, 4, 4, seed=2)})
    folded = compile_jetson(registry, model, min_subgraph_size=1)
    assert "bias" not in folded.records and folded.records["relu1"].pattern == "jetson.conv2d_bias_act"
    _check_outputs(folded, model, {"x": _w(1, 2, 4, 4, seed=2)})


def test_gemm_and_softmax_patterns(registry):
    require_kernels("MatMul", "Gemm")
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "b1"], ["h"], name="bias"),
            helper.make_node("Tanh", ["h"], ["t"], name="act"),
            helper.make_node("Gemm", ["t", "w2", "b2"], ["g"], name="gemm", transB=1),
            helper.make_node("Softmax", ["g"], ["y"], name="softmax"),
        ],
        {"x": (FLOAT, [2, 8])}, ["y"], {"w1": _w(8, 6), "b1": _w(6), "w2": _w(4, 6), "b2": _w(4)},
    )
    cm = compile_jetson(registry, model)
    rec = cm.records
    assert rec["mm"].pattern == rec["bias"].pattern == rec["act"].pattern == "jetson.gemm_bias_act"
    assert rec["gemm"].pattern == "jetson.gemm_bias_act"
    assert rec["softmax"].pattern == "jetson.softmax"
    _check_outputs(cm, model, {"x": _w(2, 8, seed=3)})


def test_region_without_mac_is_dropped(registry):
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Sigmoid", ["r"], ["y"], name="sig")], {"x": (FLOAT, [4])}, ["y"])
    cm = compile_jetson(registry, model)
    assert not cm.regions
    for rec in cm.records.values():
        assert rec.device == "host" and rec.verdicts["jetson"] is None
        assert rec.rule.startswith("jetson:mac_required") and "no multiply-accumulate" in rec.rule


def _two_conv_regions():
    """conv+relu | Hardmax (not TensorRT) | conv | Hardmax | relu+sigmoid (no MAC)."""
    return make_model(
        [
            _conv("x", "c1", "w1"),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Hardmax", ["r1"], ["h1"], name="hardmax1", axis=1),
            _conv("h1", "c2", "w2"),
            helper.make_node("Hardmax", ["c2"], ["h2"], name="hardmax2", axis=1),
            helper.make_node("Relu", ["h2"], ["r3"], name="relu3"),
            helper.make_node("Sigmoid", ["r3"], ["y"], name="sig"),
        ],
        {"x": (FLOAT, [1, 2, 4, 4])}, ["y"], {"w1": _w(2, 2, 3, 3), "w2": _w(2, 2, 3, 3, seed=5)},
    )


def test_rules_default(registry):
    require_kernels("Conv", "Hardmax")
    model = _two_conv_regions()
    cm = compile_jetson(registry, model)
    rec = cm.records
    assert "not supported by TensorRT" in rec["hardmax1"].verdicts["jetson"]
    assert rec["conv_c1"].device == rec["relu1"].device == rec["conv_c2"].device == "jetson"
    assert rec["relu3"].device == rec["sig"].device == "host"
    assert rec["relu3"].rule.startswith("jetson:mac_required")
    assert len(cm.regions) == 2
    _check_outputs(cm, model, {"x": _w(1, 2, 4, 4, seed=6)})


def test_min_subgraph_size(registry):
    require_kernels("Conv", "Hardmax")
    cm = compile_jetson(registry, _two_conv_regions(), min_subgraph_size=2)
    rec = cm.records
    assert rec["conv_c1"].device == "jetson"  # conv + relu: 2 nodes
    assert rec["conv_c2"].device == "host"
    assert rec["conv_c2"].rule == "jetson:min_subgraph_size (1 node(s), fewer than min_subgraph_size=2)"


def test_max_regions(registry):
    require_kernels("Conv", "Hardmax")
    cm = compile_jetson(registry, _two_conv_regions(), max_regions=1)
    rec = cm.records
    assert rec["conv_c1"].device == "jetson" and rec["conv_c2"].device == "host"
    assert rec["conv_c2"].rule.startswith("jetson:max_regions")
    # the count starts afresh with every compile
    again = compile_jetson(registry, _two_conv_regions(), max_regions=1)
    assert again.records["conv_c1"].device == "jetson"


def test_pattern_member_rejected_keeps_the_rest(registry):
    """A Clip whose bounds are not constants is refused; the conv pattern falls back to conv alone."""
    require_kernels("Conv")
    model = make_model(
        [_conv("x", "c", "w"), helper.make_node("Clip", ["c", "lo"], ["y"], name="clip")],
        {"x": (FLOAT, [1, 2, 4, 4]), "lo": (FLOAT, [])}, ["y"], {"w": _w(2, 2, 3, 3)},
    )
    cm = compile_jetson(registry, model)
    assert cm.records["conv_c"].device == "jetson" and cm.records["conv_c"].pattern == "jetson.conv2d_bias_act"
    assert cm.records["clip"].device == "host"
    assert "initializer" in cm.records["clip"].verdicts["jetson"]


def test_invalid_option_value_is_refused_by_the_core(registry):
    model = make_model([_conv("x", "y", "w")], {"x": (FLOAT, [1, 2, 4, 4])}, ["y"], {"w": _w(2, 2, 3, 3)})
    with pytest.raises(OptionError, match="target 'jetson': option 'precision' = 'int4'"):
        compile_jetson(registry, model, precision="int4")


def test_dynamic_batch_region(registry):
    require_kernels("Conv")
    model = make_model([_conv("x", "c", "w"), helper.make_node("Relu", ["c"], ["y"])],
                       {"x": (FLOAT, ["N", 2, 4, 4])}, ["y"], {"w": _w(2, 2, 3, 3)})
    cm = compile_jetson(registry, model)
    assert len(cm.regions) == 1
    assert cm.regions[0].artifact.metadata["input_shapes"] == [[None, 2, 4, 4]]
    for batch in (1, 3):
        _check_outputs(cm, model, {"x": _w(batch, 2, 4, 4, seed=batch)})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cost_hook(registry, precision):
    require_kernels("Conv")
    import byoc_jetson.plugin as plugin

    model = make_model([_conv("x", "y", "w")], {"x": (FLOAT, [1, 2, 8, 8])}, ["y"], {"w": _w(4, 2, 3, 3)})
    cm = compile_jetson(registry, model, precision=precision)
    cost = plugin.byoc_cost(cm.regions[0].region, {"precision": precision})
    assert cost is not None and cost > 0
