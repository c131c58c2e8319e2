"""Structural validation of ONNX protos before byoc touches their data.

Everything here works on the raw ``onnx.ModelProto`` and never decodes tensor data:

* :func:`check_text` finds string fields that are not valid UTF-8 (the python protobuf
  runtime hands them over as ``bytes`` instead of failing);
* :func:`check_structure` walks the main graph and every subgraph: node count and nesting
  budgets, declared tensor sizes against the budget, tensor payloads that do not match
  their dims/dtype, attribute types, duplicate or dangling value names, cycles; it sorts every
  graph topologically in place;
* :func:`external_tensors` finds the tensors whose data lives in external files (read by
  :mod:`byoc.frontend.external`);
* :func:`check_supported_proto` lists every node that has no byoc kernel in one error.

The checks run before the ONNX checker and version converter (C++ code) see the model, so
those only ever get structurally sound protos.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from byoc.budget import Budget, _fmt_bytes
from byoc.errors import ModelLoadError, ModelValidationError, ResourceLimitError, UnsupportedOperatorError

_T = TensorProto
#: bits per element of every tensor element type with a fixed size
_BITS = {
    _T.FLOAT: 32, _T.UINT8: 8, _T.INT8: 8, _T.UINT16: 16, _T.INT16: 16, _T.INT32: 32, _T.INT64: 64,
    _T.BOOL: 8, _T.FLOAT16: 16, _T.DOUBLE: 64, _T.UINT32: 32, _T.UINT64: 64, _T.COMPLEX64: 64,
    _T.COMPLEX128: 128, _T.BFLOAT16: 16, _T.FLOAT8E4M3FN: 8, _T.FLOAT8E4M3FNUZ: 8, _T.FLOAT8E5M2: 8,
    _T.FLOAT8E5M2FNUZ: 8,
}  # fmt: skip
# element types added in later onnx releases (looked up by name so older onnx still imports)
for _name, _bits in (("UINT4", 4), ("INT4", 4), ("FLOAT4E2M1", 4), ("FLOAT8E8M0", 8), ("UINT2", 2),
                     ("INT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(_T, _name):
        _BITS[getattr(_T, _name)] = _bits
#: int32_data packs 4-bit and 2-bit values (one byte of packed values per entry)
_INT32_PER_ENTRY = {dt: 8 // b for dt, b in _BITS.items() if b in (2, 4)}

#: which typed field may hold the values of each element type (raw_data is always allowed but STRING)
_FIELD_OF = {_T.FLOAT: "float_data", _T.COMPLEX64: "float_data", _T.INT64: "int64_data", _T.STRING: "string_data",
             _T.DOUBLE: "double_data", _T.COMPLEX128: "double_data", _T.UINT32: "uint64_data",
             _T.UINT64: "uint64_data"}
_A = AttributeProto
#: attribute type -> the field that holds its value
_ATTR_FIELD = {_A.FLOAT: "f", _A.INT: "i", _A.STRING: "s", _A.TENSOR: "t", _A.GRAPH: "g",
               _A.SPARSE_TENSOR: "sparse_tensor", _A.TYPE_PROTO: "tp", _A.FLOATS: "floats", _A.INTS: "ints",
               _A.STRINGS: "strings", _A.TENSORS: "tensors", _A.GRAPHS: "graphs",
               _A.SPARSE_TENSORS: "sparse_tensors", _A.TYPE_PROTOS: "type_protos"}
_ATTR_SINGULAR = ("f", "i", "s", "t", "g", "sparse_tensor", "tp")
_ATTR_REPEATED = ("floats", "ints", "strings", "tensors", "graphs", "sparse_tensors", "type_protos")
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def dtype_name(data_type: int) -> str:
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return f"<unknown element type {data_type}>"


def _numel(dims) -> int:
    return math.prod(int(d) for d in dims)


def raw_nbytes(data_type: int, numel: int) -> int:
    """Bytes that ``raw_data`` must hold for ``numel`` elements of ``data_type`` (packed types rounded up)."""
    return (numel * _BITS[data_type] + 7) // 8


def decoded_nbytes(data_type: int, numel: int) -> int:
    """Bytes of the numpy array the tensor becomes (sub-byte types take one byte per element)."""
    if data_type == _T.STRING:
        return numel * 8  # object pointers; the strings themselves are already in memory
    return numel * max(1, _BITS[data_type] // 8)


# --------------------------------------------------------------------------------------------
# invalid UTF-8


def _is_repeated(fd) -> bool:
    rep = getattr(fd, "is_repeated", None)
    if rep is not None:
        return bool(rep)
    return fd.label == fd.LABEL_REPEATED  # older protobuf runtimes


def _step(fd_name: str, msg, index: int | None = None) -> str:
    step = f"{fd_name}[{index}]" if index is not None else fd_name
    if isinstance(msg, NodeProto):
        name = msg.name if isinstance(msg.name, str) and msg.name else ""
        op = msg.op_type if isinstance(msg.op_type, str) else "?"
        step += f"<{op}{' ' + repr(name) if name else ''}>"
    elif isinstance(msg, (TensorProto, AttributeProto, GraphProto)) or type(msg).__name__ == "ValueInfoProto":
        if isinstance(msg.name, str) and msg.name:
            step += f"<{msg.name!r}>"
    return step


#: message descriptor -> (string fields, message fields), each as (name, repeated)
_TEXT_PLANS: dict = {}


def _text_plan(descriptor):
    plan = _TEXT_PLANS.get(descriptor)
    if plan is None:
        strings = [(fd.name, _is_repeated(fd)) for fd in descriptor.fields if fd.type == fd.TYPE_STRING]
        messages = [(fd.name, _is_repeated(fd)) for fd in descriptor.fields if fd.type == fd.TYPE_MESSAGE]
        plan = _TEXT_PLANS[descriptor] = (strings, messages)
    return plan


class _BadText(Exception):
    def __init__(self, trail: list, value):
        self.trail = trail
        self.value = value


def check_text(msg, path: str = "model", origin: str = "<model>") -> None:
    """Raise :class:`ModelLoadError` naming the first string field that is not valid UTF-8.

    The upb protobuf runtime does not validate proto2 ``string`` fields: invalid UTF-8 comes
    back as ``bytes``. Bytes fields (tensor payloads) are never read.
    """
    trail: list = []
    try:
        _check_text(msg, trail)
    except RecursionError:
        raise ModelLoadError(f"{origin}: the protobuf is nested too deeply to validate") from None
    except _BadText as bad:
        where = path + "".join("." + (_step(name, sub, index) if sub is not None else
                                      (f"{name}[{index}]" if index is not None else name))
                               for name, index, sub in bad.trail)
        _check_str(bad.value, where, origin)


def _check_text(msg, trail: list) -> None:
    strings, messages = _text_plan(msg.DESCRIPTOR)
    for name, repeated in strings:
        value = getattr(msg, name)
        if repeated:
            for i, v in enumerate(value):
                if type(v) is not str:
                    raise _BadText([*trail, (name, i, None)], v)
        elif type(value) is not str:
            raise _BadText([*trail, (name, None, None)], value)
    for name, repeated in messages:
        if repeated:
            for i, sub in enumerate(getattr(msg, name)):
                trail.append((name, i, sub))
                _check_text(sub, trail)
                trail.pop()
        elif msg.HasField(name):
            sub = getattr(msg, name)
            trail.append((name, None, sub))
            _check_text(sub, trail)
            trail.pop()


def _check_str(value, path: str, origin: str) -> None:
    if not isinstance(value, str):
        shown = bytes(value[:60]) if isinstance(value, (bytes, bytearray)) else value
        raise ModelLoadError(f"{origin}: {path} is not valid UTF-8 text ({shown!r}); ONNX names and strings must be UTF-8")


# --------------------------------------------------------------------------------------------
# graphs, nodes and tensors


def node_label(node: NodeProto, index: int) -> str:
    return f"node {node.name!r} ({node.op_type})" if node.name else f"node #{index} ({node.op_type})"


@dataclass
class ExternalTensor:
    """A tensor whose data lives in an external file, found by :func:`external_tensors`."""

    tensor: TensorProto
    what: str  # how messages name it
    nbytes: int  # bytes raw_data must hold


@dataclass
class _Walk:
    budget: Budget
    nodes: int = 0
    total_bytes: int = 0


def check_structure(proto: ModelProto, *, budget: Budget) -> None:
    """Validate the whole model without decoding tensor data; sorts every graph in place.

    :raises ResourceLimitError: node count, nesting depth or a declared tensor size over budget.
    :raises ModelValidationError: bad tensors, duplicate/dangling names, cycles.
    """
    if not proto.HasField("graph"):
        raise ModelLoadError("the protobuf holds no graph; not an ONNX model")
    walk = _Walk(budget)
    try:
        _check_graph(proto.graph, outer=(), depth=0, scope="", walk=walk)
    except RecursionError:
        raise ResourceLimitError(
            f"subgraphs are nested too deeply to validate (max_nesting={budget.max_nesting})"
        ) from None
    for fn in proto.functions:
        # model-local functions: budget their nodes; their bodies are not run by byoc directly
        walk.nodes += len(fn.node)
        if walk.nodes > budget.max_nodes:
            raise ResourceLimitError(f"the model has more than max_nodes={budget.max_nodes} nodes (functions included)")


def iter_tensors(g: GraphProto, scope: str = ""):
    """Yield ``(tensor, what)`` for every tensor of ``g`` and its subgraphs (sparse parts included)."""
    for t in g.initializer:
        yield t, f"initializer {t.name!r}{scope}"
    for st in g.sparse_initializer:
        what = f"sparse initializer {st.values.name!r}{scope}"
        yield st.values, f"values of {what}"
        yield st.indices, f"indices of {what}"
    for idx, node in enumerate(g.node):
        label = node_label(node, idx)
        for attr in node.attribute:
            base = f"attribute {attr.name!r} of {label}{scope}"
            if attr.HasField("t"):
                yield attr.t, f"tensor {base}"
            for i, t in enumerate(attr.tensors):
                yield t, f"tensor #{i} of {base}"
            sparse = list(attr.sparse_tensors)
            if attr.HasField("sparse_tensor"):
                sparse.insert(0, attr.sparse_tensor)
            for st in sparse:
                yield st.values, f"values of sparse tensor {base}"
                yield st.indices, f"indices of sparse tensor {base}"
            subgraphs = list(attr.graphs)
            if attr.HasField("g"):
                subgraphs.insert(0, attr.g)
            for sub in subgraphs:
                yield from iter_tensors(sub, f" in subgraph {attr.name!r} of {label}{scope}")


def external_tensors(proto: ModelProto) -> list[ExternalTensor]:
    """The tensors that keep their data in external files (call after :func:`check_structure`)."""
    found = []
    for t, what in iter_tensors(proto.graph):
        if t.data_location == _T.EXTERNAL:
            found.append(ExternalTensor(t, what, raw_nbytes(t.data_type, _numel(t.dims))))
    return found


def _check_graph(g: GraphProto, outer: tuple[set[str], ...], depth: int, scope: str, walk: _Walk) -> set[str]:
    """Validate and sort ``g``; returns the names it reads from enclosing graphs.

    ``outer`` holds the value names of every enclosing graph (innermost last).
    """
    _check_graph_size(g, depth, scope, walk)
    where = scope or " in the main graph"
    inputs, inits = _check_definitions(g, where, scope, walk)
    producers = _check_producers(g, inputs, inits, where, scope)
    local = inputs | inits | set(producers)

    def visible(name: str) -> bool:
        return name in local or any(name in names for names in outer)

    inner = (*outer, local)
    free: set[str] = set()
    deps: list[set[int]] = []
    dangling: list[str] = []
    for idx, node in enumerate(g.node):
        label = node_label(node, idx)
        mine: set[int] = set()
        for name in node.input:
            if not name:
                continue  # a missing optional input
            if not visible(name):
                dangling.append(f"{label} reads {name!r}")
            elif name in producers:
                mine.add(producers[name])
            elif name not in local:
                free.add(name)
        _check_device_configurations(node, label, scope)
        _check_onnx_traps(node, label, scope)
        for attr in node.attribute:
            _check_attribute(attr, node, label, scope, walk)
            subgraphs = list(attr.graphs)
            if attr.HasField("g"):
                subgraphs.insert(0, attr.g)
            for sub in subgraphs:
                sub_scope = f" in subgraph {attr.name!r} of {label}{scope}"
                used = _check_graph(sub, inner, depth + 1, sub_scope, walk)
                for name in used:
                    if name in producers:
                        mine.add(producers[name])  # implicit input: must run after its producer
                    elif name not in local:
                        free.add(name)
        deps.append(mine)
    if dangling:
        shown = "; ".join(dangling[:20]) + (f"; and {len(dangling) - 20} more" if len(dangling) > 20 else "")
        raise ModelValidationError(
            f"{len(dangling)} node input(s){where} read a value that no node produces and that is neither "
            f"a graph input nor an initializer: {shown}"
        )
    free |= _check_graph_outputs(g, local, visible, where, scope)
    _sort_in_place(g, deps, scope)
    return free


def _check_graph_size(g: GraphProto, depth: int, scope: str, walk: _Walk) -> None:
    budget = walk.budget
    if depth > budget.max_nesting:
        raise ResourceLimitError(
            f"subgraph{scope} is nested {depth} levels deep, over the budget max_nesting={budget.max_nesting}"
        )
    walk.nodes += len(g.node)
    if walk.nodes > budget.max_nodes:
        raise ResourceLimitError(
            f"the model has more than max_nodes={budget.max_nodes} nodes (subgraphs included); "
            f"raise byoc.Budget(max_nodes=...) if this model is genuine"
        )


def _check_definitions(g: GraphProto, where: str, scope: str, walk: _Walk) -> tuple[set[str], set[str]]:
    """The graph's inputs and initializers (names, declared shapes, tensors); returns both name sets."""
    inputs: set[str] = set()
    for vi in g.input:
        if vi.name in inputs:
            raise ModelValidationError(f"graph input {vi.name!r} is declared twice{where}")
        inputs.add(vi.name)
        _check_value_info(vi, "graph input", where)
    inits: set[str] = set()
    for t in g.initializer:
        what = f"initializer {t.name!r}{scope}"
        if not t.name:
            raise ModelValidationError(f"an initializer{where} has no name; every initializer needs one")
        if t.name in inits:
            raise ModelValidationError(f"initializer {t.name!r} is defined twice{where}")
        inits.add(t.name)
        check_tensor(t, what, walk)
    for st in g.sparse_initializer:
        name = st.values.name
        what = f"sparse initializer {name!r}{scope}"
        if not name:
            raise ModelValidationError(f"a sparse initializer{where} has no name (values.name is empty)")
        if name in inits:
            raise ModelValidationError(f"initializer {name!r} is defined twice{where}")
        inits.add(name)
        _check_sparse(st, what, walk)
    for vi in g.output:
        _check_value_info(vi, "graph output", where)
    for vi in g.value_info:
        _check_value_info(vi, "value_info", where)
    for vi in g.input:  # after the initializers: a tensor over budget is named before a declared shape
        _check_value_info(vi, "graph input", where, walk)
    return inputs, inits


