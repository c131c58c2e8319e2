"""Helpers for the byoc-openvino tests: small models, onnxruntime references, the plugin's counters."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def onnxruntime_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def stats() -> dict:
    from byoc_openvino import engine

    return dict(engine.STATS)


def conv_net(dynamic: bool = True, seed: int = 0) -> onnx.ModelProto:
    """A small OCR-detector-like net: input [1, 3, H, W] (H, W symbolic when ``dynamic``), two
    convolutions with Relu, a residual Add, an upsampling Resize back to H x W and a Sigmoid."""
    rng = np.random.default_rng(seed)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    h, wd = ("H", "W") if dynamic else (32, 48)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["a2"], name="add2"),
        helper.make_node("Relu", ["a2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3"),
        helper.make_node("Resize", ["c3", "", "scales"], ["up"], mode="nearest", name="resize"),
        helper.make_node("Sigmoid", ["up"], ["y"], name="sigmoid"),
    ]
    inits = [w("w1", 8, 3, 3, 3), w("b1", 8, scale=0.1), w("w2", 8, 8, 3, 3, scale=0.2), w("b2", 8, scale=0.1),
             w("w3", 1, 8, 1, 1), w("b3", 1, scale=0.1),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, wd])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, h, wd])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
