"""What users bring: model-zoo files as they ship (IR version 3), compiled to a bundle and run from it.

The nine files in the onnx wheel are IR version 3, where every initializer is also a graph
input. Their weights are ``ConstantOfShape`` fills (degenerate outputs), so they get seeded
random weights, keeping the file's ``ir_version`` and that rule (``keep_ir_version=True``).
Each goes through the command line as a user would: ``byoc compile -o``, then ``byoc run`` on
the bundle; the outputs equal the in-process compiled model's bit for bit and onnxruntime's
within 1e-3.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import byoc
from byoc.cliutil import safe_file_names
from byoc import cli
from byoc.testing.oracle import run_onnxruntime
from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs, zoo_path


@pytest.mark.parametrize("targets", [[], ["cpu"]], ids=["host", "cpu"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_file_compile_bundle_run(name, targets, tmp_path, capsys):
    assert onnx.load(str(zoo_path(name))).ir_version == 3
    model = load_zoo(name, seed=0, keep_ir_version=True)
    assert model.ir_version == 3
    inits = {t.name for t in model.graph.initializer}
    assert inits <= {i.name for i in model.graph.input}  # the IR-3 rule, kept
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = zoo_inputs(model, seed=1)
    args = []
    for i, (k, v) in enumerate(feeds.items()):
        np.save(tmp_path / f"in{i}.npy", v, allow_pickle=False)
        args += ["-i", f"{k}={tmp_path / f'in{i}.npy'}"]

    bundle = tmp_path / f"{name}.byoc"
    where = ["--host-only"] if not targets else [a for t in targets for a in ("-t", t)]
    assert cli.main(["compile", str(path), "-o", str(bundle), *where]) == 0
    assert cli.main(["run", str(bundle), *args, "-o", str(tmp_path / "out")]) == 0
    capsys.readouterr()

    compiled = byoc.compile(str(path), targets=targets)
    if targets:
        assert any(r.device == "cpu" for r in compiled.records.values()), f"{name}: nothing placed on cpu"
    want = compiled.run(feeds)
    expected = run_onnxruntime(model, feeds)
    for (out_name, got_compiled), ort in zip(want.items(), expected):
        from_bundle = np.load(tmp_path / "out" / safe_file_names([out_name], taken=["outputs.json"])[out_name],
                              allow_pickle=False)
        assert from_bundle.dtype == got_compiled.dtype and from_bundle.shape == got_compiled.shape
        assert from_bundle.tobytes() == got_compiled.tobytes(), f"{name}: {out_name} differs after the bundle"
        np.testing.assert_allclose(from_bundle, ort, rtol=1e-3, atol=1e-6, err_msg=f"{name}: {out_name}")


def test_save_refuses_what_load_would_refuse(tmp_path, monkeypatch):
    """A save that cannot be loaded is lost work: save applies the loader's checks first."""
    from byoc.errors import BundleError
    from byoc.bundle import writer as bundle_mod

    compiled = byoc.compile(load_zoo("squeezenet", keep_ir_version=True), targets=[])
    out = tmp_path / "m.byoc"
    compiled.save(out)
    assert byoc.load(out).run(zoo_inputs(load_zoo("squeezenet")))  # loads

    # had save not written the IR-3 form, the loader's checker would refuse it: save must too
    monkeypatch.setattr(bundle_mod, "_legacy_initializer_inputs", lambda proto: None)
    with pytest.raises(BundleError, match="cannot save the host graph.*initializer but not in graph input"):
        compiled.save(tmp_path / "broken.byoc")
    assert not (tmp_path / "broken.byoc").exists()


# -- input_shapes= / --shape ------------------------------------------------------------------


def _dynamic_batch_net() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu with a symbolic batch dimension "N", float32."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 8, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"], name="relu2"),
    ]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_input_shapes_give_vitis_regions_at_compile_time():
    m = _dynamic_batch_net()
    rng = np.random.default_rng(0)
    cal = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    dynamic = byoc.compile(m, targets=["vitis"], calibration=cal)
    assert not dynamic.regions and all(r.device == "host" for r in dynamic.records.values())

    for shapes in ({"N": 1}, {"x": [1, 3, 8, 8]}):
        fixed = byoc.compile(m, targets=["vitis"], calibration=cal, input_shapes=shapes)
        assert fixed.regions and {r.device for r in fixed.records.values()} == {"vitis"}, shapes
        report = fixed.report("json")
        import json

        data = json.loads(report)
        assert data["regions"] and all(r["target"] == "vitis" for r in data["regions"])
        assert "vitis" in fixed.report()
        feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
        want = run_onnxruntime(m, feeds)[0]
        got = fixed.run(feeds)["y"]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.1  # int8
        with pytest.raises(byoc.InputError, match="'x'"):
            fixed.run({"x": np.zeros((2, 3, 8, 8), np.float32)})


