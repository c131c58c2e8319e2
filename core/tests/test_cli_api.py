"""The Python side of issue 16: ``byoc.info``/``byoc.doctor``, ``CompiledModel.run_batch``, progress
reporting (``byoc.progress``), calibration files, safe output names, and the HTML report without
JavaScript (headless Chromium, scripts off).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc import progress
from byoc.cliutil import safe_file_names
from byoc.errors import InputError, OptionError, ResourceLimitError
from byoc.quantize.samples import load_calibration


def batch_model(batch: object = "N") -> onnx.ModelProto:
    """y = relu(x @ w) + z, per row: a named batch axis when ``batch`` is a string."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10 - 0.5, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "z"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def batched():
    return byoc.compile(batch_model(), targets=[])


def _feeds(n: int, rows: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((rows, 3)).astype(np.float32),
             "z": rng.standard_normal((rows, 4)).astype(np.float32)} for _ in range(n)]


# -- run_batch ------------------------------------------------------------------------------------


@settings(max_examples=15)
@given(n=st.integers(0, 9), batch_size=st.integers(1, 4), rows=st.integers(1, 3))
def test_run_batch_equals_one_run_per_feed(batched, n, batch_size, rows):
    feeds = _feeds(n, rows)
    got = list(batched.run_batch(feeds, batch_size=batch_size))
    assert len(got) == n
    for feed, out in zip(feeds, got):
        want = batched.run(feed)
        assert list(out) == ["y"]
        # BLAS may sum a batch of rows in another order than one row (OpenBLAS on AMD Zen: gemm
        # against gemv): equal to float32 rounding, not bit for bit
        np.testing.assert_allclose(out["y"], want["y"], rtol=1e-6, atol=1e-7)


def test_run_batch_batches_when_the_model_has_a_batch_axis(batched, monkeypatch):
    calls = []
    original = type(batched).run

    def counting(self, feeds, **kw):
        calls.append(len(feeds["x"]))
        return original(self, feeds, **kw)

    monkeypatch.setattr(type(batched), "run", counting)
    list(batched.run_batch(_feeds(7), batch_size=3))
    assert calls == [3, 3, 1]


def test_run_batch_without_batch_axis_runs_each_feed(monkeypatch):
    cm = byoc.compile(batch_model(batch=1), targets=[])
    assert cm._batch_axis() is None
    calls = []
    original = type(cm).run
    monkeypatch.setattr(type(cm), "run", lambda self, f, **kw: calls.append(1) or original(self, f, **kw))
    assert len(list(cm.run_batch(_feeds(4), batch_size=4))) == 4
    assert len(calls) == 4


def test_run_batch_mixed_shapes_and_errors(batched):
    feeds = _feeds(2, rows=1) + _feeds(2, rows=2, seed=1)
    feeds[2]["x"] = feeds[2]["x"].astype(np.float64)  # cannot join the batch: starts one, then fails alone
    with pytest.raises(InputError, match="feed #2"):
        list(batched.run_batch(feeds, batch_size=4))
    with pytest.raises(OptionError, match="batch_size"):
        batched.run_batch([], batch_size=0)
    with pytest.raises(InputError, match="feed #0"):
        list(batched.run_batch([42], batch_size=2))


# -- info / doctor ----------------------------------------------------------------------------------


def test_info_api(tmp_path):
    model = batch_model()
    model.graph.node.append(helper.make_node("NoSuchOp", ["y"], ["q"], name="weird", domain="vendor.x"))
    model.opset_import.append(helper.make_opsetid("vendor.x", 1))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    found = byoc.info(path)
    assert found.name == str(path)
    assert [t.name for t in found.inputs] == ["x", "z"] and found.inputs[0].shape == ["N", 3]
    assert found.operators == {"Add": 1, "MatMul": 1, "Relu": 1, "vendor.x::NoSuchOp": 1}
    assert not found.supported and found.unsupported_nodes == ["weird"]
    assert found.unsupported_operators == ["vendor.x::NoSuchOp"]
    assert "(unsupported)" in found.format() and found.to_json()["nodes"] == 4
    assert byoc.info(batch_model()).supported


