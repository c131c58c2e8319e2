"""Bundles carry OpenVINO's compiled blob: loading imports it without compiling; a blob that does
not fit this machine is recompiled from the region's ONNX (a RecompileWarning says why); the
callable is safe from several threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from ov_helpers import onnxruntime_run, stats

import byoc
from byoc.contract import Artifact
from byoc.testing.zoo import load_zoo, zoo_inputs

from byoc_openvino import codegen, engine
from byoc_openvino.options import validate_options
from byoc_openvino.runtime import OpenVINORegion, RecompileWarning, load

MODEL = "squeezenet"


@pytest.fixture(scope="module")
def squeezenet():
    model = load_zoo(MODEL, seed=0)
    return model, zoo_inputs(model, seed=1)


def _byoc(*args, env=None, cwd=None):
    exe = Path(sys.executable).with_name("byoc")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "byoc"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def test_cli_compile_then_run_in_another_process_imports_without_compiling(tmp_path, squeezenet):
    import onnx

    model, feeds = squeezenet
    onnx.save(model, tmp_path / "m.onnx")
    (name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "BYOC_OPENVINO_VERBOSE": "1", "BYOC_PLUGINS": "openvino"}
    done = _byoc("compile", str(tmp_path / "m.onnx"), "-t", "openvino", "-o", str(tmp_path / "m.byoc"), env=env)
    assert done.returncode == 0, done.stderr
    assert "compile_model" in done.stderr
    ran = _byoc("run", str(tmp_path / "m.byoc"), f"{name}={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out"), env=env)
    assert ran.returncode == 0, ran.stderr
    assert "import_model" in ran.stderr and "no compile" in ran.stderr
    assert "compile_model" not in ran.stderr, ran.stderr
    outputs = json.loads((tmp_path / "out" / "outputs.json").read_text())
    got = np.load(tmp_path / "out" / next(iter(outputs.values())))
    np.testing.assert_allclose(got, onnxruntime_run(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_load_in_a_fresh_process_counts_no_compile(tmp_path, squeezenet):
    model, feeds = squeezenet
    cm = byoc.compile(model, targets=["openvino"], strict=True)
    assert [r.region.target for r in cm.regions] == ["openvino"]
    path = cm.save(tmp_path / "m.byoc")
    np.savez(tmp_path / "feeds.npz", **feeds)
    code = (
        "import json, sys, numpy as np, byoc\n"
        "from byoc_openvino import engine\n"
        f"m = byoc.load({str(path)!r})\n"
        f"feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))\n"
        "out = m.run(feeds)\n"
        f"np.save({str(tmp_path / 'got.npy')!r}, next(iter(out.values())))\n"
        "print(json.dumps(engine.STATS))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["compiles"] == 0 and counts["imports"] == 1, counts
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), next(iter(cm.run(feeds).values())))


def test_same_region_twice_gives_identical_artifacts(squeezenet):
    model, _ = squeezenet
    a = byoc.compile(model, targets=["openvino"], strict=True).regions[0].artifact
    b = byoc.compile(model, targets=["openvino"], strict=True).regions[0].artifact
    assert a.data == b.data and a.metadata == b.metadata


def test_artifact_records_version_device_and_what_the_blob_needs(squeezenet):
    model, _ = squeezenet
    art = byoc.compile(model, targets=["openvino"], strict=True).regions[0].artifact
    meta = art.metadata
    assert meta["openvino"] == engine.version() and meta["device"] == "CPU"
    assert meta["blob"]["needs"].get("isa"), meta["blob"]
    assert meta["settings"] == {"precision": "f32", "performance_hint": "LATENCY"}
    onnx_bytes, weights, blob = codegen.unpack(art.data)
    assert len(blob) == meta["blob"]["bytes"] and len(weights) > 1_000_000  # the weights, stored once


def _artifact_from_elsewhere(art: Artifact, **changes) -> Artifact:
    meta = json.loads(json.dumps(art.metadata))
    meta.update(changes)
    return Artifact(art.target, art.format, art.data, meta)


def test_a_blob_from_another_openvino_is_recompiled_with_a_warning(squeezenet):
    model, feeds = squeezenet
    cm = byoc.compile(model, targets=["openvino"], strict=True)
    art = _artifact_from_elsewhere(cm.regions[0].artifact, openvino="2026.0.0-17289-elsewhere")
    before = stats()
    with pytest.warns(RecompileWarning, match="OpenVINO 2026.0.0"):
        fn = load(art, validate_options())
    assert stats()["compiles"] == before["compiles"] + 1 and stats()["imports"] == before["imports"]
    assert isinstance(fn, OpenVINORegion) and "2026.0.0" in fn.recompiled
    (x,) = feeds.values()
    np.testing.assert_allclose(fn(x)[0], next(iter(cm.run(feeds).values())), rtol=1e-5, atol=1e-6)


def test_a_bundle_recompiled_on_load_says_so_in_its_report(tmp_path, squeezenet, monkeypatch):
    """A bundle whose blob another OpenVINO made: byoc.load recompiles the region, and the report
    (text and JSON) has a line for it."""
    model, feeds = squeezenet
    cm = byoc.compile(model, targets=["openvino"], strict=True)
    assert cm.report_data()["regions"][0]["note"] is None
    path = cm.save(tmp_path / "m.byoc")
    monkeypatch.setattr(engine, "version", lambda: "2099.1.0-elsewhere")
    with pytest.warns(RecompileWarning):
        loaded = byoc.load(path)
    (region,) = loaded.report_data()["regions"]
    assert "recompiled" in region["note"] and "2099.1.0" in region["note"]
    assert f"{region['name']}: recompiled" in loaded.report()
    np.testing.assert_allclose(next(iter(loaded.run(feeds).values())), next(iter(cm.run(feeds).values())),
                               rtol=1e-5, atol=1e-6)


def test_a_blob_for_another_device_or_isa_is_recompiled(squeezenet):
    model, _ = squeezenet
    art = byoc.compile(model, targets=["openvino"], strict=True).regions[0].artifact
    with pytest.warns(RecompileWarning, match="device 'GPU'"):
        assert load(_artifact_from_elsewhere(art, device="GPU"), validate_options()).recompiled
    blob = dict(art.metadata["blob"], needs={"isa": "Intel AMX"})
    with pytest.warns(RecompileWarning, match="Intel AMX"):
        assert load(_artifact_from_elsewhere(art, blob=blob), validate_options()).recompiled


def test_an_altered_artifact_is_refused_before_openvino_sees_it(squeezenet):
    model, _ = squeezenet
    art = byoc.compile(model, targets=["openvino"], strict=True).regions[0].artifact
    data = bytearray(art.data)
    data[-100] ^= 0xFF
    with pytest.raises(byoc.PluginError, match="blob section does not match"):
        load(Artifact(art.target, art.format, bytes(data), art.metadata), validate_options())


def test_infer_from_several_threads(squeezenet):
    model, feeds = squeezenet
    cm = byoc.compile(model, targets=["openvino"], strict=True)
    (name, x), = feeds.items()
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(x.shape).astype(np.float32) for _ in range(6)]
    want = [next(iter(cm.run({name: a}).values())) for a in inputs]
    got: dict[int, np.ndarray] = {}
    errors = []

    def work(i):
        try:
            for _ in range(3):
                got[i] = next(iter(cm.run({name: inputs[i]}).values()))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w)
    # the runtime's callable itself, from several threads started together
    fn = load(cm.regions[0].artifact, validate_options())
    barrier = threading.Barrier(4)
    results: dict[int, np.ndarray] = {}

    def direct(i):
        barrier.wait()
        for _ in range(3):
            results[i] = fn(inputs[i])[0]

    threads = [threading.Thread(target=direct, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_array_equal(results[i], want[i])
    assert 1 <= fn.requests_made <= 4  # one infer request per concurrent call at most, reused after


def test_wrong_arity_raises_a_byoc_error(squeezenet):
    model, _ = squeezenet
    art = byoc.compile(model, targets=["openvino"], strict=True).regions[0].artifact
    fn = load(art, validate_options())
    with pytest.raises(byoc.InputError, match="takes 1 inputs"):
        fn()


def test_host_fallback_when_recompiling_fails(tmp_path, squeezenet, monkeypatch):
    """A blob that does not fit and cannot be recompiled: byoc.load(fallback="host") runs the
    region on the host with a report line; without it the load is refused."""
    model, feeds = squeezenet
    cm = byoc.compile(model, targets=["openvino"], strict=True)
    path = cm.save(tmp_path / "m.byoc")
    monkeypatch.setattr(engine, "version", lambda: "2099.0.0-other")

    def refuse(*a, **k):
        raise RuntimeError("this OpenVINO cannot compile it")

    monkeypatch.setattr(engine, "compile_model", refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        with pytest.raises(byoc.BundleError, match="recompiling"):
            byoc.load(path)
        with pytest.warns(UserWarning, match="runs on the host"):
            loaded = byoc.load(path, fallback="host")
    data = loaded.report_data()
    assert data["regions"][0]["host_fallback"] and "recompiling" in data["regions"][0]["host_fallback"]
    np.testing.assert_allclose(next(iter(loaded.run(feeds).values())), next(iter(cm.run(feeds).values())),
                               rtol=1e-4, atol=1e-5)
