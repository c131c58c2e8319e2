"""byoc.quantize: calibration statistics, schemes, the QDQ rewrite, and the compile flow.

Also the host QuantizeLinear/DequantizeLinear kernels (byoc.kernels.quant), against onnxruntime.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.plugins import build_registry
from byoc.quantize import (
    QuantParams,
    QuantScheme,
    TensorStats,
    calibrate,
    params_of,
    quantize_model,
    read_qdq,
    requant_multiplier,
)
from byoc.contract import host_callable, region_model_bytes

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=(), opset=21):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in inits],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _w(shape, seed=0, scale=0.4):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _net():
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Add", ["p", "k"], ["a"], name="addk"),
        helper.make_node("Flatten", ["a"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    inits = [("w", _w((6, 3, 3, 3))), ("b", _w((6,), 1, 0.1)), ("k", _w((1, 6, 4, 4), 2, 0.2)),
             ("wf", _w((5, 96), 3, 0.1)), ("bf", _w((5,), 4, 0.1))]
    return _model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 5])], inits)


def _samples(n=8, seed=0, shape=(1, 3, 8, 8)):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


# -- host kernels --------------------------------------------------------------------------------


def _qdq_pair_model(dtype, axis, per_axis, shape):
    zp_type = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8, np.int16: TensorProto.INT16}[dtype]
    n = shape[axis] if per_axis else 1
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
                     helper.make_tensor_value_info("s", TensorProto.FLOAT, [n] if per_axis else []),
                     helper.make_tensor_value_info("z", zp_type, [n] if per_axis else [])],
        [helper.make_tensor_value_info("q", zp_type, list(shape)),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([np.int8, np.uint8, np.int16]), st.booleans(), st.integers(0, 2), st.integers(0, 2**32 - 1))
def test_quantize_dequantize_linear_match_onnxruntime(dtype, per_axis, axis, seed):
    rng = np.random.default_rng(seed)
    shape = (2, 3, 4)
    n = shape[axis] if per_axis else 1
    info = np.iinfo(dtype)
    x = (rng.standard_normal(shape) * 50).astype(np.float32)
    x.flat[0] = 2.5  # ties round to even
    s = rng.uniform(0.05, 2.0, n).astype(np.float32)
    z = rng.integers(info.min // 4, info.max // 4 + 1, n).astype(dtype)
    if not per_axis:
        s, z = s.reshape(()), z.reshape(())
    m = _qdq_pair_model(dtype, axis, per_axis, shape)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x, "s": s, "z": z})
    got = host_callable(m)(x, s, z)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_quant_kernel_errors_name_the_node():
    m = _qdq_pair_model(np.int8, 1, True, (2, 3, 4))
    with pytest.raises(byoc.KernelError, match="QuantizeLinear"):
        host_callable(m)(np.zeros((2, 3, 4), np.float32), np.ones(5, np.float32), np.zeros(5, np.int8))


# -- statistics -------------------------------------------------------------------------------------


def test_histogram_range_doubles_and_keeps_counts():
    st_ = TensorStats(hist=np.zeros(256, np.int64))
    st_.update(np.array([0.1, -0.2, 0.0], np.float32))
    assert st_.hist_max == 0.25 and st_.hist.sum() == 3 and st_.zeros == 1
    st_.update(np.array([3.0, np.nan, -np.inf], np.float32))
    assert st_.hist_max == 4.0 and st_.hist.sum() == 4 and st_.nonfinite == 2
    assert st_.hist.size == 256  # bounded, whatever arrives
    assert (st_.min, st_.max, st_.count) == (-0.20000000298023224, 3.0, 4)
    # 0.1 and 0.2 now share the lowest bins of a 4.0-wide histogram; 3.0 sits at bin 192
    assert st_.hist[192] == 1


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.01, 100.0))
def test_thresholds_are_ordered(seed, scale):
    rng = np.random.default_rng(seed)
    s = TensorStats()
    for _ in range(3):
        s.update((rng.standard_normal(4000) * scale).astype(np.float32))
    mm = s.threshold("minmax")
    assert mm == pytest.approx(s.absmax)
    pct = s.threshold("percentile", 99.0)
    ent = s.threshold("entropy")
    assert 0 < pct <= mm and 0 < ent <= mm
    # 99% of a normal lies within 2.58 sigma; the histogram bin adds at most one bin width
    assert pct == pytest.approx(2.576 * scale, rel=0.15)
    assert ent >= 2.0 * scale  # KL keeps most of a Gaussian's range


def test_requant_multiplier():
    assert requant_multiplier(2.0**-5) == (1, 5)
    assert requant_multiplier(4.0) == (4, 0)
    rng = np.random.default_rng(0)
    for r in rng.uniform(1e-6, 100.0, 200):
        m, s = requant_multiplier(float(r))
        assert s >= 0 and m < 1 << 24
        assert abs(m / 2.0**s - r) <= r * 2.0**-23


def test_scheme_validation():
    assert QuantScheme.from_dict({"weights": "per_channel"}).weights == "per_channel"
    for bad in ({"activations": "int4"}, {"method": "magic"}, {"bits": 4}, {"percentile": 20}, {"nope": 1}):
        with pytest.raises(byoc.OptionError):
            QuantScheme.from_dict(bad)


def test_calibrate_collects_every_float_tensor_and_checks_samples():
    table = calibrate(_net(), _samples(4))
    assert table.samples == 4
    assert {"x", "c", "r", "p", "a", "f", "y"} <= set(table.stats)
    assert table["r"].min >= 0.0 and table["p"].max == table["r"].max
    with pytest.raises(byoc.CalibrationRequiredError):
        calibrate(_net(), [])
    with pytest.raises(byoc.InputError, match="sample #0"):
        calibrate(_net(), [{"x": np.zeros((1, 3, 4, 4), np.float32)}])
    with pytest.raises(byoc.InputError):
        calibrate(_net(), {"x": np.zeros((1, 3, 8, 8), np.float32)})


# -- the QDQ rewrite ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [QuantScheme(), QuantScheme(activations="float", weights="per_channel"),
                                    QuantScheme(method="entropy", weight_scale="float")],
                         ids=["pow2", "float-per-channel", "entropy-mixed"])
def test_quantize_model_gives_valid_qdq_onnx(scheme):
    m = _net()
    table = calibrate(m, _samples(8))
    qdq, params = quantize_model(ir.from_proto(m), table, scheme)
    proto = ir.to_proto(qdq)
    onnx.checker.check_model(proto)
    # value names and interface kept
    assert [v.name for v in proto.graph.input] == ["x"] and [v.name for v in proto.graph.output] == ["y"]
    # the host runs it exactly like onnxruntime does
    sess = ort.InferenceSession(proto.SerializeToString())
    host, ref = host_callable(qdq), host_callable(m)
    for feeds in _samples(3, seed=9):
        got = host(feeds["x"])[0]
        np.testing.assert_array_equal(got, sess.run(None, feeds)[0])
        step = params.tensors["y"].scale
        want = np.clip(ref(feeds["x"])[0], -128 * step, 127 * step)  # beyond the calibrated range: saturated
        assert np.abs(got - want).max() <= 10 * step  # int8 everywhere, a few steps off float
    # parameters: fused conv output left unquantised, shared scale through MaxPool/Flatten
    assert "c" not in params.tensors and params.tensors["p"].source == "shared:r"
    assert params.tensors["f"].scale == params.tensors["a"].scale
    w, b = params.tensors["w"], params.tensors["b"]
    assert w.kind == "weight" and b.kind == "bias" and b.dtype == "int32"
    if scheme.weights == "per_channel":
        assert w.axis == 0 and len(w.scale) == 6
    sx = params.tensors["x"].scale
    q_b = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == b.data))
    b_float = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "b"))
    np.testing.assert_array_equal(q_b, np.rint(b_float / (np.float32(sx) * np.asarray(w.scale, np.float32))))
    if scheme.activations == "pow2":
        for name, tq in params.tensors.items():
            if tq.kind == "activation":
                assert tq.scale == 2.0 ** -tq.fix_pos, name
    # the metadata round-trips and read_qdq sees the float operators over logical names
    again = params_of(qdq)
    assert again.to_json() == params.to_json() == QuantParams.from_json(json.loads(json.dumps(again.to_json()))
                                                                        ).to_json()
    view = read_qdq(qdq)
    assert [n.op_type for n in view.nodes] == ["Conv", "Relu", "MaxPool", "Add", "Flatten", "Gemm"]
    assert view.constants["w"].dtype == np.int8 and view.constants["b"].dtype == np.int32
    assert view.constants["k"].dtype == np.int8  # Add's constant operand
    assert view.logical(view.nodes[1].output[0]) == "r"


def test_missing_statistics_name_the_tensor():
    m = _net()
    table = calibrate(m, _samples(2))
    del table.stats["a"]
    with pytest.raises(byoc.QuantizationError, match="'a'.*node 'addk'"):
        quantize_model(ir.from_proto(m), table, QuantScheme())


# -- byoc.compile(..., calibration=) ---------------------------------------------------------------


class _QChip:
    """A target that needs calibration; its code generator hands back the QDQ region as ONNX."""

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("qchip", version="1.0", device="npu", needs_calibration=True,
                             quantization={"activations": "float"}, options={"quantization": {}}))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == "qchip":
            for op in ("Conv", "Relu", "MaxPool", "Add", "Flatten", "Gemm"):
                register(op)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == "qchip":
            assert params_of(region.model) is not None  # regions arrive quantised
            return byoc.Artifact("qchip", "onnx-qdq", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == "qchip":
            return host_callable(artifact.data)


@pytest.fixture
def qreg():
    return build_registry([("qchip", _QChip())], entry_points=False)


def test_compile_needs_calibration_for_explicit_targets(qreg):
    with pytest.raises(byoc.CalibrationRequiredError, match="'qchip'.*calibration"):
        byoc.compile(_net(), targets=["qchip"], registry=qreg)


def test_compile_skips_calibrated_targets_by_default(qreg):
    cm = byoc.compile(_net(), registry=qreg, target_options={"qchip": {"quantization": {}}})
    assert cm.options["targets"] == [] and "calibration" in cm.options["skipped_targets"]["qchip"]
    assert not cm.regions


def test_compile_with_calibration_quantises_regions(qreg, tmp_path):
    cal = _samples(6)
    cm = byoc.compile(_net(), targets=["qchip"], registry=qreg, calibration=iter(cal),
                      target_options={"qchip": {"quantization": {"weights": "per_channel"}}})
    assert cm.options["calibration"]["samples"] == 6
    assert cm.options["calibration"]["schemes"]["qchip"]["activations"] == "float"
    assert cm.options["calibration"]["schemes"]["qchip"]["weights"] == "per_channel"
    (cr,) = cm.regions
    params = params_of(cr.region.model)
    assert params.scheme.weights == "per_channel" and params.tensors["w"].axis == 0
    ref = byoc.compile(_net(), targets=[])
    feeds = _samples(1, seed=5)[0]
    got, want = cm.run(feeds)["y"], ref.run(feeds)["y"]
    step = params.tensors["y"].scale
    assert np.abs(got - np.clip(want, -128 * step, 127 * step)).max() <= 10 * step
    # save/load: the quantisation travels in the bundle; no calibration data needed
    loaded = byoc.load(cm.save(tmp_path / "q.byoc"), registry=qreg)
    np.testing.assert_array_equal(loaded.run(feeds)["y"], got)


def test_compile_rejects_a_bad_scheme_override(qreg):
    with pytest.raises(byoc.OptionError, match="qchip"):
        byoc.compile(_net(), targets=["qchip"], registry=qreg, calibration=_samples(1),
                     target_options={"qchip": {"quantization": {"method": "magic"}}})
