"""Shared fused loops (issue 19): the same loop body in two regions or two models is one file and
one compiled function, whatever its extents, strides and constants; results stay right; the
loop files are checked before they are imported and rewritten when they were changed."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from cpu_helpers import assert_close, compile_cpu, make_model, onnxruntime_run
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from numba.core import event

from byoc.contract import PluginError

import byoc_cpu.loops as loops
from byoc_cpu import runtime

SHARED = re.compile(r"^(fused\d+) = shared_loop\('''\\\n(.*?)'''\)$", re.S | re.M)


def chain_model(shape, alpha, lo, hi, bias):
    """LeakyRelu(x + bias) clipped to [lo, hi]: one fused loop whose constants are the arguments."""
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]),
             helper.make_node("LeakyRelu", ["s"], ["l"], alpha=alpha),
             helper.make_node("Clip", ["l", "lo", "hi"], ["y"])]
    inits = {"b": np.float32(bias), "lo": np.float32(lo), "hi": np.float32(hi)}
    return make_model(nodes, {"x": shape}, ["y"], inits)


def loop_texts(cm) -> dict[str, str]:
    src = cm.regions[0].artifact.metadata["source"]
    return {name: text for name, text in SHARED.findall(src)}


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache folder and nothing imported yet in this process."""
    monkeypatch.setenv("BYOC_CPU_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loops, "_loops", {})
    monkeypatch.setattr(runtime, "_modules", {})
    return tmp_path / "cache"


class Compiles(event.Listener):
    def __init__(self):
        self.names = []

    def on_start(self, ev):
        pass

    def on_end(self, ev):
        self.names.append(ev.data["dispatcher"].py_func.__qualname__)


@settings(max_examples=6)
@given(shape=st.sampled_from([(2, 3), (4, 5), (1, 7), (3, 2)]),
       alpha=st.floats(0.015625, 0.5, width=32), lo=st.floats(-2, -0.125, width=32), hi=st.floats(0.125, 2, width=32),
       bias=st.floats(-1, 1, width=32))
def test_same_loop_other_shapes_and_constants_gives_right_results(shape, alpha, lo, hi, bias):
    model = chain_model(shape, alpha, lo, hi, bias)
    x = np.random.default_rng(0).uniform(-3, 3, shape).astype(np.float32)
    cm = compile_cpu(model)
    assert_close(cm.run({"x": x}), onnxruntime_run(model, {"x": x}))
    # constants are arguments: no float literal of the model is written into the loop's text
    for text in loop_texts(cm).values():
        assert "fromhex" not in text


def test_two_models_share_one_compiled_loop(fresh):
    a = chain_model((2, 3), 0.1, -1.0, 1.0, 0.5)
    b = chain_model((5, 4), 0.3, -0.5, 2.0, -0.25)
    cma = compile_cpu(a)
    texts_a = loop_texts(cma)
    assert texts_a, "the chain was not fused into a shared loop"
    fn_a = [loops.shared_loop(t) for t in texts_a.values()]
    seen = Compiles()
    with event.install_listener("numba:compile", seen):
        cmb = compile_cpu(b)
    assert list(loop_texts(cmb).values()) == list(texts_a.values())
    assert [loops.shared_loop(t) for t in loop_texts(cmb).values()] == fn_a  # the same objects
    assert seen.names == []  # model b compiled nothing: its region loads a's loop
    files = sorted(p.name for p in fresh.glob("byoc_loop_*.py"))
    assert len(files) == len(texts_a)
    for p in fresh.glob("byoc_loop_*.py"):  # the file name is the SHA-256 of its bytes
        assert p.stem == "byoc_loop_" + hashlib.sha256(p.read_bytes()).hexdigest()
    for model, cm, shape in ((a, cma, (2, 3)), (b, cmb, (5, 4))):
        x = np.random.default_rng(1).uniform(-3, 3, shape).astype(np.float32)
        assert_close(cm.run({"x": x}), onnxruntime_run(model, {"x": x}))


def test_a_changed_loop_file_is_rewritten_not_run(fresh):
    model = chain_model((3, 4), 0.2, -1.0, 1.5, 0.1)
    compile_cpu(model)
    (path,) = fresh.glob("byoc_loop_*.py")
    good = path.read_bytes()
    path.write_text("import os\nos.environ['BYOC_PWNED'] = '1'\n")
    loops._loops.clear()
    runtime._modules.clear()
    cm = compile_cpu(model)
    assert path.read_bytes() == good
    x = np.ones((3, 4), np.float32)
    assert_close(cm.run({"x": x}), onnxruntime_run(model, {"x": x}))


@pytest.mark.parametrize("extra", [
    "    import os\n", "    x0[0] = 'a'\n", "    x0[0] = 1 \\\n", "    exec(x0)  # \"\n", "def other():\n",
])
def test_loop_text_of_another_shape_is_refused(extra):
    good = ('@numba.njit("void(int64, float32[::1], int64)", cache=True, boundscheck=False, nogil=True, '
            'error_model="numpy")\ndef loop(n0, x0, x0o):\n    for i0 in range(n0):\n        x0[U(x0o + i0)] = F0\n')
    loops.check_text(good)
    with pytest.raises(PluginError, match="not of the form byoc-cpu generates"):
        loops.check_text(good + extra)
    with pytest.raises(PluginError, match="not of the form byoc-cpu generates"):
        loops.check_text("import os\n" + good)


def test_an_edited_loop_in_the_source_is_refused():
    cm = compile_cpu(chain_model((2, 2), 0.1, -1.0, 1.0, 0.0))
    art = cm.regions[0].artifact
    art.metadata["source"] = art.metadata["source"].replace("for i0 in range(n0):", "for i0 in range(n0 + 1):", 1)
    art.metadata["source_sha256"] = runtime.sha256(art.metadata["source"].encode())
    with pytest.raises(PluginError, match="not the source byoc-cpu generates"):
        runtime.load(art, {})


def test_loop_files_are_bounded(tmp_path):
    folder = tmp_path / "c"
    (folder / "__pycache__").mkdir(parents=True)
    digests = [f"{i:064x}" for i in range(6)]
    for i, d in enumerate(digests):
        p = folder / f"byoc_loop_{d}.py"
        p.write_text("# loop\n")
        import os
        os.utime(p, ns=(10**9 * (i + 1),) * 2)
        (folder / "__pycache__" / f"byoc_loop_{d}.loop-2.py311.nbi").write_bytes(b"x")
    (folder / f"byoc_cpu_{digests[0]}.py").write_text("# module\n")
    removed = runtime.evict(folder, 2, keep={digests[0]}, prefix="byoc_loop_")
    assert removed == digests[1:4]
    assert (folder / f"byoc_cpu_{digests[0]}.py").exists()  # modules are counted apart
    assert len(list((folder / "__pycache__").iterdir())) == 3
