"""Model builders and compile helpers shared by the byoc-cpu tests."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import byoc
import byoc_cpu.plugin
from byoc.plugins import build_registry

#: a registry with only this plugin (no entry points): tests see exactly the cpu target
REGISTRY = build_registry([("cpu", byoc_cpu.plugin)], entry_points=False)
OPSET = 17


def make_model(nodes: list, inputs: Mapping[str, tuple], outputs: Iterable[str],
               inits: Mapping[str, np.ndarray] | None = None, opset: int = OPSET) -> onnx.ModelProto:
    """A float32 model; output shapes come from shape inference."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def compile_cpu(model, strict: bool = True, **options: Any):
    """Compile for the cpu target alone; plugin faults raise (``strict``) instead of falling back."""
    return byoc.compile(model, wait=True, targets=["cpu"], registry=REGISTRY, strict=strict,
                        target_options={"cpu": options} if options else None)


def compile_host(model):
    return byoc.compile(model, wait=True, targets=[])


def run_both(model, feeds: dict[str, np.ndarray], **options: Any):
    cpu = compile_cpu(model, **options)
    host = compile_host(model)
    return cpu, cpu.run(feeds), host.run(feeds)


def assert_close(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray] | list, rtol=1e-5, atol=1e-5):
    want_items = list(want.values()) if isinstance(want, Mapping) else list(want)
    assert len(got) == len(want_items)
    for (name, a), b in zip(got.items(), want_items):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)


def onnxruntime_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def cpu_nodes(cm) -> int:
    return sum(r.device == "cpu" for r in cm.records.values())


def host_kernel(spec):
    """The run function byoc-cpu's host executor gives the node (byoc's reference kernel where
    the executor declines it), as a plan built with byoc-cpu installed would."""
    from byoc.kernels import make_kernel
    from byoc_cpu.host import executor

    return executor().kernel(spec) or make_kernel(spec)
