"""Lowering: a region body (``onnx_ir.Model``) -> a :class:`Program`, plain JSON data.

The program is everything the emitter (:mod:`byoc_cpu.emit`) needs to write the region's
Python source, and nothing else: steps (GEMMs, fused elementwise loops, fixed kernels) over
flat float32 buffers named by references, plus the packed constants. It is stored in the
artifact, so the runtime can regenerate the source from it and check it is exactly the source
the artifact carries before importing anything (see :mod:`byoc_cpu.runtime`).

Phases, in order:

1. **shapes**: every value of the body gets its static shape (:func:`byoc_cpu.ops.analyze`).
2. **fusion**: nodes are grouped greedily in topological order. A Conv/Gemm/MatMul starts an
   *anchor group*; an elementwise node joins the group of one of its inputs when it iterates
   over the same shape and no node outside the group has read the group's values yet (so the
   group can run as one unit at its last node); otherwise it starts an *elementwise group*.
   A group becomes one GEMM plus one generated loop (its epilogue), or one generated loop.
3. **storage**: Reshape-like nodes are views of their input's buffer; inputs of a Concat along
   a leading axis are written by their producers straight into the Concat's buffer (no copy); a
   Conv -> Add (-> Relu) that the wide blocked kernel stores in place writes over a residual
   that dies there.
4. **steps**: per group/operator, the calls the generated driver makes.
5. **memory plan**: every intermediate buffer gets an offset in one float32 arena, reusing
   memory of buffers that are dead (interval colouring, first fit); region outputs get fresh
   arrays per call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from byoc_cpu.host import blocked
from byoc_cpu.strategy import ConvShape, choose_conv, winograd_side
from byoc_cpu.host.gemm import FULL_WIDTH
from byoc_cpu import ops
from byoc_cpu.options import DEFAULTS
from byoc_cpu.ops import OpInfo, Unsupported
from byoc_cpu.tuning import CONV, THREADS

#: program format version (part of every artifact)
PROGRAM_VERSION = 1
#: arena offsets are multiples of this many float32 elements (64 bytes)
ALIGN = 16
#: im2col matrices are built in blocks of output rows of at most this many elements
COL_BLOCK = CONV["col_block_elements"]

#: work below which a GEMM, or elements below which a loop, runs as one piece: handing a chunk
#: to a pool thread costs ~30 microseconds (its helpers poll outside the GIL,
#: byoc_cpu.host.threads), ~1.5M multiply-adds; ShuffleNet 10% faster than at 8M (A/B)
PAR_MIN_MACS = THREADS["codegen_parallel_min_macs"]
PAR_MIN_ELEMENTS = THREADS["codegen_parallel_min_elements"]
#: an im2col convolution whose row blocks would average fewer output columns than this splits
#: its output channels over the pool instead (one shared patch matrix)
IM2COL_NARROW = CONV["im2col_narrow_columns"]

#: the options the lowering reads (declared, with their defaults, in :mod:`byoc_cpu.options`)
DEFAULT_OPTIONS = {k: v for k, v in DEFAULTS.items() if k in ("fuse", "concat_in_place", "conv_strategy", "threads")}


class LoweringError(Exception):
    """A node the support checks accepted but the lowering cannot handle (a plugin bug)."""


# ---------------------------------------------------------------------------------------------
# buffers and references


@dataclass(eq=False)
class Slot:
    """One buffer: a region input, a packed constant, an output array or an arena block."""

    kind: str  # "in" | "const" | "out" | "arena"
    size: int
    index: int = -1  # input/const/out number; arena offset after planning
    first: int = 1 << 60  # first and last unit that touches it (arena planning)
    last: int = -1

    def touch(self, unit: int) -> None:
        self.first = min(self.first, unit)
        self.last = max(self.last, unit)


@dataclass(frozen=True, eq=False)
class Ref:
    """``slot`` at element ``offset`` (+ ``nstride`` per iteration of an enclosing batch loop)."""

    slot: Slot
    offset: int = 0
    nstride: int = 0

    def at(self, extra: int, nstride: int | None = None) -> "Ref":
        return Ref(self.slot, self.offset + extra, self.nstride if nstride is None else nstride)


@dataclass(eq=False)
class Val:
    name: str
    shape: tuple[int, ...]
    producer: int | None = None  # node index
    const: np.ndarray | None = None
    input_index: int | None = None
    is_output: bool = False
    uses: list[int] = field(default_factory=list)
    # storage: a view of ``parent`` at ``offset`` (aliases, concat pieces), or its own slot
    parent: "Val | None" = None
    offset: int = 0
    slot: Slot | None = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def root(self) -> tuple["Val", int]:
        v, off = self, 0
        while v.parent is not None:
            off += v.offset
            v = v.parent
        return v, off


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def broadcast_strides(shape: tuple[int, ...], target: tuple[int, ...]) -> list[int]:
    """Strides (in elements) to read a contiguous ``shape`` broadcast over ``target``."""
    pad = len(target) - len(shape)
    full = (1,) * pad + tuple(shape)
    cs = contiguous_strides(full)
    return [0 if full[i] == 1 else cs[i] for i in range(len(target))]


def collapse(dims: list[int], stride_sets: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop unit dimensions and merge neighbours every stride list walks contiguously."""
    keep = [i for i, d in enumerate(dims) if d != 1]
    dims = [dims[i] for i in keep]
    stride_sets = [[s[i] for i in keep] for s in stride_sets]
    i = len(dims) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * dims[i + 1] for s in stride_sets):
            dims[i:i + 2] = [dims[i] * dims[i + 1]]
            for s in stride_sets:
                s[i:i + 2] = [s[i + 1]]
        i -= 1
    if not dims:
        return [1], [[0] for _ in stride_sets]
    return dims, stride_sets


# ---------------------------------------------------------------------------------------------
# groups


@dataclass(eq=False)
class Group:
    members: list[int]  # node indices, topological order
    shape: tuple[int, ...]  # the iteration shape (the anchor's output)
    anchor: int | None = None
    read_outside: bool = False  # a node outside already read one of its values
    #: the values its members read from outside it (the fused loop's operands; bounded)
    reads: set[int] = field(default_factory=set)

    @property
    def last(self) -> int:
        return self.members[-1]


@dataclass
class RawEw:
    """A fused loop before serialisation: iteration dims, per-buffer references and strides."""

    dims: list[int]
    refs: list[Ref]  # operands, then outputs
    strides: list[list[int]]
    n_operands: int
    code: list[list[Any]]
    results: list[list[Any]]

    def restrict(self, dim: int, lo: int, hi: int) -> "RawEw":
        """The part of the loop with index ``dim`` in ``[lo, hi)``."""
        refs = [r.at(lo * s[dim]) for r, s in zip(self.refs, self.strides)]
        dims = list(self.dims)
        dims[dim] = hi - lo
        return dataclasses.replace(self, dims=dims, refs=refs, strides=[list(s) for s in self.strides])

    def collapsed(self) -> "RawEw":
        dims, strides = collapse(list(self.dims), [list(s) for s in self.strides])
        return dataclasses.replace(self, dims=dims, strides=strides)

    def step(self) -> dict[str, Any]:
        k = self.n_operands
        return {
            "kind": "ew",
            "dims": list(self.dims),
            "operands": [{"ref": r, "strides": s} for r, s in zip(self.refs[:k], self.strides[:k])],
            "outputs": [{"ref": r, "strides": s} for r, s in zip(self.refs[k:], self.strides[k:])],
            "code": self.code,
            "results": self.results,
        }


