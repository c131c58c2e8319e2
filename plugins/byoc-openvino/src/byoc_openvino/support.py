"""Which ONNX nodes the ``openvino`` target takes: OpenVINO's own answer, node by node.

For each graph byoc partitions, the plugin serialises the graph as ONNX, reads it with OpenVINO's
ONNX frontend and asks the device (``Core.query_model``) which operations it supports. The
answer is per OpenVINO operation; it is mapped back to the ONNX nodes by name (the frontend
gives an operation the ONNX node's name, and its outputs the node's output names). A node is
taken when every operation it became is supported. Where the mapping is not conclusive (a node
that became no named operation, a graph the frontend refuses as a whole, a node of a control-flow
body), the node is asked about alone: a one-node model of it, read and queried the same way.

Every refusal has a reason that lands in byoc's report: the frontend's own error (an operator it
does not convert), the device's (``query_model`` left out operations ``Foo``), or the plugin's
own (control flow, non-tensor values). Where OpenVINO's results differ from ONNX's reference
(found by ``byoc conformance openvino``), the runtime corrects them (see the README).
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Sequence

import onnx
import onnx_ir as ir
from onnx import helper

from byoc.contract import SupportContext

from byoc_openvino import engine

#: the opset a one-node model declares when its graph declares none (a control-flow body)
DEFAULT_OPSET = 21

#: ONNX operators with graph attributes: they stay with byoc (their bodies read values of the
#: enclosing graph, which a region's standalone model cannot carry)
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})

#: BitShift as OpenVINO 2026.4 computes it as ONNX does: a uint8 left shift saturates (4 << 7 gives
#: 255, not 0), and 32/64-bit shifts of values from 2**31 up come back wrong (read as signed)
BITSHIFT_EXACT = frozenset({("LEFT", ir.DataType.UINT16), ("LEFT", ir.DataType.UINT32),
                            ("RIGHT", ir.DataType.UINT8), ("RIGHT", ir.DataType.UINT16)})

_lock = threading.Lock()
#: graph -> (signature, device, {node name: verdict})
_answers: "weakref.WeakKeyDictionary[ir.Graph, tuple[Any, str, dict[str, Any]]]" = weakref.WeakKeyDictionary()
#: graph -> True when OpenVINO took the whole graph (every operation supported)
_whole: "weakref.WeakKeyDictionary[ir.Graph, tuple[Any, str, bool]]" = weakref.WeakKeyDictionary()


# -- ONNX models of node subsets -----------------------------------------------------------------


def _is_const(v: ir.Value) -> bool:
    return v.const_value is not None and not v.is_graph_input()


def _opsets(graph: ir.Graph | None) -> dict[str, int]:
    opsets = dict(graph.opset_imports) if graph is not None else {}
    opsets.setdefault("", DEFAULT_OPSET)
    return opsets


def _value_info(v: ir.Value) -> onnx.ValueInfoProto:
    return ir.serde.serialize_value(v)  # name, type and shape (None: left out)


def submodel(nodes: Sequence[ir.Node], inputs: Sequence[ir.Value] | None = None,
             outputs: Sequence[ir.Value] | None = None, opsets: dict[str, int] | None = None) -> bytes:
    """ONNX bytes of a model made of ``nodes`` (in order): values from outside become graph inputs
    (constants become initializers); outputs are ``outputs`` or every produced value used outside
    the nodes (or a graph output), else the last node's outputs."""
    members = set(map(id, nodes))
    produced: dict[int, ir.Value] = {}
    for n in nodes:
        for v in n.outputs:
            produced[id(v)] = v
    graph_inputs: list[ir.Value] = []
    inits: list[ir.Value] = []
    seen: set[int] = set()
    for n in nodes:
        for v in n.inputs:
            if v is None or id(v) in produced or id(v) in seen:
                continue
            seen.add(id(v))
            (inits if _is_const(v) else graph_inputs).append(v)
    if inputs is not None:
        graph_inputs = [v for v in inputs if not _is_const(v)]
        inits = [v for v in inits if id(v) not in {id(x) for x in graph_inputs}]
    if outputs is None:
        outs = []
        for v in produced.values():
            if v.is_graph_output() or any(id(user) not in members for user, _ in v.uses()):
                outs.append(v)
        if not outs:
            outs = [v for v in nodes[-1].outputs if v.name]
    else:
        outs = list(outputs)
    g = helper.make_graph(
        [ir.serde.serialize_node(n) for n in nodes],
        "byoc_openvino_query",
        [_value_info(v) for v in graph_inputs],
        [_value_info(v) for v in outs],
        [ir.serde.serialize_tensor(v.const_value) for v in inits],
    )
    for init, v in zip(g.initializer, inits):
        init.name = v.name
    model = helper.make_model(g, opset_imports=[helper.make_opsetid(d, int(o)) for d, o in sorted((opsets or {}).items())],
                              producer_name="byoc-openvino")
    return model.SerializeToString()


