"""The weight-less frontend path gives the same model as sending every weight through the checker and converter.

``load_model(..., stub_min_bytes=None)`` is the reference: no stubs, every weight serialised
into the ONNX checker and version converter (the frontend's behaviour before issue 19).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.errors import ExternalDataError
from byoc.frontend import bounded, load_model
from byoc.frontend.loader import ModelConversionWarning
from byoc.frontend.weights import STUB_LOCATION, STUB_MIN_BYTES
from byoc.testing.oracle import run_onnxruntime
from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs, zoo_path

_RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _onnx_calls_in_this_process(monkeypatch):
    """The tests spy on what onnx's checker and converter are handed: run them in-process."""
    monkeypatch.setattr(bounded, "FORKS", False)


def _both(model, **kw):
    """(weight-less load, reference load) as protos, and the warnings of each."""
    out = []
    for stub in (STUB_MIN_BYTES, None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            proto = ir.to_proto(load_model(model, require_kernels=False, stub_min_bytes=stub, **kw))
        out.append((proto, [str(w.message) for w in caught if issubclass(w.category, ModelConversionWarning)]))
    return out


def _assert_same(model, **kw):
    (fast, fast_warn), (ref, ref_warn) = _both(model, **kw)
    assert fast == ref
    assert fast_warn == ref_warn
    return fast


def _w(name, shape):
    return nh.from_array(_RNG.standard_normal(shape).astype(np.float32), name)


def _vi(name, shape):
    return h.make_tensor_value_info(name, T.FLOAT, shape)


def _model(nodes, inits, inputs, outputs, opset, ir_version=None):
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, initializer=inits),
                     opset_imports=[h.make_opsetid("", opset)])
    if ir_version is not None:
        m.ir_version = ir_version
    if m.ir_version < 4:  # IR version 3: every initializer is also a graph input
        m.graph.input.extend(_vi(t.name, list(t.dims)) for t in inits)
    return m


def _bn_params(n):
    return [_w("s", [n]), _w("b", [n]), _w("m", [n]),
            nh.from_array(np.abs(_RNG.standard_normal(n)).astype(np.float32) + 1, "v")]


# models whose conversion rewrites nodes next to big float initializers (the adapters that
# read initializers read small or integer tensors, which stay real)
ADAPTER_CASES = {
    "add6_broadcast_axis": lambda: _model(
        [h.make_node("Add", ["x", "b"], ["y"], broadcast=1, axis=1)], [_w("b", [512])],
        [_vi("x", [1, 512, 2, 2])], [_vi("y", [1, 512, 2, 2])], 6, 3),
    "gemm6_broadcast": lambda: _model(
        [h.make_node("Gemm", ["x", "w", "c"], ["y"], broadcast=1, transB=1)], [_w("w", [300, 64]), _w("c", [300])],
        [_vi("x", [2, 64])], [_vi("y", [2, 300])], 6, 3),
    "batchnorm6": lambda: _model(
        [h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=1)], _bn_params(512),
        [_vi("x", [1, 512, 2, 2])], [_vi("y", [1, 512, 2, 2])], 6, 3),
    "batchnorm7": lambda: _model(
        [h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=1)], _bn_params(512),
        [_vi("x", [1, 512, 2, 2])], [_vi("y", [1, 512, 2, 2])], 7),
    "reshape4_shape_attribute": lambda: _model(
        [h.make_node("Reshape", ["w"], ["r"], shape=[64, 300]), h.make_node("MatMul", ["x", "r"], ["y"])],
        [_w("w", [300, 64])], [_vi("x", [2, 64])], [_vi("y", [2, 300])], 4, 3),
    "upsample9_scales_input": lambda: _model(
        [h.make_node("Upsample", ["x", "sc"], ["u"], mode="nearest"), h.make_node("Mul", ["u", "w"], ["y"])],
        [nh.from_array(np.array([1, 1, 2, 2], np.float32), "sc"), _w("w", [1, 64, 4, 4])],
        [_vi("x", [1, 64, 2, 2])], [_vi("y", [1, 64, 4, 4])], 9),
    "conv1": lambda: _model(
        [h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [_w("w", [16, 3, 3, 3])],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 16, 8, 8])], 1, 3),
    "failing_conversion": lambda: _model(  # the converter refuses it: a warning either way
        [h.make_node("Mul", ["x", "b"], ["y"], broadcast=1, axis=1)], [_w("b", [512, 2])],
        [_vi("x", [1, 512, 2, 2])], [_vi("y", [1, 512, 2, 2])], 6, 3),
}


