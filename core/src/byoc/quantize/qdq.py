"""Quantise a (region) graph: choose every tensor's parameters and write them as a QDQ model.

:func:`quantize_model` takes a float graph, calibration statistics and a :class:`QuantScheme`
and returns

* :class:`QuantParams`: scale/zero point/fix position of every quantised tensor, by its name in
  the float graph (activations from the statistics, weights/biases/constants from their values);
* a QDQ model: the same graph where every quantised activation ``t`` is followed by
  ``QuantizeLinear -> DequantizeLinear`` (graph inputs are quantised at the border, so the
  graph's outside stays float), weights are int8 initializers behind a ``DequantizeLinear``
  (per-channel with ``axis``) and biases int32 initializers at scale ``s_input * s_weight``. Its
  ``metadata_props["byoc.quantization"]`` holds the :class:`QuantParams` as JSON.

The QDQ model is plain ONNX: the host runs it (a faithful float simulation of the integer
arithmetic, used as the fallback and as the reference in tests), onnxruntime runs it, and a
code generator reads the integer weights and the scales from it (:func:`read_qdq`). Value names
are kept: a node output ``t`` becomes ``t/f`` and the final ``DequantizeLinear`` writes ``t``,
so consumers and graph outputs are untouched; every introduced name maps back to its logical
name through ``QuantParams.aliases``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from byoc.errors import QuantizationError
from byoc.quantize.calibrate import CalibrationTable
from byoc.quantize.scheme import QuantParams, QuantScheme, TensorQuant, float_scale, pow2_fix_pos

META_KEY = "byoc.quantization"
QDQ_MARK = "byoc.qdq"

#: operators whose output keeps the scale of their first input (the values are a subset of it)
SHARED_SCALE_OPS = {
    "MaxPool", "GlobalMaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity",
    "Slice", "Split", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample",
}
#: producers an activation can be fused into, and the fusable activations
FUSE_PRODUCERS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "Sum"}
FUSE_ACTIVATIONS = {"Relu", "LeakyRelu", "Clip"}
#: operators whose float constant operands are quantised per tensor like activations
CONSTANT_OPERAND_OPS = {"Add", "Sub", "Mul", "Sum", "Concat", "Max", "Min"}
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _shares_scale(node: onnx.NodeProto) -> bool:
    if node.op_type not in SHARED_SCALE_OPS:
        return False
    if node.op_type in ("Resize", "Upsample"):
        mode = _attr(node, "mode", b"nearest")
        return (mode.decode() if isinstance(mode, bytes) else mode) == "nearest"
    return True


def weight_role(node: onnx.NodeProto, index: int, shape: tuple[int, ...]) -> tuple[str, int | None] | None:
    """How a float constant at input ``index`` of ``node`` is quantised: ``(kind, channel axis)``.

    ``("weight", axis)``, ``("bias", axis)``, ``("constant", None)``, or ``None`` (left float:
    shape operands, Resize scales, Clip bounds, ...).
    """
    op = node.op_type
    if op == "Conv":
        return {1: ("weight", 0), 2: ("bias", 0)}.get(index)
    if op == "ConvTranspose":  # output channels are axis 1 of each group: per-channel only without groups
        return {1: ("weight", 1 if _attr(node, "group", 1) == 1 else None), 2: ("bias", 0)}.get(index)
    if op == "Gemm":
        if index == 1:
            return ("weight", 0 if _attr(node, "transB", 0) else 1)
        if index == 2:
            return ("bias", len(shape) - 1) if len(shape) in (1, 2) and (len(shape) == 1 or shape[0] == 1) \
                else ("constant", None)
        return ("constant", None)
    if op == "MatMul":
        return ("weight", len(shape) - 1) if index == 1 and len(shape) == 2 else ("constant", None)
    if op in CONSTANT_OPERAND_OPS:
        return ("constant", None)
    return None


def _fuse_skip(name: str, producer: onnx.NodeProto, consumers: list, outputs: set[str]) -> bool:
    if producer.op_type not in FUSE_PRODUCERS or name in outputs or len(consumers) != 1:
        return False
    node, idx = consumers[0]
    return node.op_type in FUSE_ACTIVATIONS and idx == 0


def _activation_params(table: CalibrationTable, name: str, scheme: QuantScheme, output: bool = False) -> TensorQuant:
    method = scheme.output_method if output and scheme.output_method else scheme.method
    t = table.threshold(name, method, scheme.percentile)
    if scheme.activations == "pow2":
        stats = table[name]
        fp = pow2_fix_pos(t, scheme.qmax)
        if method != "minmax" and stats.count:
            fp = _best_pow2(stats, fp, scheme.qmax)
        return TensorQuant(scale=2.0 ** -fp, fix_pos=fp, threshold=t)
    return TensorQuant(scale=float_scale(t, scheme.qmax), threshold=t)


def _best_pow2(stats, fp: int, qmax: int) -> int:
    """Of ``fp`` and ``fp + 1`` (finer, clips more), the one with the smaller expected squared error."""
    hist = stats.hist.astype(np.float64)
    if stats.hist_max == 0.0 or hist.sum() == 0:
        return fp
    width = stats.hist_max / hist.size
    centers = (np.arange(hist.size) + 0.5) * width

    def err(p: int) -> float:
        s = 2.0 ** -p
        q = np.minimum(np.floor(centers / s + 0.5), qmax)
        e = (q * s - centers) ** 2 + np.where(centers < qmax * s, s * s / 12.0, 0.0)
        return float((hist * e).sum())

    return fp + 1 if err(fp + 1) < err(fp) else fp


def _values_params(values: np.ndarray, scheme: QuantScheme, axis: int | None, kind: str) -> tuple[TensorQuant,
                                                                                                np.ndarray]:
    """Per-tensor or per-channel symmetric int8 parameters of a constant, and its integers."""
    v = np.asarray(values, dtype=np.float64)
    per_channel = axis is not None and scheme.weights == "per_channel" and kind == "weight" and v.ndim > 0
    if per_channel:
        moved = np.moveaxis(v, axis, 0).reshape(v.shape[axis], -1)
        thresholds = np.abs(moved).max(axis=1) if moved.shape[1] else np.zeros(moved.shape[0])
    else:
        thresholds = np.array([np.abs(v).max() if v.size else 0.0])
    pow2 = (scheme.weight_kind if kind == "weight" else scheme.activations) == "pow2"
    scales, fps = [], []
    for j, t in enumerate(thresholds):
        if pow2:
            fp = pow2_fix_pos(float(t), scheme.qmax)
            if t > 0:  # the finer position if it loses less (clipping the largest value a little)
                part = moved[j] if per_channel else v.ravel()
                fp = min((fp, fp + 1), key=lambda p: float(((np.clip(np.floor(part * 2.0 ** p + 0.5),
                                                                       scheme.qmin, scheme.qmax) * 2.0 ** -p
                                                               - part) ** 2).sum()))
            fps.append(fp)
            scales.append(2.0 ** -fp)
        else:
            scales.append(float_scale(float(t), scheme.qmax))
    s = np.asarray(scales, dtype=np.float32)
    if per_channel:
        shape = [1] * v.ndim
        shape[axis] = -1
        q = np.rint(v / s.reshape(shape).astype(np.float64))
        tq = TensorQuant(scale=[float(x) for x in s], axis=axis, fix_pos=fps or None, kind=kind, source="values")
    else:
        q = np.rint(v / float(s[0]))
        tq = TensorQuant(scale=float(s[0]), fix_pos=fps[0] if fps else None, kind=kind, source="values")
    return tq, np.clip(q, scheme.qmin, scheme.qmax).astype(np.int8)


def _bias_params(values: np.ndarray, x: TensorQuant, w: TensorQuant, axis: int) -> tuple[TensorQuant, np.ndarray]:
    """int32 bias at scale ``s_x * s_w`` (per channel when the weight is)."""
    sx = float(x.scale)
    sw = np.asarray(w.scale, dtype=np.float64)
    s = (sx * sw).astype(np.float32)
    v = np.asarray(values, dtype=np.float64)
    if s.ndim == 1 and s.size > 1:
        if v.shape[axis] != s.size:
            raise QuantizationError(f"bias of shape {list(v.shape)} does not match {s.size} weight channels")
        shape = [1] * v.ndim
        shape[axis] = -1
        q = np.rint(v / s.reshape(shape).astype(np.float64))
        scale: float | list[float] = [float(t) for t in s]
        ax: int | None = axis
    else:
        s = s.reshape(())
        q = np.rint(v / float(s))
        scale, ax = float(s), None
    fp = None
    if x.fix_pos is not None and w.fix_pos is not None:
        fp = [int(x.fix_pos) + int(f) for f in w.fix_pos] if isinstance(w.fix_pos, list) else \
            int(x.fix_pos) + int(w.fix_pos)
        if isinstance(fp, list) and ax is None:
            fp = fp[0]
    info = np.iinfo(np.int32)
    tq = TensorQuant(scale=scale, axis=ax, fix_pos=fp, kind="bias", dtype="int32", source="values")
    return tq, np.clip(q, info.min, info.max).astype(np.int32)


class _Names:
    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in graph.input} | {v.name for v in graph.output} | {t.name for t in graph.initializer}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
        if n.name:
            names.add(n.name)
    return names


def quantize_model(model: ir.Model | onnx.ModelProto, table: CalibrationTable,
                   scheme: QuantScheme) -> tuple[ir.Model, QuantParams]:
    """Quantise ``model`` (a region body or whole model) with ``table``'s statistics.

    :returns: ``(qdq_model, params)``; see the module docstring.
    :raises QuantizationError: a float tensor that needs statistics has none (names it).
    """
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else onnx.ModelProto.FromString(
        model.SerializeToString())
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21)
    if opset < 13:
        raise QuantizationError(f"quantisation needs opset >= 13 (per-axis DequantizeLinear); the model has {opset}")
    q = _Quantizer(proto, _element_types(proto, model), table, scheme)
    q.activations()
    q.constants()
    q.rewrite()
    return ir.from_proto(proto), q.params


def _element_types(proto: onnx.ModelProto, model: ir.Model | onnx.ModelProto) -> dict[str, int]:
    """Value name -> ONNX element type, as far as it is known."""
    g = proto.graph
    dtypes: dict[str, int] = {}
    try:  # element types of the intermediate values (a region body carries none)
        typed = onnx.shape_inference.infer_shapes(proto).graph.value_info
    except Exception:  # noqa: BLE001 - the types then come from the IR, or are unknown
        typed = []
    for vi in list(g.input) + list(g.output) + list(g.value_info) + list(typed):
        if vi.type.HasField("tensor_type"):
            dtypes[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        dtypes[t.name] = t.data_type
    if isinstance(model, ir.Model):
        for node in model.graph:
            for v in node.outputs:
                if v.dtype is not None:
                    dtypes.setdefault(v.name, int(v.dtype))
    return dtypes


class _Quantizer:
    """One QDQ rewrite of ``proto`` in place: choose parameters for activations (in graph order),
    then for constants (weights, biases, operands), then insert the Q/DQ nodes."""

    def __init__(self, proto: onnx.ModelProto, dtypes: dict[str, int], table: CalibrationTable,
                 scheme: QuantScheme):
        self.proto, self.g = proto, proto.graph
        self.dtypes, self.table, self.scheme = dtypes, table, scheme
        self.inits = {t.name: t for t in self.g.initializer}
        self.consumers: dict[str, list] = {}
        for n in self.g.node:
            for i, name in enumerate(n.input):
                if name:
                    self.consumers.setdefault(name, []).append((n, i))
        self.graph_outputs = {v.name for v in self.g.output}
        self.params = QuantParams(scheme)
        self.names = _Names(_all_names(self.g))
        self.act_inputs: list[str] = []
        self.act_outputs: dict[int, list[str]] = {}
        self.new_inits: list[onnx.TensorProto] = []
        self.head: list[onnx.NodeProto] = []  # DequantizeLinear of constants, at the top
        self.used_inits: set[str] = set()
        self.float_uses: set[str] = set()  # initializers some node still reads as float

    def is_float(self, name: str, where: str) -> bool:
        if name in self.table:
            return True
        if name not in self.dtypes:
            raise QuantizationError(f"tensor {name!r} ({where}) has no calibration statistics and an unknown type")
        return self.dtypes[name] in _FLOAT_TYPES

    def from_stats(self, name: str, where: str) -> TensorQuant:
        if name not in self.table:
            raise QuantizationError(f"tensor {name!r} ({where}) has no calibration statistics; it was not computed "
                                    f"when calibrating the float model")
        return _activation_params(self.table, name, self.scheme, output=name in self.graph_outputs)

    def activations(self) -> None:
        """Parameters of the float graph inputs and node outputs, in graph order."""
        g, params = self.g, self.params
        self.act_inputs = [v.name for v in g.input if v.name not in self.inits and self.is_float(v.name, "graph input")]
        for name in self.act_inputs:
            params.tensors[name] = self.from_stats(name, "graph input")
        for k, n in enumerate(g.node):
            outs = []
            for j, name in enumerate(n.output):
                if not name or not self.is_float(name, f"output {j} of node {n.name or n.op_type!r}"):
                    continue
                if self.scheme.fuse_activations and _fuse_skip(name, n, self.consumers.get(name, []),
                                                               self.graph_outputs):
                    continue
                src = n.input[0] if n.input else ""
                if _shares_scale(n) and src in params.tensors and params.tensors[src].kind == "activation":
                    params.tensors[name] = replace(params.tensors[src], source=f"shared:{params.logical(src)}")
                else:
                    params.tensors[name] = self.from_stats(name, f"output {j} of node {n.name or n.op_type!r}")
                outs.append(name)
            self.act_outputs[k] = outs

    def scale_inits(self, base: str, tq: TensorQuant) -> tuple[str, str]:
        s_name, z_name = self.names(f"{base}/scale"), self.names(f"{base}/zero_point")
        scales = np.asarray(tq.scale, dtype=np.float32)
        self.new_inits.append(numpy_helper.from_array(scales, s_name))
        zdt = np.int32 if tq.dtype == "int32" else np.int8
        self.new_inits.append(numpy_helper.from_array(np.zeros(scales.shape, zdt), z_name))
        return s_name, z_name

    def dq_node(self, src: str, dst: str, tq: TensorQuant, base: str) -> onnx.NodeProto:
        s_name, z_name = self.scale_inits(base, tq)
        kw = {"axis": int(tq.axis)} if tq.axis is not None else {}
        node = helper.make_node("DequantizeLinear", [src, s_name, z_name], [dst], name=self.names(f"{base}/DQ"),
                                **kw)
        _mark(node, "dequantize")
        return node

    def constants(self) -> None:
        """Quantise the float initializers that nodes read as weights, biases or operands."""
        inits, params, names = self.inits, self.params, self.names
        quantised_use: dict[tuple[str, str], str] = {}  # (initializer, params json) -> dequantised name
        uses: list[tuple[onnx.NodeProto, int, str, tuple[str, int | None]]] = []
        for n in self.g.node:
            for i, name in enumerate(n.input):
                if name not in inits or inits[name].data_type not in _FLOAT_TYPES:
                    continue
                role = weight_role(n, i, tuple(inits[name].dims))
                if role is None:
                    self.float_uses.add(name)
                else:
                    uses.append((n, i, name, role))
        for n, i, name, (kind, axis) in uses:
            arr = numpy_helper.to_array(inits[name])
            if kind == "bias":
                x = params.tensors.get(n.input[0])
                w = params.get(n.input[1]) if len(n.input) > 1 else None
                if x is None or w is None or x.kind != "activation":
                    kind = "constant"
                else:
                    tq, q = _bias_params(arr, x, w, axis)
            if kind != "bias":
                tq, q = _values_params(arr, self.scheme, axis, kind)
            key = (name, json.dumps(tq.to_dict(), sort_keys=True))
            if key in quantised_use:
                n.input[i] = quantised_use[key]
                continue
            # the first quantised use keeps the name (consumers unchanged) unless the float value stays too
            first = name not in self.float_uses and not any(k[0] == name for k in quantised_use)
            logical = name if first else names(f"{name}/dq")
            q_name = names(f"{name}/q")
            self.new_inits.append(numpy_helper.from_array(q, q_name))
            tq.data = q_name
            params.tensors[logical] = tq
            params.aliases[q_name] = logical
            self.head.append(self.dq_node(q_name, logical, tq, logical))
            quantised_use[key] = logical
            self.used_inits.add(name)
            n.input[i] = logical

    def qdq(self, src: str, dst: str, logical: str) -> list[onnx.NodeProto]:
        """QuantizeLinear + DequantizeLinear from ``src`` to ``dst`` with ``logical``'s parameters."""
        names, params = self.names, self.params
        tq = params.tensors[logical]
        s_name, z_name = self.scale_inits(logical, tq)
        q_name = names(f"{logical}/q")
        qn = helper.make_node("QuantizeLinear", [src, s_name, z_name], [q_name], name=names(f"{logical}/Q"))
        _mark(qn, "quantize")
        dn = helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dst], name=names(f"{logical}/DQ"))
        _mark(dn, "dequantize")
        params.aliases[q_name] = logical
        if src != logical:
            params.aliases[src] = logical
        if dst != logical:
            params.aliases[dst] = logical
        return [qn, dn]

    def rewrite(self) -> None:
        """Border inputs, then each node followed by Q/DQ of its outputs; the parameters go into
        the model's metadata."""
        g, names = self.g, self.names
        body: list[onnx.NodeProto] = []
        renamed_inputs: dict[str, str] = {}
        for name in self.act_inputs:
            dq_name = names(f"{name}/dq")
            renamed_inputs[name] = dq_name
            body.extend(self.qdq(name, dq_name, name))
        for k, n in enumerate(g.node):
            for i, name in enumerate(n.input):
                if name in renamed_inputs:
                    n.input[i] = renamed_inputs[name]
            body.append(n)
            for name in self.act_outputs.get(k, []):
                f_name = names(f"{name}/f")
                for j, o in enumerate(n.output):
                    if o == name:
                        n.output[j] = f_name
                body.extend(self.qdq(f_name, name, name))
        # graph outputs that are graph inputs read the border-dequantised value
        for v in g.output:
            if v.name in renamed_inputs:
                raise QuantizationError(f"graph output {v.name!r} is a graph input; nothing to quantise")

        kept = [t for t in g.initializer if t.name not in self.used_inits or t.name in self.float_uses]
        del g.initializer[:]
        g.initializer.extend(kept + self.new_inits)
        del g.node[:]
        g.node.extend(self.head + body)
        for entry in list(self.proto.metadata_props):
            if entry.key == META_KEY:
                self.proto.metadata_props.remove(entry)
        meta = self.proto.metadata_props.add()
        meta.key, meta.value = META_KEY, json.dumps(self.params.to_json(), sort_keys=True)


