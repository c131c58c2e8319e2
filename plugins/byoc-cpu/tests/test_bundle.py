"""Bundles: save -> load -> run is bit-identical; a second load does not recompile; an artifact
whose source, program or constants were altered is refused; compiling twice gives identical
artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from cpu_helpers import REGISTRY, compile_cpu, make_model
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import byoc
from byoc.errors import PluginError
from byoc.contract import Artifact
from byoc_cpu import runtime
from byoc_cpu.verify import ProgramError, verify


def small_net(seed: int = 0, batch: int = 1):
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "r1"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["p", "p"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
             "b1": rng.standard_normal(8).astype(np.float32),
             "w2": rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3,
             "fc": rng.standard_normal((5, 16)).astype(np.float32), "fb": rng.standard_normal(5).astype(np.float32)}
    model = make_model(nodes, {"x": (batch, 3, 12, 12)}, ["y", "c1"], inits)
    feeds = {"x": rng.standard_normal((batch, 3, 12, 12)).astype(np.float32)}
    return model, feeds


def test_save_load_run_is_bit_identical(tmp_path):
    model, feeds = small_net()
    cm = compile_cpu(model)
    assert [cr.region.target for cr in cm.regions] == ["cpu"]
    want = cm.run(feeds)
    path = cm.save(tmp_path / "net.byoc")
    loaded = byoc.load(path, registry=REGISTRY)
    got = loaded.run(feeds)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert loaded.regions[0].artifact.metadata["source"] == cm.regions[0].artifact.metadata["source"]


@pytest.mark.parametrize("host", [None, "reference", "cpu"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["fixed", "symbolic"])
def test_a_bundle_runs_on_the_host_executor_it_was_compiled_with(tmp_path, host, symbolic):
    """The host's nodes of a loaded bundle (and of its later specialisations) run on the executor
    the compile used, so its outputs are the compiled model's bit for bit."""
    model, feeds = small_net(seed=21, batch=2)
    if symbolic:
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
        for out in model.graph.output:
            out.type.tensor_type.shape.dim[0].dim_param = "N"
        del model.graph.value_info[:]
    for targets in ([], None):
        cm = byoc.compile(model, targets=targets, registry=REGISTRY, host=host, wait=True)
        assert cm.options["host"] == (host or "cpu")
        want = cm.run(feeds)
        loaded = byoc.load(cm.save(tmp_path / f"{host}-{targets}.byoc"), registry=REGISTRY)
        assert loaded.options["host"] == cm.options["host"]
        got = loaded.run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
        if symbolic:  # a shape the bundle never saw: compiled after loading
            x = {"x": np.concatenate([feeds["x"], feeds["x"][:1]])}
            want, got = cm.run(x), loaded.run(x)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])


def test_compiling_twice_gives_identical_artifacts():
    for batch in (1, 2):
        model, _ = small_net(batch=batch)
        a, b = compile_cpu(model), compile_cpu(model)
        assert len(a.regions) == len(b.regions) >= 1
        for ra, rb in zip(a.regions, b.regions):
            assert ra.artifact.data == rb.artifact.data
            assert json.dumps(ra.artifact.metadata, sort_keys=True) == json.dumps(rb.artifact.metadata, sort_keys=True)
            assert ra.artifact.sha256 == rb.artifact.sha256


def _artifact(cm) -> Artifact:
    a = cm.regions[0].artifact
    return Artifact(a.target, a.format, a.data, json.loads(json.dumps(a.metadata)))


def test_edited_source_is_refused():
    cm = compile_cpu(small_net()[0])
    art = _artifact(cm)
    art.metadata["source"] = art.metadata["source"].replace("def run(", "import os\ndef run(")
    with pytest.raises(PluginError, match="not the source byoc-cpu generates"):
        runtime.load(art, {})
    # a consistent hash does not help: the source is regenerated from the program and compared
    art.metadata["source_sha256"] = runtime.sha256(art.metadata["source"].encode())
    with pytest.raises(PluginError, match="not the source byoc-cpu generates"):
        runtime.load(art, {})