def _check_producers(g: GraphProto, inputs: set[str], inits: set[str], where: str, scope: str) -> dict[str, int]:
    """value name -> index of the node producing it; every name assigned exactly once."""
    producers: dict[str, int] = {}
    for idx, node in enumerate(g.node):
        for out in node.output:
            if not out:
                continue  # an unused optional output
            if out in producers:
                other = producers[out]
                if other == idx:
                    raise ModelValidationError(f"{node_label(node, idx)}{scope} lists output {out!r} twice")
                raise ModelValidationError(
                    f"value {out!r} is produced twice{where}: by {node_label(g.node[other], other)} and by "
                    f"{node_label(node, idx)}; every value name must be assigned exactly once"
                )
            if out in inputs or out in inits:
                kind = "graph input" if out in inputs else "initializer"
                raise ModelValidationError(
                    f"{node_label(node, idx)}{scope} writes {out!r}, which is already a {kind}; "
                    f"every value name must be assigned exactly once"
                )
            producers[out] = idx
    return producers


_EINSUM_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")


def einsum_problem(equation: str, n_inputs: int) -> str | None:
    """Why ``equation`` is not a valid Einsum equation for ``n_inputs`` operands (``None``: it is).

    onnx's own shape inference loops forever on some invalid equations (two ellipses in a term),
    so byoc checks the grammar first: comma-separated input terms, an optional ``->`` output term,
    each term letters with at most one ``...``; output letters unique and all from the inputs.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        return f"{len(terms)} input term(s) for {n_inputs} input(s)"
    for term in [*terms, *([rhs] if arrow else [])]:
        if not _EINSUM_TERM.fullmatch(term):
            return f"term {term!r} is not letters with at most one '...'"
    if arrow:
        letters = [c for c in rhs if c.isalpha()]
        if len(set(letters)) != len(letters):
            return f"output term {rhs!r} repeats a letter"
        missing = set(letters) - set(lhs)
        if missing:
            return f"output letter(s) {''.join(sorted(missing))} appear in no input term"
        if "..." in rhs and "..." not in lhs:
            return "the output has '...' and no input does"
    return None


def _check_onnx_traps(node: NodeProto, label: str, scope: str) -> None:
    """What onnx's checker and shape inference cannot be handed (they would never return)."""
    if node.op_type == "Einsum" and node.domain in ("", "ai.onnx"):
        attr = next((a for a in node.attribute if a.name == "equation"), None)
        if attr is None or attr.type != AttributeProto.STRING:
            raise ModelValidationError(f"{label}{scope}: Einsum needs a string attribute 'equation'")
        equation = attr.s.decode("utf-8", "replace")
        why = einsum_problem(equation, sum(1 for _ in node.input))
        if why is not None:
            raise ModelValidationError(f"{label}{scope}: invalid Einsum equation {equation!r}: {why}")