# -- asking OpenVINO ---------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    """The part of an OpenVINO error that names the problem (its messages carry C++ call sites)."""
    text = " ".join(str(exc).split())
    i = text.find("Failed operations detailed log:")
    if i >= 0:
        text = text[i + len("Failed operations detailed log:"):].strip(" -")
    text = re.sub(r"(Exception from )?src/\S+:\d+:? ?", "", text)
    text = re.sub(r"Check '(.*?)' failed at ", r"check '\1' failed ", text)
    return text[:300]


def _ops_of(ov_model: Any) -> list[Any]:
    return [op for op in ov_model.get_ops() if op.get_type_name() not in ("Parameter", "Result")]


def ask_alone(node: ir.Node, device: str) -> str | None:
    """The verdict for ``node`` asked about alone: ``None`` (supported) or the reason."""
    for v in node.inputs:
        if v is not None and not _is_const(v) and v.dtype is None:
            return f"{node.op_type}: the type of input {v.name!r} is unknown (OpenVINO needs typed inputs)"
    try:
        data = submodel([node], opsets=_opsets(node.graph))
        model = engine.read_onnx(data)
    except Exception as exc:
        return f"{node.op_type}: OpenVINO's ONNX frontend refuses it: {_first_line(exc)}"
    try:
        supported = engine.query(model, device)
    except Exception as exc:
        return f"{node.op_type}: query_model({device}) failed: {_first_line(exc)}"
    missing = sorted({op.get_type_name() for op in _ops_of(model) if op.get_friendly_name() not in supported})
    if missing:
        return f"{node.op_type}: OpenVINO's {device} plugin does not support {', '.join(missing)} (query_model)"
    return None


def _signature(graph: ir.Graph) -> tuple:
    nodes = list(graph) if len(graph) < 3 else [graph.node(0), graph.node(len(graph) - 1)]
    return (len(graph), tuple(map(id, nodes)))


def _is_main(graph: ir.Graph) -> bool:
    """A top-level graph: every value its nodes read is produced in it, an input or a constant."""
    produced = {id(v) for n in graph for v in n.outputs}
    inputs = {id(v) for v in graph.inputs}
    for n in graph:
        for v in n.inputs:
            if v is not None and id(v) not in produced and id(v) not in inputs and not _is_const(v):
                return False
    return True


