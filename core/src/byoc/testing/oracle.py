"""Build one-node models and run them through byoc and the oracles (onnx.reference, onnxruntime).

Used by byoc's own kernel tests and by the conformance kit.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper

from byoc.frontend import CANONICAL_OPSET


def single_node_model(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    n_outputs: int = 1,
    opset: int = CANONICAL_OPSET,
    domain: str = "",
    const_inputs: Sequence[int] = (),
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model with one node; returns the model and the feeds for it.

    ``inputs`` holds one array per input slot (``None`` for a missing optional input).
    Inputs whose index is in ``const_inputs`` become initializers instead of graph inputs.
    Output types and shapes are left to shape inference.
    """
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, arr in enumerate(inputs):
        if arr is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        arr = np.asarray(arr)
        if i in const_inputs:
            inits.append(onnx.numpy_helper.from_array(arr, name))
        else:
            graph_inputs.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))
            )
            feeds[name] = arr
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}_0", domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], f"{op_type}_test", graph_inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outs], inits
    )
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model = onnx.shape_inference.infer_shapes(model)
    return model, feeds


def run_byoc(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **compile_options) -> list[np.ndarray]:
    import byoc

    compile_options.setdefault("wait", True)  # the engine under test answers, not a first tier
    compiled = byoc.compile(model, targets=compile_options.pop("targets", []), **compile_options)
    out = compiled.run(feeds)
    return [out[o.name] for o in model.graph.output]


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, feeds))


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def ort_peer_session(model: onnx.ModelProto | bytes, threads: int | None = None, *, extended_only: bool = False,
                     spin: bool = False):
    """An onnxruntime CPU session set up as the speed peer of a benchmark that times it
    interleaved with byoc in one process.

    ``threads`` sets its intra-op pool (``None``: onnxruntime's default). ``extended_only`` stops
    its graph optimisations at ORT_ENABLE_EXTENDED (no level-3 layout pass: no NCHWc blocked
    convolutions). ``spin`` keeps onnxruntime's default of pool threads that busy-wait after
    every run; off by default, because interleaved with another engine those threads take a core
    from whichever engine runs next. Measured on the 2-core development machine (ResNet-50,
    2 threads each, interleaved): with spinning, byoc-cpu took 86-111 ms and onnxruntime itself
    49-60 ms; without, 69 ms and 47 ms. Turning it off made onnxruntime faster too, so the peer is
    at its best, not handicapped.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if extended_only:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def assert_close(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a)
        e = np.asarray(e)
        assert a.shape == e.shape, f"output {i}: shape {a.shape}, expected {e.shape}"
        assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype}, expected {e.dtype}"
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"output {i}")
