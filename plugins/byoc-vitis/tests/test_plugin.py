"""The vitis plugin through byoc.compile: calibration flow, placement report, artifacts, bundles."""

from __future__ import annotations

import json

import numpy as np
import pytest
from vitis_helpers import compile_vitis, model, samples
from onnx import helper

import byoc
from byoc.quantize import params_of
from byoc.testing.zoo import load_zoo, zoo_inputs
from byoc_vitis.program import ProgramError, loads

X = ("x", [1, 4, 8, 8])


def _w(shape, seed=1, scale=0.4):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _net():
    """conv-relu-maxpool, then a grouped conv (rejected), a conv, flatten-gemm, softmax."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "wg"], ["g"], group=2, name="grouped"),
        helper.make_node("Conv", ["g", "w2"], ["c2"], name="conv2"),
        helper.make_node("LeakyRelu", ["c2"], ["l2"], alpha=0.2, name="leaky_wrong_slope"),
        helper.make_node("Flatten", ["l2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax"),
    ]
    inits = [("w1", _w((8, 4, 3, 3))), ("b1", _w((8,), 2, 0.1)), ("wg", _w((8, 4, 1, 1), 3)),
             ("w2", _w((8, 8, 1, 1), 4)), ("wf", _w((10, 8 * 16), 5, 0.1)), ("bf", _w((10,), 6, 0.1))]
    return model(nodes, [X], [("y", [1, 10])], inits)


def test_explicit_target_without_calibration_is_a_clear_error(registry):
    with pytest.raises(byoc.CalibrationRequiredError, match="calibration"):
        byoc.compile(_net(), targets=["vitis"], registry=registry)
    assert issubclass(byoc.CalibrationRequiredError, byoc.OptionError)


def test_default_targets_skip_vitis_and_say_why(registry):
    # no DPU here: vitis is an emulation (Target.available is False), so targets=None leaves it out
    cm = byoc.compile(_net(), registry=registry)
    assert cm.options["targets"] == []
    assert "not present" in cm.options["skipped_targets"]["vitis"]
    # even with calibration data
    cm = byoc.compile(_net(), registry=registry, calibration=[{"x": np.zeros((1, 4, 8, 8), np.float32)}])
    assert cm.options["targets"] == []
    assert all(r.device == "host" for r in cm.records.values())


def test_empty_or_malformed_calibration(registry):
    with pytest.raises(byoc.CalibrationRequiredError, match="no samples"):
        compile_vitis(_net(), registry, [])
    with pytest.raises(byoc.InputError, match="sample #1"):
        compile_vitis(_net(), registry, [{"x": np.zeros((1, 4, 8, 8), np.float32)}, {"x": np.zeros((2, 2))}])


def test_report_names_dpu_nodes_and_fallback_reasons(registry):
    cm = compile_vitis(_net(), registry, samples({"x": X[1]}))
    rec = cm.records
    assert rec["conv1"].device == rec["relu1"].device == rec["pool1"].device == "vitis"
    assert rec["conv2"].device == rec["fc"].device == "vitis"
    assert rec["grouped"].device == "host" and "grouped convolution (group 2" in rec["grouped"].verdicts["vitis"]
    assert "26/256" in rec["leaky_wrong_slope"].verdicts["vitis"]
    assert rec["softmax"].verdicts["vitis"] == "Softmax: operator not supported by vitis"
    assert rec["flatten"].device == "vitis" and rec["flatten"].verdicts["vitis"] is None
    assert not cm.faults
    # the grouped conv splits the graph: two DPU regions, each with its own program
    assert len(cm.regions) == 3 and {cr.artifact.format for cr in cm.regions} == {"vitis-dpu-program"}
    text = cm.report()
    assert "grouped convolution (group 2" in text and "not the DPU's fixed slope" in text
    assert "vitis_0" in text and "vitis-dpu-program" in text


def test_grouped_conv_option(registry):
    cm = compile_vitis(_net(), registry, samples({"x": X[1]}), grouped_conv=True)
    assert cm.records["grouped"].device == "vitis"


def test_limits_are_reported(registry):
    cases = {
        "Conv: kernel 17x17 is outside": (helper.make_node("Conv", ["x", "w"], ["y"]), [("w", _w((2, 4, 17, 17)))],
                                          [1, 2, 8, 8], [1, 4, 24, 24]),
        "stride 9x9 is outside": (helper.make_node("Conv", ["x", "w"], ["y"], strides=[9, 9]),
                                  [("w", _w((2, 4, 1, 1)))], [1, 2, 1, 1], [1, 4, 8, 8]),
        "padding [3, 3, 3, 3] exceeds kernel-1": (helper.make_node("Conv", ["x", "w"], ["y"], pads=[3, 3, 3, 3]),
                                                   [("w", _w((2, 4, 3, 3)))], [1, 2, 12, 12], [1, 4, 8, 8]),
        "dilation 5x5": (helper.make_node("Conv", ["x", "w"], ["y"], dilations=[5, 5]),
                         [("w", _w((2, 4, 2, 2)))], [1, 2, 3, 3], [1, 4, 8, 8]),
        "only ReLU6": (helper.make_node("Clip", ["x", "lo", "hi"], ["y"]),
                       [("lo", np.float32(0)), ("hi", np.float32(4))], [1, 4, 8, 8], [1, 4, 8, 8]),
        "nearest only": (helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear"),
                         [("s", np.array([1, 1, 2, 2], np.float32))], [1, 4, 16, 16], [1, 4, 8, 8]),
    }
    for reason, (node, inits, out, inp) in cases.items():
        m = model([node], [("x", inp)], [("y", out)], inits)
        cm = compile_vitis(m, registry, samples({"x": inp}, n=2))
        (rec,) = cm.records.values()
        assert rec.device == "host" and reason in rec.verdicts["vitis"], (reason, rec.verdicts)


def test_artifact_is_deterministic_and_carries_its_quantisation(registry):
    cal = samples({"x": X[1]})
    a = compile_vitis(_net(), registry, cal)
    b = compile_vitis(_net(), registry, cal)
    assert [cr.artifact.data for cr in a.regions] == [cr.artifact.data for cr in b.regions]
    meta = a.regions[0].artifact.metadata
    assert meta["scheme"]["activations"] == "pow2"
    for name, scale in meta["input_scales"].items():
        assert np.log2(scale) == int(np.log2(scale)), (name, scale)  # power-of-two scales
    json.dumps(meta)
    # the region kept for the host fallback is the QDQ model, with its parameters
    assert params_of(a.regions[0].region.model) is not None


def test_save_load_runs_without_calibration_data(registry, tmp_path):
    cm = compile_vitis(_net(), registry, samples({"x": X[1]}))
    path = cm.save(tmp_path / "m.byoc")
    loaded = byoc.load(path, registry=registry)
    for feeds in samples({"x": X[1]}, n=3, seed=11):
        np.testing.assert_array_equal(loaded.run(feeds)["y"], cm.run(feeds)["y"])
    # without the plugin the kept QDQ subgraphs run on the host: the same int8 model, in float
    from byoc.plugins import build_registry

    with pytest.warns(UserWarning):
        hosted = byoc.load(path, registry=build_registry([], entry_points=False), fallback="host")
    feeds = samples({"x": X[1]}, n=1, seed=12)[0]
    np.testing.assert_allclose(hosted.run(feeds)["y"], cm.run(feeds)["y"], atol=0.05)


def test_reference_engine_gives_the_same_bits(registry):
    cal = samples({"x": X[1]})
    fast = compile_vitis(_net(), registry, cal)
    slow = compile_vitis(_net(), registry, cal, engine="reference")
    for feeds in samples({"x": X[1]}, n=2, seed=3):
        np.testing.assert_array_equal(fast.run(feeds)["y"], slow.run(feeds)["y"])


def test_tampered_program_is_refused():
    from byoc_vitis.codegen import build_program
    from byoc_vitis.program import dumps

    m = _net()
    from vitis_helpers import make_registry

    cm = compile_vitis(m, make_registry(), samples({"x": X[1]}))
    data = cm.regions[0].artifact.data
    assert dumps(loads(data)) == data
    with pytest.raises(ProgramError, match="magic"):
        loads(b"PK\x03\x04" + data[4:])
    with pytest.raises(ProgramError):
        loads(data[: len(data) // 2])
    bad = data.replace(b'"op":"conv"', b'"op":"exec"', 1)
    with pytest.raises(ProgramError, match="unknown op"):
        loads(bad)
    assert build_program  # the code generator is importable on its own


def test_squeezenet_small(registry):
    """A small version of benchmarks/vitis_accuracy.py: SqueezeNet, 4 calibration samples, 3 checks."""
    m = load_zoo("squeezenet")
    cal = [zoo_inputs(m, seed=100 + i) for i in range(4)]
    cm = byoc.compile(m, targets=["vitis"], registry=registry, calibration=cal)
    on_dpu = [r for r in cm.records.values() if r.device == "vitis"]
    assert len(on_dpu) >= len(cm.records) - 2  # all but Softmax and the final Reshape
    host = byoc.compile(m, targets=[])
    for i in range(3):
        feeds = zoo_inputs(m, seed=1000 + i)
        got, want = cm.run(feeds), host.run(feeds)
        (name,) = got
        rel = np.linalg.norm(got[name] - want[name]) / np.linalg.norm(want[name])
        assert rel < 0.1, rel


def test_threads_give_identical_bits(registry):
    """One compiled model, four threads: the engine keeps no state between calls."""
    import threading

    cm = compile_vitis(_net(), registry, samples({"x": X[1]}))
    feeds = samples({"x": X[1]}, n=4, seed=21)
    expected = [cm.run(f)["y"] for f in feeds]
    bad = []

    def work(t):
        for i in range(20):
            k = (t + i) % 4
            if not np.array_equal(cm.run(feeds[k])["y"], expected[k]):
                bad.append((t, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
