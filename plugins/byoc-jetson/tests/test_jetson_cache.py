"""The TensorRT path without a GPU: a fake TensorRT backend, the real engine cache.

The fake stands in for the library (its version, the GPU's compute capability, the builder):
it "builds" an engine that holds the region's ONNX and "runs" it with the CPU emulation, so the
whole TensorRT code path above the library (cache key, cache, lazy/eager build, byoc.compile
wiring) is exercised here.
"""

from __future__ import annotations

import hashlib
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jetson_helpers import assert_fp16_close, compile_jetson, host_run, make_model, require_kernels, whole_region
from onnx import TensorProto, helper

import byoc_jetson.plugin as plugin
import byoc_jetson.tensorrt_rt as trt_rt
from byoc_jetson.cache import EngineCache, EngineKey
from byoc_jetson.emulation import EmulatedRegion
from byoc_jetson.options import validate_options

FLOAT = TensorProto.FLOAT
MAGIC = b"FAKE-TRT-ENGINE\n"


class _Runner:
    def __init__(self, fn):
        self.fn = fn

    def covers(self, shapes):
        return -1

    def __call__(self, *inputs, profile=0):
        return self.fn(*inputs)

    def close(self):
        pass


class FakeBackend:
    """A stand-in for :class:`TensorRTBackend` itself (the library-level double is ``fake_trt``)."""

    def __init__(self, version: str = "10.3.0", cc: str = "8.7", name: str = "Orin"):
        self._version = version
        self._cc = cc
        self._name = name
        self.builds: list[dict] = []
        self.loads = 0

    def version(self) -> str:
        return self._version

    def compute_capability(self, device: int = 0) -> str:
        return self._cc

    def device_name(self, device: int = 0) -> str:
        return self._name

    def build(self, onnx_bytes: bytes, config, device=0, extra=()) -> bytes:
        self.builds.append(dict(config))
        return MAGIC + config["precision"].encode() + b"\n" + onnx_bytes

    def load(self, engine: bytes, input_names, output_names, device=0, pin_after_runs=0):
        assert engine.startswith(MAGIC)
        self.loads += 1
        precision, _, data = engine[len(MAGIC):].partition(b"\n")
        return _Runner(EmulatedRegion(data, precision.decode()))