def ask_graph(graph: ir.Graph, device: str) -> dict[str, Any]:
    """``{node name: None | reason}`` for the nodes of ``graph`` whose verdict the whole-graph
    query settles (the others are asked about alone by :func:`verdict`)."""
    answers: dict[str, Any] = {}
    whole = False
    nodes = [n for n in graph if n.op_type not in CONTROL_FLOW]
    if nodes and len(nodes) == len(graph) and _is_main(graph):
        try:
            data = submodel(nodes, list(graph.inputs), list(graph.outputs), _opsets(graph))
            model = engine.read_onnx(data)
            supported = engine.query(model, device)
        except Exception:
            model = None  # the frontend refuses something in it: every node is asked about alone
        if model is not None:
            by_name: dict[str, list[Any]] = {}
            by_tensor: dict[str, list[Any]] = {}
            ops = _ops_of(model)
            for op in ops:
                by_name.setdefault(op.get_friendly_name(), []).append(op)
                for out in op.outputs():
                    for name in out.get_names():
                        by_tensor.setdefault(name, []).append(op)
            unsupported = {op.get_friendly_name() for op in ops if op.get_friendly_name() not in supported}
            whole = not unsupported
            accounted: set[str] = set()
            for n in nodes:
                mine = {id(op): op for op in by_name.get(n.name, [])}
                for v in n.outputs:
                    for op in by_tensor.get(v.name, []):
                        mine[id(op)] = op
                if not mine:
                    continue  # no named operation (folded or renamed): asked about alone
                refused = sorted({op.get_type_name() for op in mine.values() if op.get_friendly_name() in unsupported})
                accounted.update(op.get_friendly_name() for op in mine.values())
                answers[n.name] = (f"{n.op_type}: OpenVINO's {device} plugin does not support {', '.join(refused)} "
                                   "(query_model)") if refused else None
            if unsupported - accounted:
                # an unsupported operation no node claims by name: ask about each node alone
                answers = {k: v for k, v in answers.items() if v is not None}
    with _lock:
        _whole[graph] = (_signature(graph), device, whole)
    return answers


def verdict(node: ir.Node, ctx: SupportContext) -> Any:
    """The support check registered for every operator: ``True`` or the reason."""
    if node.op_type in CONTROL_FLOW or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                           for a in node.attributes.values()):
        return f"{node.op_type}: control flow (a body with graphs) stays with byoc's host runtime"
    for v in list(node.inputs) + list(node.outputs):
        if v is not None and v.type is not None and not isinstance(v.type, ir.TensorType):
            return f"{node.op_type}: {v.name!r} is a {v.type} (OpenVINO regions take tensors only)"
        if v is not None and v.shape is not None and any(isinstance(d, int) and d == 0 for d in v.shape):
            # OpenVINO's CPU plugin dies of SIGFPE compiling some of these (a Conv with 0 channels)
            return (f"{node.op_type}: {v.name!r} is empty ({list(v.shape)}): OpenVINO does not compile zero-size "
                    "tensors; byoc's host runs them")
    if node.op_type == "BitShift":
        direction = node.attributes.get_string("direction", "")
        dtype = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
        if (direction, dtype) not in BITSHIFT_EXACT:
            return (f"BitShift: a {direction} shift of {dtype} differs from ONNX's in OpenVINO (a uint8 left shift "
                    "saturates; 32/64-bit shifts of values from 2**31 up are read as signed); byoc's host runs it")
    try:
        device = engine.resolve_device(str(ctx.options.get("device", "CPU")))
    except Exception as exc:
        return f"{node.op_type}: OpenVINO is not usable here: {type(exc).__name__}: {exc}"
    graph = node.graph
    if graph is None:
        return ask_alone(node, device) or True
    sig = _signature(graph)
    with _lock:
        cached = _answers.get(graph)
    if cached is None or cached[0] != sig or cached[1] != device:
        answers = ask_graph(graph, device)
        with _lock:
            _answers[graph] = cached = (sig, device, answers)
    answers = cached[2]
    if node.name in answers:
        return answers[node.name] or True
    reason = ask_alone(node, device)
    with _lock:
        answers[node.name] = reason
    return reason or True


def whole_graph_supported(graph: ir.Graph | None, device: str) -> bool:
    """OpenVINO took the whole ``graph`` in one query (every operation supported)."""
    if graph is None:
        return False
    with _lock:
        entry = _whole.get(graph)
    return entry is not None and entry[0] == _signature(graph) and entry[1] == device and entry[2]


def all_operators() -> list[str]:
    """Every operator of the default ONNX domain (OpenVINO is asked about each node)."""
    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    return sorted(names)


__all__ = ["CONTROL_FLOW", "all_operators", "ask_alone", "ask_graph", "submodel", "verdict",
           "whole_graph_supported"]
