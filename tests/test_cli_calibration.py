"""``byoc compile MODEL -t vitis --calibration DIR -o m.byoc`` then ``byoc run m.byoc``: int8 targets
from the command line (issue 16, acceptance 2), run as a user does: the executable in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("byoc_vitis")
EXE = Path(sys.executable).with_name("byoc.exe" if os.name == "nt" else "byoc")
pytestmark = pytest.mark.skipif(not EXE.exists(), reason="the byoc executable is not installed")


def byoc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BYOC_")}
    env["BYOC_PLUGINS"] = "vitis"
    return subprocess.run([str(EXE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("calib")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32) * 0.1, "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), d / "small.onnx")
    (d / "calib").mkdir()
    samples = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(6)]
    for i, x in enumerate(samples):
        np.savez(d / "calib" / f"{i:03d}.npz", x=x)
    np.savez(d / "stacked.npz", x=np.stack(samples))
    np.save(d / "x.npy", samples[0])
    return d


def _reference(work: Path) -> np.ndarray:
    from byoc.testing.oracle import run_onnxruntime

    pytest.importorskip("onnxruntime")
    return run_onnxruntime(onnx.load(work / "small.onnx"), {"x": np.load(work / "x.npy")})[0]


def test_compile_vitis_with_calibration_dir_then_run_the_bundle(work, tmp_path):
    done = byoc("compile", str(work / "small.onnx"), "-t", "vitis", "--calibration", str(work / "calib"),
                "-o", "m.byoc", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "calibration: 6 sample(s)" in done.stdout and "vitis 2" in done.stdout
    done = byoc("run", "m.byoc", "-i", f"x={work / 'x.npy'}", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    files = json.loads((tmp_path / "out" / "outputs.json").read_text())
    got = np.load(tmp_path / "out" / files["y"])
    want = _reference(work)
    # int8: within the vitis target's declared tolerance, relative to the output's range
    from byoc_vitis.plugin import ATOL, RTOL

    assert np.max(np.abs(got - want)) <= ATOL + RTOL * np.max(np.abs(want))


def test_stacked_npz_and_sample_limit(work, tmp_path):
    done = byoc("compile", str(work / "small.onnx"), "-t", "vitis", "--calibration", str(work / "stacked.npz"),
                "--calibration-samples", "3", "-o", "m.byoc", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "calibration: 3 sample(s)" in done.stdout


def test_vitis_without_calibration_is_one_line(work, tmp_path):
    done = byoc("compile", str(work / "small.onnx"), "-t", "vitis", "-o", "m.byoc", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--calibration DIR|FILE.npz" in done.stderr
    assert not (tmp_path / "m.byoc").exists()
