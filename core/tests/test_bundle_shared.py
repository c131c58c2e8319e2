"""Weights stored once in a bundle: a region subgraph refers to its artifact's bytes."""

from __future__ import annotations

import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_bundle import FEEDS, Vendor, members_of, refused, registry, rehash, same_outputs, write_zip

import byoc
from byoc.bundle import BundleFallbackWarning, shared


def big_model(n: int = 4096) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, n],
                           np.random.default_rng(0).standard_normal((3, n)).astype(np.float32).tobytes(), raw=True)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture()
def big(tmp_path):
    reg = registry(Vendor(ops=("Relu", "MatMul")))
    cm = byoc.compile(big_model(), registry=reg)
    return cm, cm.save(tmp_path / "big.byoc"), reg


def region_onnx(members: dict[str, bytes]) -> str:
    (name,) = [n for n in members if n.endswith("region.onnx")]
    return name


def test_weights_are_stored_once_and_both_paths_run(big, tmp_path):
    cm, path, reg = big
    members = members_of(path)
    weight_bytes = 3 * 4096 * 4
    # the vendor's artifact holds the region's ONNX body (weights included); the kept subgraph
    # refers to those bytes instead of holding them again
    assert len(members[region_onnx(members)]) < 1024
    assert sum(len(d) for d in members.values()) < 1.1 * weight_bytes + 8192
    with zipfile.ZipFile(path) as zf:
        assert sum(i.compress_size for i in zf.infolist()) < 1.1 * weight_bytes + 8192
    want = cm.run(FEEDS)
    assert same_outputs(want, byoc.load(path, registry=reg).run(FEEDS))
    with pytest.warns(BundleFallbackWarning):
        fallback = byoc.load(path, registry=registry(), fallback="host")
    assert same_outputs(want, fallback.run(FEEDS))
    assert fallback.save(tmp_path / "again.byoc").read_bytes() == path.read_bytes()


def _edit_reference(members, **changes):
    name = region_onnx(members)
    proto = onnx.ModelProto()
    proto.ParseFromString(members[name])
    (t,) = [t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    info = {e.key: e.value for e in t.external_data}
    info.update(changes)
    del t.external_data[:]
    for k, v in info.items():
        if v is not None:
            e = t.external_data.add()
            e.key, e.value = k, v
    return rehash({**members, name: proto.SerializeToString()})


@pytest.mark.parametrize("changes, message", [
    ({"offset": "999999999"}, "outside the artifact"),
    ({"offset": "-4"}, "outside the artifact"),
    ({"length": "12"}, "do not hold dims"),
    ({"offset": "x"}, "malformed artifact reference"),
    ({"location": "../../etc/passwd"}, "external data"),
    ({"location": "/tmp/w.bin"}, "external data"),
    ({"checksum": "0"}, "where none are allowed"),
])
def test_bad_references_are_refused_naming_the_tensor(big, tmp_path, changes, message):
    _, path, reg = big
    bad = write_zip(tmp_path / "bad.byoc", _edit_reference(members_of(path), **changes))
    err = refused(bad, registry=reg)
    assert message in str(err) and "region.onnx" in str(err)


def test_a_reference_in_the_host_graph_is_refused(big, tmp_path):
    _, path, reg = big
    members = members_of(path)
    proto = onnx.ModelProto()
    proto.ParseFromString(members["model.onnx"])
    proto.graph.initializer.add().CopyFrom(helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0]))
    t = proto.graph.initializer[-1]
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", shared.LOCATION), ("offset", "0"), ("length", "4")):
        e = t.external_data.add()
        e.key, e.value = k, v
    bad = write_zip(tmp_path / "bad.byoc", rehash({**members, "model.onnx": proto.SerializeToString()}))
    err = refused(bad, registry=reg)
    assert "'z'" in str(err) and "model.onnx" in str(err)


def test_loading_views_the_artifact_bytes_instead_of_copying_them():
    """The reader attaches a region subgraph's weights as read-only views of its artifact member."""
    w = np.arange(2048, dtype=np.float32).reshape(2, 1024)
    artifact = bytes(64) + w.tobytes()

    def graph():
        g = onnx.GraphProto()
        t = g.initializer.add()
        t.name, t.data_type = "w", TensorProto.FLOAT
        t.dims.extend(w.shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", shared.LOCATION), ("offset", "64"), ("length", str(w.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return g

    def fail(msg):
        return ValueError(msg)

    held = shared.detach(graph(), artifact, fail, views=True)
    (_, ref), = held
    arr = shared.view_of(ref, artifact, None)
    assert np.array_equal(arr, w) and not arr.flags.writeable
    assert np.shares_memory(arr, np.frombuffer(artifact, np.uint8))
    # without views (the writer's check) the bytes are copied back into the proto
    copied = shared.detach(graph(), artifact, fail)
    assert copied[0][1].raw_data == w.tobytes() and shared.view_of(copied[0][1], artifact, None) is None


def test_low_entropy_weights_are_found_in_linear_time():
    # a constant tensor matches the artifact's first word almost everywhere: the search must not
    # compare the whole tensor at each of those places (that was quadratic: minutes per model)
    half = np.full(1 << 18, 0.5, np.float32)  # 1 MiB
    needle = half.copy()
    needle[-1] = 1.0
    artifact = np.concatenate([half, half, half, half, needle]).tobytes()
    graph = helper.make_graph([], "g", [], [], [onnx.numpy_helper.from_array(needle, "w"),
                                                onnx.numpy_helper.from_array(half[:2048] + 1, "absent")])
    assert shared.share(graph, artifact) == needle.nbytes
    w, absent = graph.initializer
    assert {e.key: e.value for e in w.external_data}["offset"] == str(4 * half.nbytes)
    assert absent.HasField("raw_data")  # not in the artifact: stays inline
    # an occurrence only at unaligned offsets is not shared either
    odd = bytes(1) + needle.tobytes() + bytes(3)
    graph = helper.make_graph([], "g", [], [], [onnx.numpy_helper.from_array(needle, "w")])
    assert shared.share(graph, odd) == 0 and graph.initializer[0].HasField("raw_data")