@pytest.mark.parametrize("case", sorted(ADAPTER_CASES))
def test_conversion_with_stubs_gives_the_reference_model(case):
    model = ADAPTER_CASES[case]()
    fast = _assert_same(model)
    assert fast.ir_version == model.ir_version  # IR version 3 stays 3: initializers remain graph inputs
    assert fast.graph.initializer  # the weights are there, with data
    assert all(t.data_location == T.DEFAULT for t in fast.graph.initializer)


@pytest.mark.parametrize("case", ["batchnorm7", "upsample9_scales_input", "gemm6_broadcast"])
def test_converted_model_runs_like_onnxruntime(case):
    model = ADAPTER_CASES[case]()
    if model.opset_import[0].version < 7:  # onnxruntime runs opset 7 and newer
        model = onnx.version_converter.convert_version(model, 7)
    feeds = {i.name: _RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}}
    got = byoc.compile(model, targets=[]).run(feeds)
    for actual, want in zip(got.values(), run_onnxruntime(model, feeds)):
        np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_files_as_shipped(name):
    """The nine files from the onnx wheel: IR version 3, opset 9, weights as ConstantOfShape."""
    model = onnx.load(str(zoo_path(name)))
    assert model.ir_version == 3
    assert _assert_same(model).ir_version == 3


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "inception_v1"])
def test_zoo_with_random_weights(name):
    _assert_same(load_zoo(name))


def test_ir_version_3_with_big_weights_as_graph_inputs():
    model = load_zoo("squeezenet")
    model.ir_version = 3
    model.graph.input.extend(_vi(t.name, list(t.dims)) for t in model.graph.initializer)
    fast = _assert_same(model)
    assert fast.ir_version == 3
    assert {t.name for t in fast.graph.initializer} <= {i.name for i in fast.graph.input}


def test_external_data_gives_the_same_model(tmp_path):
    model = load_zoo("squeezenet")
    path = tmp_path / "m.onnx"
    onnx.save_model(onnx.ModelProto.FromString(model.SerializeToString()), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    fast = _assert_same(str(path))
    assert fast == ir.to_proto(load_model(model, require_kernels=False))  # same as in memory


def test_external_data_ir_version_3(tmp_path):
    model = ADAPTER_CASES["batchnorm6"]()
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    assert _assert_same(str(path)).ir_version == 3


def test_weights_are_the_originals_and_read_only():
    model = load_zoo("squeezenet")
    ir_model = load_model(model, require_kernels=False)
    for t in model.graph.initializer:
        arr = ir_model.graph.initializers[t.name].const_value.numpy()
        np.testing.assert_array_equal(arr, nh.to_array(t))
        if arr.nbytes >= STUB_MIN_BYTES:
            assert not arr.flags.writeable


def test_checker_and_converter_never_see_the_weights(monkeypatch):
    model = load_zoo("resnet50")
    weight_bytes = sum(nh.to_array(t).nbytes for t in model.graph.initializer)
    seen = []
    check, convert = onnx.checker.check_model, onnx.version_converter.convert_version
    monkeypatch.setattr(onnx.checker, "check_model", lambda m, *a, **k: seen.append(len(m)) or check(m, *a, **k))
    monkeypatch.setattr(onnx.version_converter, "convert_version",
                        lambda m, v: seen.append(m.ByteSize()) or convert(m, v))
    before = model.SerializeToString()
    load_model(model)
    assert len(seen) == 2  # one check, one conversion (opset 9 -> 21)
    assert max(seen) < weight_bytes / 100
    assert model.SerializeToString() == before  # the caller's proto is untouched


def test_no_conversion_at_the_canonical_opset(monkeypatch):
    model = onnx.version_converter.convert_version(ADAPTER_CASES["batchnorm7"](), 21)
    monkeypatch.setattr(onnx.version_converter, "convert_version", lambda *a: pytest.fail("converted"))
    load_model(model)


def test_converter_touching_a_stub_falls_back_to_the_full_model(monkeypatch):
    real = onnx.version_converter.convert_version
    touched = []

    def meddling(proto, version):
        out = real(proto, version)
        for t in out.graph.initializer:
            if t.data_location == T.EXTERNAL:  # a stub: pretend an adapter reshaped it
                t.dims.reverse()
                touched.append(t.name)
        return out

    monkeypatch.setattr(onnx.version_converter, "convert_version", meddling)
    model = ADAPTER_CASES["gemm6_broadcast"]()
    fast = ir.to_proto(load_model(model, require_kernels=False))
    monkeypatch.setattr(onnx.version_converter, "convert_version", real)
    assert touched  # the skeleton was tried first
    assert fast == ir.to_proto(load_model(model, require_kernels=False, stub_min_bytes=None))


def test_converter_failing_on_the_skeleton_only_falls_back(monkeypatch):
    real = onnx.version_converter.convert_version

    def picky(proto, version):
        if any(t.data_location == T.EXTERNAL for t in proto.graph.initializer):
            raise RuntimeError("no external data here")
        return real(proto, version)

    monkeypatch.setattr(onnx.version_converter, "convert_version", picky)
    model = ADAPTER_CASES["batchnorm6"]()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelConversionWarning)
        fast = ir.to_proto(load_model(model, require_kernels=False))
    assert fast.opset_import[0].version == 21


