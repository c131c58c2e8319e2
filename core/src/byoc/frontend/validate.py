"""Structural validation of ONNX protos before byoc touches their data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto

from byoc.budget import Budget
from byoc.errors import ModelValidationError, UnsupportedOperatorError


def _tensor_nbytes(t: TensorProto) -> int:
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:
        itemsize = 1
    return math.prod(int(d) for d in t.dims) * itemsize


def check_proto(proto: onnx.ModelProto, *, budget: Budget, base_dir: Path | None) -> None:
    """Budget and name checks on the raw proto (no tensor data is decoded)."""
    total = 0
    for t in proto.graph.initializer:
        if any(d < 0 for d in t.dims):
            raise ModelValidationError(f"initializer {t.name!r}: negative dimension {list(t.dims)}")
        budget.check_alloc(t.dims, onnx.helper.tensor_dtype_to_np_dtype(t.data_type) if t.data_type else np.uint8,
                           f"initializer {t.name!r}")
        total += _tensor_nbytes(t)
    if len(proto.graph.node) > budget.max_nodes:
        raise ModelValidationError(f"the graph has {len(proto.graph.node)} nodes, over max_nodes={budget.max_nodes}")


def load_external_data(proto: onnx.ModelProto, base_dir: Path, *, budget: Budget) -> None:
    """Load external tensor data that stays inside ``base_dir`` (filled in by the frontend)."""
    from onnx.external_data_helper import uses_external_data

    for t in proto.graph.initializer:
        if uses_external_data(t):
            from byoc.errors import ExternalDataError

            raise ExternalDataError(f"initializer {t.name!r}: external data is not supported yet")


def sort_topologically(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Return the proto with its nodes in topological order; a cycle is an error."""
    g = proto.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    producers: dict[str, int] = {}
    for idx, n in enumerate(g.node):
        for o in n.output:
            if o:
                producers[o] = idx
    n_nodes = len(g.node)
    indeg = [0] * n_nodes
    users: list[list[int]] = [[] for _ in range(n_nodes)]
    for idx, n in enumerate(g.node):
        deps = {producers[i] for i in n.input if i in producers and i not in available}
        indeg[idx] = len(deps)
        for d in deps:
            users[d].append(idx)
    order = [i for i in range(n_nodes) if indeg[i] == 0]
    head = 0
    while head < len(order):
        for u in users[order[head]]:
            indeg[u] -= 1
            if indeg[u] == 0:
                order.append(u)
        head += 1
    if len(order) != n_nodes:
        stuck = [g.node[i].name or f"#{i} ({g.node[i].op_type})" for i in range(n_nodes) if indeg[i] > 0]
        raise ModelValidationError(f"the graph has a cycle through node(s): {', '.join(stuck[:10])}")
    if order != list(range(n_nodes)):
        nodes = [g.node[i] for i in order]
        del g.node[:]
        g.node.extend(nodes)
    return proto


def check_supported(model: ir.Model) -> None:
    """Raise one error listing every node whose operator has no byoc kernel."""
    from byoc.kernels import is_supported

    bad = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if not is_supported(node.op_type, node.domain):
            bad.append((node.name or "", node.domain or "ai.onnx", node.op_type))
    if bad:
        listing = "; ".join(f"{n or '<unnamed>'} ({d}::{op})" for n, d, op in bad[:50])
        more = f" and {len(bad) - 50} more" if len(bad) > 50 else ""
        raise UnsupportedOperatorError(
            f"{len(bad)} node(s) use operators byoc cannot run: {listing}{more}", nodes=bad
        )
