"""The nine model-zoo architectures from the onnx wheel (seeded random weights) on the cpu
target alone vs onnxruntime: rtol 1e-3, every node offloaded.

Compile time here is mostly byoc's frontend on the large-weight models (AlexNet, VGG-19,
ZFNet-512); the generated modules are cached (``$BYOC_CPU_CACHE``), so a second run is faster.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import compile_cpu, cpu_nodes, onnxruntime_run

from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_matches_onnxruntime(name):
    model = load_zoo(name, seed=0)
    feeds = zoo_inputs(model, seed=1)
    expected = onnxruntime_run(model, feeds)
    cm = compile_cpu(model)
    assert cpu_nodes(cm) == len(cm.records), "every node of the zoo models has a cpu code generator"
    got = cm.run(feeds)
    assert list(got) == [o.name for o in model.graph.output]
    for (out_name, actual), want in zip(got.items(), expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype, out_name
        np.testing.assert_allclose(actual, want, rtol=1e-3, atol=1e-6, err_msg=f"{name}: {out_name}")
