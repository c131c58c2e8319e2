"""Weights stored once: a region's kept subgraph refers to bytes of its own artifact.

A region's artifact usually holds the region's weights already (a plugin copies them into its
constants, as raw little-endian arrays); keeping the subgraph for the host fallback would store
them a second time. When saving, every initializer of the subgraph (top-level graph, at least
:data:`MIN_SHARED_BYTES`) whose exact bytes occur in the artifact, at a 4-byte aligned offset,
is written without data, as a reference::

    data_location = EXTERNAL
    external_data = {"location": "byoc:artifact", "offset": "<bytes>", "length": "<bytes>"}

When reading, every reference is checked before any other check runs; the loader then attaches
plain numeric tensors as read-only NumPy views over the member's bytes (:func:`view_of`: no copy
of the weights for a host fallback that may never run) and puts other types' bytes back
(:func:`resolve`). Only that exact
location is accepted, the range must lie inside the region's artifact member (whose SHA-256 the
manifest has already verified) and match the tensor's dims and type: a reference never reaches
a file, and anything else that claims external data is still refused.
"""

from __future__ import annotations

import hashlib
import math
import sys

import numpy as np
import onnx

#: the ``location`` of a tensor whose bytes are in the region's artifact member
LOCATION = "byoc:artifact"
#: the ``location`` of a tensor whose bytes are in the bundle's weight pool (``weights.bin``: a
#: model with per-shape specialisations stores each weight of its graphs there, once)
POOL = "byoc:weights"
_LOCATIONS = (LOCATION, POOL)
#: smaller initializers are stored inline (the reference would not pay for itself)
MIN_SHARED_BYTES = 4096


def _raw(t: onnx.TensorProto) -> bytes | None:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if t.HasField("raw_data"):
        return t.raw_data
    return None


#: unaligned occurrences :func:`_find_aligned` looks past before it gives up (the tensor is then
#: stored inline: sharing saves space, it is never needed)
MAX_UNALIGNED_HITS = 64


def _find_aligned(artifact: bytes, raw: bytes) -> int:
    """The first 4-byte aligned offset of ``raw`` in ``artifact``, or -1. ``bytes.find`` is a
    linear-time substring search; comparing ``raw`` at every position whose first word matched
    was quadratic for low-entropy weights (a constant tensor matches almost everywhere: saving
    the onnx wheel's light Inception v2 ran for over 20 minutes)."""
    pos = artifact.find(raw)
    for _ in range(MAX_UNALIGNED_HITS):
        if pos < 0 or pos % 4 == 0:
            return pos
        pos = artifact.find(raw, pos + 1)
    return -1


def share(graph: onnx.GraphProto, artifact: bytes) -> int:
    """Replace, in place, each initializer of ``graph`` whose bytes occur in ``artifact`` (at a
    4-byte aligned offset) by a reference; returns the number of bytes no longer stored twice."""
    saved = 0
    for t in graph.initializer:
        raw = _raw(t)
        if raw is None or len(raw) < MIN_SHARED_BYTES or len(raw) % 4:
            continue
        off = _find_aligned(artifact, raw)
        if off >= 0:
            _refer(t, LOCATION, off, len(raw))
            saved += len(raw)
    return saved


