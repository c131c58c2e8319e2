"""The ``byoc`` command as a user runs it: the installed executable in a subprocess.

Every error case asserts exactly one line on stderr, a non-zero exit status, no traceback, and
that no existing file was touched. Plugins are switched off (``BYOC_PLUGINS=``) unless a test
needs one, so these run in the core's own environment; the int8 calibration flow (vitis) is in
``tests/test_cli_calibration.py``.
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

EXE = Path(sys.executable).with_name("byoc.exe" if os.name == "nt" else "byoc")
pytestmark = pytest.mark.skipif(not EXE.exists(), reason=f"the byoc executable is not installed beside {sys.executable}")


def byoc(*args: str, cwd: Path, env: dict[str, str] | None = None, plugins: str | None = "",
         timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BYOC_")}
    full_env["PYTHONIOENCODING"] = "utf-8"
    if plugins is not None:
        full_env["BYOC_PLUGINS"] = plugins
    full_env.update(env or {})
    return subprocess.run([str(EXE), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(done: subprocess.CompletedProcess, *needles: str, status: int = 2) -> str:
    err = done.stderr
    assert done.returncode == status, (done.returncode, err, done.stdout)
    assert "Traceback" not in err and "Traceback" not in done.stdout, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- models --------------------------------------------------------------------------------------


def conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: output names that clash once made file names: a/b -> a_b, a_b, .. -> output, output
HOSTILE_OUTPUTS = ["a/b", "a_b", "..", "output", "CON"]


def hostile_outputs_model() -> onnx.ModelProto:
    ops = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"]
    nodes = [helper.make_node(op, ["x"], [name], name=f"n{i}") for i, (op, name) in enumerate(zip(ops, HOSTILE_OUTPUTS))]
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in HOSTILE_OUTPUTS])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    onnx.save(conv_model(), d / "small.onnx")
    onnx.save(hostile_outputs_model(), d / "hostile.onnx")
    rng = np.random.default_rng(1)
    np.save(d / "x.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    np.save(d / "h.npy", rng.standard_normal((2, 3)).astype(np.float32))
    return d


# -- every command --------------------------------------------------------------------------------


def test_version_and_help(work):
    done = byoc("--version", cwd=work)
    assert done.returncode == 0 and done.stdout.startswith("byoc ")
    done = byoc("run", "--help", cwd=work)
    assert done.returncode == 0 and "--calibration" in done.stdout and "--progress" in done.stdout


def test_info(work):
    done = byoc("info", "small.onnx", cwd=work)
    assert done.returncode == 0, done.stderr
    assert "x: FLOAT [1, 3, 8, 8]" in done.stdout and "Conv" in done.stdout
    done = byoc("info", "small.onnx", "--json", cwd=work)
    data = json.loads(done.stdout)
    assert data["operators"] == {"Conv": 1, "Relu": 1} and data["unsupported_nodes"] == []


def test_targets_and_doctor_without_plugins(work):
    done = byoc("targets", cwd=work)
    assert done.returncode == 0 and "no targets installed" in done.stdout
    done = byoc("doctor", cwd=work)
    assert done.returncode == 0 and "no problems found" in done.stdout
    done = byoc("doctor", "--json", cwd=work)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True


def test_compile_run_bundle_host_only(work, tmp_path):
    done = byoc("compile", str(work / "small.onnx"), "--host-only", "-o", str(tmp_path / "m.byoc"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.byoc").is_file() and "bundle:" in done.stdout
    assert done.stderr == ""  # quiet in a pipe: no progress
    done = byoc("run", "m.byoc", "-i", f"x={work / 'x.npy'}", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    mapping = json.loads((tmp_path / "out" / "outputs.json").read_text())
    assert mapping == {"y": "y.npy"}
    y = np.load(tmp_path / "out" / "y.npy")
    assert y.shape == (1, 4, 8, 8) and (y >= 0).all()
    # a bare FILE.npy fills the inputs in order (the bundle's names are known once it is loaded)
    done = byoc("run", "m.byoc", "-o", "out2", str(work / "x.npy"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out2" / "y.npy"), y)


def test_progress_flag_writes_lines_to_stderr_only(work, tmp_path):
    done = byoc("run", str(work / "small.onnx"), "-i", f"x={work / 'x.npy'}", "--progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[byoc] compile: load and validate the model" in done.stderr
    assert "[byoc] first run" in done.stderr and "[byoc]" not in done.stdout
    assert done.stdout.startswith("y: float32 [1, 4, 8, 8]")


def test_explain_partition_and_reports(work, tmp_path):
    done = byoc("explain", str(work / "small.onnx"), "--json", "r.json", "--html", "r.html", "--dot", "r.dot",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["totals"]["nodes"] == 2
    assert "<noscript>" in (tmp_path / "r.html").read_text()
    done = byoc("partition", str(work / "small.onnx"), "-o", "p.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    onnx.checker.check_model(onnx.load(tmp_path / "p.onnx"))


def test_new_plugin(tmp_path):
    done = byoc("new-plugin", "mychip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "byoc-mychip" / "pyproject.toml").is_file()
    before = snapshot(tmp_path)
    assert_one_line_error(byoc("new-plugin", "mychip", cwd=tmp_path), "not empty")
    assert snapshot(tmp_path) == before


# -- every error of issue 16: one line, non-zero, no traceback, nothing overwritten ---------------


def test_npy_header_claiming_64_gib(work, tmp_path):
    big = tmp_path / "big.npy"
    header = {"descr": "<f4", "fortran_order": False, "shape": (4, 1024, 1024, 1024)}
    with big.open("wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 64)
    line = assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"x={big}", cwd=tmp_path), "x")
    assert "16.0 GiB" in line or "max_tensor_bytes" in line


def test_truncated_and_pickled_npy(work, tmp_path):
    short = tmp_path / "short.npy"
    np.save(short, np.zeros((1, 3, 8, 8), np.float32))
    short.write_bytes(short.read_bytes()[:-10])
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"x={short}", cwd=tmp_path), "truncated")
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"x={obj}", cwd=tmp_path), "never unpickles")
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", "x=nothere.npy", cwd=tmp_path), "not found")


def test_input_naming_a_directory(work, tmp_path):
    (tmp_path / "d").mkdir()
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", "x=d", cwd=tmp_path), "directory")


def test_output_dir_naming_an_existing_file(work, tmp_path):
    (tmp_path / "taken").write_text("keep me")
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"x={work / 'x.npy'}", "-o", "taken",
                               cwd=tmp_path), "not a folder")
    assert (tmp_path / "taken").read_text() == "keep me"


def test_output_names_made_safe_and_unique(work, tmp_path):
    done = byoc("run", str(work / "hostile.onnx"), "-i", f"x={work / 'h.npy'}", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    mapping = json.loads((out / "outputs.json").read_text())
    assert list(mapping) == HOSTILE_OUTPUTS
    files = list(mapping.values())
    assert len({f.lower() for f in files}) == len(files) == len(HOSTILE_OUTPUTS)
    assert all("/" not in f and "\\" not in f and not f.startswith(".") for f in files)
    assert sorted(p.name for p in out.iterdir()) == sorted(files + ["outputs.json"])
    x = np.load(work / "h.npy")
    expected = {"a/b": np.maximum(x, 0), "a_b": -x, "..": np.abs(x), "output": 1 / (1 + np.exp(-x)), "CON": np.tanh(x)}
    for name, want in expected.items():
        np.testing.assert_allclose(np.load(out / mapping[name]), want, rtol=1e-5, atol=1e-6)
        assert f"-> out/{mapping[name]}" in done.stdout or f"-> {out / mapping[name]}" in done.stdout
    # a second run into the same folder overwrites nothing unless --force
    before = snapshot(out)
    assert_one_line_error(byoc("run", str(work / "hostile.onnx"), "-i", f"x={work / 'h.npy'}", "-o", "out",
                               cwd=tmp_path), "already exist", "--force")
    assert snapshot(out) == before
    done = byoc("run", str(work / "hostile.onnx"), "-i", f"x={work / 'h.npy'}", "-o", "out", "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_output_paths_checked_before_any_work(work, tmp_path):
    done = byoc("explain", str(work / "small.onnx"), "--html", "nodir/x.html", "--progress", cwd=tmp_path)
    assert_one_line_error(done, "--html", "nodir", "does not exist")
    assert done.stdout == ""  # no table: nothing was compiled
    (tmp_path / "adir").mkdir()
    assert_one_line_error(byoc("compile", str(work / "small.onnx"), "--host-only", "-o", "adir", cwd=tmp_path),
                          "folder")
    assert_one_line_error(byoc("partition", str(work / "small.onnx"), "-o", "nodir/p.onnx", cwd=tmp_path), "nodir")
    assert_one_line_error(byoc("explain", str(work / "small.onnx"), "--json", "same", "--dot", "same", cwd=tmp_path),
                          "both write")
    assert not (tmp_path / "same").exists()


def test_misspelt_option_gets_a_suggestion(work, tmp_path):
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "--taget", "cpu", cwd=tmp_path),
                          "'--taget'", "did you mean '--target'")
    assert_one_line_error(byoc("--taget", "cpu", "run", cwd=tmp_path), "did you mean '--target'")
    assert_one_line_error(byoc("rnu", "small.onnx", cwd=tmp_path), "did you mean 'run'")
    assert_one_line_error(byoc(cwd=tmp_path), "command")


def test_unnamed_input_files(work, tmp_path):
    assert_one_line_error(byoc("run", str(work / "small.onnx"), str(work / "x.npy"), str(work / "x.npy"),
                               cwd=tmp_path), "2 input file(s) without a name", "['x']", "NAME=FILE.npy")
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "=x.npy", cwd=tmp_path), "NAME=FILE.npy or FILE.npy")
    done = byoc("run", str(work / "small.onnx"), "-i", str(work / "x.npy"), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("y: float32 [1, 4, 8, 8]"), done.stderr


def test_same_input_twice(work, tmp_path):
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"x={work / 'x.npy'}", "-i",
                               f"x={work / 'x.npy'}", cwd=tmp_path), "'x' given twice")


def test_unknown_target_lists_available_targets(work, tmp_path):
    line = assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"x={work / 'x.npy'}", "-t", "nosuch",
                                      cwd=tmp_path), "unknown target 'nosuch'", "available targets")
    assert "PluginError" not in line
    assert_one_line_error(byoc("conformance", "nosuch", "-q", cwd=tmp_path), "unknown target 'nosuch'")
    assert_one_line_error(byoc("compile", str(work / "small.onnx"), "-t", "nosuch", "-o", "m.byoc", cwd=tmp_path),
                          "unknown target")
    assert not (tmp_path / "m.byoc").exists()


def test_conformance_without_hypothesis(work, tmp_path):
    fake = tmp_path / "nohyp" / "hypothesis"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hypothesis'\", name='hypothesis')\n")
    env = {"PYTHONPATH": str(fake.parent)}
    assert_one_line_error(byoc("conformance", "anything", cwd=tmp_path, env=env), "pip install hypothesis")


def test_missing_model_and_bad_model(work, tmp_path):
    assert_one_line_error(byoc("run", "nothere.onnx", cwd=tmp_path), "not found")
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07garbage" * 10)
    assert_one_line_error(byoc("info", "junk.onnx", cwd=tmp_path), "junk.onnx")
    assert_one_line_error(byoc("run", str(work / "small.onnx"), cwd=tmp_path), "missing input 'x'")
    assert_one_line_error(byoc("run", str(work / "small.onnx"), "-i", f"q={work / 'x.npy'}", cwd=tmp_path),
                          "unknown input name(s) ['q']")


def test_calibration_argument_errors(work, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(byoc("compile", str(work / "small.onnx"), "--calibration", "empty", "-o", "m.byoc",
                               cwd=tmp_path), "no .npz files")
    np.savez(tmp_path / "wrong.npz", z=np.zeros((2, 1, 3, 8, 8), np.float32))
    assert_one_line_error(byoc("compile", str(work / "small.onnx"), "--calibration", "wrong.npz", "-o", "m.byoc",
                               cwd=tmp_path), "missing ['x']", "unknown ['z']")
    assert_one_line_error(byoc("compile", str(work / "small.onnx"), "--calibration-samples", "2", "-o", "m.byoc",
                               cwd=tmp_path), "--calibration-samples needs --calibration")
    assert not (tmp_path / "m.byoc").exists()


def test_debug_shows_the_traceback(work, tmp_path):
    for args, env in ((["--debug", "run", "nothere.onnx"], None), (["run", "nothere.onnx", "--debug"], None),
                      (["run", "nothere.onnx"], {"BYOC_DEBUG": "1"})):
        done = byoc(*args, cwd=tmp_path, env=env)
        assert done.returncode == 2
        assert "Traceback (most recent call last)" in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("byoc run: error: InputError: model: file not found")


# every command that writes a named file: an existing one is kept unless --force
WRITERS = [
    ("compile", ["--host-only", "-o", "{out}"], "--output"),
    ("explain", ["--json", "{out}"], "--json"),
    ("explain", ["--dot", "{out}"], "--dot"),
    ("explain", ["--html", "{out}"], "--html"),
    ("partition", ["-o", "{out}"], "--output"),
]


@pytest.mark.parametrize(("command", "args", "option"), WRITERS, ids=[f"{c}-{o}" for c, _, o in WRITERS])
def test_an_existing_file_is_overwritten_only_with_force(work, tmp_path, command, args, option):
    out = tmp_path / "existing.out"
    out.write_bytes(b"the user's own file")
    argv = [command, str(work / "small.onnx"), *[a.format(out=out) for a in args]]
    done = byoc(*argv, cwd=tmp_path)
    assert_one_line_error(done, option, "already exists", "--force")
    assert out.read_bytes() == b"the user's own file"
    done = byoc(*argv, "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() != b"the user's own file"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
