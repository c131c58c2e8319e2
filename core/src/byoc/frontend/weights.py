"""A weight-less view of a model for the ONNX checker and version converter.

Both are C++ code that take a serialised model: handing them a model with its weights costs a
serialisation (``SerializeToString``/``ByteSize``) and a parse of every byte per call, although
neither looks at weight values. byoc therefore gives them a *skeleton*: a copy of the model's
structure in which every big floating-point initializer of the main graph is replaced by a
stub that keeps its name, element type, dims and doc string, and holds no data. The original
payloads stay where they are (the caller's proto is never copied or modified) and are attached
to the ``onnx_ir`` model at the end, as read-only NumPy views over the bytes read once from
the proto or the external data file.

What is stubbed, and what is not:

* main-graph initializers of type FLOAT, FLOAT16 or DOUBLE whose data is at least
  :data:`STUB_MIN_BYTES` bytes and whose payload matches their dims (a tensor with a bad
  payload stays real, so the usual checks report it exactly as before);
* everything else stays real: integer tensors and small float tensors (the converter's
  adapters read shapes, scales, axes, pads and BatchNorm attributes from those), tensors in
  subgraphs and node attributes, sparse tensors, tensors with metadata.

A stub has two forms. For the converter and byoc's own structural checks it is an external
data reference to :data:`STUB_LOCATION` with the real dims (the converter keeps it as it is,
and the checks budget its declared size). The ONNX checker insists that external files exist
and that inline data fills the dims, so while it runs (:meth:`Weights.checker_view`) every
stub is a one-element tensor of the same rank instead: the checker looks at names, types and
ranks, never at values. After the conversion, :meth:`Weights.converted_intact` makes sure
the converter left every stub as it was; if not, the loader converts the full model instead.

The model's ``ir_version`` is never changed: with IR version 3 the initializers stay listed
as graph inputs, as the format requires.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx import ModelProto, TensorProto, numpy_helper

from byoc.frontend import validate

#: initializers smaller than this many bytes stay in the model the checker and converter see
STUB_MIN_BYTES = 1024

#: the external-data location every stub points to (never a real file: nothing ever reads it)
STUB_LOCATION = "<byoc: weight held outside the proto>"

_T = TensorProto
#: element types that are stubbed: their numpy dtype (little-endian, as ONNX stores raw data)
_STUB_DTYPES = {_T.FLOAT: np.dtype("<f4"), _T.FLOAT16: np.dtype("<f2"), _T.DOUBLE: np.dtype("<f8")}
#: the typed field that may hold the values of each stubbed type instead of raw_data
_TYPED = {_T.FLOAT: "float_data", _T.FLOAT16: "int32_data", _T.DOUBLE: "double_data"}
_OTHER_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


@dataclass
class _Weight:
    name: str
    data_type: int
    dims: tuple[int, ...]
    doc_string: str
    raw: bytes | None  # little-endian payload, or None when ``typed`` or ``arr`` holds the values
    typed: TensorProto | None  # the original tensor (values in a typed field), read-only
    arr: np.ndarray | None = None  # the values of an ``onnx_ir`` tensor (a private read-only copy)

    def array(self) -> np.ndarray:
        if self.arr is not None:
            return self.arr
        if self.raw is not None:
            return np.frombuffer(self.raw, dtype=_STUB_DTYPES[self.data_type]).reshape(self.dims)
        return numpy_helper.to_array(self.typed)


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def stub_worthy(t: TensorProto, min_bytes: int) -> bool:
    """Whether ``t``'s data may be held outside the skeleton (type, size, plain payload; no data read)."""
    if t.data_type not in _STUB_DTYPES or t.data_location != _T.DEFAULT or t.HasField("segment"):
        return False
    if len(t.metadata_props) or any(d < 0 for d in t.dims):
        return False
    if type(t.name) is not str or type(t.doc_string) is not str:  # invalid UTF-8: copied, then reported
        return False
    return validate.raw_nbytes(t.data_type, _numel(t.dims)) >= min_bytes


def holdable(t: TensorProto, what: str, min_bytes: int, held: Weights) -> bool:
    """Whether the external tensor ``t`` (a main-graph initializer when ``what`` says so) is kept as a stub."""
    if what != f"initializer {t.name!r}" or t.name in held:
        return False
    if t.data_type not in _STUB_DTYPES or len(t.metadata_props):
        return False
    return validate.raw_nbytes(t.data_type, _numel(t.dims)) >= min_bytes


