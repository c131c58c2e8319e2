"""Random graphs for partition properties: index DAGs, elementwise ONNX DAGs, layer DAGs.

* :func:`index_dags`: DAGs over integer node ids with two-node composite units and a random
  candidate mask, the input of :func:`byoc.partition.regions.form_regions`.
* :func:`onnx_dags`: ONNX models of unary/binary elementwise nodes on one shape (diamonds, long
  skips, values that are both consumed and graph outputs).
* :func:`layer_dags`: ONNX models mixing the operators a target claims (convolutions, matrix
  products, pooling, normalisation, activations, elementwise) on one ``[N, C, H, W]`` shape, so
  that any node can feed any other: random DAGs of operators with consistent shapes.

And independent checks to hold results against: :func:`kahn_acyclic`, :func:`contracted`,
:func:`graph_is_dag`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

# -- independent acyclicity checks -----------------------------------------------------------


def kahn_acyclic(succs: dict) -> bool:
    """``succs``: node -> iterable of successor nodes (every node a key). Kahn's algorithm."""
    indeg = {u: 0 for u in succs}
    for u in succs:
        for v in set(succs[u]):
            indeg[v] += 1
    ready = [u for u, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for v in set(succs[u]):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return seen == len(succs)


def contracted(n: int, preds: Sequence[Sequence[int]], group_of: Sequence[Any]) -> dict:
    """The graph over the labels ``group_of[i]`` of ``n`` nodes with predecessors ``preds``, self-loops dropped."""
    succs: dict[Any, set] = {group_of[i]: set() for i in range(n)}
    for c in range(n):
        for p in preds[c]:
            if group_of[p] != group_of[c]:
                succs[group_of[p]].add(group_of[c])
    return succs


def graph_is_dag(graph) -> bool:
    """``graph`` (an ``onnx_ir.Graph``) has no cycle through its nodes' values."""
    nodes = list(graph)
    producer = {}
    for k, node in enumerate(nodes):
        for v in node.outputs:
            producer[v.name] = k
    succs: dict[int, set] = {k: set() for k in range(len(nodes))}
    for k, node in enumerate(nodes):
        for v in node.inputs:
            if v is not None and v.name in producer:
                succs[producer[v.name]].add(k)
    return kahn_acyclic(succs)


# -- index DAGs -------------------------------------------------------------------------------


@st.composite
def index_dags(draw, max_nodes: int = 40):
    """``(n, preds, unit_of, n_units, candidate)`` for :func:`byoc.partition.regions.form_regions`."""
    n = draw(st.integers(1, max_nodes))
    preds = []
    for i in range(n):
        if i == 0:
            preds.append([])
            continue
        # mostly recent predecessors (chains), sometimes far ones (long skips, diamonds)
        ps = draw(st.lists(st.integers(max(0, i - 6), i - 1) | st.integers(0, i - 1), max_size=3))
        preds.append(sorted(set(ps)))
    # some edges contracted into two-node units (composites), only where that keeps a DAG
    unit_of = list(range(n))
    for c in draw(st.lists(st.integers(0, n - 1), max_size=n // 3, unique=True)):
        if not preds[c] or unit_of[c] != c:
            continue
        p = draw(st.sampled_from(preds[c]))
        if unit_of[p] != p or sum(1 for u in unit_of if u == p) > 1:
            continue
        trial = list(unit_of)
        trial[c] = p
        if kahn_acyclic(contracted(n, preds, trial)):
            unit_of = trial
    ids: dict[int, int] = {}
    unit_of = [ids.setdefault(u, len(ids)) for u in unit_of]
    n_units = len(ids)
    candidate = draw(st.lists(st.booleans(), min_size=n_units, max_size=n_units))
    return n, preds, unit_of, n_units, candidate


# -- elementwise ONNX DAGs ----------------------------------------------------------------------


def _pick_inputs(draw, values: list[str], k: int) -> list[str]:
    # mostly recent values (chains), sometimes any earlier one (long skips, diamonds)
    return [values[draw(st.integers(max(0, len(values) - 4), len(values) - 1) | st.integers(0, len(values) - 1))]
            for _ in range(k)]


def _outputs(draw, values: list[str], nodes: list[onnx.NodeProto], n_inputs: int) -> list[str]:
    used = {v for node in nodes for v in node.input}
    sinks = [v for v in values[n_inputs:] if v not in used]
    shared = draw(st.lists(st.sampled_from(values[n_inputs:]), max_size=2))  # consumed and an output
    return [v for v in values[n_inputs:] if v in set(sinks) | set(shared)]


@st.composite
def onnx_dags(draw, unary: Sequence[str], binary: Sequence[str], shape: Sequence[int] = (2, 3),
              max_nodes: int = 14, opset: int = 17) -> onnx.ModelProto:
    """A random DAG of elementwise nodes (names ``n0, n1, ...``) on float tensors of ``shape``."""
    n_inputs = draw(st.integers(1, 2))
    n = draw(st.integers(1, max_nodes))
    values = [f"x{i}" for i in range(n_inputs)]
    nodes = []
    for i in range(n):
        is_binary = bool(binary) and (not unary or draw(st.booleans()))
        ins = _pick_inputs(draw, values, 2 if is_binary else 1)
        nodes.append(helper.make_node(draw(st.sampled_from(list(binary if is_binary else unary))), ins, [f"v{i}"],
                                      name=f"n{i}"))
        values.append(f"v{i}")
    outputs = _outputs(draw, values, nodes, n_inputs)
    graph = helper.make_graph(
        nodes, "random",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, list(shape)) for v in values[:n_inputs]],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, list(shape)) for v in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# -- layer DAGs: mixed operators on one NCHW shape ----------------------------------------------

#: ``builder(draw, name, inputs, shape, rng) -> (nodes, initializers)``; every layer maps
#: ``shape`` to ``shape`` so any value can feed any layer
LayerBuilder = Callable[..., tuple[list[onnx.NodeProto], list[onnx.TensorProto]]]


def _w(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return (rng.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32)


def _unary(op_type: str, **attrs) -> LayerBuilder:
    def build(draw, name, inputs, shape, rng):
        return [helper.make_node(op_type, inputs[:1], [name], name=name, **attrs)], []
    build.arity = 1  # type: ignore[attr-defined]
    return build


def _binary(op_type: str) -> LayerBuilder:
    def build(draw, name, inputs, shape, rng):
        return [helper.make_node(op_type, inputs[:2], [name], name=name)], []
    build.arity = 2  # type: ignore[attr-defined]
    return build


def _conv(draw, name, inputs, shape, rng):
    c = shape[1]
    k = draw(st.sampled_from([1, 3]))
    group = draw(st.sampled_from([g for g in (1, c) if c % g == 0]))
    w = numpy_helper.from_array(_w(rng, (c, c // group, k, k), 1.0 / np.sqrt(c // group * k * k)), f"{name}_w")
    b = numpy_helper.from_array(_w(rng, (c,), 0.1), f"{name}_b")
    node = helper.make_node("Conv", [inputs[0], w.name, b.name], [name], name=name, pads=[k // 2] * 4,
                            group=group)
    return [node], [w, b]


def _matmul(draw, name, inputs, shape, rng):
    w = numpy_helper.from_array(_w(rng, (shape[-1], shape[-1]), 1.0 / np.sqrt(shape[-1])), f"{name}_w")
    return [helper.make_node("MatMul", [inputs[0], w.name], [name], name=name)], [w]


def _pool(op_type: str) -> LayerBuilder:
    def build(draw, name, inputs, shape, rng):
        k = draw(st.sampled_from([1, 3]))
        return [helper.make_node(op_type, inputs[:1], [name], name=name, kernel_shape=[k, k],
                                 pads=[k // 2] * 4)], []
    build.arity = 1  # type: ignore[attr-defined]
    return build


def _batchnorm(draw, name, inputs, shape, rng):
    c = shape[1]
    params = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{name}_scale"),
        numpy_helper.from_array(_w(rng, (c,), 0.2), f"{name}_bias"),
        numpy_helper.from_array(_w(rng, (c,), 0.2), f"{name}_mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{name}_var"),
    ]
    node = helper.make_node("BatchNormalization", [inputs[0]] + [p.name for p in params], [name], name=name)
    return [node], params


def _transpose(draw, name, inputs, shape, rng):
    return [helper.make_node("Transpose", inputs[:1], [name], name=name, perm=[0, 1, 3, 2])], []


for _b in (_conv, _matmul, _batchnorm, _transpose):
    _b.arity = 1  # type: ignore[attr-defined]

#: operator -> layer builder; :func:`layer_dags` uses those a target claims
LAYERS: dict[str, LayerBuilder] = {
    "Conv": _conv,
    "MatMul": _matmul,
    "MaxPool": _pool("MaxPool"),
    "AveragePool": _pool("AveragePool"),
    "BatchNormalization": _batchnorm,
    "Transpose": _transpose,  # square spatial dims: the shape is kept
    "Relu": _unary("Relu"),
    "LeakyRelu": _unary("LeakyRelu", alpha=0.1),
    "Sigmoid": _unary("Sigmoid"),
    "Tanh": _unary("Tanh"),
    "Neg": _unary("Neg"),
    "Abs": _unary("Abs"),
    "Identity": _unary("Identity"),
    "Add": _binary("Add"),
    "Sub": _binary("Sub"),
    "Mul": _binary("Mul"),
    "Max": _binary("Max"),
    "Min": _binary("Min"),
}


#: layers drawn four times as often (accelerators offload regions that contain one)
MAC_LAYERS = frozenset({"Conv", "MatMul"})


@st.composite
def layer_dags(draw, ops: Sequence[str], shape: Sequence[int] = (1, 4, 5, 5), max_nodes: int = 10,
               opset: int = 21) -> onnx.ModelProto:
    """A random DAG of the layers in ``ops`` (keys of :data:`LAYERS`) on float ``shape`` (square H == W)."""
    ops = [o for o in ops if o in LAYERS]
    if not ops:
        raise ValueError(f"layer_dags: none of {list(ops)} is a known layer ({sorted(LAYERS)})")
    shape = list(shape)
    # multiply-accumulate layers more often: targets keep regions that contain one
    weighted = [o for o in ops for _ in range(4 if o in MAC_LAYERS else 1)]
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    n_inputs = draw(st.integers(1, 2))
    n = draw(st.integers(1, max_nodes))
    values = [f"x{i}" for i in range(n_inputs)]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    for i in range(n):
        op_type = draw(st.sampled_from(weighted))
        build = LAYERS[op_type]
        ins = _pick_inputs(draw, values, getattr(build, "arity", 1))
        new_nodes, new_inits = build(draw, f"n{i}", ins, shape, rng)
        nodes.extend(new_nodes)
        inits.extend(new_inits)
        values.append(f"n{i}")
    outputs = _outputs(draw, values, nodes, n_inputs)
    graph = helper.make_graph(
        nodes, "layers",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, shape) for v in values[:n_inputs]],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, shape) for v in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


__all__ = [
    "LAYERS",
    "contracted",
    "graph_is_dag",
    "index_dags",
    "kahn_acyclic",
    "layer_dags",
    "onnx_dags",
]
