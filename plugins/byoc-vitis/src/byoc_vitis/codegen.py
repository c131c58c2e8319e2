"""Code generation: a quantised (QDQ) region -> a DPU program (:mod:`byoc_vitis.program`).

The region reaches the code generator in the QDQ form :mod:`byoc.quantize` wrote: int8
weights, int32 biases and every activation's scale. Each compute node becomes one
instruction; a ReLU/ReLU6/LeakyRelu that the quantiser left fused (its producer's output has no
scale of its own) is folded into the producer's instruction. Each requantisation ratio
``s_in * s_w / s_out`` becomes an integer multiplier and a right shift
(:func:`byoc.quantize.requant_multiplier`, 24-bit multipliers; exact for power-of-two scales,
where it is a pure shift). Nothing depends on the environment: the same region gives the same
bytes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from byoc.contract import QuantizationError
from byoc.contract import Artifact, Region
from byoc.quantize import QdqView, read_qdq, requant_multiplier
from byoc_vitis.program import (
    ACT_LEAKY,
    ACT_NONE,
    ACT_RELU,
    ACT_RELU6,
    FORMAT,
    HSIG_BITS,
    Program,
    dumps,
)

#: bits of a requantisation multiplier
MULT_BITS = 24
_I32 = (1 << 31) - 1


class CodegenError(QuantizationError):
    """The region cannot be turned into a DPU program; the message names the node."""


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def multiplier(ratio: float) -> tuple[int, int]:
    m, s = requant_multiplier(float(ratio), MULT_BITS)
    if m >= 1 << 31:
        raise CodegenError(f"requantisation ratio {ratio:g} is too large for the DPU")
    return m, s


def common_multipliers(ratios: list[float]) -> tuple[list[int], int]:
    """Multipliers ``M_i`` and one shift ``S`` with ``M_i / 2**S ~= ratios[i]`` (largest M below 2**24)."""
    top = max(ratios)
    if not top > 0:
        raise CodegenError("eltwise requantisation ratios must be positive")
    shift = max(0, MULT_BITS - math.frexp(top)[1])
    ms = [int(round(r * (1 << shift))) for r in ratios]
    while shift > 0 and all(m % 2 == 0 for m in ms):
        ms = [m >> 1 for m in ms]
        shift -= 1
    if max(ms) >= 1 << 31:
        raise CodegenError(f"eltwise requantisation ratio {top:g} is too large for the DPU")
    return ms, shift


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in model.graph.initializer:
        out[t.name] = tuple(t.dims)
    return out


class _Builder:
    def __init__(self, view: QdqView, shapes: Mapping[str, tuple[int, ...]]):
        self.view = view
        self.params = view.params
        self.prog = Program()
        self.shapes = shapes
        self.fused: set[int] = set()
        self.consumers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
        for k, n in enumerate(view.nodes):
            for name in n.input:
                if name:
                    self.consumers.setdefault(name, []).append((k, n))

    # -- tensors --------------------------------------------------------------------------
    def L(self, name: str) -> str:
        return self.view.logical(name)

    def shape(self, raw: str) -> tuple[int, ...]:
        for name in (raw, self.L(raw)):
            if name in self.shapes:
                return self.shapes[name]
        raise CodegenError(f"tensor {self.L(raw)!r} has no static shape")

    def scale(self, logical: str) -> float:
        tq = self.params.tensors.get(logical)
        if tq is None or tq.kind not in ("activation", "constant") or tq.axis is not None:
            raise CodegenError(f"tensor {logical!r} has no per-tensor int8 scale")
        return float(tq.scale)

    def tensor(self, raw: str) -> str:
        """The program tensor for a node input (a constant operand becomes a ``const`` instruction)."""
        name = self.L(raw)
        if name not in self.prog.tensors:
            tq = self.params.tensors.get(name)
            if tq is None:
                raise CodegenError(f"tensor {name!r} is not quantised")
            if name in self.view.constants:
                data = self.view.constants[name]
                self.declare(name, data.shape)
                self.prog.instructions.append({"op": "const", "y": name,
                                               "data": self.prog.add_array(f"{name}.data", data, "int8")})
            else:
                raise CodegenError(f"tensor {name!r} is read before any instruction writes it")
        return name

    def declare(self, name: str, shape) -> str:
        tq = self.params.tensors[name]
        self.prog.tensors[name] = {"shape": [int(d) for d in shape], "scale": float(tq.scale),
                                   "fix_pos": tq.fix_pos if isinstance(tq.fix_pos, int) else None}
        return name

    def output(self, node: onnx.NodeProto) -> tuple[str, int, int, str]:
        """(logical output, activation code, act_max, raw name) of ``node``, fusing a following activation."""
        raw = node.output[0]
        name = self.L(raw)
        if name in self.params.tensors:
            self.declare(name, self.shape(raw))
            return name, ACT_NONE, 127, raw
        users = self.consumers.get(raw, [])
        if len(users) != 1 or users[0][1].op_type not in ("Relu", "Clip", "LeakyRelu"):
            raise CodegenError(f"node {node.name!r} ({node.op_type}): output {name!r} is unquantised but not "
                               f"followed by a fusable activation")
        k, act = users[0]
        self.fused.add(k)
        out_raw = act.output[0]
        out = self.L(out_raw)
        self.declare(out, self.shape(out_raw))
        code = {"Relu": ACT_RELU, "Clip": ACT_RELU6, "LeakyRelu": ACT_LEAKY}[act.op_type]
        act_max = 127
        if code == ACT_RELU6:
            act_max = int(np.clip(np.rint(np.float32(6.0) / np.float32(self.scale(out))), 0, 127))
        return out, code, act_max, out_raw

    # -- weights ----------------------------------------------------------------------------
    def weight(self, raw: str, channels: int, channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
        name = self.L(raw)
        tq = self.params.tensors.get(name)
        if tq is None or name not in self.view.constants or tq.kind != "weight":
            raise CodegenError(f"weights {name!r} are not quantised int8 constants")
        scales = np.asarray(tq.scale, dtype=np.float64).reshape(-1)
        if scales.size == 1:
            scales = np.full(channels, scales[0])
        elif tq.axis != channel_axis or scales.size != channels:
            raise CodegenError(f"weights {name!r}: per-channel scales along axis {tq.axis} do not match the "
                               f"{channels} output channels")
        return self.view.constants[name], scales

    def bias(self, node: onnx.NodeProto, index: int, channels: int) -> np.ndarray:
        if len(node.input) <= index or not node.input[index]:
            return np.zeros(channels, np.int32)
        name = self.L(node.input[index])
        tq = self.params.tensors.get(name)
        if tq is None or tq.kind != "bias" or name not in self.view.constants:
            raise CodegenError(f"bias {name!r} of node {node.name!r} is not an int32 bias")
        return self.view.constants[name].reshape(-1).astype(np.int32)

    def requant_arrays(self, base: str, ratios: np.ndarray) -> tuple[str, str]:
        ms, ss = zip(*(multiplier(r) for r in ratios))
        return (self.prog.add_array(f"{base}.M", np.array(ms, np.int64), "int64"),
                self.prog.add_array(f"{base}.S", np.array(ss, np.int32), "int32"))

    @staticmethod
    def check_accumulator(node: onnx.NodeProto, k: int, b: np.ndarray) -> None:
        bound = k * 128 * 128 + (int(np.abs(b.astype(np.int64)).max()) if b.size else 0)
        if bound > _I32:
            raise CodegenError(f"node {node.name!r} ({node.op_type}): {k} products per output could overflow the "
                               f"int32 accumulator")

    # -- operators ------------------------------------------------------------------------------
    def build(self) -> Program:
        for raw in self.view.inputs:
            name = self.L(raw)
            if name not in self.params.tensors:
                raise CodegenError(f"region input {raw!r} is not quantised")
            self.declare(name, self.shape(raw))
            self.prog.inputs.append({"name": raw, "tensor": name, "shape": list(self.shape(raw)),
                                     "scale": float(self.params.tensors[name].scale)})
        for k, node in enumerate(self.view.nodes):
            if k in self.fused:
                continue
            handler = getattr(self, f"op_{node.op_type}", None)
            if handler is None:
                raise CodegenError(f"node {node.name!r}: operator {node.op_type} has no DPU instruction")
            handler(node)
        for raw in self.view.outputs:
            name = self.L(raw)
            if name not in self.prog.tensors:
                raise CodegenError(f"region output {raw!r} is not computed on the DPU")
            self.prog.outputs.append({"name": raw, "tensor": name, "shape": list(self.shape(raw)),
                                      "scale": float(self.params.tensors[name].scale)})
        return self.prog

    def op_Conv(self, node: onnx.NodeProto) -> None:
        x = self.tensor(node.input[0])
        xs = self.shape(node.input[0])
        w, sw = self.weight(node.input[1], self.shape(node.input[1])[0], 0)
        b = self.bias(node, 2, w.shape[0])
        y, act, act_max, _ = self.output(node)
        kernel = list(w.shape[2:])
        strides = list(_attr(node, "strides", [1, 1]))
        dilations = list(_attr(node, "dilations", [1, 1]))
        pads = _pads_of(node, xs, kernel, strides, dilations)
        self.check_accumulator(node, int(np.prod(w.shape[1:])), b)
        m, s = self.requant_arrays(y, self.scale(x) * sw / self.scale(y))
        self.prog.instructions.append({
            "op": "conv", "x": x, "y": y, "w": self.prog.add_array(f"{y}.w", w, "int8"),
            "b": self.prog.add_array(f"{y}.b", b, "int32"), "M": m, "S": s, "stride": strides,
            "dilation": dilations, "pads": pads, "group": int(_attr(node, "group", 1)), "act": act,
            "act_max": act_max, "node": node.name})

    def op_ConvTranspose(self, node: onnx.NodeProto) -> None:
        x = self.tensor(node.input[0])
        group = int(_attr(node, "group", 1))
        wshape = self.shape(node.input[1])
        out_ch = wshape[1] * group
        w, sw = self.weight(node.input[1], wshape[1], 1)
        if group > 1:
            sw = np.resize(sw, out_ch)
        b = self.bias(node, 2, out_ch)
        y, act, act_max, _ = self.output(node)
        pads = list(_attr(node, "pads", [0, 0, 0, 0]))
        self.check_accumulator(node, int(wshape[0] // group * wshape[2] * wshape[3]), b)
        m, s = self.requant_arrays(y, self.scale(x) * np.resize(sw, out_ch) / self.scale(y))
        self.prog.instructions.append({
            "op": "deconv", "x": x, "y": y, "w": self.prog.add_array(f"{y}.w", w, "int8"),
            "b": self.prog.add_array(f"{y}.b", b, "int32"), "M": m, "S": s,
            "stride": list(_attr(node, "strides", [1, 1])), "dilation": list(_attr(node, "dilations", [1, 1])),
            "pads": pads, "group": group, "act": act, "act_max": act_max, "node": node.name})

    def _fc(self, node: onnx.NodeProto, w: np.ndarray, sw: np.ndarray, b: np.ndarray) -> None:
        x = self.tensor(node.input[0])
        y, act, act_max, _ = self.output(node)
        self.check_accumulator(node, int(w.shape[1]), b)
        m, s = self.requant_arrays(y, self.scale(x) * sw / self.scale(y))
        self.prog.instructions.append({
            "op": "fc", "x": x, "y": y, "w": self.prog.add_array(f"{y}.w", np.ascontiguousarray(w), "int8"),
            "b": self.prog.add_array(f"{y}.b", b, "int32"), "M": m, "S": s, "act": act, "act_max": act_max,
            "node": node.name})

    def op_Gemm(self, node: onnx.NodeProto) -> None:
        trans_b = int(_attr(node, "transB", 0))
        wshape = self.shape(node.input[1])
        f = wshape[0] if trans_b else wshape[1]
        w, sw = self.weight(node.input[1], f, 0 if trans_b else 1)
        self._fc(node, w if trans_b else w.T, sw, self.bias(node, 2, f))

    def op_MatMul(self, node: onnx.NodeProto) -> None:
        f = self.shape(node.input[1])[1]
        w, sw = self.weight(node.input[1], f, 1)
        self._fc(node, w.T, sw, np.zeros(f, np.int32))

    def _pool(self, node: onnx.NodeProto, kernel, strides, pads, dilations, avg: bool, include_pad: bool):
        x = self.tensor(node.input[0])
        y, _, _, _ = self.output(node)
        ratio = self.scale(x) / self.scale(y)
        ins: dict[str, Any] = {"op": "avgpool" if avg else "maxpool", "x": x, "y": y, "kernel": kernel,
                               "stride": strides, "pads": pads, "node": node.name}
        if avg:
            counts = np.arange(kernel[0] * kernel[1] + 1)
            ratios = np.where(counts > 0, ratio / np.maximum(counts, 1), ratio)
            ins["M"], ins["S"] = self.requant_arrays(y, ratios)
            ins["count_include_pad"] = int(include_pad)
        else:
            ins["M"], ins["S"] = multiplier(ratio)
            ins["dilation"] = dilations
        self.prog.instructions.append(ins)

    def op_MaxPool(self, node: onnx.NodeProto) -> None:
        kernel = list(_attr(node, "kernel_shape"))
        strides = list(_attr(node, "strides", [1, 1]))
        dil = list(_attr(node, "dilations", [1, 1]))
        self._pool(node, kernel, strides, _pads_of(node, self.shape(node.input[0]), kernel, strides, dil), dil,
                   False, False)

    def op_AveragePool(self, node: onnx.NodeProto) -> None:
        kernel = list(_attr(node, "kernel_shape"))
        strides = list(_attr(node, "strides", [1, 1]))
        pads = _pads_of(node, self.shape(node.input[0]), kernel, strides, [1, 1])
        self._pool(node, kernel, strides, pads, [1, 1], True, bool(_attr(node, "count_include_pad", 0)))

    def op_GlobalAveragePool(self, node: onnx.NodeProto) -> None:
        hw = list(self.shape(node.input[0])[2:])
        self._pool(node, hw, [1, 1], [0, 0, 0, 0], [1, 1], True, True)

    def op_GlobalMaxPool(self, node: onnx.NodeProto) -> None:
        hw = list(self.shape(node.input[0])[2:])
        self._pool(node, hw, [1, 1], [0, 0, 0, 0], [1, 1], False, False)

    def op_Add(self, node: onnx.NodeProto) -> None:
        xs = [self.tensor(i) for i in node.input]
        y, act, act_max, _ = self.output(node)
        ms, s = common_multipliers([self.scale(x) / self.scale(y) for x in xs])
        self.prog.instructions.append({"op": "eltwise", "x": xs, "y": y,
                                       "M": self.prog.add_array(f"{y}.M", np.array(ms, np.int64), "int64"),
                                       "S": s, "act": act, "act_max": act_max, "node": node.name})

    op_Sum = op_Add

    def op_Mul(self, node: onnx.NodeProto) -> None:
        a, b = (self.tensor(i) for i in node.input)
        y, act, act_max, _ = self.output(node)
        m, s = multiplier(self.scale(a) * self.scale(b) / self.scale(y))
        self.prog.instructions.append({"op": "mul", "x": [a, b], "y": y, "M": m, "S": s, "act": act,
                                       "act_max": act_max, "node": node.name})

    def op_Concat(self, node: onnx.NodeProto) -> None:
        xs = [self.tensor(i) for i in node.input]
        y, _, _, _ = self.output(node)
        rank = len(self.prog.tensors[y]["shape"])
        m, s = self.requant_arrays(y, np.array([self.scale(x) / self.scale(y) for x in xs]))
        self.prog.instructions.append({"op": "concat", "x": xs, "y": y, "axis": int(_attr(node, "axis", 1)) % rank,
                                       "M": m, "S": s, "node": node.name})

    def _act(self, node: onnx.NodeProto, code: int) -> None:
        x = self.tensor(node.input[0])
        y, _, _, _ = self.output(node)
        m, s = multiplier(self.scale(x) / self.scale(y))
        act_max = 127
        if code == ACT_RELU6:
            act_max = int(np.clip(np.rint(np.float32(6.0) / np.float32(self.scale(y))), 0, 127))
        self.prog.instructions.append({"op": "act", "x": x, "y": y, "M": m, "S": s, "act": code,
                                       "act_max": act_max, "node": node.name})

    def op_Relu(self, node):
        self._act(node, ACT_RELU)

    def op_Clip(self, node):
        self._act(node, ACT_RELU6)

    def op_LeakyRelu(self, node):
        self._act(node, ACT_LEAKY)

    def _hard(self, node: onnx.NodeProto, swish: bool) -> None:
        x = self.tensor(node.input[0])
        y, _, _, _ = self.output(node)
        alpha, beta = (1 / 6, 0.5) if swish else (float(_attr(node, "alpha", 0.2)), float(_attr(node, "beta", 0.5)))
        one = 1 << HSIG_BITS
        a = int(round(alpha * self.scale(x) * one))
        b = int(round(beta * one))
        ratio = (self.scale(x) if swish else 1.0) / one / self.scale(y)
        m, s = multiplier(ratio)
        self.prog.instructions.append({"op": "hswish" if swish else "hsigmoid", "x": x, "y": y, "A": a, "B": b,
                                       "M": m, "S": s, "node": node.name})

    def op_HardSigmoid(self, node):
        self._hard(node, False)

    def op_HardSwish(self, node):
        self._hard(node, True)

    def _reshape(self, node: onnx.NodeProto) -> None:
        x = self.tensor(node.input[0])
        y, _, _, _ = self.output(node)
        m, s = multiplier(self.scale(x) / self.scale(y))
        self.prog.instructions.append({"op": "reshape", "x": x, "y": y, "M": m, "S": s, "node": node.name})

    op_Reshape = _reshape
    op_Flatten = _reshape

    def op_Resize(self, node: onnx.NodeProto) -> None:
        x = self.tensor(node.input[0])
        xs = self.shape(node.input[0])
        y, _, _, _ = self.output(node)
        map_h, map_w = resize_maps(node, xs, tuple(self.prog.tensors[y]["shape"]), self.view.floats)
        m, s = multiplier(self.scale(x) / self.scale(y))
        self.prog.instructions.append({
            "op": "resize", "x": x, "y": y, "map_h": self.prog.add_array(f"{y}.map_h", map_h, "int32"),
            "map_w": self.prog.add_array(f"{y}.map_w", map_w, "int32"), "M": m, "S": s, "node": node.name})


def _pads_of(node, xs, kernel, strides, dilations) -> list[int]:
    """``[top, left]`` pads as the engines use them (bottom/right follow from the output shape)."""
    pads = _conv_pads_proto(node, xs[2:], kernel, strides, dilations)
    return [pads[0], pads[1], pads[2], pads[3]]


def _conv_pads_proto(node: onnx.NodeProto, in_hw, kernel, strides, dilations) -> list[int]:
    auto = _attr(node, "auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(_attr(node, "pads", [0, 0, 0, 0]))
        return pads if len(pads) == 4 else [0, 0, 0, 0]
    if auto == "VALID":
        return [0, 0, 0, 0]
    total = [max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
             for n, k, s, d in zip(in_hw, kernel, strides, dilations)]
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    if auto == "SAME_UPPER":
        return [small[0], small[1], big[0], big[1]]
    return [big[0], big[1], small[0], small[1]]


def resize_maps(node: onnx.NodeProto, in_shape, out_shape, floats: Mapping[str, np.ndarray]):
    """Source row/column of every output row/column of a nearest Resize, found by running it on a probe."""
    from byoc.contract import host_callable

    h, w = in_shape[2], in_shape[3]
    probe = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
    inits, names = [], ["probe"]
    for i, name in enumerate(node.input[1:], start=1):
        if not name:
            names.append("")
            continue
        arr = np.asarray(floats[name]).copy()
        if i == 3 and arr.size == 4:  # sizes: batch and channels of the probe are 1
            arr[:2] = 1
        inits.append(numpy_helper.from_array(arr, f"in{i}"))
        names.append(f"in{i}")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    n = helper.make_node("Resize", names, ["out"], **attrs)
    graph = helper.make_graph([n], "probe", [helper.make_tensor_value_info("probe", onnx.TensorProto.FLOAT,
                                                                          [1, 1, h, w])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    out = host_callable(model)(probe)[0]
    if out.shape[2:] != tuple(out_shape[2:]):
        raise CodegenError(f"node {node.name!r} (Resize): probe output {list(out.shape)} does not match "
                           f"{list(out_shape)}")
    idx = out[0, 0].astype(np.int64)
    map_h = idx[:, 0] // w
    map_w = idx[0, :] % w
    if not np.array_equal(idx, map_h[:, None] * w + map_w[None, :]):
        raise CodegenError(f"node {node.name!r} (Resize): the nearest mapping is not separable")
    return map_h.astype(np.int32), map_w.astype(np.int32)


def build_program(model: onnx.ModelProto) -> Program:
    """The DPU program of a QDQ region model."""
    view = read_qdq(model)
    return _Builder(view, _shapes(model)).build()


def generate(region: Region, options: Mapping[str, Any]) -> Artifact:
    """``byoc_codegen`` for target ``vitis``."""
    import onnx_ir as ir

    proto = ir.to_proto(region.model)
    program = build_program(proto)
    data = dumps(program)
    ops = Counter(ins["op"] for ins in program.instructions)
    params = read_qdq(proto).params
    meta = {
        "inputs": [v.name for v in region.inputs],
        "outputs": [v.name for v in region.outputs],
        "instructions": len(program.instructions),
        "ops": dict(sorted(ops.items())),
        "input_scales": {e["name"]: e["scale"] for e in program.inputs},
        "output_scales": {e["name"]: e["scale"] for e in program.outputs},
        "scheme": params.scheme.to_dict(),
        "weights_bytes": int(sum(a.nbytes for k, a in program.arrays.items() if k.endswith(".w"))),
    }
    return Artifact("vitis", FORMAT, data, meta)


__all__ = ["CodegenError", "MULT_BITS", "build_program", "common_multipliers", "generate", "multiplier",
           "resize_maps"]