def _make_stub(stub: TensorProto, name: str, data_type: int, dims, doc_string: str) -> None:
    stub.Clear()
    stub.name = name
    stub.data_type = data_type
    stub.dims.extend(dims)
    if doc_string:
        stub.doc_string = doc_string
    _to_reference(stub)


def _to_reference(stub: TensorProto) -> None:
    stub.data_location = _T.EXTERNAL
    entry = stub.external_data.add()
    entry.key, entry.value = "location", STUB_LOCATION


def is_stub(t: TensorProto) -> bool:
    return (t.data_location == _T.EXTERNAL and len(t.external_data) == 1
            and t.external_data[0].key == "location" and t.external_data[0].value == STUB_LOCATION)


class Weights:
    """The payloads held outside a skeleton, by initializer name."""

    def __init__(self) -> None:
        self._items: dict[str, _Weight] = {}
        self._stubs: list[TensorProto] = []  # the stub messages inside the skeleton

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def is_held_stub(self, t: TensorProto, what: str) -> bool:
        """Whether ``t`` (named ``what`` by :func:`validate.iter_tensors`) is one of this skeleton's stubs."""
        return what == f"initializer {t.name!r}" and t.name in self._items and is_stub(t)

    def take(self, source: TensorProto, stub: TensorProto, min_bytes: int) -> bool:
        """Make ``stub`` (a message in the skeleton) a stub of ``source`` if worth it; else copy ``source``.

        Returns whether it was stubbed. The payload is read once (one copy of the bytes); a
        tensor whose payload does not fill its dims exactly is copied, to be reported by the
        structural checks.
        """
        if not stub_worthy(source, min_bytes) or source.name in self._items:
            stub.CopyFrom(source)
            return False
        nbytes = validate.raw_nbytes(source.data_type, _numel(source.dims))
        typed = _TYPED[source.data_type]
        others = [f for f in _OTHER_FIELDS if f != typed and len(getattr(source, f))]
        raw, keep = None, None
        if source.HasField("raw_data"):
            raw = source.raw_data
            ok = len(raw) == nbytes and not others and not len(getattr(source, typed))
        else:
            keep = source
            ok = len(getattr(source, typed)) == _numel(source.dims) and not others
        if not ok:
            stub.CopyFrom(source)
            return False
        self._items[source.name] = _Weight(source.name, source.data_type, tuple(source.dims), source.doc_string,
                                           raw, keep)
        _make_stub(stub, source.name, source.data_type, source.dims, source.doc_string)
        self._stubs.append(stub)
        return True

    def take_bytes(self, tensor: TensorProto, data: bytes) -> None:
        """Hold ``data`` (read from an external file) for ``tensor``, which becomes a stub in place."""
        self._items[tensor.name] = _Weight(tensor.name, tensor.data_type, tuple(tensor.dims), tensor.doc_string,
                                           data, None)
        _make_stub(tensor, tensor.name, tensor.data_type, list(tensor.dims), tensor.doc_string)
        self._stubs.append(tensor)

    @contextlib.contextmanager
    def checker_view(self):
        """Turn every stub into a one-element inline tensor of the same rank while the ONNX checker runs."""
        for t in self._stubs:
            validate.one_element_stand_in(t)
        try:
            yield
        finally:
            for t in self._stubs:
                w = self._items[t.name]
                t.ClearField("raw_data")
                del t.dims[:]
                t.dims.extend(w.dims)
                _to_reference(t)

    def converted_intact(self, converted: ModelProto) -> bool:
        """Whether the converter left every stub of ``converted`` as it was (else the stubs cannot be trusted).

        Every stub must still be a main-graph initializer with the name, type and dims it had;
        a stub that moved into a node attribute or a subgraph, was renamed, reshaped or given
        data means an adapter worked on weight values, so the caller converts the full model.
        """
        seen: set[str] = set()
        for t in converted.graph.initializer:
            if not is_stub(t):
                if t.name in self._items:  # real data under a stub's name: computed from a stub
                    return False
                continue
            w = self._items.get(t.name)
            if w is None or t.name in seen or t.data_type != w.data_type or tuple(t.dims) != w.dims:
                return False
            if t.HasField("raw_data") or any(len(getattr(t, f)) for f in _OTHER_FIELDS):
                return False
            seen.add(t.name)
        nested = [*_nested_tensors(converted.graph)]
        for info in converted.training_info:
            nested += [t for g in (info.initialization, info.algorithm) for t, _ in validate.iter_tensors(g)]
        return not any(is_stub(t) for t in nested)

    def adopt(self, proto: ModelProto, held: dict[str, _Weight]) -> None:
        """Take ``held`` (weights already kept out of ``proto``, a skeleton) with their stubs in ``proto``."""
        for t in proto.graph.initializer:
            w = held.get(t.name)
            if w is not None and t.name not in self._items:
                _make_stub(t, w.name, w.data_type, w.dims, w.doc_string)
                self._items[t.name] = w
                self._stubs.append(t)

    def materialise(self, proto: ModelProto) -> None:
        """Put the payloads back into the stubs of ``proto`` (a skeleton or its converted copy)."""
        for t in proto.graph.initializer:
            if is_stub(t) and t.name in self._items:
                w = self._items[t.name]
                t.ClearField("external_data")
                t.ClearField("data_location")
                if w.raw is not None:
                    t.raw_data = w.raw
                elif w.arr is not None:
                    t.raw_data = w.arr.astype(_STUB_DTYPES[w.data_type], copy=False).tobytes()
                else:
                    t.CopyFrom(w.typed)
        self._stubs = []
        self._items = {}

    def attach(self, model: ir.Model) -> None:
        """Give every stubbed initializer of ``model`` its payload (a read-only view, no copy)."""
        inits = model.graph.initializers
        for name, w in self._items.items():
            value = inits.get(name)
            if value is None:  # the converter removed it
                continue
            value.const_value = ir.Tensor(w.array(), name=name, doc_string=w.doc_string or None)
        for value in inits.values():  # (converted_intact makes sure no stub is left anywhere else)
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and tensor.location == STUB_LOCATION:
                raise ValueError(f"initializer {value.name!r} is a weight stub without data")