def test_doctor_api():
    from byoc.plugins import build_registry

    class Good:
        @byoc.hookimpl
        def byoc_register_targets(self, register):
            register(byoc.Target("npu", version="1", device="npu"))

    class Broken:
        @byoc.hookimpl
        def byoc_register_targets(self, register):
            raise ValueError("no driver")

    report = byoc.doctor(build_registry([("good", Good())], entry_points=False))
    assert report.ok and report.usable_targets == ["npu"] and "no problems found" in report.format()
    with pytest.warns(UserWarning):
        reg = build_registry([("good", Good()), ("broken", Broken())], entry_points=False)
    report = byoc.doctor(reg)
    assert not report.ok and [p.kind for p in report.problems] == ["broken"]
    assert report.problems[0].plugin == "broken" and "no driver" in report.problems[0].message
    assert report.to_json()["ok"] is False


# -- progress ---------------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.events = []

    def start(self, task):
        self.events.append(("start", task.label, task.total))

    def update(self, task):
        self.events.append(("update", task.label, task.completed))

    def finish(self, task):
        self.events.append(("finish", task.label, task.completed))


def test_progress_is_silent_by_default_and_reports_compile_and_first_run():
    assert not progress.active()
    with progress.phase("nobody listens", total=3) as task:
        task.advance()  # a no-op
    rec = Recorder()
    with progress.listen(rec):
        cm = byoc.compile(batch_model(), targets=[])
        cm.run(_feeds(1)[0])
        cm.run(_feeds(1)[0])  # warm: nothing reported
    labels = [label for kind, label, _ in rec.events if kind == "start"]
    assert labels[:2] == ["compile: load and validate the model", "compile: shared passes"]
    assert "compile: execution plan" in labels
    assert labels.count("first run (Numba compiles or loads the kernels)") == 1
    steps = [n for kind, label, n in rec.events if kind == "finish" and label.startswith("first run")]
    assert steps == [2]  # three steps: two done when the third starts, finishing closes the task
    starts = sum(kind == "start" for kind, _, _ in rec.events)
    assert starts == sum(kind == "finish" for kind, _, _ in rec.events)


def test_a_broken_listener_never_breaks_a_compile():
    class Broken:
        def start(self, task):
            raise RuntimeError("display gone")

        update = finish = start

    with progress.listen(Broken()):
        cm = byoc.compile(batch_model(), targets=[])
        assert cm.run(_feeds(1)[0])["y"].shape == (1, 4)


def test_line_listener_output():
    import io

    from byoc.terminal import show_progress

    buf = io.StringIO()
    with show_progress(True, buf):
        with progress.phase("calibration", total=2) as task:
            task.advance()
            task.advance()
    text = buf.getvalue()
    assert "[byoc] calibration (2 steps) ..." in text and "[byoc] calibration: done in" in text
    buf = io.StringIO()
    with show_progress(None, buf):  # not a terminal: quiet
        with progress.phase("calibration"):
            pass
    assert buf.getvalue() == ""


# -- calibration files -------------------------------------------------------------------------------


def test_load_calibration_folder_and_stacked(tmp_path):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 3)).astype(np.float32) for _ in range(5)]
    (tmp_path / "d").mkdir()
    for i, x in enumerate(xs):
        np.savez(tmp_path / "d" / f"{i}.npz", x=x)
    (tmp_path / "d" / "README.txt").write_text("ignored")
    samples = load_calibration(tmp_path / "d", input_names=["x"])
    assert len(samples) == 5
    for got, want in zip(samples, xs):
        np.testing.assert_array_equal(got["x"], want)
    assert len(load_calibration(tmp_path / "d", samples=2)) == 2
    np.savez(tmp_path / "s.npz", x=np.stack(xs))
    stacked = load_calibration(tmp_path / "s.npz", samples=3, input_names=["x"])
    assert len(stacked) == 3 and stacked[2]["x"].shape == (1, 3)
    np.testing.assert_array_equal(stacked[2]["x"], xs[2])


def test_load_calibration_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_calibration(tmp_path / "nothere")
    np.savez(tmp_path / "uneven.npz", x=np.zeros((3, 2)), z=np.zeros((4, 2)))
    with pytest.raises(InputError, match="disagree"):
        load_calibration(tmp_path / "uneven.npz")
    np.savez(tmp_path / "scalar.npz", x=np.float32(1))
    with pytest.raises(InputError, match="scalar"):
        load_calibration(tmp_path / "scalar.npz")
    np.savez(tmp_path / "obj.npz", x=np.array([{}], dtype=object))
    with pytest.raises(InputError, match="never unpickles"):
        load_calibration(tmp_path / "obj.npz")
    with pytest.raises(InputError, match="at least 1"):
        load_calibration(tmp_path / "uneven.npz", samples=0)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not an .npz"):
        load_calibration(tmp_path / "bad.npz")


