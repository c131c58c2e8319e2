"""The CPU emulation path: run a region's ONNX on byoc's host kernels with TensorRT's precision.

Used when the ``tensorrt`` package or a CUDA GPU is missing (or with ``runtime="emulation"``),
so a model can be developed and its accuracy checked without the board. With precision
``fp16`` it models what a TensorRT FP16 engine does to the numbers:

* the weights (float initializers) are rounded to float16, as the builder stores them;
* the region's float inputs are rounded to float16 (the engine's first reformat);
* every layer's float output is rounded to float16; nodes fused by a ``jetson.*`` pattern keep
  float32 between them, as a fused TensorRT kernel does, and round once at the pattern's end;
* arithmetic inside a layer runs in float32 (TensorRT's FP16 convolutions and GEMMs
  accumulate in float32 on tensor cores).

Values beyond float16's range become ``inf``, as on the device. With ``fp32`` the emulation is
the host reference itself.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from byoc.contract import host_callable

PATTERN_KEY = "byoc.pattern"


def to_fp16(arr: np.ndarray) -> np.ndarray:
    """``arr`` rounded to float16 precision, keeping float32 (other dtypes unchanged)."""
    if isinstance(arr, np.ndarray) and arr.dtype == np.float32:
        with np.errstate(over="ignore"):
            return arr.astype(np.float16).astype(np.float32)
    return arr


def _fused_interior(node: ir.Node) -> bool:
    """``node`` sits inside a fused pattern: every consumer belongs to the same pattern."""
    pattern = node.metadata_props.get(PATTERN_KEY)
    if not pattern:
        return False
    for v in node.outputs:
        if v.is_graph_output():
            return False
        for use in v.uses():
            if use.node.metadata_props.get(PATTERN_KEY) != pattern:
                return False
    return True


def _rounding(run: Callable[..., Sequence[np.ndarray]]) -> Callable[..., Sequence[np.ndarray]]:
    def step(*args):
        return tuple(to_fp16(out) for out in run(*args))

    return step


def _round_weights(graph: ir.Graph) -> None:
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is None or tensor.dtype != ir.DataType.FLOAT:
            continue
        value.const_value = ir.Tensor(to_fp16(tensor.numpy()), name=value.name)


class EmulatedRegion:
    """``EmulatedRegion(onnx_bytes, precision)(*inputs) -> list of outputs``."""

    runtime_path = "emulation"

    def __init__(self, data: bytes, precision: str = "fp16"):
        model = ir.from_proto(onnx.ModelProto.FromString(data))
        self.precision = precision
        self.fp16 = precision == "fp16"
        if self.fp16:
            _round_weights(model.graph)

        def wrap(node: ir.Node, run):
            if not self.fp16 or _fused_interior(node):
                return run
            return _rounding(run)

        self.body = host_callable(model, wrap=wrap)
        self.input_names = list(self.body.input_names)
        self.output_names = list(self.body.output_names)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if len(inputs) != len(self.input_names):
            raise ValueError(f"expected {len(self.input_names)} inputs ({self.input_names}), got {len(inputs)}")
        if self.fp16:
            inputs = tuple(to_fp16(np.asarray(x)) for x in inputs)
        return self.body(*inputs)


__all__ = ["EmulatedRegion", "to_fp16"]