def test_program_reaching_outside_its_buffers_is_refused():
    cm = compile_cpu(small_net()[0])
    art = _artifact(cm)
    steps = art.metadata["program"]["steps"]
    gemm = next(s for s in _flat(steps) if s["kind"] in ("wgemm", "gemm"))
    gemm["c"][2] += 10**6  # write far past the buffer
    with pytest.raises(PluginError, match="program is invalid"):
        runtime.load(art, {})


def test_altered_constants_are_refused():
    cm = compile_cpu(small_net()[0])
    art = _artifact(cm)
    data = bytearray(art.data)
    data[0] ^= 1
    with pytest.raises(PluginError, match="constants do not match"):
        runtime.load(Artifact(art.target, art.format, bytes(data), art.metadata), {})


def test_bundle_with_tampered_artifact_falls_back_or_fails(tmp_path):
    """A bundle edited consistently (manifest hashes updated) still cannot smuggle in code."""
    import hashlib
    import zipfile

    model, feeds = small_net()
    cm = compile_cpu(model)
    path = cm.save(tmp_path / "net.byoc")
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    name = next(n for n in members if n.endswith("artifact.json"))
    meta = json.loads(members[name])
    meta["metadata"]["source"] += "\nimport os; os.system('echo pwned')\n"
    members[name] = json.dumps(meta, sort_keys=True, indent=1).encode() + b"\n"
    manifest = json.loads(members["manifest.json"])
    manifest["members"][name] = {"sha256": hashlib.sha256(members[name]).hexdigest(), "size": len(members[name])}
    members["manifest.json"] = json.dumps(manifest, sort_keys=True, indent=1).encode() + b"\n"
    bad = tmp_path / "bad.byoc"
    with zipfile.ZipFile(bad, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    with pytest.raises(byoc.BundleError, match="not the source byoc-cpu generates"):
        byoc.load(bad, registry=REGISTRY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback = byoc.load(bad, registry=REGISTRY, fallback="host")
    np.testing.assert_allclose(fallback.run(feeds)["y"], cm.run(feeds)["y"], rtol=1e-5, atol=1e-6)


_CHILD = """
import sys, time, json
import byoc
t0 = time.perf_counter()
cm = byoc.load(sys.argv[1])
print(json.dumps({"load_s": time.perf_counter() - t0}))
"""


def test_second_load_uses_the_cache(tmp_path):
    """Two fresh processes load the same bundle: the first compiles into the cache folder, the
    second loads Numba's machine code from it (nothing new is written)."""
    model, _ = small_net(seed=7)
    path = compile_cpu(model).save(tmp_path / "net.byoc")
    cache = tmp_path / "cache"
    env = dict(os.environ, BYOC_CPU_CACHE=str(cache), BYOC_PLUGINS="cpu")
    env.pop("NUMBA_CACHE_DIR", None)

    def load_once():
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])["load_s"]

    def snapshot():
        return {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}

    load_once()
    first = snapshot()
    modules = [p for p in first if p.suffix == ".py"]
    source = byoc.load(path).regions[0].artifact.metadata["source"]
    assert sorted(p.name[:9] for p in modules) == ["byoc_cpu_"] + ["byoc_loop"] * source.count("= shared_loop(")
    assert any(p.suffix == ".nbc" for p in first), "Numba wrote no machine code into the cache"
    load_once()
    assert snapshot() == first  # nothing recompiled, nothing rewritten


def test_unwritable_cache_folder_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cm = compile_cpu(small_net(seed=3)[0], cache_dir=str(blocker / "sub"))
    assert cm.regions[0].region.target == "cpu"


def test_wrong_input_shape_names_the_tensor():
    model, feeds = small_net()
    cm = compile_cpu(model)
    fn = runtime.load(cm.regions[0].artifact, {})
    with pytest.raises(byoc.InputError, match="'x' has shape"):
        fn(np.zeros((1, 3, 5, 5), np.float32))


