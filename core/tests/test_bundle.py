"""Bundles: ``CompiledModel.save`` / ``byoc.load``.

save -> load -> run is bit-identical; every tampered, truncated, renamed, unsafe or foreign file
is refused with a BundleError naming the member or plugin; saving is atomic; a missing plugin is
named with the version the bundle needs, and ``fallback="host"`` runs its regions on the host.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import byoc
from byoc import BundleError
from byoc.plugins import build_registry
from byoc.bundle import BundleFallbackWarning
from byoc.bundle import writer as bundle_writer
from byoc.bundle.reader import Reader
from byoc.contract import host_callable, region_model_bytes

MAGIC = b"\x00FAKE-ENGINE\xff"


class Vendor:
    """A test plugin whose artifact is opaque bytes (a header + the region's ONNX body)."""

    def __init__(self, name="fake", version="1.0", ops=("Relu",), fail_runtime=False):
        self.name, self.version, self.ops, self.fail_runtime = name, version, set(ops), fail_runtime
        self.seen: list[byoc.Artifact] = []

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version=self.version, device="npu", options={"level": 2}))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == self.name:
            for op in self.ops:
                register(op)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == self.name:
            meta = {"engine": {"level": options["level"], "ops": region.op_types, "pi": 3.25}}
            return byoc.Artifact(self.name, "fake-engine", MAGIC + region_model_bytes(region.model), meta)

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == self.name:
            if self.fail_runtime:
                raise RuntimeError("engine does not load on this device")
            assert artifact.data.startswith(MAGIC)
            self.seen.append(artifact)
            return host_callable(artifact.data[len(MAGIC):])


def registry(*plugins):
    return build_registry([(p.name, p) for p in plugins], entry_points=False)