def _model(scale: float = 1.0):
    return make_model([helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                      {"x": (FLOAT, [2, 3])}, ["y"], {"k": np.array(scale, np.float32)})


def _artifact(model, **options):
    return plugin.byoc_codegen(whole_region(model), validate_options(options))


def _region(backend, cache, model=None, **options):
    opts = validate_options({"runtime": "tensorrt", "precompile": True, **options})
    return trt_rt.TensorRTRegion(_artifact(model or _model(), **options), opts, backend=backend, cache=cache)


def test_cache_hit_then_invalidated_by_each_key_part(tmp_path):
    cache = EngineCache(tmp_path)
    fake = FakeBackend()
    _region(fake, cache)
    assert len(fake.builds) == 1
    _region(fake, cache)  # same everything: served from the cache
    assert len(fake.builds) == 1 and cache.hits == 1
    changes = [
        ("tensorrt version", lambda: (FakeBackend(version="10.4.0"), {}, None)),
        ("compute capability", lambda: (FakeBackend(cc="7.2"), {}, None)),
        ("GPU model", lambda: (FakeBackend(name="Thor"), {}, None)),
        ("expected shapes", lambda: (FakeBackend(), {"profile_shapes": [{"x": [2, 3]}]}, None)),
        ("precision", lambda: (FakeBackend(), {"precision": "fp32"}, None)),
        ("workspace", lambda: (FakeBackend(), {"workspace": 1 << 22}, None)),
        ("max_batch_size", lambda: (FakeBackend(), {"max_batch_size": 1}, None)),
        ("subgraph", lambda: (FakeBackend(), {}, _model(2.0))),
    ]
    for what, make in changes:
        backend, options, model = make()
        _region(backend, cache, model, **options)
        assert len(backend.builds) == 1, f"changing the {what} must rebuild the engine"
        # and the changed configuration is cached in turn
        _region(backend, cache, model, **options)
        assert len(backend.builds) == 1, what
    # the original entry is still there
    again = FakeBackend()
    _region(again, cache)
    assert again.builds == []
    assert len(list(tmp_path.glob("*.engine"))) == 1 + len(changes)


PARTS = {
    "version": ["10.0.1", "10.3.0"],
    "cc": ["7.2", "8.7"],
    "precision": ["fp16", "fp32"],
    "workspace": [1 << 22, 1 << 30],
    "scale": [1.0, 2.0],
}


@settings(max_examples=15)
@given(st.lists(st.fixed_dictionaries({k: st.sampled_from(v) for k, v in PARTS.items()}), min_size=1, max_size=8))
def test_builds_exactly_once_per_distinct_key(configs):
    """Over any sequence of configurations, the builder runs once per distinct (key parts) combination."""
    with tempfile.TemporaryDirectory() as folder:
        cache = EngineCache(folder)
        seen, builds = set(), 0
        for c in configs:
            fake = FakeBackend(c["version"], c["cc"])
            _region(fake, cache, _model(c["scale"]), precision=c["precision"], workspace=c["workspace"])
            builds += len(fake.builds)
            seen.add(tuple(sorted(c.items())))
            assert builds == len(seen)


def test_engine_key_digest_covers_every_part():
    base = dict(subgraph_sha256="a" * 64, tensorrt_version="10.0", compute_capability="9.0", precision="fp16",
                builder_options={"workspace": 1, "max_batch_size": 8}, device_name="NVIDIA H100 80GB HBM3",
                recipe_version=2)
    digest = EngineKey.make(**base).digest
    assert digest == EngineKey.make(**base).digest
    for key, other in [("subgraph_sha256", "b" * 64), ("tensorrt_version", "10.1"), ("compute_capability", "8.6"),
                       ("precision", "fp32"), ("builder_options", {"workspace": 2, "max_batch_size": 8}),
                       # same compute capability 9.0, another GPU model: NVIDIA ties engines to the device type
                       ("device_name", "NVIDIA H200"), ("recipe_version", 3)]:
        assert EngineKey.make(**{**base, key: other}).digest != digest, key


def test_corrupted_engine_is_rebuilt_never_loaded(tmp_path):
    cache = EngineCache(tmp_path)
    fake = FakeBackend()
    region = _region(fake, cache)
    engine_path, meta_path = cache.paths(region.key)
    data = engine_path.read_bytes()
    engine_path.write_bytes(data[:-10])  # truncated
    again = FakeBackend()
    _region(again, cache)
    assert len(again.builds) == 1
    assert hashlib.sha256(engine_path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    meta_path.write_text("{not json")
    third = FakeBackend()
    _region(third, cache)
    assert len(third.builds) == 1


def test_lazy_build_without_precompile(tmp_path):
    cache = EngineCache(tmp_path)
    fake = FakeBackend()
    opts = validate_options({"runtime": "tensorrt"})
    region = trt_rt.TensorRTRegion(_artifact(_model()), opts, backend=fake, cache=cache)
    assert fake.builds == [] and fake.loads == 0
    x = np.array([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]], np.float32)
    (y,) = region(x)
    assert len(fake.builds) == 1 and fake.loads == 1
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    region(x)
    assert len(fake.builds) == 1 and fake.loads == 1


def test_builder_failure_propagates(tmp_path):
    class Broken(FakeBackend):
        def build(self, onnx_bytes, config, device=0, extra=()):
            raise trt_rt.TensorRTError("TensorRT's ONNX parser rejected the region: boom")

    with pytest.raises(trt_rt.TensorRTError, match="boom"):
        _region(Broken(), EngineCache(tmp_path))
    assert list(tmp_path.glob("*.engine")) == []


def test_compile_on_the_tensorrt_path_with_a_fake_library(registry, monkeypatch, tmp_path):
    """byoc.compile with runtime="tensorrt": engines built at compile time (precompile) into the cache folder."""
    require_kernels("MatMul")
    fake = FakeBackend()
    monkeypatch.setattr(trt_rt, "get_backend", lambda: fake)
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                       {"x": (FLOAT, [2, 4])}, ["y"], {"w": rng.standard_normal((4, 3)).astype(np.float32)})
    cache_dir = tmp_path / "cache"
    cm = compile_jetson(registry, model, runtime="tensorrt", precompile=True, cache_dir=str(cache_dir))
    assert not cm.faults
    assert len(fake.builds) == 1 and len(list(cache_dir.glob("*.engine"))) == 1
    (cr,) = cm.regions
    assert cr.artifact.metadata["runtime_path"] == "tensorrt"
    x = rng.standard_normal((2, 4)).astype(np.float32)
    assert_fp16_close(cm.run({"x": x})["y"], host_run(model, {"x": x})[0])
    # a second compile of the same model finds the engine
    compile_jetson(registry, model, runtime="tensorrt", precompile=True, cache_dir=str(cache_dir))
    assert len(fake.builds) == 1


def test_tensorrt_path_without_the_library_falls_back_with_a_fault(registry, monkeypatch):
    """Forcing runtime="tensorrt" where tensorrt is missing: the region falls back to the host, named."""
    require_kernels("MatMul")
    from byoc_jetson.options import GpuProbe

    # tensorrt made missing here, so the test has the same outcome on a machine that has it
    monkeypatch.setattr(trt_rt, "tensorrt_probe", lambda: GpuProbe(False, "the tensorrt package is not installed"))
    monkeypatch.setattr(trt_rt, "_backend", None)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (FLOAT, [2, 4])}, ["y"],
                       {"w": np.ones((4, 3), np.float32)})
    with pytest.warns(UserWarning, match="tensorrt"):
        cm = compile_jetson(registry, model, runtime="tensorrt", precompile=True)
    assert not cm.regions
    rec = next(iter(cm.records.values()))
    assert rec.device == "host" and "tensorrt" in rec.fallback