@settings(max_examples=60)
@given(st.data())
def test_verifier_never_crashes_on_mutated_programs(data):
    """Any mutation of a number in a valid program is either accepted (and stays in bounds, by the
    checks the verifier makes) or refused with ProgramError: never another exception."""
    program = _program()
    paths = list(_numbers(program))
    path = data.draw(st.sampled_from(paths))
    value = data.draw(st.one_of(st.integers(-5, 10**7), st.just(-1), st.floats(allow_nan=True), st.none(),
                                st.text(max_size=3)))
    target = program
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        verify(program)
    except ProgramError:
        pass


_PROGRAM = None


def _program():
    global _PROGRAM
    if _PROGRAM is None:
        _PROGRAM = json.dumps(compile_cpu(small_net(batch=2)[0]).regions[0].artifact.metadata["program"])
    return json.loads(_PROGRAM)


def _numbers(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, path + (i,))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path


def _flat(steps):
    for s in steps:
        if s["kind"] == "batch":
            yield from _flat(s["steps"])
        elif s["kind"] == "par":
            for chunk in s["chunks"]:
                yield from _flat(chunk)
        else:
            yield s


def _assert_refused_with(model, strategy: str, kind: str, index: int, value: int) -> None:
    """The program of ``model`` (one convolution, ``strategy``) verifies; with argument ``index``
    of its ``kind`` step set to ``value`` it does not."""
    program = compile_cpu(model, conv_strategy=strategy, threads=1).regions[0].artifact.metadata["program"]
    verify(program)
    (step,) = [s for s in _flat(program["steps"]) if s["kind"] == kind]
    step["args"][index] = value
    with pytest.raises(ProgramError):
        verify(program)


@pytest.mark.parametrize("wide, kind", [(False, "conv8"), (True, "conv16")])
@pytest.mark.parametrize("index, value", [(13, 10**6), (1, 5), (11, 9), (8, 10**6), (9, 1), (0, 10**4),
                                          (4, 0), (6, 10**3), (14, 10**3), (14, 0), (12, -1)])
def test_verifier_refuses_a_blocked_conv_reaching_past_its_buffers(monkeypatch, wide, kind, index, value):
    # conv8 / conv16 args: cb, plane, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow; each change
    # reads or writes past a buffer (positions, the plane's slack, channel blocks, the weights, the
    # output, the phase planes) or divides by zero (a stride of 0)
    monkeypatch.setattr("byoc_cpu.host.blocked.WIDE", wide)
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 16, 12, 12)},
                       ["y"], {"W": rng.standard_normal((32, 16, 3, 3)).astype(np.float32)})
    _assert_refused_with(model, "blocked", kind, index, value)


@pytest.mark.parametrize("kind, index, value", [("reorder8", 3, 5), ("reorder8", 6, 0), ("reorder8", 0, 10**4),
                                                ("reorder8", 4, 10**4), ("conv16", 3, 10**3), ("conv16", 5, 0)])
def test_verifier_refuses_a_strided_blocked_conv_reaching_past_its_buffers(monkeypatch, kind, index, value):
    # reorder8 args: c, h, w, plane, hq, wq, sh, sw, pt, pl (stride phases: planes of hq x wq);
    # conv16 with taller phase planes reads past its input; a stride of 0 divides by zero
    monkeypatch.setattr("byoc_cpu.host.blocked.WIDE", True)
    rng = np.random.default_rng(2)
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
                       {"x": (1, 16, 12, 12)}, ["y"], {"W": rng.standard_normal((32, 16, 3, 3)).astype(np.float32)})
    _assert_refused_with(model, "blocked", kind, index, value)


@pytest.mark.parametrize("index, value", [(0, 10**4), (3, 1), (8, 10**5), (9, 10**5), (2, 10**6)])
def test_verifier_refuses_phase_planes_reaching_past_their_buffers(index, value):
    # phase args: c, h, w, ldq, sh, sw, pt, pl, hq, wq; each change reads or writes past a buffer
    rng = np.random.default_rng(1)
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], strides=[2, 2], pads=[3, 3, 3, 3])],
                       {"x": (1, 3, 20, 20)}, ["y"], {"W": rng.standard_normal((16, 3, 7, 7)).astype(np.float32)})
    _assert_refused_with(model, "phase", "phase", index, value)