class Pool:
    """The bytes of ``weights.bin``: each distinct weight once, 4-byte aligned."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._at: dict[bytes, int] = {}

    def add(self, raw: bytes) -> int:
        key = hashlib.sha256(raw).digest()
        if key not in self._at:
            self.data += bytes(-len(self.data) % 4)
            self._at[key] = len(self.data)
            self.data += raw
        return self._at[key]


def share_pool(graph: onnx.GraphProto, pool: Pool) -> int:
    """Replace, in place, each initializer of ``graph`` (at least :data:`MIN_SHARED_BYTES`, not
    already a reference) by a reference to its bytes in ``pool``; returns the bytes moved."""
    moved = 0
    for t in graph.initializer:
        raw = _raw(t)
        if raw is None or len(raw) < MIN_SHARED_BYTES:
            continue
        _refer(t, POOL, pool.add(raw), len(raw))
        moved += len(raw)
    return moved


def _refer(t: onnx.TensorProto, location: str, off: int, length: int) -> None:
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", str(off)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def _names_used(graph: onnx.GraphProto, out: set[str], depth: int = 0) -> None:
    if depth > 64:
        return
    for node in graph.node:
        out.update(node.input)
        for attr in node.attribute:
            subs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
            for sub in subs:
                _names_used(sub, out, depth + 1)
    out.update(o.name for o in graph.output)
    out.update(i.name for i in graph.input)  # an initializer that is also an input stays


def prune_unused(graph: onnx.GraphProto) -> int:
    """Drop, in place, the top-level initializers that no node (subgraphs included) and no graph
    output reads: the host graph keeps the names of weights a region took over; returns the
    number of bytes dropped."""
    used: set[str] = set()
    _names_used(graph, used)
    dropped, gone = 0, set()
    for i in reversed(range(len(graph.initializer))):
        if graph.initializer[i].name not in used:
            dropped += graph.initializer[i].ByteSize()
            gone.add(graph.initializer[i].name)
            del graph.initializer[i]
    for i in reversed(range(len(graph.value_info))):
        if graph.value_info[i].name in gone:
            del graph.value_info[i]
    return dropped


def detach(graph: onnx.GraphProto, artifact: bytes | None, fail, budget=None,
           spent: list[int] | None = None, pool: bytes | None = None,
           views: bool = False) -> list[tuple[int, onnx.TensorProto]]:
    """Check every reference to ``artifact`` (as :func:`resolve`) and swap each referring
    initializer for a one-element stand-in of its type; returns what :func:`attach` puts back.
    The structural checks then run on a proto without the weights (they would copy them; the
    weights' size is already bounded by the artifact member's, which the reader budgeted).

    With ``views``, a reference of a plain numeric type is not copied: its entry holds the
    reference itself (no bytes), and :func:`view_of` gives a read-only NumPy view over the
    ``artifact``/``pool`` bytes for it (the loader attaches those to the IR, so a region's
    kept subgraph costs no copy of its weights)."""
    held = []
    for i, t in enumerate(graph.initializer):
        if t.data_location != onnx.TensorProto.EXTERNAL or \
                {e.key: e.value for e in t.external_data}.get("location") not in _LOCATIONS:
            continue
        real = onnx.TensorProto()
        real.CopyFrom(t)
        stand_in = graph.initializer[i]
        stand_in.Clear()
        stand_in.name, stand_in.data_type = real.name, real.data_type
        stand_in.dims.append(1)
        stand_in.raw_data = bytes(_itemsize(real, fail))
        held.append((i, real))
    # the bytes are only read once every reference is known to be sound
    resolve_all = onnx.GraphProto()
    resolve_all.initializer.extend(r for _, r in held)
    resolve(resolve_all, artifact, fail, budget, spent, pool, copy=lambda t: not (views and _viewable(t)))
    return [(i, t) for (i, _), t in zip(held, resolve_all.initializer)]


#: element types whose raw bytes a NumPy view reads as they are (little-endian, as ONNX stores them)
_VIEW_DTYPES = {
    onnx.TensorProto.FLOAT: "<f4", onnx.TensorProto.DOUBLE: "<f8", onnx.TensorProto.FLOAT16: "<f2",
    onnx.TensorProto.INT8: "i1", onnx.TensorProto.UINT8: "u1", onnx.TensorProto.INT16: "<i2",
    onnx.TensorProto.UINT16: "<u2", onnx.TensorProto.INT32: "<i4", onnx.TensorProto.UINT32: "<u4",
    onnx.TensorProto.INT64: "<i8", onnx.TensorProto.UINT64: "<u8",
}


def _viewable(t: onnx.TensorProto) -> bool:
    return sys.byteorder == "little" and t.data_type in _VIEW_DTYPES


def view_of(t: onnx.TensorProto, artifact: bytes | None, pool: bytes | None) -> np.ndarray | None:
    """The read-only array a reference kept by ``detach(..., views=True)`` stands for (``None``
    for a tensor that holds its own bytes). Only valid after ``detach`` checked ``t``."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {e.key: e.value for e in t.external_data}
    blob = artifact if info["location"] == LOCATION else pool
    dtype = np.dtype(_VIEW_DTYPES[t.data_type])
    length = int(info["length"])
    arr = np.frombuffer(blob, dtype=dtype, count=length // dtype.itemsize, offset=int(info["offset"]))
    arr = arr.reshape(tuple(t.dims))
    arr.flags.writeable = False
    return arr


def attach(graph: onnx.GraphProto, held: list[tuple[int, onnx.TensorProto]]) -> None:
    """Undo :func:`detach`: the real initializers, with their bytes, back in their places."""
    real = {t.name: t for _, t in held}  # by name: the checks may have reordered the graph
    for t in graph.initializer:
        if t.name in real:
            t.CopyFrom(real.pop(t.name))


def _itemsize(t: onnx.TensorProto, fail) -> int:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        raise fail(f"initializer {t.name!r}: data type {t.data_type} cannot refer to artifact bytes") from None


def _check_amplification(graph: onnx.GraphProto, fail, budget, spent: list[int] | None) -> None:
    """Many references may name the same bytes: what they would copy is counted against the
    budget (each tensor, and every reference of the load together in ``spent``) before any is."""
    total = 0
    for t in graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        if info.get("location") not in _LOCATIONS:
            continue
        try:
            length = int(info.get("length", "0"))
        except ValueError:
            continue  # malformed: resolve says so
        if budget is not None and length > budget.max_tensor_bytes:
            raise fail(f"initializer {t.name!r}: {length} bytes referred to, over the budget's "
                       f"max_tensor_bytes={budget.max_tensor_bytes}")
        total += max(length, 0)
    if spent is not None:
        spent[0] += total
        total = spent[0]
    if budget is not None and total > budget.max_total_bytes:
        raise fail(f"references to artifact bytes would copy {total} bytes, over the budget's "
                   f"max_total_bytes={budget.max_total_bytes}")


def resolve(graph: onnx.GraphProto, artifact: bytes | None, fail, budget=None, spent: list[int] | None = None,
            pool: bytes | None = None, copy=None) -> None:
    """Put back, in place, the bytes of every top-level initializer that refers to ``artifact``
    (or to ``pool``, the bundle's ``weights.bin``). ``fail(message)`` returns the exception to
    raise for a malformed reference; ``budget`` bounds the bytes copied (``spent``: a running
    total over several graphs). ``copy(tensor)`` false leaves that (checked) reference as it is."""
    _check_amplification(graph, fail, budget, spent)
    for t in graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location")
        if location not in _LOCATIONS:
            continue  # a real external file: refused by the caller's external-data check
        blob = artifact if location == LOCATION else pool
        if blob is None or set(info) != {"location", "offset", "length"}:
            raise fail(f"initializer {t.name!r}: a reference to {location} bytes where none are allowed")
        try:
            off, length = int(info["offset"]), int(info["length"])
        except ValueError:
            raise fail(f"initializer {t.name!r}: malformed artifact reference {info!r}") from None
        if off < 0 or length < 0 or off + length > len(blob):
            whose = "the artifact's" if location == LOCATION else "the weight pool's"
            raise fail(f"initializer {t.name!r}: range [{off}, {off + length}) is outside {whose} "
                       f"{len(blob)} bytes")
        itemsize = _itemsize(t, fail)
        if any(d < 0 for d in t.dims) or math.prod(int(d) for d in t.dims) * itemsize != length:
            raise fail(f"initializer {t.name!r}: {length} bytes do not hold dims {list(t.dims)}")
        if copy is not None and not copy(t):
            continue
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        t.raw_data = bytes(blob[off:off + length])


__all__ = ["LOCATION", "MIN_SHARED_BYTES", "POOL", "Pool", "attach", "detach", "prune_unused", "resolve", "share",
           "share_pool", "view_of"]