def make_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], np.linspace(-1, 1, 6, dtype=np.float32))
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Add", ["a", "w"], ["b"], name="add"),
        helper.make_node("Relu", ["b"], ["c"], name="r2"),
        helper.make_node("Mul", ["c", "a"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


FEEDS = {"x": np.array([[1.5, -2.0, 0.0], [np.nan, np.inf, -0.0]], dtype=np.float32)}


def same_outputs(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a
    )


@pytest.fixture()
def vendor():
    return Vendor()


@pytest.fixture()
def reg(vendor):
    return registry(vendor)


@pytest.fixture()
def compiled(reg):
    return byoc.compile(make_model(), registry=reg)


@pytest.fixture()
def saved(compiled, tmp_path) -> Path:
    return compiled.save(tmp_path / "m.byoc")


# -- helpers to take bundles apart ------------------------------------------------------------


def members_of(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def write_zip(path: Path, members: dict[str, bytes], *, raw_names: dict[str, str] | None = None,
              compress=zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = compress
            if raw_names and name in raw_names:
                info.filename = raw_names[name]  # bypasses ZipInfo's own clean-up (NUL, etc.)
            zf.writestr(info, data)
    return path


def rehash(members: dict[str, bytes]) -> dict[str, bytes]:
    """Recompute the manifest's hashes and sizes, as a careful attacker would."""
    manifest = json.loads(members["manifest.json"])
    manifest["members"] = {
        n: {"sha256": __import__("hashlib").sha256(d).hexdigest(), "size": len(d)}
        for n, d in members.items() if n != "manifest.json"
    }
    return {**members, "manifest.json": json.dumps(manifest).encode()}


def edit_manifest(members: dict[str, bytes], fn) -> dict[str, bytes]:
    manifest = json.loads(members["manifest.json"])
    fn(manifest)
    return {**members, "manifest.json": json.dumps(manifest).encode()}


def data_range(path: Path, name: str) -> tuple[int, int]:
    """Byte range of a member's (compressed) data inside the archive file."""
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    n, m = struct.unpack("<HH", raw[info.header_offset + 26: info.header_offset + 30])
    start = info.header_offset + 30 + n + m
    return start, start + info.compress_size


def put(path: Path, data: bytes) -> Path:
    """Write a fresh file (unlinking first: truncating an ext4 file in a loop is slow)."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return path


def refused(path, match: str | None = None, **kwargs) -> BundleError:
    with pytest.raises(BundleError) as info:
        byoc.load(path, **kwargs)
    if match is not None:
        assert match in str(info.value), str(info.value)
    return info.value


# -- round trips -----------------------------------------------------------------------------


def test_roundtrip_with_plugin_is_bit_identical(compiled, saved, reg, vendor):
    assert [r.region.target for r in compiled.regions] == ["fake", "fake"]
    loaded = byoc.load(saved, registry=reg)
    assert same_outputs(compiled.run(FEEDS), loaded.run(FEEDS))
    # the plugin's runtime got the very bytes and metadata its codegen produced
    originals = {cr.region.name: cr.artifact for cr in compiled.regions}
    for cr in loaded.regions:
        assert cr.artifact.data == originals[cr.region.name].data
        assert cr.artifact.metadata == originals[cr.region.name].metadata
        assert cr.artifact.format == "fake-engine" and cr.plugin == "fake"
    assert vendor.seen[-2:] == [cr.artifact for cr in loaded.regions]
    # everything report() needs survives
    assert loaded.records == compiled.records
    assert loaded.placement() == compiled.placement()
    assert loaded.options == compiled.options
    assert loaded.faults == compiled.faults
    assert [(t.name, t.version, t.plugin) for t in loaded.targets] == [("fake", "1.0", "fake")]
    assert [(r.region.name, [v.name for v in r.region.inputs], [v.name for v in r.region.outputs])
            for r in loaded.regions] == [(r.region.name, [v.name for v in r.region.inputs],
                                          [v.name for v in r.region.outputs]) for r in compiled.regions]
    assert loaded.input_names == compiled.input_names and loaded.output_names == compiled.output_names
    assert loaded.host_fallback == {}
    if hasattr(compiled, "report"):
        assert loaded.report("json") == compiled.report("json")


def test_saving_is_deterministic_and_load_save_is_a_fixed_point(compiled, saved, reg, tmp_path):
    again = compiled.save(tmp_path / "again.byoc")
    assert again.read_bytes() == saved.read_bytes()
    resaved = byoc.load(saved, registry=reg).save(tmp_path / "resaved.byoc")
    assert resaved.read_bytes() == saved.read_bytes()


def test_host_only_roundtrip_never_consults_plugins(tmp_path, monkeypatch):
    """A host-only bundle needs no target: with the reference kernels chosen it loads without the
    plugin registry (with an installed CPU executor it consults the registry for that alone)."""
    compiled = byoc.compile(make_model(), targets=[])
    path = compiled.save(tmp_path / "host.byoc")

    def no_registry(*a, **k):
        raise AssertionError("a host-only bundle must not load plugins")

    monkeypatch.setenv("BYOC_HOST_EXECUTOR", "reference")
    monkeypatch.setattr("byoc.plugins.get_registry", no_registry)
    loaded = byoc.load(path)
    assert loaded.regions == [] and loaded.targets == []
    assert same_outputs(compiled.run(FEEDS), loaded.run(FEEDS))
    assert loaded.records == compiled.records


def test_manifest_contents(saved):
    members = members_of(saved)
    manifest = json.loads(members["manifest.json"])
    assert manifest["format"] == "byoc-bundle" and manifest["format_version"] == 2
    assert manifest["byoc_version"] == byoc.__version__
    assert manifest["plugins"]["fake"]["plugin"] == "fake" and manifest["plugins"]["fake"]["version"] == "1.0"
    assert set(manifest["members"]) == set(members) - {"manifest.json"}
    import hashlib

    for name, entry in manifest["members"].items():
        assert entry == {"sha256": hashlib.sha256(members[name]).hexdigest(), "size": len(members[name])}
    host = onnx.ModelProto.FromString(members["model.onnx"])
    regions = [n for n in host.graph.node if n.domain == "byoc"]
    assert [n.op_type for n in regions] == ["Region", "Region"]
    assert {a.name: a.s.decode() for a in regions[0].attribute} == {"target": "fake", "region": regions[0].name}
    assert members["regions/0000/artifact.bin"].startswith(MAGIC)


UNARY = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"]
BINARY = ["Add", "Mul", "Sub"]


@st.composite
def chain_models(draw):
    """A random graph of unary/binary float ops, and the op types the test plugin supports."""
    n = draw(st.integers(1, 6))
    values, nodes, inits = ["x"], [], []
    for i in range(n):
        op = draw(st.sampled_from(UNARY + BINARY))
        a = draw(st.sampled_from(values))
        if op in BINARY:
            if draw(st.booleans()):
                b = f"c{i}"
                inits.append(helper.make_tensor(b, TensorProto.FLOAT, [3], draw(
                    st.lists(st.floats(-4, 4, width=32), min_size=3, max_size=3))))
            else:
                b = draw(st.sampled_from(values))
            nodes.append(helper.make_node(op, [a, b], [f"v{i}"], name=f"n{i}"))
        else:
            nodes.append(helper.make_node(op, [a], [f"v{i}"], name=f"n{i}"))
        values.append(f"v{i}")
    outs = sorted(set(draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=2))))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 3]) for o in outs], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ops = draw(st.sets(st.sampled_from(UNARY + BINARY)))
    return model, ops


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=chain_models(), data=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True),
                                          min_size=6, max_size=6))
def test_roundtrip_property(case, data, tmp_path):
    model, ops = case
    reg = registry(Vendor(ops=ops))
    compiled = byoc.compile(model, registry=reg)
    path = compiled.save(tmp_path / "p.byoc")
    feeds = {"x": np.array(data, dtype=np.float32).reshape(2, 3)}
    loaded = byoc.load(path, registry=reg)
    assert same_outputs(compiled.run(feeds), loaded.run(feeds))
    assert loaded.placement() == compiled.placement()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BundleFallbackWarning)
        host = byoc.load(path, registry=registry(), fallback="host")
    assert same_outputs(compiled.run(feeds), host.run(feeds))
    assert loaded.save(tmp_path / "q.byoc").read_bytes() == path.read_bytes()


# -- plugins: missing, other version, failing, host fallback -----------------------------------


def test_missing_plugin_names_it_and_the_version(saved):
    err = refused(saved, registry=registry())
    assert "'fake'" in str(err) and "'1.0'" in str(err) and "not installed" in str(err)
    assert "fallback='host'" in str(err)


def test_other_plugin_version_is_refused(saved):
    err = refused(saved, registry=registry(Vendor(version="2.0")))
    assert "'1.0'" in str(err) and "'2.0'" in str(err)


def test_fallback_host_runs_regions_on_host_with_a_warning(compiled, saved, tmp_path):
    with pytest.warns(BundleFallbackWarning, match="fake") as caught:
        loaded = byoc.load(saved, registry=registry(), fallback="host")
    assert len(caught) == 2  # one per region
    assert same_outputs(compiled.run(FEEDS), loaded.run(FEEDS))
    assert set(loaded.host_fallback) == {r.region.name for r in compiled.regions}
    for name, rec in loaded.records.items():
        assert rec.device == "host"
        if compiled.records[name].device == "fake":
            assert "not installed" in rec.fallback and rec.region == compiled.records[name].region
    # the artifacts are kept: saving again gives the original bundle, loadable with the plugin
    assert loaded.save(tmp_path / "again.byoc").read_bytes() == saved.read_bytes()
    with pytest.warns(BundleFallbackWarning, match="'2.0'"):
        byoc.load(saved, registry=registry(Vendor(version="2.0")), fallback="host")


def test_runtime_hook_failure(saved, compiled):
    broken = registry(Vendor(fail_runtime=True))
    err = refused(saved, registry=broken)
    assert "plugin 'fake'" in str(err) and "engine does not load" in str(err)
    with pytest.warns(BundleFallbackWarning, match="engine does not load"):
        loaded = byoc.load(saved, registry=broken, fallback="host")
    assert same_outputs(compiled.run(FEEDS), loaded.run(FEEDS))


def test_bad_fallback_value(saved, reg):
    with pytest.raises(byoc.ByocError, match="fallback"):
        byoc.load(saved, registry=reg, fallback="cpu")
    byoc.load(saved, registry=reg, fallback="error")


def test_file_over_budget_is_refused_unopened(saved, reg, tmp_path):
    big = put(tmp_path / "big.byoc", saved.read_bytes() + b"\0" * (2 << 20))
    refused(big, "max_total_bytes", registry=reg, budget=byoc.Budget(max_total_bytes=1 << 10))


# -- tampering ---------------------------------------------------------------------------------


def test_bit_flip_in_any_member_names_it(saved, tmp_path, reg):
    # deflated members (as saved); the last byte of a deflate stream may hold unused padding bits
    for name in members_of(saved):
        start, end = data_range(saved, name)
        for pos in (start, (start + end) // 2):
            raw = bytearray(saved.read_bytes())
            raw[pos] ^= 0x10
            bad = tmp_path / "flip.byoc"
            put(bad, bytes(raw))
            err = refused(bad, registry=reg)
            assert repr(name) in str(err), (name, pos, str(err))
    # stored members: every byte is content, so a flip anywhere in any member is refused, naming it
    stored = write_zip(tmp_path / "stored.byoc", members_of(saved), compress=zipfile.ZIP_STORED)
    byoc.load(stored, registry=reg)
    raw = stored.read_bytes()
    for name in members_of(stored):
        start, end = data_range(stored, name)
        for pos in range(start, end):
            flipped = bytearray(raw)
            flipped[pos] ^= 1 << (pos % 8)
            bad = tmp_path / "flip.byoc"
            put(bad, bytes(flipped))
            err = refused(bad, registry=reg)
            assert repr(name) in str(err), (name, pos, str(err))


def test_every_single_bit_flip_is_refused_or_harmless(saved, tmp_path, reg):
    """Flip one bit at every byte of the file: refused, or (zip metadata we ignore) identical results."""
    raw = saved.read_bytes()
    expected = byoc.load(saved, registry=reg).run(FEEDS)
    original = members_of(saved)
    bad = tmp_path / "flip.byoc"
    harmless = []
    for pos in range(len(raw)):
        flipped = bytearray(raw)
        flipped[pos] ^= 1 << (pos % 8)
        put(bad, bytes(flipped))
        try:
            loaded = byoc.load(bad, registry=reg)
        except BundleError:
            continue
        harmless.append(pos)
        assert same_outputs(expected, loaded.run(FEEDS)), pos
        # what loads is zip bookkeeping (timestamps, attributes, version fields) or the tail of a
        # deflate stream past the member's declared end: the members themselves are unchanged
        assert members_of(bad) == original, pos
    assert len(harmless) < len(raw) // 4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_corruption_is_refused_or_harmless(saved, reg, tmp_path, data):
    raw = bytearray(saved.read_bytes())
    for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8)):
        raw[pos] = data.draw(st.integers(0, 255))
    bad = tmp_path / "corrupt.byoc"
    put(bad, bytes(raw))
    try:
        loaded = byoc.load(bad, registry=reg)
    except BundleError:
        return
    assert same_outputs(byoc.load(saved, registry=reg).run(FEEDS), loaded.run(FEEDS))


def test_every_truncation_is_refused(saved, tmp_path, reg):
    raw = saved.read_bytes()
    bad = tmp_path / "short.byoc"
    for n in range(len(raw)):
        put(bad, raw[:n])
        err = refused(bad, registry=reg)
        assert str(bad) in str(err)
    put(bad, b"")
    refused(bad, "empty", registry=reg)


def test_manifest_hash_lies(saved, tmp_path, reg):
    members = members_of(saved)
    lie = edit_manifest(members, lambda m: m["members"]["model.onnx"].update(sha256="0" * 64))
    err = refused(write_zip(tmp_path / "lie.byoc", lie), registry=reg)
    assert "'model.onnx'" in str(err) and "SHA-256" in str(err)
    # content changed, manifest not updated
    members["regions/0001/artifact.json"] = members["regions/0001/artifact.json"].replace(b"3.25", b"3.75")
    err = refused(write_zip(tmp_path / "changed.byoc", members), registry=reg)
    assert "'regions/0001/artifact.json'" in str(err) and "SHA-256" in str(err)


def test_manifest_lies_about_versions(saved, tmp_path, reg):
    members = members_of(saved)
    lie = edit_manifest(members, lambda m: m["plugins"]["fake"].update(version="2.0"))
    err = refused(write_zip(tmp_path / "lie.byoc", lie), registry=reg)
    assert "'fake'" in str(err) and "'2.0'" in str(err)
    # a consistent lie (compiled.json rewritten and rehashed) meets the installed plugin's version
    compiled_json = json.loads(members["compiled.json"])
    compiled_json["targets"][0]["version"] = "2.0"
    both = rehash({**lie, "compiled.json": json.dumps(compiled_json).encode()})
    err = refused(write_zip(tmp_path / "both.byoc", both), registry=reg)
    assert "'2.0'" in str(err) and "'1.0'" in str(err) and "plugin 'fake'" in str(err)


def test_member_deleted_renamed_or_added(saved, tmp_path, reg):
    members = members_of(saved)
    for name in members:
        if name == "manifest.json":
            continue
        gone = {k: v for k, v in members.items() if k != name}
        refused(write_zip(tmp_path / "gone.byoc", gone), f"member {name!r}", registry=reg)
        renamed = {(k + ".old" if k == name else k): v for k, v in members.items()}
        refused(write_zip(tmp_path / "renamed.byoc", renamed), f"{name + '.old'!r}", registry=reg)
        # deleted and dropped from the manifest too: the compiled model still needs it
        gone_listed = rehash(gone)
        refused(write_zip(tmp_path / "gone2.byoc", gone_listed), f"member {name!r}", registry=reg)
    no_manifest = {k: v for k, v in members.items() if k != "manifest.json"}
    refused(write_zip(tmp_path / "nomanifest.byoc", no_manifest), "'manifest.json' is missing", registry=reg)
    extra = {**members, "regions/0000/notes.txt": b"hello"}
    refused(write_zip(tmp_path / "extra.byoc", extra), "unexpected member 'regions/0000/notes.txt'", registry=reg)
    # an extra member listed in the manifest with a correct hash is still not part of the model
    refused(write_zip(tmp_path / "extra2.byoc", rehash(extra)), "unexpected member 'regions/0000/notes.txt'",
            registry=reg)
    extra_region = rehash({**members, "regions/0002/artifact.bin": b"x"})
    refused(write_zip(tmp_path / "extra3.byoc", extra_region), "'regions/0002/artifact.bin'", registry=reg)


@pytest.mark.parametrize("name", [
    "../evil.onnx", "regions/../../evil", "/etc/passwd", "regions\\0000\\artifact.bin", "C:evil",
    "c:/windows/evil", "model.onnx\x00.txt", "./model.onnx", "regions//x", "regions/0000/", "",
])
def test_path_escaping_member_names_are_refused(saved, tmp_path, reg, name):
    members = members_of(saved)
    # the unsafe name is added both on its own and listed in a rehashed manifest
    evil = {**members, "EVIL": b"payload"}
    for variant in (evil, rehash(evil)):
        if "EVIL" in json.loads(variant["manifest.json"])["members"]:
            variant = edit_manifest(variant, lambda m: m["members"].__setitem__(name, m["members"].pop("EVIL")))
        path = write_zip(tmp_path / "evil.byoc", variant, raw_names={"EVIL": name})
        err = refused(path, registry=reg)
        assert "unsafe member name" in str(err) and repr(name) in str(err), str(err)
    assert not (tmp_path.parent / "evil.onnx").exists()


def test_not_a_zip_and_empty_file(tmp_path, reg):
    onnx_file = tmp_path / "model.byoc"
    onnx_file.write_bytes(make_model().SerializeToString())
    refused(onnx_file, "not a byoc bundle", registry=reg)
    text = tmp_path / "text.byoc"
    text.write_text("hello, I am not a zip\n" * 10)
    refused(text, "not a byoc bundle", registry=reg)
    empty = tmp_path / "empty.byoc"
    empty.write_bytes(b"")
    refused(empty, "empty", registry=reg)
    refused(tmp_path / "nowhere.byoc", "not found", registry=reg)
    refused(tmp_path, "directory", registry=reg)
    other_zip = write_zip(tmp_path / "other.byoc", {"readme.txt": b"hi"})
    refused(other_zip, "'manifest.json' is missing", registry=reg)


def test_malformed_manifest_and_compiled_json(saved, tmp_path, reg):
    members = members_of(saved)
    cases = {
        "not json": {**members, "manifest.json": b"{not json"},
        "newer format": edit_manifest(members, lambda m: m.update(format_version=99)),
        "other format": edit_manifest(members, lambda m: m.update(format="zip")),
        "duplicate keys": {**members, "manifest.json": members["manifest.json"].replace(
            b'"format": "byoc-bundle"', b'"format": "byoc-bundle", "format": "byoc-bundle"')},
        "no plugin entry": edit_manifest(members, lambda m: m["plugins"].clear()),
        "bad hash": edit_manifest(members, lambda m: m["members"]["model.onnx"].update(sha256="xyz")),
        "bad size": edit_manifest(members, lambda m: m["members"]["model.onnx"].update(size=-1)),
        "lying size": edit_manifest(members, lambda m: m["members"]["model.onnx"].update(size=5)),
        "compiled.json garbage": rehash({**members, "compiled.json": b"[1, 2]"}),
        "record garbage": rehash({**members, "compiled.json": members["compiled.json"].replace(
            b'"device": "host"', b'"device": 7', 1)}),
        "region node missing": rehash({**members, "model.onnx": _drop_region_nodes(members["model.onnx"])}),
        "model.onnx garbage": rehash({**members, "model.onnx": b"\x08\x07\x12garbage"}),
        "region.onnx external data": rehash({**members, "regions/0000/region.onnx": _with_external_init(
            members["regions/0000/region.onnx"])}),
    }
    for what, variant in cases.items():
        err = refused(write_zip(tmp_path / "bad.byoc", variant), registry=reg)
        assert "member '" in str(err) or "manifest" in str(err), (what, str(err))


def _drop_region_nodes(data: bytes) -> bytes:
    proto = onnx.ModelProto.FromString(data)
    keep = [n for n in proto.graph.node if n.domain != "byoc"]
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    return proto.SerializeToString()


def _with_external_init(data: bytes) -> bytes:
    proto = onnx.ModelProto.FromString(data)
    t = helper.make_tensor("ext", TensorProto.FLOAT, [1], [0.0])
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", "../../../etc/passwd"
    proto.graph.initializer.append(t)
    return proto.SerializeToString()


def test_declared_sizes_over_budget_are_refused_before_decompressing(saved, tmp_path, reg, monkeypatch):
    members = members_of(saved)
    bomb = rehash({**members, "regions/0000/artifact.bin": MAGIC + b"\x00" * (8 << 20)})
    path = write_zip(tmp_path / "bomb.byoc", bomb)
    assert path.stat().st_size < 100_000  # 8 MiB of zeros deflate to a few KiB
    read = []
    original = Reader._read_member
    monkeypatch.setattr(Reader, "_read_member",
                        lambda self, zf, info: read.append(info.filename) or original(self, zf, info))
    err = refused(path, registry=reg, budget=byoc.Budget(max_total_bytes=1 << 20))
    assert "max_total_bytes" in str(err) and "'regions/0000/artifact.bin'" in str(err)
    assert read == ["manifest.json"]


def test_foreign_zip_features_are_refused(saved, tmp_path, reg):
    members = members_of(saved)
    path = write_zip(tmp_path / "bz.byoc", members, compress=zipfile.ZIP_BZIP2)
    refused(path, "compression method", registry=reg)
    dup = tmp_path / "dup.byoc"
    write_zip(dup, members)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        with zipfile.ZipFile(dup, "a") as zf:
            zf.writestr("model.onnx", members["model.onnx"])
    refused(dup, "appears twice", registry=reg)


def test_load_never_unpickles(tmp_path, monkeypatch):
    """An artifact holding a pickle stays opaque bytes; nothing in load touches pickle."""
    triggered = []

    class Evil:
        def __reduce__(self):
            return (triggered.append, ("unpickled!",))

    payload = pickle.dumps(Evil())

    class PickleVendor(Vendor):
        @byoc.hookimpl
        def byoc_codegen(self, target, region, options):
            return byoc.Artifact(self.name, "pickle?", MAGIC + region_model_bytes(region.model) + payload)

        @byoc.hookimpl
        def byoc_runtime(self, target, artifact, options):
            body = artifact.data[len(MAGIC):-len(payload)]
            return host_callable(body)

    reg = registry(PickleVendor())
    compiled = byoc.compile(make_model(), registry=reg)
    path = compiled.save(tmp_path / "p.byoc")

    def forbidden(*a, **k):
        raise AssertionError("pickle used while loading a bundle")

    for fn in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, fn, forbidden)
    loaded = byoc.load(path, registry=reg)
    assert same_outputs(compiled.run(FEEDS), loaded.run(FEEDS))
    assert triggered == []


# -- atomic saving -------------------------------------------------------------------------------


def _only_bundle_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_failed_save_keeps_the_old_file(compiled, saved, tmp_path, monkeypatch):
    old = saved.read_bytes()
    calls = []
    original = bundle_writer._write_member

    def fail_midway(zf, name, data):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        original(zf, name, data)

    monkeypatch.setattr(bundle_writer, "_write_member", fail_midway)
    with pytest.raises(BundleError, match="No space left"):
        compiled.save(saved)
    assert saved.read_bytes() == old
    assert _only_bundle_files(tmp_path) == ["m.byoc"]

    monkeypatch.setattr(bundle_writer, "_write_member", original)

    def interrupted(zf, name, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle_writer, "_write_member", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compiled.save(saved)
    assert saved.read_bytes() == old and _only_bundle_files(tmp_path) == ["m.byoc"]
    monkeypatch.setattr(bundle_writer, "_write_member", original)

    def no_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with pytest.raises(BundleError, match="Input/output error"):
        compiled.save(saved)
    assert saved.read_bytes() == old and _only_bundle_files(tmp_path) == ["m.byoc"]
    monkeypatch.undo()

    def no_replace(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "replace", no_replace)
    with pytest.raises(BundleError, match="not permitted"):
        compiled.save(saved)
    assert saved.read_bytes() == old and _only_bundle_files(tmp_path) == ["m.byoc"]


def test_unbundleable_model_fails_before_touching_the_file(compiled, saved, tmp_path):
    old = saved.read_bytes()
    compiled.options["target_options"]["fake"]["level"] = object()
    with pytest.raises(BundleError, match="JSON"):
        compiled.save(saved)
    assert saved.read_bytes() == old and _only_bundle_files(tmp_path) == ["m.byoc"]


def test_save_path_errors(compiled, tmp_path):
    with pytest.raises(BundleError, match="directory"):
        compiled.save(tmp_path)
    with pytest.raises(BundleError, match="does not exist"):
        compiled.save(tmp_path / "no" / "such" / "m.byoc")


# -- command line ---------------------------------------------------------------------------------


def test_cli_compile_then_run_bundle(tmp_path, monkeypatch, capsys, reg):
    from byoc import cli

    monkeypatch.setattr("byoc.plugins._registry", reg)
    model = tmp_path / "m.onnx"
    model.write_bytes(make_model().SerializeToString())
    np.save(tmp_path / "x.npy", FEEDS["x"], allow_pickle=False)
    assert cli.main(["compile", str(model), "-t", "fake"]) == 0
    out = capsys.readouterr().out
    bundle = tmp_path / "m.byoc"
    assert bundle.exists() and "regions: 2" in out and str(bundle) in out
    assert cli.main(["run", str(bundle), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out")]) == 0
    got = np.load(tmp_path / "out" / "y.npy", allow_pickle=False)
    want = byoc.compile(make_model(), registry=reg).run(FEEDS)["y"]
    assert got.tobytes() == want.tobytes()

    # run with the plugin gone: a clear error, unless --host-fallback
    monkeypatch.setattr("byoc.plugins._registry", registry())
    capsys.readouterr()
    assert cli.main(["run", str(bundle), "-i", f"x={tmp_path / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "BundleError" in err and "'fake'" in err and "'1.0'" in err
    with pytest.warns(BundleFallbackWarning):
        assert cli.main(["run", str(bundle), "--host-fallback", "-i", f"x={tmp_path / 'x.npy'}"]) == 0
    assert cli.main(["run", str(bundle), "-t", "fake", "-i", f"x={tmp_path / 'x.npy'}"]) == 2

    other = tmp_path / "host.bundle"
    assert cli.main(["compile", str(model), "--host-only", "-o", str(other)]) == 0
    assert cli.main(["run", str(other), "-i", f"x={tmp_path / 'x.npy'}"]) == 0  # recognised by content
