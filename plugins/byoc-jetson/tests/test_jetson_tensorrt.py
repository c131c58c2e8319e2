"""The real TensorRT path: needs the tensorrt package and a CUDA GPU (``@pytest.mark.gpu``, skipped otherwise)."""

from __future__ import annotations

import numpy as np
import pytest
from jetson_helpers import assert_fp16_close, compile_jetson, make_model
from onnx import TensorProto, helper

from byoc.testing.oracle import run_onnxruntime
from byoc_jetson.cache import EngineCache
from byoc_jetson.tensorrt_rt import TensorRTRegion

FLOAT = TensorProto.FLOAT
pytestmark = pytest.mark.gpu


def _conv_net(batch="N"):
    rng = np.random.default_rng(0)
    return make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("Gemm", ["f", "g"], ["h"], transB=1),
            helper.make_node("Softmax", ["h"], ["y"]),
        ],
        {"x": (FLOAT, [batch, 3, 8, 8])}, ["y"],
        {"w": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
         "b": rng.standard_normal(8).astype(np.float32) * 0.1,
         "g": (rng.standard_normal((10, 128)) * 0.1).astype(np.float32)},
    )


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_engine_runs_and_matches_onnxruntime(registry, precision, tmp_path):
    model = _conv_net()
    cm = compile_jetson(registry, model, runtime="tensorrt", precision=precision, precompile=True,
                        cache_dir=str(tmp_path))
    assert not cm.faults, cm.faults
    (cr,) = cm.regions
    assert cr.artifact.metadata["runtime_path"] == "tensorrt"
    assert len(list(tmp_path.glob("*.engine"))) == 1
    rng = np.random.default_rng(1)
    for batch in (1, 3):  # dynamic batch: one optimisation profile up to max_batch_size
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        (want,) = run_onnxruntime(model, {"x": x})
        got = cm.run({"x": x})["y"]
        if precision == "fp16":
            assert_fp16_close(got, want, what="fp16 engine")
        else:
            # float32 engine (TF32 off); kernel choice (e.g. Winograd) still reorders sums
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


def test_engine_cache_is_reused(registry, tmp_path):
    model = _conv_net(batch=2)
    cm = compile_jetson(registry, model, runtime="tensorrt", precompile=True, cache_dir=str(tmp_path))
    (cr,) = cm.regions
    cache = EngineCache(tmp_path)
    options = dict(cm.options["target_options"]["jetson"])
    region = TensorRTRegion(cr.artifact, options, cache=cache)
    assert cache.hits == 1 and cache.misses == 0
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    # the same engine bytes on the same GPU
    np.testing.assert_allclose(region(x)[0], cm.run({"x": x})["y"], rtol=1e-6, atol=1e-7)