def test_a_model_cannot_pose_as_a_stub(tmp_path):
    model = ADAPTER_CASES["batchnorm7"]()
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", STUB_LOCATION
    with pytest.raises(ExternalDataError, match="'s'"):
        load_model(model)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ExternalDataError, match="not found"):
        load_model(str(path))


def test_compiled_zoo_model_matches_onnxruntime():
    model = load_zoo("squeezenet")
    feeds = zoo_inputs(model)
    got = byoc.compile(model, targets=[]).run(feeds)
    for actual, want in zip(got.values(), run_onnxruntime(model, feeds)):
        np.testing.assert_allclose(actual, want, rtol=1e-3, atol=1e-6)


def test_ir_model_weights_are_never_serialised(monkeypatch):
    """An ``onnx_ir.Model`` gives the same model as its proto, without serialising its weights."""
    model = load_zoo("squeezenet")
    ir_in = ir.from_proto(model)
    before = {name: value.const_value for name, value in ir_in.graph.initializers.items()}
    weight_bytes = sum(nh.to_array(t).nbytes for t in model.graph.initializer)
    sizes = []
    to_proto = ir.to_proto
    monkeypatch.setattr(ir, "to_proto", lambda m: (lambda p: sizes.append(p.ByteSize()) or p)(to_proto(m)))
    got = load_model(ir_in, require_kernels=False)
    monkeypatch.setattr(ir, "to_proto", to_proto)
    assert sizes and sizes[0] < weight_bytes / 20
    assert ir.to_proto(got) == ir.to_proto(load_model(model, require_kernels=False))
    for name, value in ir_in.graph.initializers.items():  # the caller's model is as it was
        assert value.const_value is before[name]
        arr = got.graph.initializers[name].const_value.numpy()
        np.testing.assert_array_equal(arr, value.const_value.numpy())
        if arr.nbytes >= STUB_MIN_BYTES:
            assert not arr.flags.writeable
            assert not np.shares_memory(arr, value.const_value.numpy())  # a private copy


def test_ir_model_falls_back_with_held_weights(monkeypatch):
    """A converter that touches a stub: the full model (weights put back) is converted instead."""
    model = ADAPTER_CASES["batchnorm7"]()
    real = onnx.version_converter.convert_version
    calls = []

    def convert(m, v):
        calls.append(m)
        out = real(m, v)
        if len(calls) == 1:
            for t in out.graph.initializer:
                if t.data_location == T.EXTERNAL:
                    t.dims[0] += 1  # a stub reshaped: the stubs cannot be trusted
        return out

    monkeypatch.setattr(onnx.version_converter, "convert_version", convert)
    got = load_model(ir.from_proto(model), require_kernels=False)
    monkeypatch.setattr(onnx.version_converter, "convert_version", real)
    assert len(calls) == 2
    assert ir.to_proto(got) == ir.to_proto(load_model(model, require_kernels=False))