def _check_device_configurations(node: NodeProto, label: str, scope: str) -> None:
    for dc in getattr(node, "device_configurations", ()):
        # multi-device annotations (onnx >= 1.18); byoc ignores them but must be able to write them back
        if not dc.configuration_id or any(not spec.tensor_name for spec in dc.sharding_spec):
            raise ModelValidationError(
                f"{label}{scope}: a device configuration without configuration_id or a sharding spec "
                f"without tensor_name"
            )


def _check_graph_outputs(g: GraphProto, local: set[str], visible, where: str, scope: str) -> set[str]:
    """Graph outputs: named, listed once, produced somewhere; returns those read from outer graphs."""
    free: set[str] = set()
    seen_out: set[str] = set()
    for vi in g.output:
        if vi.name in seen_out:
            raise ModelValidationError(f"graph output {vi.name!r} is listed twice{where}")
        seen_out.add(vi.name)
        if not vi.name:
            raise ModelValidationError(f"a graph output{where} has no name")
        if not visible(vi.name):
            raise ModelValidationError(
                f"graph output {vi.name!r}{scope} is not produced by any node and is neither a graph input "
                f"nor an initializer"
            )
        if vi.name not in local:
            free.add(vi.name)
    return free


#: ``dim_value: -1`` is how some exporters (paddle2onnx, older TensorFlow converters) write a
#: dynamic dimension; onnxruntime reads it as unknown, and so does byoc (the value is cleared)
_DYNAMIC_DIM_VALUE = -1
#: ``dim_param`` spellings exporters write for "unknown" (PaddlePaddle's ``?``, onnx's generated
#: ``unk__N``): each is an independent unknown, never a name two dimensions share
_ANONYMOUS_DIM = re.compile(r"\?+|-1|none|None|unknown|dynamic|unk__\d+|\s*")


