"""Issue 18, class 6: a model with symbolic input dimensions keeps its per-shape specialisations
in its bundle. byoc-cpu is a static-shape target, so byoc compiles it per concrete input shapes
at run time (byoc.runtime.specialize); the bundle stores each specialisation made so far and the
symbolic source, so that the loaded model gives bit-identical outputs for the shapes seen before
saving and specialises new shapes as the in-memory model does. The new bundle fields are
untrusted input: each damaged one is refused with a BundleError (or an OptionError for options)."""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.errors import BundleError


def _model() -> onnx.ModelProto:
    """MatMul (a 4 KiB weight, shared between the specialisations' subgraphs and artifacts) ->
    Tanh -> Add with a second input; symbolic batch "N" on both inputs."""
    w = (np.arange(32 * 40, dtype=np.float32).reshape(32, 40) % 13 - 6) / 17
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"], name="mm"), h.make_node("Tanh", ["m"], ["t"], name="tanh"),
             h.make_node("Add", ["t", "z"], ["y"], name="add")]
    graph = h.make_graph(nodes, "spec", [h.make_tensor_value_info("x", T.FLOAT, ["N", 32]),
                                         h.make_tensor_value_info("z", T.FLOAT, ["N", 40])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["N", 40])], [nh.from_array(w, "w")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return {"x": rng.standard_normal((n, 32)).astype(np.float32), "z": rng.standard_normal((n, 40)).astype(np.float32)}


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def _on_cpu(cm) -> bool:
    return any(cr.region.target == "cpu" for cr in cm.regions)


@settings(max_examples=4)
@given(st.lists(st.integers(1, 7), min_size=3, max_size=3, unique=True))
def test_specialisations_survive_save_and_load(tmp_path_factory, sizes):
    a, b, c = sizes
    cm = byoc.compile(_model(), targets=["cpu"])
    before = {n: cm.run(_feeds(n)) for n in (a, b)}
    assert all(_on_cpu(s) for s in cm.specializer.cache.values())
    path = tmp_path_factory.mktemp("spec") / "m.byoc"
    cm.save(path)
    loaded = byoc.load(path)
    spec = loaded.specializer
    assert spec is not None and [dict(k)["x"][0] for k in spec.cache] == [a, b]
    assert all(_on_cpu(s) for s in spec.cache.values())  # the cpu code came back, not a host stand-in
    for n in (a, b):
        assert _same(loaded.run(_feeds(n)), before[n]), f"shape {n} differs after loading"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a new shape is specialised, not refused
        fresh = loaded.run(_feeds(c))
    assert _same(fresh, cm.run(_feeds(c)))
    assert len(spec.cache) == 3 and _on_cpu(spec.cache[next(reversed(spec.cache))])
    # a loaded model saves again, with its new specialisation
    again = path.with_name("again.byoc")
    loaded.save(again)
    reloaded = byoc.load(again)
    assert len(reloaded.specializer.cache) == 3
    for n in (a, b, c):
        assert _same(reloaded.run(_feeds(n)), loaded.run(_feeds(n)))


def test_a_model_never_run_saves_its_source_only(tmp_path):
    cm = byoc.compile(_model(), targets=["cpu"])
    cm.save(tmp_path / "m.byoc")
    with zipfile.ZipFile(tmp_path / "m.byoc") as zf:
        names = zf.namelist()
    assert "source.onnx" in names and not any(n.startswith("specs/") for n in names)
    loaded = byoc.load(tmp_path / "m.byoc")
    assert _same(loaded.run(_feeds(3)), cm.run(_feeds(3))) and len(loaded.specializer.cache) == 1


def test_weights_are_stored_once(saved):
    """The source, the base host graph and each specialisation's graphs hold the same weight:
    the bundle's weight pool (weights.bin) keeps it once and the graphs refer to it."""
    raw = _model().graph.initializer[0].raw_data
    holders = sorted(n for n, data in saved.items() if raw in data)
    assert saved["weights.bin"].count(raw) == 1
    assert [n for n in holders if n.endswith(".onnx")] == []
    assert [n for n in holders if n != "weights.bin"] == [n for n in sorted(saved) if n.endswith("artifact.bin")]


def test_save_refuses_only_what_cannot_be_specialised_after_loading(tmp_path):
    cm = byoc.compile(_model(), targets=["cpu"])
    cm.run(_feeds(2))
    cm.specializer.recipe = {**cm.specializer.recipe, "calibrated": True}
    with pytest.raises(BundleError, match=r"\['cpu'\] calibrate every new input shape.*input_shapes="):
        cm.save(tmp_path / "m.byoc")
    cm.specializer.recipe = None
    with pytest.raises(BundleError, match=r"records no compile settings.*input_shapes="):
        cm.save(tmp_path / "m.byoc")
    assert not (tmp_path / "m.byoc").exists()


# -- the new fields are untrusted input --------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cm = byoc.compile(_model(), targets=["cpu"])
    for n in (2, 3):
        cm.run(_feeds(n))
    path = tmp_path_factory.mktemp("saved") / "m.byoc"
    cm.save(path)
    with zipfile.ZipFile(path) as zf:
        return _Members({i.filename: zf.read(i) for i in zf.infolist()})


class _Members(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"<bundle members {sorted(self)}>"


def _write(members: dict[str, bytes], path, rehash: bool = True):
    members = dict(members)
    if rehash:  # as a careful attacker would: hashes prove nothing on their own
        manifest = json.loads(members["manifest.json"])
        manifest["members"] = {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                               for n, d in members.items() if n != "manifest.json"}
        members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _edit(members, name, fn):
    members = dict(members)
    doc = json.loads(members[name])
    fn(doc)
    members[name] = json.dumps(doc).encode()
    return members


def _section(fn):
    return lambda m: _edit(m, "compiled.json", lambda d: fn(d["specialisation"]))


def _set(path, value):
    def fn(section):
        obj = section
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return _section(fn)


def _fixed_source(m):
    m = dict(m)
    m["source.onnx"] = m["specs/0000/model.onnx"]  # fixed shapes: not a symbolic source
    return m


def _drop(name):
    def fn(m):
        m = dict(m)
        del m[name]
        return m
    return fn


def _add(name):
    def fn(m):
        return {**m, name: m["specs/0000/model.onnx"]}
    return fn


DAMAGE = {
    "filed under other shapes": (_set(["shapes", 0, "inputs"], {"x": [3, 32], "z": [3, 40]}), "appear twice"),
    "filed under a wrong shape": (_set(["shapes", 0, "inputs"], {"x": [5, 32], "z": [5, 40]}), "filed under input"),
    "filed under other inputs": (_set(["shapes", 0, "inputs"], {"x": [2, 32]}), "filed under inputs"),
    "members elsewhere": (_set(["shapes", 0, "members"], "specs/0001/"), r"shapes\[0\]"),
    "negative dim": (_set(["shapes", 1, "inputs", "x"], [-1, 32]), "dims must be"),
    "boolean dim": (_set(["shapes", 1, "inputs", "x"], [True, 32]), "dims must be"),
    "too many": (_set(["shapes"], [{"inputs": {"x": [i]}, "members": f"specs/{i:04d}/"} for i in range(5000)]),
                 "at most"),
    "unknown static target": (_set(["static_targets"], ["nope"]), "static_targets"),
    "no static target": (_set(["static_targets"], []), "static_targets"),
    "unknown pass": (_set(["settings", "passes"], ["evil"]), "pass names"),
    "hook_timeout text": (_set(["settings", "hook_timeout"], "5"), "hook_timeout"),
    "hook_timeout negative": (_set(["settings", "hook_timeout"], -1), "hook_timeout"),
    "placement": (_set(["settings", "placement"], "anywhere"), "placement"),
    "strict": (_set(["settings", "strict"], "yes"), "strict"),
    "options for another target": (_set(["settings", "target_options"], {"jetson": {}}), "target_options"),
    "options not an object": (_set(["settings", "target_options"], {"cpu": 5}), "target_options"),
    "bad option value": (_set(["settings", "target_options", "cpu"], {"nope": 1}), "nope"),
    "extra settings key": (_set(["settings", "pickle"], True), "expected an object"),
    "extra section key": (_set(["cache_dir"], "/tmp"), "malformed"),
    "section not an object": (lambda m: _edit(m, "compiled.json", lambda d: d.update(specialisation=[1])),
                              "malformed"),
    "source elsewhere": (_set(["source"], "../source.onnx"), "source"),
    "targets tampered": (_set(["targets", 0, "version"], "9.9"), "tampered"),
    "nested specialisation": (lambda m: _edit(m, "specs/0000/compiled.json",
                                              lambda d: d.update(specialisation={})), "of its own"),
    "spec for other targets": (lambda m: _edit(m, "specs/0001/compiled.json", lambda d: d.update(targets=[])),
                               "not the specialisation's"),
    "fixed-shape source": (_fixed_source, "not the model's source"),
    "missing spec member": (_drop("specs/0001/compiled.json"), "missing"),
    "missing source": (_drop("source.onnx"), "missing"),
    "missing weights": (_drop("weights.bin"), "missing"),
    "short weights": (lambda m: {**m, "weights.bin": m["weights.bin"][:100]}, "outside the weight pool"),
    "extra spec member": (_add("specs/0009/model.onnx"), "unexpected member"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_specialisation_is_refused(saved, tmp_path, damage):
    fn, match = DAMAGE[damage]
    path = _write(fn(saved), tmp_path / "m.byoc")
    with pytest.raises(byoc.ByocError, match=match):
        byoc.load(path).run(_feeds(4))


def test_hashes_still_protect_the_new_members(saved, tmp_path):
    members = dict(saved)
    members["specs/0000/regions/0000/artifact.bin"] += b"\0"
    with pytest.raises(BundleError, match="tampered or corrupt"):
        byoc.load(_write(members, tmp_path / "m.byoc", rehash=False))


def test_a_machine_local_option_in_the_section_is_not_used(saved, tmp_path):
    folder = tmp_path / "planted"
    members = _set(["settings", "target_options", "cpu"], {"cache_dir": str(folder)})(saved)
    loaded = byoc.load(_write(members, tmp_path / "m.byoc"))
    loaded.run(_feeds(5))  # a new shape compiles with the loading user's options
    assert not folder.exists()


_WEIRD = [None, True, -1, 2**70, 1.5, float("nan"), "", "x" * 300, [], {}, {"a": [1]}, [[1]]]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=60)
@given(st.data())
def test_any_damage_to_compiled_json_is_refused_or_harmless(saved, tmp_path_factory, data):
    """A random field of the model's or a specialisation's compiled.json (the section included)
    set to a random JSON value: refused with a byoc error, or loads and runs."""
    member = data.draw(st.sampled_from(["compiled.json", "specs/0000/compiled.json"]), label="member")
    doc = json.loads(saved[member])
    where = data.draw(st.sampled_from([p for p in _paths(doc) if p]), label="field")
    value = data.draw(st.sampled_from(_WEIRD), label="value")

    def fn(d):
        obj = d
        for k in where[:-1]:
            obj = obj[k]
        obj[where[-1]] = value

    path = _write(_edit(saved, member, fn), tmp_path_factory.mktemp("d") / "m.byoc")
    try:
        loaded = byoc.load(path)
        for n in (2, 3):
            loaded.run(_feeds(n))
    except byoc.ByocError:
        pass


def test_missing_plugin_refused_or_host_with_fallback(saved, tmp_path):
    from byoc.plugins import build_registry

    path = _write(saved, tmp_path / "m.byoc", rehash=False)
    empty = build_registry([], entry_points=False)
    with pytest.raises(BundleError, match="'cpu'.*not installed"):
        byoc.load(path, registry=empty)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = byoc.load(path, registry=empty, fallback="host")
        reference = byoc.compile(_model(), targets=[])
        for n in (2, 3, 6):  # the kept subgraphs and the base run on the host
            got, want = loaded.run(_feeds(n)), reference.run(_feeds(n))
            assert all(np.allclose(got[k], want[k], rtol=1e-5, atol=1e-6) for k in want)
    assert loaded.specializer.compile_fn is None and len(loaded.specializer.cache) == 2
