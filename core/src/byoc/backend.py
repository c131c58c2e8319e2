"""The ONNX backend API (``onnx.backend.base.Backend``) over byoc.

Lets ONNX's own backend test-suite, and any tool written against that API, drive byoc::

    import byoc.backend as backend
    rep = backend.prepare(model)          # compiles once
    outputs = rep.run([x])                # list of arrays, graph input order
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import byoc
from byoc.runtime.compiled import CompiledModel


class ByocRep(BackendRep):
    """A prepared (compiled) model."""

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = self.compiled.input_names
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            feeds = dict(zip(names, inputs))
            if len(inputs) > len(names):
                # optional inputs (initializers listed as inputs) follow the required ones
                extra = [s.name for s in self.compiled.inputs if s.optional]
                feeds.update(zip(extra, inputs[len(names):]))
        out = self.compiled.run(feeds)
        return namedtupledict("Outputs", list(out))(*out.values())


class ByocBackend(Backend):
    """byoc as an ONNX backend; the device is always the host CPU (targets are chosen by plugins)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> ByocRep:
        targets = kwargs.pop("targets", [])
        return ByocRep(byoc.compile(model, targets=targets, **kwargs))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[np.ndarray],
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple]] | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        names = [n for n in node.input]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.shape(a))
            for n, a in zip(names, inputs)
            if n
        ]
        graph_outputs = [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in node.output]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.pop("opset_version", None) or byoc.frontend.CANONICAL_OPSET
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        feeds = {n: np.asarray(a) for n, a in zip(names, inputs) if n}
        out = byoc.compile(model, targets=[]).run(feeds)
        return namedtupledict("Outputs", list(out))(*out.values())

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = ByocBackend.prepare
run_model = ByocBackend.run_model
run_node = ByocBackend.run_node
supports_device = ByocBackend.supports_device