def test_cli_shape_on_compile_run_explain_partition(tmp_path, capsys):
    path = tmp_path / "dyn.onnx"
    onnx.save(_dynamic_batch_net(), str(path))
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x, allow_pickle=False)
    bundle = tmp_path / "dyn.byoc"
    assert cli.main(["compile", str(path), "-t", "cpu", "--shape", "x=2,3,8,8", "-o", str(bundle)]) == 0
    assert cli.main(["run", str(bundle), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out")]) == 0
    got = np.load(tmp_path / "out" / "y.npy", allow_pickle=False)
    np.testing.assert_allclose(got, run_onnxruntime(_dynamic_batch_net(), {"x": x})[0], rtol=1e-3, atol=1e-5)
    loaded = byoc.load(bundle)
    assert [list(v.shape) for v in loaded.model.graph.inputs] == [[2, 3, 8, 8]]
    assert cli.main(["run", str(bundle), "--shape", "N=1", "-i", f"x={tmp_path / 'x.npy'}"]) == 2
    assert "drop --shape" in capsys.readouterr().err

    assert cli.main(["run", str(path), "-t", "cpu", "--shape", "N=2", "-i", f"x={tmp_path / 'x.npy'}"]) == 0
    assert cli.main(["explain", str(path), "-t", "cpu", "--shape", "N=2", "--json", str(tmp_path / "r.json")]) == 0
    import json

    data = json.loads((tmp_path / "r.json").read_text())
    assert any(r["target"] == "cpu" for r in data["regions"])
    assert cli.main(["partition", str(path), "-t", "cpu", "--shape", "N=2", "-o", str(tmp_path / "p.onnx")]) == 0
    dims = onnx.load(str(tmp_path / "p.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [2, 3, 8, 8]
    capsys.readouterr()
    assert cli.main(["run", str(path), "--shape", "nope=1", "-i", f"x={tmp_path / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "OptionError" in err and "'nope'" in err and "'N'" in err
    assert cli.main(["run", str(path), "--shape", "x=a,b", "-i", f"x={tmp_path / 'x.npy'}"]) == 2


# -- every compiled model round-trips, with the cpu plugin ----------------------------------


def test_random_graphs_roundtrip_on_cpu():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from byoc.testing.graphs import LAYERS, layer_dags
    from byoc.testing.roundtrip import assert_roundtrip

    @settings(max_examples=15)
    @given(model=layer_dags(sorted(LAYERS), max_nodes=6), seed=st.integers(0, 2**31 - 1))
    def check(model, seed):
        rng = np.random.default_rng(seed)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in model.graph.input}
        assert_roundtrip(model, feeds, ["cpu"], "random graph")

    check()


def _node_cases():
    from byoc.testing.roundtrip import node_case_sample

    return node_case_sample(every=40)


@pytest.mark.parametrize("case", _node_cases(), ids=lambda c: c.name)
def test_node_cases_roundtrip_on_cpu(case):
    from byoc.testing.roundtrip import assert_roundtrip, node_case_feeds

    try:
        byoc.compile(case.model, targets=["cpu"])
    except byoc.ByocError as exc:
        pytest.skip(f"not compiled: {type(exc).__name__}: {exc}")
    assert_roundtrip(case.model, node_case_feeds(case), ["cpu"], case.name)


def test_a_model_specialised_at_run_time_saves_its_specialisations(tmp_path):
    """Found by the exporter corpus (onnxscript model with a symbolic batch, on cpu): cpu generates
    code per input shape, so the compiled model ran cpu code while its bundle held only the
    host base: other bits after loading. The bundle now keeps the specialisations (issue 18,
    class 6): the loaded model runs the same cpu code, bit for bit; fixed shapes round-trip too."""
    from byoc.testing.roundtrip import assert_roundtrip

    m = _dynamic_batch_net()
    compiled = byoc.compile(m, targets=["cpu"])
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)}
    before = compiled.run(feeds)
    compiled.save(tmp_path / "m.byoc")
    loaded = byoc.load(tmp_path / "m.byoc")
    assert np.array_equal(loaded.run(feeds)["y"], before["y"])
    assert [cr.region.target for s in loaded.specializer.cache.values() for cr in s.regions] == ["cpu"]
    assert_roundtrip(m, feeds, ["cpu"], "fixed batch", input_shapes={"N": 2})


# -- what a new plugin starts with --------------------------------------------------------------


def test_new_plugin_pins_the_core_and_starts_below_the_builtins(tmp_path, capsys):
    import importlib.util
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    from byoc.plugins import get_registry

    assert cli.main(["new-plugin", "newchip", "--dir", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    project = tomllib.loads((tmp_path / "p" / "pyproject.toml").read_text())["project"]
    assert "byoc-core>=2.0,<3" in project["dependencies"]
    assert not any(c.startswith("Framework :: byoc") for c in project.get("classifiers", []))
    # the target it registers: priority below every built-in (cpu is -10)
    spec = importlib.util.spec_from_file_location("byoc_newchip_plugin", tmp_path / "p" / "src" / "byoc_newchip" / "plugin.py")
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(tmp_path / "p" / "src"))
    try:
        spec.loader.exec_module(module)
        found = []
        module.byoc_register_targets(found.append)
    finally:
        sys.path.remove(str(tmp_path / "p" / "src"))
    builtins = [t for t in get_registry().targets.values() if t.name in ("cpu", "jetson", "vitis")]
    assert found and builtins
    assert all(found[0].priority < t.priority for t in builtins), (found[0].priority, [(t.name, t.priority) for t in builtins])


def test_plugins_pin_the_core_by_hook_api_major():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    core = tomllib.loads((root / "core" / "pyproject.toml").read_text())["project"]
    assert core["name"] == "byoc-core" and core["version"] == byoc.__version__
    major = int(core["version"].split(".")[0])
    for pyproject in sorted(root.glob("plugins/*/pyproject.toml")) + sorted(root.glob("tests/plugins/*/pyproject.toml")):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        assert f"byoc-core>={major}.0,<{major + 1}" in deps, pyproject
        assert not any(d.split("[")[0].split(">")[0].split("=")[0].strip() == "byoc" for d in deps), pyproject