def _check_value_info(vi, kind: str, where: str, walk: _Walk | None = None) -> None:
    """Declared shapes: ``-1`` and the anonymous ``dim_param`` spellings (:data:`_ANONYMOUS_DIM`)
    become independent unknown dimensions, as in onnxruntime; any other negative dimension, or
    known dimensions whose product is over the tensor budget, is refused."""
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None or not tt.HasField("shape"):
        return
    known = []
    for d in tt.shape.dim:
        if d.HasField("dim_param") and _ANONYMOUS_DIM.fullmatch(d.dim_param):
            d.ClearField("dim_param")  # an independent unknown
        if not d.HasField("dim_value"):
            continue
        if d.dim_value == _DYNAMIC_DIM_VALUE:
            d.ClearField("dim_value")  # unknown, like a dim with neither value nor param
            continue
        if d.dim_value < 0:
            raise ModelValidationError(
                f"{kind} {vi.name!r}{where}: negative dimension {d.dim_value} in its declared shape; "
                f"dimensions must be >= 0, symbolic, or -1 (unknown)"
            )
        known.append(d.dim_value)
    if walk is None or 0 in known:
        return
    nbytes = math.prod(known) * max(1, _BITS.get(tt.elem_type, 8) // 8)
    if nbytes > walk.budget.max_tensor_bytes:
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        raise ResourceLimitError(
            f"{kind} {vi.name!r}{where}: its declared shape {shape} needs at least {_fmt_bytes(nbytes)}, over the budget max_tensor_bytes="
            f"{_fmt_bytes(walk.budget.max_tensor_bytes)}"
        )


def _check_attribute(attr: AttributeProto, node: NodeProto, label: str, scope: str, walk: _Walk) -> None:
    base = f"attribute {attr.name!r} of {label}{scope}"
    if attr.ref_attr_name:
        raise ModelValidationError(
            f"{base} refers to the function attribute {attr.ref_attr_name!r}, but the node is not inside a "
            f"function body; give the attribute a value"
        )
    # the declared type must match the one value field present (the C++ version converter
    # crashes the process on a mismatch, e.g. type TYPE_PROTO holding ints)
    present = [f for f in _ATTR_SINGULAR if attr.HasField(f)] + [f for f in _ATTR_REPEATED if len(getattr(attr, f))]
    declared = _ATTR_FIELD.get(attr.type)
    if declared is None:
        raise ModelValidationError(
            f"{base}: attribute type {attr.type} is not a valid AttributeProto type (UNDEFINED or unknown)"
        )
    if len(present) > 1 or (present and present[0] != declared):
        raise ModelValidationError(
            f"{base}: declared as {AttributeProto.AttributeType.Name(attr.type)} but holds "
            f"{', '.join(present)}; an attribute holds exactly one value of its declared type"
        )
    if declared in ("t", "g", "sparse_tensor", "tp") and not present:
        raise ModelValidationError(
            f"{base}: declared as {AttributeProto.AttributeType.Name(attr.type)} but holds no value"
        )
    if attr.HasField("t"):
        check_tensor(attr.t, f"tensor {base}", walk)
    for i, t in enumerate(attr.tensors):
        check_tensor(t, f"tensor #{i} of {base}", walk)
    if attr.HasField("sparse_tensor"):
        _check_sparse(attr.sparse_tensor, f"sparse tensor {base}", walk)
    for i, st in enumerate(attr.sparse_tensors):
        _check_sparse(st, f"sparse tensor #{i} of {base}", walk)


def _check_sparse(st: onnx.SparseTensorProto, what: str, walk: _Walk) -> None:
    dims = list(st.dims)
    if any(d < 0 for d in dims):
        raise ModelValidationError(f"{what}: negative dimension in its dense shape {dims}")
    if st.values.data_type in _BITS:
        # the sparse tensor may be densified: budget the dense size
        _check_budget(decoded_nbytes(st.values.data_type, _numel(dims)), dims, st.values.data_type, what, walk,
                      count_total=False)
    check_tensor(st.values, f"values of {what}", walk)
    check_tensor(st.indices, f"indices of {what}", walk)
    if st.indices.data_type != _T.INT64:
        raise ModelValidationError(f"{what}: indices must be INT64, got {dtype_name(st.indices.data_type)}")


def _check_budget(nbytes: int, dims, data_type: int, what: str, walk: _Walk, count_total: bool = True) -> None:
    budget = walk.budget
    if nbytes > budget.max_tensor_bytes:
        raise ResourceLimitError(
            f"{what}: declared shape {list(dims)} of {dtype_name(data_type)} needs {_fmt_bytes(nbytes)}, over the "
            f"budget max_tensor_bytes={_fmt_bytes(budget.max_tensor_bytes)}; raise byoc.Budget(max_tensor_bytes=...) "
            f"if this model is genuine"
        )
    if count_total:
        walk.total_bytes += nbytes
        if walk.total_bytes > budget.max_total_bytes:
            raise ResourceLimitError(
                f"{what}: the model's tensors add up to more than max_total_bytes="
                f"{_fmt_bytes(budget.max_total_bytes)}"
            )


def check_tensor(t: TensorProto, what: str, walk: _Walk) -> None:
    """Check one tensor's declared size against the budget, then its payload against dims/dtype."""
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ModelValidationError(f"{what}: negative dimension in shape {dims}; dimensions must be >= 0")
    dt = t.data_type
    if dt != _T.STRING and dt not in _BITS:
        valid = "FLOAT, INT64, FLOAT16, ... (see onnx.TensorProto.DataType)"
        raise ModelValidationError(f"{what}: element type {dtype_name(dt)} is not a valid tensor type; use {valid}")
    numel = _numel(dims)
    _check_budget(decoded_nbytes(dt, numel), dims, dt, what, walk)  # before looking at any data
    if t.HasField("segment"):
        raise ModelValidationError(f"{what}: segmented tensors are not supported; store the whole tensor")

    present = [f for f in _TYPED_FIELDS if len(getattr(t, f))]
    has_raw = t.HasField("raw_data")
    if t.data_location == _T.EXTERNAL:
        if present or has_raw:
            raise ModelValidationError(f"{what}: declared as external data but also holds data in the model")
        if dt == _T.STRING:
            raise ModelValidationError(f"{what}: STRING tensors cannot be stored as external data")
        return  # read later by byoc.frontend.external, after every check
    if t.data_location != _T.DEFAULT:
        raise ModelValidationError(f"{what}: unknown data_location {t.data_location}; use DEFAULT or EXTERNAL")
    if has_raw:
        present.append("raw_data")
    if len(present) > 1:
        raise ModelValidationError(f"{what}: holds data in several fields ({', '.join(present)}); use exactly one")
    if not present:
        if numel == 0:
            return
        raise ModelValidationError(
            f"{what}: holds no data for its {numel} element(s) of shape {dims}; fill raw_data or the typed field"
        )
    where_ = present[0]
    if where_ == "raw_data":
        if dt == _T.STRING:
            raise ModelValidationError(f"{what}: STRING tensors cannot use raw_data; use string_data")
        expected = raw_nbytes(dt, numel)
        got = len(t.raw_data)
        if got != expected:
            raise ModelValidationError(
                f"{what}: raw_data holds {got} bytes but shape {dims} of {dtype_name(dt)} needs {expected} bytes"
            )
        return
    allowed = _FIELD_OF.get(dt, "int32_data")
    if where_ != allowed:
        raise ModelValidationError(f"{what}: {dtype_name(dt)} values must be stored in {allowed} or raw_data, "
                                   f"not in {where_}")
    if dt in (_T.COMPLEX64, _T.COMPLEX128):
        expected = 2 * numel
    elif dt in _INT32_PER_ENTRY:
        per = _INT32_PER_ENTRY[dt]
        expected = (numel + per - 1) // per
    else:
        expected = numel
    got = len(getattr(t, where_))
    if got != expected:
        raise ModelValidationError(
            f"{what}: {where_} holds {got} value(s) but shape {dims} of {dtype_name(dt)} needs {expected}"
        )


def _sort_in_place(g: GraphProto, deps: list[set[int]], scope: str) -> None:
    """Reorder ``g.node`` topologically (``deps[i]``: nodes that must run before node i)."""
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return  # already in order (the common case)
    n = len(deps)
    users: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i, ds in enumerate(deps):
        indeg[i] = len(ds)
        for d in ds:
            users[d].append(i)
    # Kahn's algorithm, taking the lowest index first so a sorted graph keeps its order
    import heapq

    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != n:
        cycle = _find_cycle(deps, {i for i in range(n) if indeg[i] > 0})
        names = " -> ".join(node_label(g.node[i], i) for i in cycle)
        raise ModelValidationError(
            f"the graph{scope or ''} has a cycle: {names}; ONNX graphs must be acyclic "
            f"(loops belong in a Loop or Scan node)"
        )
    if order != list(range(n)):
        nodes = [g.node[i] for i in order]
        copies = []
        for nd in nodes:
            c = NodeProto()
            c.CopyFrom(nd)
            copies.append(c)
        del g.node[:]
        g.node.extend(copies)


def _find_cycle(deps: list[set[int]], stuck: set[int]) -> list[int]:
    """One cycle among ``stuck`` nodes (every stuck node depends on another stuck node)."""
    start = min(stuck)
    path: list[int] = []
    pos: dict[int, int] = {}
    cur = start
    while cur not in pos:
        pos[cur] = len(path)
        path.append(cur)
        cur = min(d for d in deps[cur] if d in stuck)
    cycle = path[pos[cur]:]
    # report in execution order (producer before consumer), closing the loop
    cycle.reverse()
    return cycle + [cycle[0]]


# --------------------------------------------------------------------------------------------
# operators


def _iter_nodes(g: GraphProto, scope: str = ""):
    """Yield ``(node, label)`` for every node of ``g`` and its subgraphs."""
    for idx, node in enumerate(g.node):
        label = node_label(node, idx)
        yield node, f"{label}{scope}"
        for attr in node.attribute:
            subgraphs = list(attr.graphs)
            if attr.HasField("g"):
                subgraphs.insert(0, attr.g)
            for sub in subgraphs:
                yield from _iter_nodes(sub, f" in subgraph {attr.name!r} of {label}{scope}")


def _known_to_onnx(op_type: str, domain: str) -> bool:
    try:
        return bool(onnx.defs.has(op_type, domain))
    except Exception:
        return False


def check_supported_proto(proto: ModelProto, *, only_if_unknown: bool = False) -> None:
    """Raise one :class:`UnsupportedOperatorError` listing every node that has no byoc kernel.

    With ``only_if_unknown`` the error is raised only when some node uses an operator or domain
    that ONNX itself does not know (so that it is reported as unsupported rather than as a
    checker failure); the error then still lists every node without a kernel.
    """
    from byoc.kernels import is_supported

    bad: list[tuple[str, str, str]] = []
    labels: list[str] = []
    unknown = False
    for node, label in _iter_nodes(proto.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if is_supported(node.op_type, domain):
            continue
        bad.append((node.name or "", domain or "ai.onnx", node.op_type))
        labels.append(label)
        if not _known_to_onnx(node.op_type, domain):
            unknown = True
    if not bad or (only_if_unknown and not unknown):
        return
    _raise_unsupported(bad, labels)


def _raise_unsupported(bad: list[tuple[str, str, str]], labels: list[str]) -> None:
    kinds = []
    for _, domain, op in bad:
        text = f"{domain}::{op}"
        if not _known_to_onnx(op, "" if domain == "ai.onnx" else domain):
            text += " (not an ONNX operator)"
        if text not in kinds:
            kinds.append(text)
    listing = "; ".join(f"{label} [{d}::{op}]" for label, (_, d, op) in zip(labels[:50], bad[:50]))
    more = f"; and {len(bad) - 50} more" if len(bad) > 50 else ""
    contrib = sorted({op for _, d, op in bad if d == "com.microsoft"})
    hint = (f" {', '.join(contrib)} are onnxruntime's own operators, written by its graph optimiser: export the "
            f"model without onnxruntime's optimisation (plain ONNX operators)." if contrib else "")
    raise UnsupportedOperatorError(
        f"{len(bad)} node(s) use operators byoc cannot run: {', '.join(kinds[:30])}. Nodes: {listing}{more}.{hint} "
        f"byoc.kernels.supported_ops() lists the operators byoc runs; a vendor plugin may add others",
        nodes=bad,
    )


def one_element_stand_in(t: onnx.TensorProto) -> None:
    """Turn ``t`` (in place) into a one-element inline tensor of the same type and rank: what
    the ONNX checker sees instead of a stubbed or external weight (it inspects name, type and
    rank only)."""
    rank = len(t.dims)
    t.ClearField("external_data")
    t.data_location = onnx.TensorProto.DEFAULT
    del t.dims[:]
    t.dims.extend([1] * rank)
    t.raw_data = bytes(raw_nbytes(t.data_type, 1))
