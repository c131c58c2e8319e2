"""Issue 18, class 2 (found in round two): references to artifact bytes (byoc.bundle.shared) are
copied when a bundle loads, and many references may name the same bytes. A region subgraph with
thousands of initializers, each referring to its whole artifact, made a small bundle inflate to
gigabytes past the budget. What the references would copy is now counted against the budget
(each tensor, and every member of the bundle together) before anything is copied."""

from __future__ import annotations

import os
import resource
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import byoc
import byoc_fuzz.hostile as fh

REGION = "regions/0000/region.onnx"


def _members(tmp_path) -> dict[str, bytes]:
    w = np.arange(16384, dtype=np.float32).reshape(128, 128)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["a"], name="n0"), helper.make_node("Relu", ["a"], ["y"], name="n1")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 128])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    reg = fh.registry(fh.HostilePlugin("none", "none", 0))
    path = tmp_path / "plain.byoc"
    byoc.compile(model, targets=["hostile"], registry=reg).save(path)
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def _write(members: dict[str, bytes], path) -> str:
    members = dict(members)
    fh._rehash(members)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return os.fspath(path)


def _with_copies(members: dict[str, bytes], copies: int, length: int | None = None) -> dict[str, bytes]:
    region = onnx.ModelProto()
    region.ParseFromString(members[REGION])
    ref = next(t for t in region.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    for i in range(copies):
        t = region.graph.initializer.add()
        t.CopyFrom(ref)
        t.name = f"copy{i}"
        if length is not None:
            for e in t.external_data:
                if e.key == "length":
                    e.value = str(length)
            del t.dims[:]
            t.dims.append(length // 4)
    return {**members, REGION: region.SerializeToString()}


@settings(max_examples=5)
@given(copies=st.sampled_from([600, 2000, 5000]), budget_mib=st.sampled_from([8, 16, 32]))
def test_references_that_would_copy_past_the_budget_are_refused_first(tmp_path_factory, copies, budget_mib):
    tmp = tmp_path_factory.mktemp("amp")
    path = _write(_with_copies(_members(tmp), copies), tmp / "m.byoc")
    reg = fh.registry(fh.HostilePlugin("none", "none", 0))
    budget = byoc.Budget(max_total_bytes=budget_mib << 20, max_tensor_bytes=budget_mib << 19)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(byoc.BundleError, match="references to artifact bytes would copy.*max_total_bytes"):
        byoc.load(path, registry=reg, budget=budget)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) << 10
    assert grown < 2 * (budget_mib << 20)


def test_one_reference_past_the_tensor_budget_is_refused(tmp_path):
    path = _write(_with_copies(_members(tmp_path), 1, length=(64 << 10) + 64), tmp_path / "m.byoc")
    reg = fh.registry(fh.HostilePlugin("none", "none", 0))
    with pytest.raises(byoc.BundleError, match="bytes referred to, over the budget.s max_tensor_bytes"):
        byoc.load(path, registry=reg, budget=byoc.Budget(max_tensor_bytes=64 << 10))


def test_a_few_honest_copies_still_load(tmp_path):
    path = _write(_with_copies(_members(tmp_path), 3), tmp_path / "m.byoc")
    reg = fh.registry(fh.HostilePlugin("none", "none", 0))
    cm = byoc.load(path, registry=reg, budget=byoc.Budget(max_total_bytes=32 << 20))
    x = np.ones((128, 128), np.float32)
    assert np.array_equal(cm.run({"x": x})["y"], np.maximum(x + np.arange(16384, dtype=np.float32).reshape(128, 128), 0))


@pytest.mark.parametrize("dims", [[1 << 32, 1 << 32], [1 << 62, 4], [-1, -2]])
def test_a_reference_whose_dims_overflow_is_refused(tmp_path, dims):
    # dims multiplying past 2**63 wrap to 0 in int64: with length 0 the reference looked consistent
    members = _with_copies(_members(tmp_path), 1, length=0)
    region = onnx.ModelProto()
    region.ParseFromString(members[REGION])
    t = next(t for t in region.graph.initializer if t.name == "copy0")
    del t.dims[:]
    t.dims.extend(dims)
    path = _write({**members, REGION: region.SerializeToString()}, tmp_path / "m.byoc")
    with pytest.raises(byoc.BundleError, match="do not hold dims"):
        byoc.load(path, registry=fh.registry(fh.HostilePlugin("none", "none", 0)))