def split(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges covering ``range(total)`` in at most ``parts`` near-equal pieces
    (lengths multiples of ``align``, but the last)."""
    parts = max(1, min(parts, -(-total // align)))
    step = -(-total // parts)
    step = -(-step // align) * align
    return [(s, min(total, s + step)) for s in range(0, total, step)]


def _par(chunks: list) -> list[dict[str, Any]]:
    """Steps that run as independent chunks on the pool (a single chunk runs inline)."""
    if not chunks:
        return []
    if isinstance(chunks[0], dict):  # a flat list of independent steps: one chunk each
        chunks = [[st] for st in chunks]
    chunks = [c for c in chunks if c]
    if len(chunks) == 1:
        return chunks[0]
    return [{"kind": "par", "chunks": chunks}]


class Lowering:
    def __init__(self, model: ir.Model, options: dict[str, Any] | None = None):
        self.model = model
        self.graph = model.graph
        self.options = dict(DEFAULT_OPTIONS)
        self.options.update({k: v for k, v in (options or {}).items() if k in DEFAULT_OPTIONS})
        self.opset = self.graph.opset_imports.get("", self.graph.opset_imports.get("ai.onnx", 21))
        self.vals: dict[int, Val] = {}  # id(ir.Value) -> Val
        self.nodes: list[ir.Node] = []
        self.infos: list[OpInfo] = []
        self.consts: list[np.ndarray] = []
        self.const_axes: dict[int, list[int]] = {}  # const index -> axes it is transposed by at load
        self.const_slots: dict[int, Slot] = {}  # id(ndarray) -> slot
        self.slots: list[Slot] = []
        self.weights: list[tuple[Ref, int, int, int]] = []  # GEMM left operands: (ref, m, k, ld)
        self.weight_index: dict[tuple, int] = {}
        self.row_tables: list[list[list[int]]] = []
        self.rows_index: dict[tuple, int] = {}
        threads = self.options["threads"]
        if threads is None:
            from byoc_cpu.host import threads as policy

            threads = policy.num_threads()
        self.nt = max(1, int(threads))
        # pieces a GEMM is cut into for the pool: none where OpenBLAS's own threads split it
        # (BYOC_THREAD_POLICY=blas); pads, loops and pools still use the pool
        from byoc_cpu.host import threads as _policy

        self.gnt = 1 if _policy.blas_gemms() else self.nt

    # -- phase 1: values and shapes ---------------------------------------------------------

    def _val(self, v: ir.Value) -> Val:
        return self.vals[id(v)]

    def analyze(self) -> None:
        g = self.graph
        for i, v in enumerate(g.inputs):
            if v.dtype != ir.DataType.FLOAT:
                raise LoweringError(f"region input {v.name!r} is {v.dtype}, not float32")
            shape = _static(v.shape, v.name)
            self.vals[id(v)] = Val(v.name, shape, input_index=i)
        for v in g.initializers.values():
            arr = v.const_value.numpy()
            self.vals[id(v)] = Val(v.name, tuple(int(d) for d in arr.shape), const=arr)
        self.nodes = _topological(g)

        def shape_of(v):
            if v is None:
                return None
            rec = self.vals.get(id(v))
            return rec.shape if rec is not None else None

        def const_of(v):
            rec = self.vals.get(id(v)) if v is not None else None
            return rec.const if rec is not None else None

        def dtype_of(v):
            if v is None:
                return None
            rec = self.vals.get(id(v))
            if rec is not None and rec.const is not None:
                return ir.DataType.from_numpy(rec.const.dtype)
            return ir.DataType.FLOAT if rec is not None else v.dtype

        for k, node in enumerate(self.nodes):
            try:
                info = ops.analyze(node, shape_of, const_of, self.opset, dtype_of=dtype_of)
            except Unsupported as exc:
                raise LoweringError(f"node {node.name!r}: {exc}") from None
            self.infos.append(info)
            for v in node.inputs:
                if v is not None:
                    if id(v) not in self.vals:
                        raise LoweringError(f"node {node.name!r} reads {v.name!r}, which nothing defines")
                    self._val(v).uses.append(k)
            out = node.outputs[0]
            self.vals[id(out)] = Val(out.name, tuple(info.out_shapes[0]), producer=k)
        for v in g.outputs:
            self._val(v).is_output = True

    # -- phase 2: fusion ----------------------------------------------------------------------

    def fuse(self) -> list[Group | int]:
        """Execution units in order: a :class:`Group` or a single node index."""
        fuse = bool(self.options["fuse"])
        group_of: dict[int, Group] = {}
        units: list[Group | int] = []
        for k, (node, info) in enumerate(zip(self.nodes, self.infos)):
            producers = [self._val(v).producer for v in node.inputs if v is not None]
            groups_read = []
            for p in producers:
                if p is not None and p in group_of and group_of[p] not in groups_read:
                    groups_read.append(group_of[p])
            joined = None
            if info.kind == "ew" and fuse:
                shape = tuple(info.out_shapes[0])
                for grp in sorted(groups_read, key=lambda gr: -gr.last):
                    if grp.shape == shape and not grp.read_outside and self._fits(grp, node):
                        joined = grp
                        break
            for grp in groups_read:
                if grp is not joined:
                    grp.read_outside = True
            if info.kind == "alias":
                # a view: reading through it counts as reading the group (it may not run later)
                units.append(k)
                continue
            if joined is not None:
                joined.reads |= self._reads(joined, node)
                joined.members.append(k)
                group_of[k] = joined
                # the group now runs at k: move it to the end of the unit list
                units.remove(joined)
                units.append(joined)
            elif info.kind in ("anchor", "ew"):
                grp = Group([k], tuple(info.out_shapes[0]), anchor=k if info.kind == "anchor" else None)
                grp.reads = self._reads(grp, node)
                group_of[k] = grp
                units.append(grp)
            else:
                units.append(k)
        # aliases read groups too: a group read through a view must already have run
        return self._order_units(units)

    def _reads(self, grp: Group, node: ir.Node) -> set[int]:
        """The values ``node`` reads from outside ``grp`` (scalar constants are literals, not buffers)."""
        inside = set(grp.members)
        out = set()
        for v in node.inputs:
            if v is None:
                continue
            val = self._val(v)
            if (val.producer is None or val.producer not in inside) and not (val.const is not None and val.size == 1):
                out.add(id(val))
        return out

    def _fits(self, grp: Group, node: ir.Node) -> bool:
        """Whether ``node`` may join ``grp`` within the bounds of one generated loop
        (:data:`byoc_cpu.ops.MAX_FUSED_OPERANDS`, :data:`~byoc_cpu.ops.MAX_FUSED_MEMBERS`)."""
        return len(grp.members) < ops.MAX_FUSED_MEMBERS and \
            len(grp.reads | self._reads(grp, node)) <= ops.MAX_FUSED_OPERANDS

    def _order_units(self, units: list[Group | int]) -> list[Group | int]:
        """Re-check the order: every unit runs after the units producing what it reads."""
        pos: dict[int, int] = {}
        for u, unit in enumerate(units):
            for k in (unit.members if isinstance(unit, Group) else [unit]):
                pos[k] = u
        for u, unit in enumerate(units):
            for k in (unit.members if isinstance(unit, Group) else [unit]):
                for v in self.nodes[k].inputs:
                    p = self._val(v).producer if v is not None else None
                    if p is not None and pos[p] > u:
                        raise LoweringError(f"internal: unit order broken at node {self.nodes[k].name!r}")
        return units

    # -- phase 3: storage -----------------------------------------------------------------------

    def storage(self, units: list[Group | int]) -> None:
        # aliases: views of their input
        for k, node in enumerate(self.nodes):
            if self.infos[k].kind == "alias":
                out, src = self._val(node.outputs[0]), self._val(node.inputs[0])
                out.parent, out.offset = src, 0
        # concat along a leading axis: producers write into the concat's buffer
        if self.options["concat_in_place"]:
            for k in range(len(self.nodes) - 1, -1, -1):
                node, info = self.nodes[k], self.infos[k]
                if node.op_type != "Concat":
                    continue
                out = self._val(node.outputs[0])
                axis = info.params["axis"]
                if int(np.prod(out.shape[:axis], dtype=np.int64)) != 1:
                    continue
                inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
                off, placed = 0, []
                for v in node.inputs:
                    piece = self._val(v)
                    if self._can_place(piece, k) and piece not in placed:
                        piece.parent, piece.offset = out, off
                        placed.append(piece)
                    off += piece.shape[axis] * inner
                info.params["placed"] = [self._val(v) in placed for v in node.inputs]
                # a piece placed twice would be written twice: only the first occurrence is placed
                seen = set()
                for i, v in enumerate(node.inputs):
                    if id(v) in seen:
                        info.params["placed"][i] = False
                    seen.add(id(v))
        self._over_residuals(units)
        # buffers for the values that exist in memory: region inputs, what a unit writes (group
        # outputs, single operators) and what views and concat pieces hang off them
        materialized: set[int] = set()
        for unit in units:
            if isinstance(unit, Group):
                materialized.update(id(v) for v in self.group_outputs(unit))
            elif self.infos[unit].kind != "alias":
                materialized.add(id(self._val(self.nodes[unit].outputs[0])))
        for val in self._all_vals():
            if val.input_index is not None and val.slot is None:
                val.slot = Slot("in", val.size, val.input_index)
            elif id(val) in materialized:
                root, _ = val.root()
                if root.slot is None:
                    if root.const is not None or root.input_index is not None:
                        raise LoweringError(f"internal: {val.name!r} would be written into a constant or input")
                    root.slot = self.new_slot(root.size)
        # region outputs live in arrays of their own (returned to the caller)
        for v in self.graph.outputs:
            root, _ = self._val(v).root()
            if root.slot is not None and root.slot.kind == "arena":
                root.slot.kind = "out"

    def _over_residuals(self, units: list[Group | int]) -> None:
        """A Conv -> Add (-> Relu) group that the wide blocked kernel runs in place, applying the
        Add as it stores its tiles, writes its output over the residual where the residual dies
        there: each element is read just before the same thread overwrites it, so the kernel
        fetches one buffer, not two (the store's lines are the residual's). ResNet-50's 64 -> 256
        at 56x56 with a residual of its own: 1.0 ms; over the residual: 0.7, as without one."""
        pos = {k: u for u, unit in enumerate(units) for k in (unit.members if isinstance(unit, Group) else [unit])}
        for u, grp in enumerate(units):
            if not isinstance(grp, Group) or grp.anchor is None or self.nodes[grp.anchor].op_type != "Conv":
                continue
            res = self._residual_over(grp, u, pos)
            if res is not None:
                out = self._val(self.nodes[grp.last].outputs[0])
                out.parent, out.offset = res, 0
                self.infos[grp.anchor].params["over_residual"] = True

    def _residual_over(self, grp: Group, u: int, pos: dict[int, int]) -> "Val | None":
        """The residual ``grp``'s output may take (:meth:`_over_residuals`), else None."""
        ops_ = [self.nodes[k].op_type for k in grp.members]
        if ops_[1:] not in (["Add"], ["Sum"], ["Add", "Relu"], ["Sum", "Relu"]):
            return None
        conv, add = self.nodes[grp.anchor], self.nodes[grp.members[1]]
        raw, out = self._val(conv.outputs[0]), self._val(self.nodes[grp.last].outputs[0])
        others = [self._val(v) for v in add.inputs if v is not None and self._val(v) is not raw]
        if len(add.inputs) != 2 or len(others) != 1 or raw.uses != [grp.members[1]]:
            return None
        res = others[0]
        if (out.is_output or out.parent is not None or res.shape != out.shape or res.parent is not None
                or res.producer is None or res.const is not None or res.input_index is not None or res.is_output
                or res is self._val(conv.inputs[0])):
            return None
        if any(self.infos[k].kind == "alias" or pos[k] >= u for k in res.uses if k != grp.members[1]):
            return None  # read later, or through a view
        if any(v.parent is res for v in self._all_vals()):
            return None
        p = self.infos[grp.anchor].params
        return res if self.conv_strategy(p) == "blocked" and _blocked_form(p)[3] else None

    def _can_place(self, piece: Val, concat_index: int) -> bool:
        if piece.parent is not None or piece.producer is None or piece.is_output:
            return False
        if self.infos[piece.producer].kind == "alias":
            return False
        # every use but the concat must be a plain read (no second concat placement)
        return all(self.nodes[u].op_type != "Concat" or u == concat_index for u in piece.uses)

    def _all_vals(self) -> list[Val]:
        seen, out = set(), []
        for v in self.vals.values():
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    def new_slot(self, size: int) -> Slot:
        slot = Slot("arena", int(size))
        self.slots.append(slot)
        return slot

    def const_slot(self, arr: np.ndarray) -> Slot:
        key = id(arr)
        if key not in self.const_slots:
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            self.const_slots[key] = Slot("const", int(arr.size), len(self.consts))
            self.consts.append(arr)
        return self.const_slots[key]

    def pack(self, arr: np.ndarray) -> Ref:
        """A new packed constant (``self.consts`` keeps it alive, so its ``id`` stays unique)."""
        return Ref(self.const_slot(np.ascontiguousarray(arr, dtype=np.float32)))

    def pack_transposed(self, arr: np.ndarray, axes: tuple[int, ...]) -> Ref:
        """``arr.transpose(axes)`` (flat), stored as ``arr`` itself and transposed at load: the
        artifact then holds the weights' own bytes, which a bundle keeps once (the region's
        subgraph refers to them)."""
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if list(axes) == list(range(arr.ndim)):
            return self.pack(arr)
        slot = Slot("const", int(arr.size), len(self.consts))
        self.const_slots[id(arr)] = slot
        self.consts.append(arr)
        self.const_axes[slot.index] = [int(a) for a in axes]
        return Ref(slot)

    def ref(self, val: Val) -> Ref:
        root, off = val.root()
        if root.slot is None:
            if root.const is None:
                raise LoweringError(f"internal: value {val.name!r} has no buffer")
            root.slot = self.const_slot(root.const)
        return Ref(root.slot, off)

    # -- phase 4: steps ---------------------------------------------------------------------------

    def lower(self) -> dict[str, Any]:
        self.analyze()
        units = self.fuse()
        self.storage(units)
        steps: list[dict[str, Any]] = []
        for u, unit in enumerate(units):
            self.unit_index = u
            if isinstance(unit, Group):
                new = self.lower_group(unit)
            else:
                new = self.lower_node(unit)
            steps.extend(new)
            self._touch(unit, u)
        return self.finish(steps, len(units))

    def _touch(self, unit: Group | int, u: int) -> None:
        members = unit.members if isinstance(unit, Group) else [unit]
        for k in members:
            node = self.nodes[k]
            for v in list(node.inputs) + list(node.outputs[:1]):
                if v is not None and id(v) in self.vals:
                    slot = self._val(v).root()[0].slot
                    if slot is not None:
                        slot.touch(u)

    # .. elementwise groups and epilogues ..........................................................

    def lower_group(self, grp: Group) -> list[dict[str, Any]]:
        if grp.anchor is not None:
            op = self.nodes[grp.anchor].op_type
            return {"Conv": self.lower_conv, "Gemm": self.lower_gemm, "MatMul": self.lower_matmul}[op](grp)
        return self.ew_par(self.build_ew(grp, grp.shape, None))

    def group_outputs(self, grp: Group) -> list[Val]:
        inside = set(grp.members)
        outs = []
        for k in grp.members:
            val = self._val(self.nodes[k].outputs[0])
            if val.is_output or any(u not in inside for u in val.uses):
                outs.append(val)
        return outs

    def build_ew(self, grp: Group, shape: tuple[int, ...], acc: tuple[Ref, list[int]] | None,
                 logical: tuple[int, ...] | None = None, drop_batch: bool = False,
                 extra: list[tuple[Any, ...]] | None = None) -> "RawEw":
        """The generated loop of ``grp``'s elementwise members over ``shape`` (not yet collapsed).

        ``acc``: the anchor's result as operand 0 (a reference and its strides over ``shape``);
        ``extra``: additions applied to it first: ``("const", array)`` with the array shaped to
        broadcast against ``shape`` (a bias), or ``("val", Val, scale)`` (Gemm's C input).
        ``logical`` is the shape the members' operands broadcast against when it differs from
        ``shape`` (1-D convolutions); with ``drop_batch`` the leading dimension becomes the
        enclosing batch loop (per-image epilogues).
        """
        logical = logical or shape
        operands: list[tuple[Ref, list[int]]] = []
        keys: dict[Any, list[Any]] = {}
        code: list[list[Any]] = []
        temp_of: dict[int, list[Any]] = {}

        def to_iter(strides: list[int]) -> list[int]:
            if len(logical) != len(shape):  # 1-D conv: (N, M, OW) -> (N, M, 1, OW)
                strides = strides[:2] + [0] + strides[2:]
            return strides

        def operand(ref: Ref, strides: list[int], key) -> list[Any]:
            if key not in keys:
                keys[key] = ["x", len(operands)]
                operands.append((ref, strides))
            return keys[key]

        def const_arg(arr: np.ndarray, target: tuple[int, ...], in_iter_space: bool = False) -> list[Any]:
            arr = np.asarray(arr, dtype=np.float32)
            if arr.size == 1:
                return ["l", float(arr.reshape(-1)[0])]
            ref = self.pack(arr)
            strides = broadcast_strides(arr.shape, target)
            return operand(ref, strides if in_iter_space else to_iter(strides), ("const", id(ref.slot)))

        def arg_of(v: ir.Value) -> list[Any]:
            val = self._val(v)
            if val.producer is not None and val.producer in temp_of:
                return temp_of[val.producer]
            if val.const is not None and val.size == 1:
                return ["l", float(np.asarray(val.const, dtype=np.float64).reshape(-1)[0])]
            return operand(self.ref(val), to_iter(broadcast_strides(val.shape, logical)), ("val", id(val)))

        def emit(op: str, args: list[Any], attrs: dict[str, Any] | None = None) -> list[Any]:
            code.append([op, args, attrs or {}])
            return ["t", len(code) - 1]

        if acc is not None:
            cur = operand(acc[0], acc[1], ("acc",))
            for item in extra or []:
                if item[0] == "const":
                    cur = emit("add", [cur, const_arg(item[1], shape, in_iter_space=True)])
                else:
                    val, scale = item[1], item[2]
                    term = operand(self.ref(val), broadcast_strides(val.shape, shape), ("val", id(val)))
                    if scale != 1.0:
                        term = emit("mul", [term, ["l", float(scale)]])
                    cur = emit("add", [cur, term])
            temp_of[grp.anchor] = cur
        for k in grp.members:
            if k == grp.anchor:
                continue
            node, info = self.nodes[k], self.infos[k]
            temp_of[k] = self._ew_code(node, info, arg_of, const_arg, emit, logical)
        outputs, results = [], []
        for val in self.group_outputs(grp):
            ref, strides = self.ref(val), to_iter(contiguous_strides(val.shape))
            res = temp_of[val.producer]
            if res[0] == "x" and operands[res[1]][0] == ref and operands[res[1]][1] == strides:
                continue  # the anchor's own output, already where the GEMM wrote it
            outputs.append((ref, strides))
            results.append(res)
        dims = list(shape)
        strides_all = [list(s) for _, s in operands] + [list(s) for _, s in outputs]
        refs = [r for r, _ in operands] + [r for r, _ in outputs]
        if drop_batch:
            refs = [r.at(0, s[0]) for r, s in zip(refs, strides_all)]
            dims = dims[1:]
            strides_all = [s[1:] for s in strides_all]
        return RawEw(dims, refs, strides_all, len(operands), code, results)

    def ew_step(self, *args, **kwargs) -> dict[str, Any]:
        return self.build_ew(*args, **kwargs).collapsed().step()

    def _ew_code(self, node, info, arg_of, const_arg, emit, logical) -> list[Any]:
        op = node.op_type
        p = info.params
        if op == "BatchNormalization":
            x = arg_of(node.inputs[0])
            c = logical[1]
            cshape = (c,) + (1,) * (len(logical) - 2)
            t = emit("mul", [x, const_arg(p["scale"].reshape(cshape), logical)])
            return emit("add", [t, const_arg(p["shift"].reshape(cshape), logical)])
        if op in ops.UNARY:
            attrs = {}
            if op == "LeakyRelu":
                attrs = {"alpha": p["alpha"]}
            elif op == "HardSigmoid":
                attrs = {"alpha": p["alpha"], "beta": p["beta"]}
            elif op == "Elu":
                attrs = {"alpha": p["alpha"]}
            elif op == "Selu":
                attrs = {"alpha": p["alpha"], "gamma": p["gamma"]}
            elif op == "Clip":
                attrs = {"lo": p["lo"], "hi": p["hi"]}
            name = ops.UNARY[op]
            if op == "Gelu" and p["tanh"]:
                name = "gelu_tanh"
            return emit(name, [arg_of(node.inputs[0])], attrs)
        args = [arg_of(v) for v in node.inputs if v is not None]
        name = ops.BINARY[op]
        cur = args[0]
        if len(args) == 1:
            cur = emit("copy", [cur])
        for a in args[1:]:
            cur = emit(name, [cur, a])
        if op == "Mean" and len(args) > 1:
            cur = emit("div", [cur, ["l", float(len(args))]])
        return cur

    # .. anchors ....................................................................................

    def _anchor_target(self, grp: Group) -> tuple[Val, bool]:
        """Where the GEMM writes: the anchor's own output when others read it, else the group's
        first output (the epilogue then runs in place)."""
        outs = self.group_outputs(grp)
        raw = self._val(self.nodes[grp.anchor].outputs[0])
        if raw in outs:
            return raw, True
        return outs[0], False

    def weight(self, ref: Ref, m: int, k: int, ld: int) -> int:
        """A GEMM left operand the runtime prepares once (packed for the micro-kernel)."""
        key = (id(ref.slot), ref.offset, m, k, ld)
        if key not in self.weight_index:
            self.weight_index[key] = len(self.weights)
            self.weights.append((ref, m, k, ld))
        return self.weight_index[key]

    def lower_conv(self, grp: Group) -> list[dict[str, Any]]:
        node = self.nodes[grp.anchor]
        p = self.infos[grp.anchor].params
        n, c, h, w, m, cg = p["n"], p["c"], p["h"], p["w"], p["m"], p["cg"]
        kh, kw, sh, sw = p["kh"], p["kw"], p["sh"], p["sw"]
        oh, ow, group = p["oh"], p["ow"], p["group"]
        mg = m // group
        wt = np.asarray(p["weight"], dtype=np.float32).reshape(m, cg, kh, kw)
        xref = self.ref(self._val(node.inputs[0]))
        strategy = self.conv_strategy(p)
        target, _ = self._anchor_target(grp)
        tref = self.ref(target)
        logical = tuple(self._val(node.outputs[0]).shape)
        xn, tn = xref.at(0, c * h * w), tref.at(0, m * oh * ow)
        nt = self.nt if m * oh * ow * cg * kh * kw >= PAR_MIN_MACS else 1
        gnt = min(nt, self.gnt)
        extra = []
        if p["bias"] is not None and strategy != "blocked":  # the blocked kernel adds its bias itself
            extra.append(("const", np.asarray(p["bias"], dtype=np.float32).reshape(m, 1, 1)))
        shape4 = (n, m, oh, ow)
        out_strides = [m * oh * ow, oh * ow, ow, 1]

        def epilogue(acc: tuple[Ref, list[int]]) -> RawEw | None:
            if not extra and len(grp.members) == 1 and acc[0] is tn:
                return None
            return self.build_ew(grp, shape4, acc, logical=logical, drop_batch=True, extra=extra)

        def epi(raw: RawEw | None, dim: int, lo: int, hi: int) -> list[dict[str, Any]]:
            return [] if raw is None else [raw.restrict(dim, lo, hi).collapsed().step()]

        pre: list[dict[str, Any]] = []
        chunks: list[list[dict[str, Any]]] = []
        if strategy in ("winograd", "direct"):
            raw = epilogue((tn, out_strides))
            pre, chunks = self._by_channels(strategy, p, xn, tn, self.pack(wt), raw, nt, epi)
        elif strategy == "blocked":
            bias = np.zeros(m, np.float32) if p["bias"] is None else p["bias"]
            pre, chunks = self._blocked(p, xn, tn, out_strides, wt, self.pack(bias), nt, epilogue, epi)
        else:
            if strategy in ("shift", "phase"):
                kdim, wref, ncols, row_width, acc, segments, b_group = self._shifted_input(p, xn, wt, nt, pre)
                c_ref, ldc = acc[0], ncols
            elif strategy == "pointwise":
                kdim = cg
                wref = self.pack(wt.reshape(group, mg, cg))
                src, ldb = xn, h * w
                if sh != 1 or sw != 1:
                    sub = Ref(self.scratch(c * oh * ow))
                    pre.append({"kind": "subsample", "x": xn, "y": sub, "args": [c, h, w, sh, sw, oh, ow]})
                    src, ldb = sub, oh * ow
                ncols, row_width = oh * ow, ow
                segments = [[0, cg, ldb]]
                b_group, acc, c_ref, ldc = (lambda g: src.at(g * cg * ldb)), (tn, out_strides), tn, oh * ow
            else:  # im2col
                kdim = cg * kh * kw
                wref = self.pack(wt.reshape(group, mg, kdim))
                acc, ncols = (tn, out_strides), oh * ow
            raw = epilogue(acc)
            if strategy == "im2col":
                pre, chunks = self._im2col_chunks(xn, wref, p, group, mg, kdim, tn, raw, gnt, epi)
            else:
                rows = self.rows(segments)

                def gemm(g: int, m0: int, m1: int, lo: int, hi: int) -> dict[str, Any]:
                    wi = self.weight(wref.at((g * mg + m0) * kdim), m1 - m0, kdim, kdim)
                    # shift/phase: the epilogue reads the first ow columns of each row_width
                    rowed = [row_width, ow] if row_width > ow else []
                    return {"kind": "wgemm", "w": wi, "b": b_group(g), "c": c_ref.at((g * mg + m0) * ldc),
                            "rows": rows, "args": [ldc, lo, hi, 0] + rowed}

                if group > 1:  # whole groups per chunk
                    for g0, g1 in split(group, 2 * gnt if gnt > 1 else 1, 1):
                        chunks.append([gemm(g, 0, mg, 0, ncols) for g in range(g0, g1)] + epi(raw, 0, g0 * mg, g1 * mg))
                elif gnt > 1 and ncols >= 256 * gnt:  # wide: blocks of output rows
                    for r0, r1 in split(oh, 2 * gnt, 1):
                        chunks.append([gemm(0, 0, m, r0 * row_width, min(ncols, r1 * row_width))] + epi(raw, 1, r0, r1))
                else:  # narrow: blocks of output channels
                    for m0, m1 in split(m, gnt, 8):
                        chunks.append([gemm(0, m0, m1, 0, ncols)] + epi(raw, 0, m0, m1))
        body = (pre if strategy == "winograd" else _par(pre)) + _par(chunks)
        info = {"node": node.name, "strategy": strategy}
        if n == 1:
            for st in body:
                _drop_batch(st)
            steps = body
        else:
            steps = [{"kind": "batch", "count": n, "steps": body}]
        steps[0]["info"] = info
        return steps

    def _by_channels(self, strategy: str, p, xn: Ref, tn: Ref, wref: Ref, raw, nt: int, epi):
        """(pre, chunks) of a convolution computed per output channel block: ``direct`` (each
        chunk its channels, then their epilogue) or ``winograd`` (one core call that splits its
        transforms and GEMMs over the pool itself, then the epilogue in channel blocks; the weights
        stay as they are: the kernel transforms them once per loaded program)."""
        c, h, w, m = p["c"], p["h"], p["w"], p["m"]
        pt, pl, oh, ow = p["pt"], p["pl"], p["oh"], p["ow"]
        blocks = split(m, 2 * nt if nt > 1 else 1, 1)
        if strategy == "winograd":
            pre = [{"kind": "winograd", "x": xn, "w": wref, "y": tn,
                    "args": [c, h, w, m, pt, pl, oh, ow, winograd_side(oh, ow)]}]
            return pre, ([] if raw is None else [epi(raw, 0, m0, m1) for m0, m1 in blocks])
        geo = [c, h, w, m, p["cg"], p["kh"], p["kw"], p["sh"], p["sw"], p["dh"], p["dw"], pt, pl, oh, ow]
        return [], [[{"kind": "conv_direct", "x": xn, "w": wref, "y": tn, "args": geo + [m0, m1]}] + epi(raw, 0, m0, m1)
                    for m0, m1 in blocks]

    def _shifted_input(self, p, xn: Ref, wt: np.ndarray, nt: int, pre: list):
        """The B operand of the shift and phase strategies: one indirect GEMM per group over the
        zero-padded input (stride 1: ``pad``) or over its stride phases (``phase``), K = taps x
        channels, row (tap, c) of B being channel c's (phase) plane at the tap's fixed offset;
        the accumulator has the plane's padded width, cropped by the epilogue. Appends the
        padding steps to ``pre``; returns ``(kdim, wref, ncols, row_width, acc, segments,
        b_group)`` (the accumulator's rows are ``ncols`` apart)."""
        c, h, w, m, cg, group = p["c"], p["h"], p["w"], p["m"], p["cg"], p["group"]
        kh, kw, sh, sw, dh, dw, oh, ow = p["kh"], p["kw"], p["sh"], p["sw"], p["dh"], p["dw"], p["oh"], p["ow"]
        pt, pl = p["pt"], p["pl"]
        hq, wq = oh + ((kh - 1) * dh) // sh, ow + ((kw - 1) * dw) // sw  # stride 1: the padded plane
        ldq = sh * sw * hq * wq + ((kw - 1) * dw) // sw
        wref = self.pack_transposed(wt.reshape(group, m // group, cg, kh * kw), (0, 1, 3, 2))
        xp = Ref(self.scratch(c * ldq))
        for c0, c1 in split(c, nt, 1):
            if sh == 1 and sw == 1:
                pre.append({"kind": "pad", "x": xn.at(c0 * h * w), "y": xp.at(c0 * ldq),
                            "args": [c1 - c0, h, w, ldq, hq, wq, pt, pl]})
            else:
                pre.append({"kind": "phase", "x": xn.at(c0 * h * w), "y": xp.at(c0 * ldq),
                            "args": [c1 - c0, h, w, ldq, sh, sw, pt, pl, hq, wq]})
        ncols = oh * wq
        acc = (Ref(self.scratch(m * ncols)), [0, ncols, wq, 1])
        segments = []
        for t in range(kh * kw):
            a, d = (t // kw) * dh, (t % kw) * dw
            segments.append([((a % sh) * sw + d % sw) * hq * wq + (a // sh) * wq + d // sw, cg, ldq])
        return kh * kw * cg, wref, ncols, wq, acc, segments, (lambda g: xp.at(g * cg * ldq))

    def _blocked(self, p, xn: Ref, tn: Ref, out_strides: list[int], wt: np.ndarray, bref: Ref, nt: int, epilogue,
                 epi):
        """(pre, chunks) of a convolution by the channel-blocked direct kernel
        (:mod:`byoc_cpu.host.blocked`): the input reordered into blocks of 8 channels (in
        parallel by blocks), then output rows (wide outputs) or blocks of 16 or 32 output channels,
        each followed by its epilogue; the kernel adds the bias ``bref``. The wide form
        (``conv16``) writes the output's own rows, and applies a Relu / residual Add epilogue
        itself (:func:`_kernel_epilogue`; any other runs in place, as a GEMM's); the 8-wide form
        writes a planar buffer of the padded width, whose padding columns the epilogue drops, as
        the shift strategy's does. The weights are stored as their own bytes and blocked at load
        (a transpose; a stem's few weights are stored blocked, their channels zero-padded)."""
        c, h, w, m, kh, kw = p["c"], p["h"], p["w"], p["m"], p["kh"], p["kw"]
        pt, pl, oh, sh, sw = p["pt"], p["pl"], p["oh"], p["sh"], p["sw"]
        mbw, hq, wq, in_place = _blocked_form(p)
        plane, cb = blocked.plane_length(hq, wq, kw, sh, sw), -(-c // blocked.CB)  # a stem: one zero-padded block
        kind = "conv16" if mbw == blocked.MB_WIDE else "conv8"
        if c % blocked.CB:  # a stem's few weights, stored blocked with their channels zero-padded
            wref = self.pack(blocked.blocked_weights(wt, mbw))
        else:
            shape, axes = blocked.blocked_weights_axes(m, c, kh, kw, mbw)
            wref = self.pack_transposed(wt.reshape(shape), axes)
        x8 = Ref(self.scratch(cb * plane * blocked.CB))
        pre = [{"kind": "reorder8", "x": xn.at(b0 * blocked.CB * h * w), "y": x8.at(b0 * plane * blocked.CB),
                "args": [min(c, b1 * blocked.CB) - b0 * blocked.CB, h, w, plane, hq, wq, sh, sw, pt, pl]}
               for b0, b1 in split(cb, nt, 1)]
        if in_place:  # the wide form on the output's own rows
            ldr, y_ref = p["ow"], tn
            raw = epilogue((tn, out_strides))
        else:  # rows of the planes' width, cropped by the epilogue
            ldr, y_ref = wq, Ref(self.scratch(m * oh * wq))
            raw = epilogue((y_ref, [0, oh * wq, wq, 1]))
        ep, r_ref = 0, y_ref
        fused = _kernel_epilogue(raw) if y_ref is tn else None
        if p.get("over_residual") and (fused is None or fused[1] is None):
            raise LoweringError("internal: a convolution writes over its residual without the kernel's epilogue")
        if fused is not None:  # the kernel applies it as it stores its tiles: no pass of its own
            ep, r_ref, raw = fused[0], fused[1] or tn, None
        nb = m // mbw

        def conv(mb0: int, mb1: int, r0: int, r1: int) -> dict[str, Any]:
            return {"kind": kind, "x": x8, "w": wref, "b": bref, "r": r_ref, "y": y_ref,
                    "args": [cb, plane, wq, hq, sh, sw, kh, kw, m, oh * ldr, mb0, mb1, r0, r1, ldr, ep]}

        # byoc's own kernel: split over the pool even where OpenBLAS's threads take the GEMMs
        if nt > 1 and oh * wq >= 256 * nt:  # wide: blocks of output rows
            chunks = [[conv(0, nb, r0, r1)] + epi(raw, 1, r0, r1) for r0, r1 in split(oh, 2 * nt, 1)]
        else:  # narrow: blocks of output channels
            chunks = [[conv(b0, b1, 0, oh)] + epi(raw, 0, b0 * mbw, b1 * mbw)
                      for b0, b1 in split(nb, nt, 1)]
        return pre, chunks

    def rows(self, segments: list[list[int]]) -> int:
        """A row table of an indirect GEMM: ``[start, count, stride]`` runs of B's rows."""
        key = tuple(tuple(int(v) for v in seg) for seg in segments)
        if key not in self.rows_index:
            self.rows_index[key] = len(self.row_tables)
            self.row_tables.append([list(seg) for seg in key])
        return self.rows_index[key]

    def _im2col_chunks(self, xn: Ref, wref: Ref, p, group, mg, krows, tn: Ref, raw, nt, epi):
        """(pre, chunks): patch matrices per block of output rows; blocks run in parallel, each with
        its own buffer. A small output (few columns per block: the 7x7 planes of a classifier's last
        stage) instead gets one patch matrix, and the blocks are of output channels, each a GEMM
        over all the columns: 49 columns cut in four ran the GEMMs at half speed."""
        h, w, oh, ow, cg = p["h"], p["w"], p["oh"], p["ow"], p["cg"]
        geo = [p["kh"], p["kw"], p["sh"], p["sw"], p["dh"], p["dw"], p["pt"], p["pl"], ow]
        rows_cap = max(1, COL_BLOCK // max(1, krows * ow))
        parts = max(2 * nt if nt > 1 else 1, -(-oh // rows_cap))
        if group == 1 and nt > 1 and oh <= rows_cap and oh * ow < IM2COL_NARROW * parts and mg >= 8 * nt:
            col = Ref(self.scratch(krows * oh * ow))
            pre = [{"kind": "im2col", "x": xn, "y": col, "args": [cg, h, w] + geo + [0, oh]}]
            rows = self.rows([[0, krows, oh * ow]])
            return pre, [[{"kind": "wgemm", "w": self.weight(wref.at(m0 * krows), m1 - m0, krows, krows), "b": col,
                           "c": tn.at(m0 * oh * ow), "rows": rows, "args": [oh * ow, 0, oh * ow, 0]}]
                         + epi(raw, 0, m0, m1) for m0, m1 in split(mg, nt, 8)]
        chunks = []
        for r0, r1 in split(oh, parts, 1):
            width = (r1 - r0) * ow
            col = Ref(self.scratch(krows * width))
            rows = self.rows([[0, krows, width]])
            steps = []
            for g in range(group):
                wi = self.weight(wref.at(g * mg * krows), mg, krows, krows)
                steps.append({"kind": "im2col", "x": xn.at(g * cg * h * w), "y": col,
                              "args": [cg, h, w] + geo + [r0, r1]})
                steps.append({"kind": "wgemm", "w": wi, "b": col, "c": tn.at(g * mg * oh * ow + r0 * ow),
                              "rows": rows, "args": [oh * ow, 0, width, 0]})
            chunks.append(steps + epi(raw, 1, r0, r1))
        return [], chunks

    def conv_strategy(self, p: dict[str, Any]) -> str:
        """The strategy :func:`byoc_cpu.strategy.choose_conv` gives this convolution (one image)."""
        shape = ConvShape(p["c"], p["m"], p["group"], p["kh"], p["kw"], p["sh"], p["sw"], p["dh"], p["dw"],
                          p["pt"], p["pl"], p["pb"], p["pr"], p["h"], p["w"], p["oh"], p["ow"],
                          own_gemm=FULL_WIDTH, implicit=FULL_WIDTH)
        return choose_conv(shape, "codegen", self.options["conv_strategy"]).strategy

    def scratch(self, size: int) -> Slot:
        slot = self.new_slot(size)
        slot.touch(self.unit_index)
        return slot

    def lower_gemm(self, grp: Group) -> list[dict[str, Any]]:
        node = self.nodes[grp.anchor]
        p = self.infos[grp.anchor].params
        m, n, k, ta, tb = p["m"], p["n"], p["k"], p["ta"], p["tb"]
        a = self.ref(self._val(node.inputs[0]))
        bval = self._val(node.inputs[1])
        b = self.pack(bval.const) if bval.const is not None else self.ref(bval)
        target, _ = self._anchor_target(grp)
        tref = self.ref(target)
        extra: list[tuple[Any, ...]] = []
        if p["c"] is not None:
            cval = self._val(p["c"])
            if cval.const is not None:
                extra.append(("const", np.asarray(cval.const, dtype=np.float64) * p["beta"]))
            else:
                extra.append(("val", cval, p["beta"]))
        raw = None
        if extra or len(grp.members) > 1:
            raw = self.build_ew(grp, (m, n), (tref, [n, 1]), extra=extra)
        return self._gemm_chunks(m, n, k, a, m if ta else k, b, k if tb else n, tref, raw, p["alpha"], ta, tb)

    def _gemm_chunks(self, m, n, k, a: Ref, lda, b: Ref, ldb, c: Ref, raw, alpha=1.0, ta=False, tb=False,
                     rows_of_a: int = 1) -> list[dict[str, Any]]:
        """An OpenBLAS GEMM (+ epilogue over (m, n)) cut into column or row blocks for the pool."""
        nt = self.gnt if m * n * k >= PAR_MIN_MACS else 1
        chunks = []
        if n >= 2 * 16 * nt or nt == 1:
            for j0, j1 in split(n, 2 * nt if nt > 1 else 1, 16):
                bo = j0 * (ldb if tb else 1)
                st = _gemm(m, j1 - j0, k, a, lda, b.at(bo), ldb, c.at(j0), n, alpha=alpha, ta=ta, tb=tb)
                chunks.append([st] + ([] if raw is None else [raw.restrict(1, j0, j1).collapsed().step()]))
        else:
            for i0, i1 in split(m, nt, 8):
                ao = i0 * (1 if ta else lda)
                st = _gemm(i1 - i0, n, k, a.at(ao), lda, b, ldb, c.at(i0 * n), n, alpha=alpha, ta=ta, tb=tb)
                chunks.append([st] + ([] if raw is None else [raw.restrict(0, i0, i1).collapsed().step()]))
        return _par(chunks)

    def lower_matmul(self, grp: Group) -> list[dict[str, Any]]:
        node = self.nodes[grp.anchor]
        p = self.infos[grp.anchor].params
        batch, m, k, n = p["batch"], p["m"], p["k"], p["n"]
        a = self.ref(self._val(node.inputs[0]))
        bval = self._val(node.inputs[1])
        b = self.pack(bval.const) if bval.const is not None else self.ref(bval)
        target, _ = self._anchor_target(grp)
        tref = self.ref(target)
        shape = tuple(self._val(node.outputs[0]).shape)
        if p["b2d"]:
            # (..., M, K) @ (K, N): one GEMM over all leading rows
            steps = self._gemm_chunks(batch * m, n, k, a, k, b, n, tref, None)
        else:
            body = [_gemm(m, n, k, a.at(0, m * k), k, b.at(0, k * n), n, tref.at(0, m * n), n)]
            steps = [{"kind": "batch", "count": batch, "steps": body}]
        if len(grp.members) > 1:
            steps += self.ew_par(self.build_ew(grp, shape, (tref, contiguous_strides(shape))))
        return steps

    def ew_par(self, raw: "RawEw") -> list[dict[str, Any]]:
        """A fused loop, cut along its outer dimension over the pool when it is large."""
        raw = raw.collapsed()
        total = int(np.prod(raw.dims))
        parts = 2 * self.nt if self.nt > 1 and total >= PAR_MIN_ELEMENTS and raw.dims[0] > 1 else 1
        if parts == 1:
            return [raw.step()]
        return _par([[raw.restrict(0, lo, hi).step()] for lo, hi in split(raw.dims[0], parts, 1)])

    # .. single operators ...........................................................................

    def lower_node(self, k: int) -> list[dict[str, Any]]:
        node, info = self.nodes[k], self.infos[k]
        op, p = node.op_type, info.params
        if info.kind == "alias":
            out = self._val(node.outputs[0])
            src_root, _ = out.root()
            if out.is_output and src_root.slot.kind in ("in", "const"):
                # a view of the region's input would be returned as an output: copy it instead
                out.parent = None
                out.slot = self.new_slot(out.size)
                out.slot.kind = "out"
                return [self._copy(self.ref(self._val(node.inputs[0])), self.ref(out), out.size)]
            return []
        x = self._val(node.inputs[0])
        y = self._val(node.outputs[0])
        xr, yr = self.ref(x), self.ref(y)
        if op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"):
            planes = x.shape[0] * x.shape[1]
            plane_in, plane_out = x.size // planes, y.size // planes
            parts = 2 * self.nt if self.nt > 1 and x.size >= PAR_MIN_ELEMENTS else 1
            steps = []
            for c0, c1 in split(planes, parts, 1):
                steps.append(self._pool_step(op, p, x.shape, c1 - c0, xr.at(c0 * plane_in), yr.at(c0 * plane_out)))
            return _par(steps)
        if op in ("Softmax", "LogSoftmax"):
            return [{"kind": "softmax", "x": xr, "y": yr, "args": [p["rows"], p["cols"], int(p["log"])]}]
        if op == "LRN":
            n, c = x.shape[:2]
            hw = x.size // (n * c)
            body = [{"kind": "lrn", "x": xr.at(0, c * hw), "y": yr.at(0, c * hw),
                     "args": [c, hw, p["size"]], "fargs": [p["alpha"], p["beta"], p["bias"]]}]
            if n == 1:
                _drop_batch(body[0])
                return body
            return [{"kind": "batch", "count": n, "steps": body}]
        if op == "Transpose":
            perm = p["perm"]
            cs = contiguous_strides(x.shape)
            dims, (si, so) = collapse(list(y.shape), [[cs[q] for q in perm], contiguous_strides(y.shape)])
            return [{"kind": "ew", "dims": dims, "operands": [{"ref": xr, "strides": si}],
                     "outputs": [{"ref": yr, "strides": so}], "code": [["copy", [["x", 0]], {}]],
                     "results": [["t", 0]]}]
        if op == "Concat":
            axis = p["axis"]
            outer = int(np.prod(y.shape[:axis], dtype=np.int64))
            inner = int(np.prod(y.shape[axis + 1:], dtype=np.int64))
            steps, off = [], 0
            placed = p.get("placed", [False] * len(node.inputs))
            for v, done in zip(node.inputs, placed):
                piece = self._val(v)
                blen = piece.shape[axis] * inner
                if not done:
                    steps.append({"kind": "copy", "x": self.ref(piece), "y": yr.at(off),
                                  "args": [blen, y.shape[axis] * inner, outer, blen]})
                off += blen
            return steps
        raise LoweringError(f"internal: no lowering for {op}")

    def _pool_step(self, op: str, p: dict[str, Any], shape, planes: int, xr: Ref, yr: Ref) -> dict[str, Any]:
        h, w = shape[2], shape[3] if len(shape) > 3 else 1
        if op == "MaxPool":
            args = [planes, h, w, p["kh"], p["kw"], p["sh"], p["sw"], p["dh"], p["dw"], p["pt"], p["pl"],
                    p["oh"], p["ow"]]
            return {"kind": "maxpool", "x": xr, "y": yr, "args": args}
        if op == "AveragePool":
            args = [planes, h, w, p["kh"], p["kw"], p["sh"], p["sw"], p["pt"], p["pl"], p["oh"], p["ow"],
                    p["pt"] + h + p["pb"], p["pl"] + w + p["pr"], int(p["include_pad"])]
            return {"kind": "avgpool", "x": xr, "y": yr, "args": args}
        cols = int(np.prod(shape[2:], dtype=np.int64))
        return {"kind": "gpool", "x": xr, "y": yr, "args": [planes, cols, int(op == "GlobalMaxPool")]}

    def _copy(self, src: Ref, dst: Ref, size: int) -> dict[str, Any]:
        return {"kind": "copy", "x": src, "y": dst, "args": [size, size, 1, size]}

    # -- phase 5: memory plan and serialisation ----------------------------------------------------

    def finish(self, steps: list[dict[str, Any]], n_units: int) -> dict[str, Any]:
        # scratch and arena buffers: interval colouring, first fit, larger buffers first
        arena = [s for s in self.slots if s.kind == "arena"]
        for s in arena:
            if s.last < 0:
                s.first = s.last = 0
        placed: list[Slot] = []
        total = 0
        for s in sorted(arena, key=lambda s: (-s.size, s.first, s.last)):
            size = _align(s.size)
            busy = sorted((q.index, q.index + _align(q.size)) for q in placed
                          if not (q.last < s.first or s.last < q.first))
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, hi)
            s.index = off
            total = max(total, off + size)
            placed.append(s)
        outs = [s for s in self.slots if s.kind == "out"]
        for i, s in enumerate(outs):
            s.index = i
        # region outputs: a view of an output buffer
        outputs = []
        for v in self.graph.outputs:
            val = self._val(v)
            root, off = val.root()
            if root.slot.kind != "out":
                raise LoweringError(f"internal: output {v.name!r} is not in an output buffer")
            outputs.append({"name": v.name, "shape": list(val.shape), "buf": root.slot.index, "offset": off})
        inputs = [{"name": v.name, "shape": list(self._val(v).shape)} for v in self.graph.inputs]
        program = {
            "version": PROGRAM_VERSION,
            "inputs": inputs,
            "outputs": outputs,
            "out_sizes": [s.size for s in outs],
            "consts": [{"shape": list(a.shape), "size": int(a.size),
                        **({"axes": self.const_axes[i]} if i in self.const_axes else {})}
                       for i, a in enumerate(self.consts)],
            "arena": total,
            "weights": [{"ref": _ref_json(r), "m": m, "k": k, "ld": ld} for r, m, k, ld in self.weights],
            "rows": self.row_tables,
            "steps": [_serialise(st) for st in steps],
        }
        return program


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _gemm(m, n, k, a: Ref, lda, b: Ref, ldb, c: Ref, ldc, beta=0.0, alpha=1.0, ta=False, tb=False):
    return {"kind": "gemm", "a": a, "b": b, "c": c, "args": [m, n, k, lda, ldb, ldc],
            "fargs": [float(alpha), float(beta)], "trans": [int(ta), int(tb)]}


def _blocked_form(p: dict[str, Any]) -> tuple[int, int, int, bool]:
    """``(mb, hq, wq, in_place)`` of a convolution the blocked kernel runs: its block of output
    channels (the form), its (phase) planes' height and width (stride 1: the padded plane;
    strided: its stride-phase planes, as :func:`byoc_cpu.host.blocked.reorder8` writes them), and
    whether the wide form writes the output's own rows in place."""
    geo = (p["c"], p["m"], p["group"], p["kh"], p["kw"], p["sh"], p["sw"], p["dh"], p["dw"])
    mbw = blocked.preferred(*geo, p["oh"], p["ow"]) or blocked.block_for(p["m"])  # forced: the form that applies
    hq, wq = blocked.phase_extent(p["oh"], p["kh"], p["sh"]), blocked.phase_extent(p["ow"], p["kw"], p["sw"])
    return mbw, hq, wq, mbw == blocked.MB_WIDE and blocked.own_rows(p["ow"], wq)


def _kernel_epilogue(raw: RawEw | None) -> tuple[int, Ref | None] | None:
    """``(ep, residual)`` where a convolution's epilogue ``raw`` (over its output, in place) is one
    the blocked kernels apply as they store (:func:`byoc_cpu.host.blocked.conv16`): Relu (ep 1), an
    Add of a tensor laid out as the output (2, the residual's reference), or that Add then Relu
    (3); ``None`` for anything else (the epilogue then runs as its own loop)."""
    if raw is None or len(raw.refs) != raw.n_operands + 1 or raw.n_operands > 2:
        return None
    acc, out = raw.refs[0], raw.refs[-1]
    if (acc.slot is not out.slot or acc.offset != out.offset or any(s != raw.strides[0] for s in raw.strides)
            or any(attrs for _, _, attrs in raw.code) or raw.results != [["t", len(raw.code) - 1]]):
        return None
    ops = [(op, [tuple(a) for a in args]) for op, args, _ in raw.code]
    x0, x1 = ("x", 0), ("x", 1)
    add = ("add", [x0, x1]) in ops[:1] or ("add", [x1, x0]) in ops[:1]
    relu = ops[-1:] == [("relu", [("t", len(ops) - 2) if add else x0])]
    if raw.n_operands == 2 and add and len(ops) == 1 + relu:
        return 2 + relu, raw.refs[1]
    if raw.n_operands == 1 and relu and len(ops) == 1:
        return 1, None
    return None


def _drop_batch(step: dict[str, Any]) -> None:
    """Outside a batch loop (one image) the per-iteration strides are irrelevant."""
    for key, val in list(step.items()):
        if isinstance(val, Ref):
            step[key] = val.at(0, 0)
    for group in ("operands", "outputs"):
        for o in step.get(group, []):
            o["ref"] = o["ref"].at(0, 0)
    for chunk in step.get("chunks", []):
        for st in chunk:
            _drop_batch(st)


def _ref_json(ref: Ref) -> list[Any]:
    slot = ref.slot
    if slot.kind == "arena":
        return ["arena", 0, slot.index + ref.offset, ref.nstride]
    return [slot.kind, slot.index, ref.offset, ref.nstride]


def _serialise(step: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(step):
        val = step[key]
        if isinstance(val, Ref):
            out[key] = _ref_json(val)
        elif key == "steps":
            out[key] = [_serialise(s) for s in val]
        elif key == "chunks":
            out[key] = [[_serialise(s) for s in chunk] for chunk in val]
        elif key in ("operands", "outputs"):
            out[key] = [{"ref": _ref_json(o["ref"]), "strides": [int(s) for s in o["strides"]]} for o in val]
        elif key == "info":
            out[key] = dict(val)
        else:
            out[key] = val
    return out


def _static(shape, name: str) -> tuple[int, ...]:
    if shape is None or any(not isinstance(d, int) for d in shape):
        raise LoweringError(f"value {name!r} has no static shape")
    return tuple(int(d) for d in shape)


def _topological(graph: ir.Graph) -> list[ir.Node]:
    nodes = list(graph)
    index = {id(n): i for i, n in enumerate(nodes)}
    indeg = [0] * len(nodes)
    succ: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        preds = set()
        for v in node.inputs:
            p = v.producer() if v is not None else None
            if p is not None and id(p) in index:
                preds.add(index[id(p)])
        indeg[i] = len(preds)
        for q in preds:
            succ[q].append(i)
    ready = [i for i in range(len(nodes)) if indeg[i] == 0]
    order = []
    import heapq

    heapq.heapify(ready)
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise LoweringError("the region body has a cycle")
    return order


def lower(model: ir.Model, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Lower a region body: ``(program, constants)``."""
    low = Lowering(model, options)
    program = low.lower()
    return program, low.consts


__all__ = ["Lowering", "LoweringError", "PROGRAM_VERSION", "lower"]
