"""The TensorRT path against the test double of tensorrt 10/11 and cudart (``tests/fake_trt``).

Every test here runs twice, once per TensorRT major (fixture ``fake_trt``). The double checks
the plugin's plumbing (API calls, types, profiles, memory, streams, threads, cache), not
TensorRT's numerics: its engines run the network with onnxruntime on the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from jetson_helpers import assert_fp16_close, compile_jetson, jetson_callable, make_model
from onnx import TensorProto, helper, numpy_helper

import byoc_jetson.plugin as plugin
import byoc_jetson.tensorrt_rt as trt_rt
from byoc.errors import InputError, PluginError
from byoc.plugins import build_registry
from byoc.testing.oracle import run_onnxruntime
from byoc_jetson.cache import EngineCache
from byoc_jetson.codegen import fp16_network
from byoc_jetson.options import validate_options

FLOAT = TensorProto.FLOAT
HERE = Path(__file__).parent


def _conv_net(batch="N"):
    rng = np.random.default_rng(0)
    return make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("Gemm", ["f", "g"], ["y"], transB=1),
        ],
        {"x": (FLOAT, [batch, 3, 4, 4])}, ["y"],
        {"w": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
         "b": rng.standard_normal(4).astype(np.float32) * 0.1,
         "g": (rng.standard_normal((5, 64)) * 0.1).astype(np.float32)},
    )


def _gpu():
    return sys.modules["cuda.bindings.runtime"].gpu


def _major(trt) -> int:
    return int(trt.__version__.split(".")[0])


def _region(model, tmp_path, **options):
    artifact, fn = jetson_callable(model, runtime="tensorrt", cache_dir=str(tmp_path / "engines"), **options)
    assert isinstance(fn, trt_rt.TensorRTRegion)
    return artifact, fn


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_compile_build_run_against_onnxruntime(fake_trt, registry, tmp_path, precision):
    model = _conv_net()
    cm = compile_jetson(registry, model, runtime="tensorrt", precision=precision, precompile=True,
                        cache_dir=str(tmp_path))
    assert not cm.faults, cm.faults
    (cr,) = cm.regions
    assert cr.artifact.metadata["runtime_path"] == "tensorrt"
    assert len(list(tmp_path.glob("*.engine"))) == 1
    (build,) = fake_trt.state.builds
    if _major(fake_trt) >= 11:
        # TensorRT 11: no FP16 flag; precision is the network's types (float16 weights, float32 I/O)
        assert not hasattr(fake_trt.BuilderFlag, "FP16") and build["strongly_typed"]
        inits = {t.data_type for t in build["model"].graph.initializer}
        assert inits == ({TensorProto.FLOAT16} if precision == "fp16" else {TensorProto.FLOAT})
    else:
        assert not build["strongly_typed"]
        assert ("FP16" in build["flags"]) == (precision == "fp16")
    assert ("TF32" in build["flags"]) == (precision == "fp16")  # fp32 clears TF32
    assert [t[2] for t in build["inputs"]] == [int(fake_trt.DataType.FLOAT)]  # I/O stays float32
    # dynamic batch: an exact batch-1 profile and a 1..max_batch_size one tuned for the largest
    assert build["profiles"] == [{"x": [[1, 3, 4, 4]] * 3}, {"x": [[1, 3, 4, 4], [8, 3, 4, 4], [8, 3, 4, 4]]}]
    rng = np.random.default_rng(1)
    for batch in (1, 3, 8, 1):
        x = rng.standard_normal((batch, 3, 4, 4)).astype(np.float32)
        (want,) = run_onnxruntime(model, {"x": x})
        got = cm.run({"x": x})["y"]
        assert got.dtype == np.float32 and got.shape == want.shape
        if precision == "fp16":
            assert_fp16_close(got, want, what="fp16 engine")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(fake_trt.state.builds) == 1  # every batch within the two profiles


def test_auto_picks_tensorrt_when_present_and_registration_touches_no_cuda(fake_trt, registry, tmp_path):
    gpu = _gpu()
    reg = build_registry([("jetson", plugin)], entry_points=False)
    assert reg.targets["jetson"].runtime_path == "auto"
    assert gpu.calls == []  # building the registry initialised nothing (fork-safe)
    cm = compile_jetson(registry, _conv_net(2), runtime="auto", cache_dir=str(tmp_path))
    assert cm.regions[0].artifact.metadata["runtime_path"] == "tensorrt"
    assert ("cudaGetDeviceCount", None) in gpu.calls


def test_scalar_input(fake_trt, tmp_path):
    model = make_model([helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                       {"x": (FLOAT, [2, 3]), "s": (FLOAT, [])}, ["y"])
    _, fn = _region(model, tmp_path, precision="fp32")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    (y,) = fn(x, np.float32(-1.5))
    np.testing.assert_array_equal(y, np.maximum(x * -1.5, 0))
    (y,) = fn(x, np.array(2.0, np.float32))  # a 0-d array stays 0-d (set_input_shape(name, ()))
    np.testing.assert_array_equal(y, np.maximum(x * 2, 0))


def test_feeds_convert_only_when_exact(fake_trt, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (FLOAT, [2, 2])}, ["y"])
    _, fn = _region(model, tmp_path, precision="fp32")
    exact = np.array([[1.0, -2.0], [0.5, 3.0]])  # float64, every value a float32
    np.testing.assert_array_equal(fn(exact)[0], np.maximum(exact, 0).astype(np.float32))
    np.testing.assert_array_equal(fn(np.array([[1, -2], [3, 4]], np.int16))[0], [[1, 0], [3, 4]])  # safe cast
    with pytest.raises(InputError, match="'x'.*float64"):
        fn(np.array([[0.1, 0.2], [0.3, 0.4]]))  # not exactly representable: no silent rounding
    with pytest.raises(InputError, match="'x'"):
        fn(np.array([[2**40 + 1, 0], [0, 0]], np.int64))  # 2**40 alone would be exact


def test_int64_inputs_stay_int64(fake_trt, tmp_path):
    model = make_model([helper.make_node("Add", ["x", "x"], ["y"])], {"x": (TensorProto.INT64, [3])}, ["y"])
    _, fn = _region(model, tmp_path)
    x = np.array([2**40, -1, 7], np.int64)  # no int64 -> int32 wrap-around
    np.testing.assert_array_equal(fn(x)[0], x + x)


def test_beyond_every_profile_rebuilds_then_runs_on_the_host(fake_trt, tmp_path):
    model = _conv_net()
    _, fn = _region(model, tmp_path, precision="fp32", max_batch_size=2, max_engines=1)
    rng = np.random.default_rng(2)

    def check(batch):
        x = rng.standard_normal((batch, 3, 4, 4)).astype(np.float32)
        np.testing.assert_allclose(fn(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-5)

    check(2)
    assert len(fake_trt.state.builds) == 1
    check(5)  # beyond 1..2: an engine with an exact profile for batch 5
    assert len(fake_trt.state.builds) == 2
    assert fake_trt.state.builds[1]["profiles"] == [{"x": [[5, 3, 4, 4]] * 3}]
    check(5)
    assert len(fake_trt.state.builds) == 2
    with pytest.warns(RuntimeWarning, match="run on the host"):
        check(7)  # max_engines reached: the host runs it
    assert len(fake_trt.state.builds) == 2
    # the extra engine is cached like the first: a new region builds nothing
    _, again = _region(model, tmp_path, precision="fp32", max_batch_size=2, max_engines=1)
    again(np.zeros((2, 3, 4, 4), np.float32))
    again(np.zeros((5, 3, 4, 4), np.float32))
    assert len(fake_trt.state.builds) == 2


def test_dynamic_dims_beyond_the_batch(fake_trt, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (FLOAT, ["N", 2, "W"])}, ["y"])
    # no expected shape: precompile cannot make a profile, so the first run builds an exact one
    _, fn = _region(model, tmp_path, precompile=True, precision="fp32")
    assert fake_trt.state.builds == []
    x = np.linspace(-1, 1, 2 * 2 * 5, dtype=np.float32).reshape(2, 2, 5)
    np.testing.assert_array_equal(fn(x)[0], np.maximum(x, 0))
    assert fake_trt.state.builds[0]["profiles"] == [{"x": [[2, 2, 5]] * 3}]
    # expected shapes (option profile_shapes): one exact profile each, built at compile time
    _, fn = _region(model, tmp_path, precompile=True, precision="fp32",
                    profile_shapes=[{"x": [1, 2, 7]}, {"x": [4, 2, 9]}])
    assert fake_trt.state.builds[1]["profiles"] == [{"x": [[1, 2, 7]] * 3}, {"x": [[4, 2, 9]] * 3}]
    for shape in ((4, 2, 9), (1, 2, 7)):
        x = np.ones(shape, np.float32)
        np.testing.assert_array_equal(fn(x)[0], x)
    assert len(fake_trt.state.builds) == 2


def test_refused_engine_is_evicted_and_rebuilt(fake_trt, tmp_path):
    model = _conv_net(2)
    _, first = _region(model, tmp_path, precompile=True)
    assert len(fake_trt.state.builds) == 1
    fake_trt.state.refuse_next = 1  # the entry passes the cache's hash checks, TensorRT refuses it
    cache = EngineCache(tmp_path / "engines")
    opts = validate_options({"runtime": "tensorrt", "precompile": True, "cache_dir": str(tmp_path / "engines")})
    region = trt_rt.TensorRTRegion(_artifact(model), opts, cache=cache)
    assert (cache.hits, cache.evictions, cache.misses) == (1, 1, 1)
    assert len(fake_trt.state.builds) == 2
    x = np.ones((2, 3, 4, 4), np.float32)
    assert_fp16_close(region(x)[0], run_onnxruntime(model, {"x": x})[0])
    # the rebuilt engine was stored: the next region loads it
    again = EngineCache(tmp_path / "engines")
    trt_rt.TensorRTRegion(_artifact(model), opts, cache=again)
    assert (again.hits, again.misses) == (1, 0)


def _artifact(model):
    artifact, _ = jetson_callable(model, runtime="emulation")
    return artifact


def test_unwritable_cache_folder_still_runs(fake_trt, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")  # mkdir fails even as root
    model = _conv_net(2)
    with pytest.warns(RuntimeWarning, match="could not store the TensorRT engine"):
        _, fn = jetson_callable(model, runtime="tensorrt", precompile=True, cache_dir=str(blocker / "engines"))
    x = np.ones((2, 3, 4, 4), np.float32)
    assert_fp16_close(fn(x)[0], run_onnxruntime(model, {"x": x})[0])
    assert fn.cache.store_errors and fn.cache.misses == 1


def test_stream_destroyed_buffers_freed_pinned_after_runs(fake_trt, tmp_path):
    gpu = _gpu()
    model = _conv_net(2)
    _, fn = _region(model, tmp_path, precision="fp32", pin_after_runs=2)
    rng = np.random.default_rng(3)
    for i in range(4):
        x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
        np.testing.assert_allclose(fn(x)[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
        if i == 1:
            assert gpu.pinned_copies == 0 and gpu.pageable_copies == 4  # 2 runs x (1 in + 1 out)
    assert gpu.pinned_copies == 4 and gpu.host_memory  # runs 3 and 4 staged through pinned buffers
    assert gpu.streams_created == 1 and gpu.device_memory
    fn.close()
    assert gpu.streams_destroyed == 1 and gpu.streams == {}
    assert gpu.device_memory == {} and gpu.host_memory == {}


def test_io_modes_are_checked(fake_trt, tmp_path):
    model = _conv_net(2)
    _, fn = _region(model, tmp_path, precompile=True)
    key = fn.key
    engine = fn.cache.load(key)
    backend = trt_rt.get_backend()
    with pytest.raises(trt_rt.TensorRTError, match="'y' is .*OUTPUT, expected .*INPUT"):
        backend.load(engine, ["y"], ["x"])
    with pytest.raises(trt_rt.TensorRTError, match="no tensor 'z'"):
        backend.load(engine, ["x"], ["z"])


def test_device_option_sets_the_device_in_the_build_thread(fake_trt, tmp_path):
    gpu = _gpu()
    gpu.devices = [("NVIDIA H100 80GB HBM3", 9, 0), ("NVIDIA H200", 9, 0)]
    model = _conv_net(2)
    _, fn = _region(model, tmp_path, device=1)
    assert fn.key.device_name == "NVIDIA H200" and fn.key.compute_capability == "9.0"
    done = []
    worker = threading.Thread(target=lambda: done.append(fn(np.ones((2, 3, 4, 4), np.float32))))
    worker.start()
    worker.join()
    (build,) = fake_trt.state.builds
    assert build["build_device"] == 1 and build["thread"] == worker.ident and build["device"] == "NVIDIA H200"
    assert done and done[0][0].shape == (2, 5)
    # same compute capability, another GPU model: another engine
    _, other = _region(model, tmp_path, device=0)
    assert other.key.digest != fn.key.digest
    with pytest.raises(trt_rt.TensorRTError, match="'device' is 2, but this machine has 2"):
        _region(model, tmp_path, device=2)


def test_concurrent_calls_from_threads(fake_trt, tmp_path):
    model = _conv_net()
    _, fn = _region(model, tmp_path, precision="fp32")
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((1 + i % 3, 3, 4, 4)).astype(np.float32) for i in range(8)]
    out = [None] * len(xs)

    def work(i):
        out[i] = fn(xs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, out):
        np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert len(fake_trt.state.builds) == 1


def test_driver_too_old(fake_trt, registry, tmp_path):
    """cuda-python 13 on a CUDA 12 driver: "tensorrt" is a clear error, "auto" falls back visibly."""
    _gpu().driver = "too-old"
    model = _conv_net(2)
    with pytest.raises(PluginError, match="cudaErrorInsufficientDriver"):
        _strict(registry, model, tmp_path)
    with pytest.warns(RuntimeWarning, match="falls back to the CPU emulation.*cudaErrorInsufficientDriver"):
        cm = compile_jetson(registry, model, runtime="auto", cache_dir=str(tmp_path))
    meta = cm.regions[0].artifact.metadata
    assert meta["runtime_path"] == "emulation" and "cudaErrorInsufficientDriver" in meta["runtime_note"]


def _strict(registry, model, tmp_path):
    import byoc

    return byoc.compile(model, targets=["jetson"], registry=registry, strict=True,
                        target_options={"jetson": {"runtime": "tensorrt", "cache_dir": str(tmp_path)}})


def test_no_gpu_is_not_a_fault(fake_trt, registry):
    _gpu().driver = "no-device"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        cm = compile_jetson(registry, _conv_net(2), runtime="auto")
    assert cm.regions[0].artifact.metadata["runtime_path"] == "emulation"


@pytest.mark.parametrize("require", ["1", ""])
def test_required_gpu_tests_fail_instead_of_skipping(require):
    """TensorRT installed, driver too old: with BYOC_REQUIRE_GPU=1 the GPU tests fail, else skip, said loudly."""
    env = dict(os.environ, BYOC_REQUIRE_GPU=require, BYOC_JETSON_FAKE_GPU="too-old")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          str(HERE / "test_jetson_tensorrt.py")], capture_output=True, text=True, env=env,
                         cwd=HERE, timeout=600)
    if require:
        assert run.returncode == 1, run.stdout[-2000:]
        assert "BYOC_REQUIRE_GPU=1 but the TensorRT path cannot run" in run.stdout
        assert "cudaErrorInsufficientDriver" in run.stdout
    else:
        assert run.returncode == 0, run.stdout[-2000:]
        assert "GPU test(s) were NOT run" in run.stdout and "cudaErrorInsufficientDriver" in run.stdout


def test_fp16_network_is_valid_onnx_with_float32_io():
    rng = np.random.default_rng(5)
    model = make_model(
        [helper.make_node("Constant", [], ["k"], value_float=0.5),
         helper.make_node("Mul", ["x", "k"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Cast", ["a"], ["c"], to=FLOAT),
         helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="nearest"),
         helper.make_node("Relu", ["r"], ["y"])],
        {"x": (FLOAT, [1, 2, 3, 3])}, ["y", "m"],
        {"b": rng.standard_normal((1, 2, 3, 3)).astype(np.float32),
         "scales": np.array([1, 1, 2, 2], np.float32)},
    )
    half = onnx.ModelProto.FromString(fp16_network(model.SerializeToString()))
    onnx.checker.check_model(half, full_check=True)
    assert [i.name for i in half.graph.input] == ["x"] and [o.name for o in half.graph.output] == ["y", "m"]
    types = {t.name: t.data_type for t in half.graph.initializer}
    assert types == {"b": TensorProto.FLOAT16, "scales": TensorProto.FLOAT}  # Resize scales stay float32
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    want = run_onnxruntime(model, {"x": x})
    from onnx.reference import ReferenceEvaluator

    got = ReferenceEvaluator(half).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        assert_fp16_close(g, w, what="fp16 network")
    assert numpy_helper.to_array(half.graph.initializer[0]).dtype in (np.float16, np.float32)
