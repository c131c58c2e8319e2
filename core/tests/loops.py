"""A counting Loop (``v += 1`` per iteration) shared by the control and hostile-input tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def counting_loop(trip_count: int | None, name: str = "runaway"):
    """A model ``v = v0 + iterations``; ``trip_count=None`` loops until the condition (always true) fails."""
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]), h.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, [1])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("v_out", T.FLOAT, [1])],
        [nh.from_array(np.ones(1, np.float32), "one")],
    )
    inits = [nh.from_array(np.array(True), "c")]
    if trip_count is not None:
        inits.append(nh.from_array(np.array(trip_count, np.int64), "M"))
    node = h.make_node("Loop", ["M" if trip_count is not None else "", "c", "v0"], ["v"], body=body, name=name)
    graph = h.make_graph([node], "counting_loop", [h.make_tensor_value_info("v0", T.FLOAT, [1])],
                         [h.make_tensor_value_info("v", T.FLOAT, [1])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
