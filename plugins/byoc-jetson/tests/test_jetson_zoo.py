"""The nine model-zoo architectures on jetson (CPU emulation, fp16) against onnxruntime.

jetson must take every Conv and Gemm (BatchNormalization is folded into Conv by the shared
passes), offload no region without a multiply-accumulate operator, and stay within float16
tolerance (rtol 1e-2, atol 1e-3) of onnxruntime's float32 outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from jetson_helpers import assert_fp16_close, compile_jetson, require_kernels

from byoc.testing.oracle import run_onnxruntime
from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs
from byoc_jetson.support import MAC_OPS


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_architecture(registry, name):
    model = load_zoo(name, seed=0)
    require_kernels(*sorted({n.op_type for n in model.graph.node} - {"ConstantOfShape"}))
    feeds = zoo_inputs(model, seed=1)
    want = run_onnxruntime(model, feeds)
    cm = compile_jetson(registry, model)
    assert not cm.faults, [str(f) for f in cm.faults]
    macs = [r for r in cm.records.values() if r.op_type in ("Conv", "Gemm")]
    assert macs
    off = [f"{r.name} ({r.op_type}): {r.verdicts.get('jetson') or r.rule or r.fallback}" for r in macs
           if r.device != "jetson"]
    assert not off, off
    assert cm.regions
    for cr in cm.regions:
        assert any(n.op_type in MAC_OPS for n in cr.region.nodes), f"{cr.region.name} has no MAC operator"
        assert cr.artifact.metadata["runtime_path"] == "emulation"
    got = cm.run(feeds)
    assert list(got) == [o.name for o in model.graph.output]
    for (out, actual), expected in zip(got.items(), want):
        assert actual.dtype == expected.dtype == np.float32
        assert_fp16_close(actual, expected, what=f"{name}: {out}")