def _mark(node: onnx.NodeProto, what: str) -> None:
    entry = node.metadata_props.add()
    entry.key, entry.value = QDQ_MARK, what


@dataclass
class QdqView:
    """A QDQ model seen as its float operators on logical tensors (:func:`read_qdq`)."""

    params: QuantParams
    #: the compute nodes (every node but the quantiser's own Q/DQ), in graph order
    nodes: list[onnx.NodeProto]
    #: integer data of quantised constants by logical name (int8 weights/constants, int32 biases)
    constants: dict[str, np.ndarray]
    #: float initializers left as they were (shapes, Resize scales, Clip bounds, ...)
    floats: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]

    def logical(self, name: str) -> str:
        return self.params.logical(name)


def params_of(model: ir.Model | onnx.ModelProto) -> QuantParams | None:
    """The :class:`QuantParams` a QDQ model carries, or ``None``."""
    props = model.metadata_props if isinstance(model, ir.Model) else {e.key: e.value for e in model.metadata_props}
    text = props.get(META_KEY)
    if text is None:
        return None
    try:
        return QuantParams.from_json(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise QuantizationError(f"malformed {META_KEY} metadata: {exc}") from None


def read_qdq(model: ir.Model | onnx.ModelProto) -> QdqView:
    """Read a model written by :func:`quantize_model` back as compute nodes over logical names."""
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    params = params_of(proto)
    if params is None:
        raise QuantizationError(f"the model has no {META_KEY} metadata: it was not quantised by byoc.quantize")
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    constants, floats = {}, {}
    for name, tq in params.tensors.items():
        if tq.data is not None:
            if tq.data not in inits:
                raise QuantizationError(f"quantised constant {name!r}: initializer {tq.data!r} is missing")
            constants[name] = numpy_helper.to_array(inits[tq.data])
    used = {tq.data for tq in params.tensors.values() if tq.data}
    nodes = []
    for n in g.node:
        mark = next((e.value for e in n.metadata_props if e.key == QDQ_MARK), None)
        if mark is None:
            nodes.append(n)
    for name, t in inits.items():
        if name not in used and t.data_type in _FLOAT_TYPES | {onnx.TensorProto.INT64, onnx.TensorProto.INT32}:
            floats[name] = numpy_helper.to_array(t)
    return QdqView(params, nodes, constants, floats, [v.name for v in g.input if v.name not in inits],
                   [v.name for v in g.output])


__all__ = [
    "CONSTANT_OPERAND_OPS",
    "FUSE_ACTIVATIONS",
    "FUSE_PRODUCERS",
    "META_KEY",
    "QDQ_MARK",
    "QdqView",
    "SHARED_SCALE_OPS",
    "params_of",
    "quantize_model",
    "read_qdq",
    "weight_role",
]
