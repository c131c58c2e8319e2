"""Codegen: the region as a standalone ONNX model plus its builder config, deterministic."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jetson_helpers import compile_jetson, host_run, make_model, require_kernels, whole_region
from onnx import TensorProto, helper

import byoc
import byoc_jetson.plugin as plugin
from byoc.errors import OptionError
from byoc.plugins import build_registry
from byoc.testing.oracle import run_onnxruntime
from byoc_jetson.codegen import CONFIG_KEY, RECIPE_VERSION, read_config
from byoc_jetson.options import (
    DEFAULT_OPTIONS,
    registered_runtime_path,
    runtime_path,
    tensorrt_available,
    validate_options,
)

FLOAT = TensorProto.FLOAT


def _model(seed=0, n=4):
    rng = np.random.default_rng(seed)
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        {"x": (FLOAT, [2, n])}, ["y"],
        {"w": rng.standard_normal((n, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)},
    )


def _artifact(model, **options):
    return plugin.byoc_codegen(whole_region(model), validate_options(options))


@settings(max_examples=10)
@given(seed=st.integers(0, 1000), n=st.integers(1, 8), precision=st.sampled_from(["fp16", "fp32"]))
def test_codegen_is_deterministic(seed, n, precision):
    a = _artifact(_model(seed, n), precision=precision)
    b = _artifact(_model(seed, n), precision=precision)
    assert a.data == b.data and a.metadata == b.metadata and a.sha256 == b.sha256


def test_artifact_is_a_standalone_onnx_model_with_its_builder_config():
    model = _model()
    art = _artifact(model, precision="fp32", workspace=1 << 24)
    proto = onnx.ModelProto.FromString(art.data)
    onnx.checker.check_model(proto)
    assert [i.name for i in proto.graph.input] == art.metadata["inputs"] == ["x"]
    assert [o.name for o in proto.graph.output] == art.metadata["outputs"] == ["y"]
    config = {"precision": "fp32", "workspace": 1 << 24, "max_batch_size": DEFAULT_OPTIONS["max_batch_size"],
              "profile_shapes": None, "recipe": RECIPE_VERSION}
    assert read_config(art.data) == art.metadata["builder_config"] == config
    assert {p.key for p in proto.metadata_props} == {CONFIG_KEY}
    assert art.metadata["subgraph_sha256"] == hashlib.sha256(art.data).hexdigest()
    assert art.format == "onnx" and art.target == "jetson"
    json.dumps(art.metadata)  # JSON-serialisable
    # the file alone runs anywhere ONNX runs: same numbers as the host reference
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    (ort,) = run_onnxruntime(proto, {"x": x})
    np.testing.assert_allclose(ort, host_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_builder_options_change_the_artifact():
    base = _artifact(_model())
    for change in ({"precision": "fp32"}, {"workspace": 1 << 25}, {"max_batch_size": 2},
                   {"profile_shapes": [{"x": [2, 4]}]}):
        other = _artifact(_model(), **change)
        assert other.data != base.data and other.metadata["subgraph_sha256"] != base.metadata["subgraph_sha256"]
    # options that do not reach the builder leave it unchanged
    assert _artifact(_model(), min_subgraph_size=3, precompile=True, device=1, pin_after_runs=0,
                     max_engines=1).data == base.data


def test_runtime_path_is_reported():
    active = "tensorrt" if tensorrt_available() else "emulation"
    assert runtime_path(DEFAULT_OPTIONS) == active
    assert _artifact(_model()).metadata["runtime_path"] == active
    assert _artifact(_model(), runtime="emulation").metadata["runtime_path"] == "emulation"
    assert _artifact(_model(), runtime="tensorrt").metadata["runtime_path"] == "tensorrt"
    reg = build_registry([("jetson", plugin)], entry_points=False)
    # registration does not initialise CUDA: it only says whether tensorrt is installed
    assert reg.targets["jetson"].runtime_path == registered_runtime_path()
    assert registered_runtime_path() in ("emulation", "auto")
    assert reg.targets["jetson"].device == "gpu"
    assert (reg.targets["jetson"].rtol, reg.targets["jetson"].atol) == (1e-2, 1e-3)


def test_compile_twice_gives_identical_artifacts(registry):
    require_kernels("MatMul")
    a = compile_jetson(registry, _model())
    b = compile_jetson(registry, _model())
    assert [r.artifact.data for r in a.regions] == [r.artifact.data for r in b.regions]
    assert [r.artifact.metadata for r in a.regions] == [r.artifact.metadata for r in b.regions]


def test_entry_point_is_installed():
    reg = build_registry()
    assert "jetson" in reg.targets and reg.targets["jetson"].distribution == "byoc-jetson"
    assert byoc.HOOK_API_VERSION == reg.targets["jetson"].api_version


@pytest.mark.parametrize("bad", [
    {"precision": "int8"}, {"workspace": 10}, {"min_subgraph_size": 0}, {"max_regions": 0},
    {"precompile": "yes"}, {"runtime": "cuda"}, {"max_batch_size": True}, {"cache_dir": 3}, {"nope": 1},
    {"device": -1}, {"device": "0"}, {"max_engines": -1}, {"pin_after_runs": 1.5}, {"profile_shapes": {"x": [1]}},
    {"profile_shapes": [{"x": [-1, 3]}]}, {"profile_shapes": [{}]},
])
def test_option_validation(bad):
    with pytest.raises(OptionError, match="jetson"):
        validate_options(bad)


def test_hooks_are_scoped_to_the_jetson_target():
    """byoc calls the jetson hooks only for "jetson": no hook needs to check the target name."""
    from byoc.plugins import build_registry

    reg = build_registry([("jetson", plugin)], entry_points=False)
    assert reg.scopes == {"jetson": ["jetson"]}
    assert reg.hookimpls("byoc_codegen", "other") == []


def test_bundle_round_trip_is_bit_identical(registry, tmp_path):
    """save -> byoc.load -> run: the runtime hook rebuilds the callable from the artifact alone."""
    require_kernels("MatMul")
    cm = compile_jetson(registry, _model())
    path = cm.save(tmp_path / "model.byoc")
    loaded = byoc.load(path, registry=registry)
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], cm.run({"x": x})["y"])
    assert [r.artifact.data for r in loaded.regions] == [r.artifact.data for r in cm.regions]


def test_optimisation_profiles():
    from byoc_jetson.codegen import ProfileError, optimisation_profiles

    config = {"max_batch_size": 4, "profile_shapes": None}
    assert optimisation_profiles([("x", [2, 3])], config) == []  # static: none needed
    one, span = optimisation_profiles([("x", [-1, 3]), ("s", [])], config)
    assert one == {"x": ((1, 3),) * 3} and span == {"x": ((1, 3), (4, 3), (4, 3))}
    # expected shapes first; a dynamic input they do not name takes their batch
    config = {"max_batch_size": 4, "profile_shapes": [{"x": [2, 3]}]}
    profiles = optimisation_profiles([("x", [-1, 3]), ("y", [-1, 5])], config)
    assert profiles[0] == {"x": ((2, 3),) * 3, "y": ((2, 5),) * 3} and len(profiles) == 3
    # shapes met beyond every profile: exactly those
    assert optimisation_profiles([("x", [-1, 3])], config, [{"x": [9, 3]}]) == [{"x": ((9, 3),) * 3}]
    with pytest.raises(ProfileError, match="'x'.*no expected shape|profile_shapes"):
        optimisation_profiles([("x", [-1, -1])], {"max_batch_size": 4, "profile_shapes": None})
    with pytest.raises(ProfileError, match="does not fit"):
        optimisation_profiles([("x", [-1, 3])], {"max_batch_size": 4, "profile_shapes": [{"x": [2, 4]}]})