_IR_STUB_TYPES = {ir.DataType.FLOAT: _T.FLOAT, ir.DataType.FLOAT16: _T.FLOAT16, ir.DataType.DOUBLE: _T.DOUBLE}


@contextlib.contextmanager
def ir_held_out(model: ir.Model, min_bytes: int):
    """While serialising ``model``: its big in-memory float initializers of the main graph are
    external references (no bytes serialised); yields those weights by name, each a private
    read-only copy. The caller's model is as it was afterwards."""
    held: dict[str, _Weight] = {}
    swapped: list[tuple[ir.Value, object]] = []
    try:
        for value in model.graph.initializers.values():
            tensor = value.const_value
            data_type = _IR_STUB_TYPES.get(getattr(tensor, "dtype", None))
            if (data_type is None or isinstance(tensor, ir.ExternalTensor) or tensor.metadata_props
                    or validate.raw_nbytes(data_type, _numel(tensor.shape.numpy())) < min_bytes):
                continue
            arr = np.array(tensor.numpy(), dtype=_STUB_DTYPES[data_type].newbyteorder("="), copy=True)
            arr.flags.writeable = False
            name = value.name or ""
            held[name] = _Weight(name, data_type, tuple(arr.shape), tensor.doc_string or "", None, None, arr)
            swapped.append((value, tensor))
            value.const_value = ir.ExternalTensor(STUB_LOCATION, None, None, tensor.dtype, shape=tensor.shape,
                                                  name=name, doc_string=tensor.doc_string)
        yield held
    finally:
        for value, tensor in swapped:
            value.const_value = tensor


def _nested_tensors(g):
    """Every tensor of ``g`` but its own initializers: sparse values, attributes, subgraphs."""
    for st in g.sparse_initializer:
        yield st.values
    for node in g.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from (t for t, _ in validate.iter_tensors(sub))


def _copy_fields(src, dst, skip: str) -> None:
    """Copy every set field of ``src`` but ``skip`` into ``dst`` (protobuf messages of one type)."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def skeleton(proto: ModelProto, min_bytes: int = STUB_MIN_BYTES) -> tuple[ModelProto, Weights]:
    """A new model with ``proto``'s structure and stubs for its big float initializers; ``proto`` is not modified.

    Everything but those payloads is copied (nodes, attributes, small and non-float tensors),
    so the skeleton can be checked, sorted and converted on its own.
    """
    skel = ModelProto()
    _copy_fields(proto, skel, skip="graph")
    if proto.HasField("graph"):
        graph = proto.graph
        _copy_fields(graph, skel.graph, skip="initializer")
        weights = Weights()
        for t in graph.initializer:
            weights.take(t, skel.graph.initializer.add(), min_bytes)
        return skel, weights
    return skel, Weights()