def test_npy_header_checked_against_the_budget(tmp_path):
    from byoc.arrays import load_npy

    path = tmp_path / "a.npy"
    np.save(path, np.zeros((64, 64), np.float32))
    with pytest.raises(ResourceLimitError, match="max_tensor_bytes"):
        load_npy(path, "input 'a'", byoc.Budget(max_tensor_bytes=1024))
    assert load_npy(path).shape == (64, 64)


# -- safe output names --------------------------------------------------------------------------------


@given(st.lists(st.text(max_size=12), max_size=12, unique=True))
def test_safe_file_names_are_safe_and_unique(names):
    files = safe_file_names(names, taken=["outputs.json"])
    assert list(files) == names
    lowered = [f.lower() for f in files.values()]
    assert len(set(lowered)) == len(lowered) and "outputs.json" not in lowered
    for f in files.values():
        assert re.fullmatch(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*\.npy", f), f
        assert f.split(".")[0].lower() not in ("con", "nul", "aux", "prn")


# -- the HTML report without JavaScript ----------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    the browser reads commands on fd 3 and writes answers on fd 4, each JSON followed by NUL).
    ``--dump-dom`` cannot be used: it needs JavaScript, which these checks switch off."""

    def __init__(self, exe: str, profile: Path):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # in the child: fds 3 and 4 as the protocol expects
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
               "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, close_fds=False, preexec_fn=wire,
                                     env={**os.environ, "HOME": str(profile)})
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self) -> dict:
        import json
        import select

        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from_child], [], [], 60)
            assert ready, "chromium did not answer within 60 s"
            chunk = os.read(self._from_child, 1 << 20)
            assert chunk, "chromium closed the protocol pipe"
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method: str, session: str | None = None, **params) -> dict:
        import json

        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._id:
                assert "error" not in answer, answer
                return answer.get("result", {})
            self.events.append(answer)

    def wait_event(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read())

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._to_child)
        os.close(self._from_child)


def _open_without_scripts(html: str, selector: str):
    """Open ``html`` with JavaScript off; returns (has #byoc-ok, rows of ``selector`` as HTML, laid out)."""
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium binary on PATH (apt-get install -y chromium) to check the HTML report")
    if os.name != "posix":
        pytest.skip("the DevTools pipe is wired with POSIX file descriptors")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(html, encoding="utf-8")
        browser = _Browser(exe, Path(tmp) / "profile")
        try:
            target = browser.send("Target.createTarget", url="about:blank")["targetId"]
            session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            browser.send("Emulation.setScriptExecutionDisabled", session, value=True)
            browser.send("Page.enable", session)
            browser.send("Page.navigate", session, url=page.as_uri())
            browser.wait_event("Page.loadEventFired")
            root = browser.send("DOM.getDocument", session, depth=-1)["root"]["nodeId"]
            ok = browser.send("DOM.querySelector", session, nodeId=root, selector="#byoc-ok")["nodeId"]
            rows = browser.send("DOM.querySelectorAll", session, nodeId=root, selector=selector)["nodeIds"]
            html_rows = [browser.send("DOM.getOuterHTML", session, nodeId=n)["outerHTML"] for n in rows]
            table = browser.send("DOM.querySelector", session, nodeId=root, selector="#byoc-static-nodes")["nodeId"]
            box = browser.send("DOM.getBoxModel", session, nodeId=table)["model"] if table else None
        finally:
            browser.close()
    return bool(ok), html_rows, box


def test_html_report_reads_without_javascript():
    cm = byoc.compile(batch_model(), targets=[])
    data = cm.report_data()
    data["nodes"][0]["name"] = "<b>mm</b> & \"quoted\" __BYOC_PAYLOAD__"
    from byoc.report import render

    ran, rows, box = _open_without_scripts(render(data, "html"), "#byoc-static-nodes tr")
    assert not ran  # the page's script did not run
    # parsed as a real table (with scripts on, <noscript> content is inert text) and laid out
    assert len(rows) == 1 + len(data["nodes"])  # the header and one row per node
    assert box is not None and box["width"] > 0 and box["height"] > 0
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows[1:]]
    assert [c[2] for c in cells] == [n["op_type"] for n in data["nodes"]]
    assert cells[0][1] == "&lt;b&gt;mm&lt;/b&gt; &amp; \"quoted\" __BYOC_PAYLOAD__"  # text, never markup
    assert all(c[3] == "host" for c in cells)
