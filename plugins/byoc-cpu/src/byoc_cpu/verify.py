"""Check a program before any code is generated from it.

The runtime regenerates a region's source from the program stored in its artifact, so only
source this plugin writes is ever imported. But the kernels run without bounds checks, so the
*numbers* in a program read from a bundle are checked too: every field has the right type,
every instruction and kernel is one the emitter knows, and every memory access of every step
(GEMM operands with their leading dimensions, strided loops, fixed kernels, batch loops) stays
inside its buffer; region inputs and constants are never written. The code generator runs the
same check on what it produced, so a lowering bug fails at compile time, not as a wrong result.
"""

from __future__ import annotations

import math
from typing import Any

from byoc_cpu.host.blocked import CB, MB, MB_WIDE, tile_pixels

from byoc_cpu.emit import FIXED, INSTRUCTIONS
from byoc_cpu.lower import PROGRAM_VERSION

_BIG = 1 << 48
_KINDS = ("in", "const", "out", "arena")
_WRITABLE = ("out", "arena")
_ATTRS = {"alpha", "beta", "gamma", "lo", "hi"}
_FIXED_SHAPE = {  # kind -> (ints, floats); must agree with emit.FIXED
    "pad": (8, 0), "phase": (10, 0), "im2col": (14, 0), "subsample": (7, 0), "conv_direct": (17, 0), "maxpool": (13, 0),
    "avgpool": (14, 0), "gpool": (3, 0), "softmax": (3, 0), "lrn": (3, 3), "copy": (4, 0), "winograd": (9, 0),
    "reorder8": (10, 0), "conv8": (16, 0), "conv16": (16, 0),
}


for _kind, (_fn, _layout) in FIXED.items():
    assert sum(t for t in _layout if isinstance(t, int)) == _FIXED_SHAPE[_kind][0], _kind


class ProgramError(ValueError):
    """The program is malformed or would touch memory outside its buffers."""


def _fail(where: str, message: str) -> ProgramError:
    return ProgramError(f"{where}: {message}")


def _int(v: Any, where: str, lo: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < _BIG:
        raise _fail(where, f"expected an integer >= {lo}, got {v!r}")
    return v


def _flt(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(where, f"expected a number, got {v!r}")
    return float(v)


def _list(v: Any, where: str, n: int | None = None) -> list:
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise _fail(where, f"expected a list{'' if n is None else f' of {n}'}, got {type(v).__name__}")
    return v


def _dict(v: Any, where: str, keys: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(v, dict):
        raise _fail(where, f"expected an object, got {type(v).__name__}")
    missing, extra = keys - set(v), set(v) - keys - optional
    if missing or extra:
        raise _fail(where, f"keys {sorted(v)}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    return v


def _shape(v: Any, where: str) -> int:
    size = 1
    for d in _list(v, where):
        size *= _int(d, where, 1)
    if size >= _BIG:
        raise _fail(where, "tensor too large")
    return size


class _Checker:
    def __init__(self, program: dict[str, Any]):
        p = _dict(program, "program", {"version", "region", "inputs", "outputs", "out_sizes", "consts", "arena",
                                       "steps", "weights", "rows"})
        if p["version"] != PROGRAM_VERSION:
            raise _fail("program", f"version {p['version']!r}, this plugin reads version {PROGRAM_VERSION}")
        if not isinstance(p["region"], str):
            raise _fail("program.region", "expected a string")
        self.sizes: dict[str, list[int]] = {"in": [], "const": [], "out": [], "arena": [_int(p["arena"], "arena")]}
        for i, x in enumerate(_list(p["inputs"], "inputs")):
            _dict(x, f"inputs[{i}]", {"name", "shape"})
            if not isinstance(x["name"], str):
                raise _fail(f"inputs[{i}].name", "expected a string")
            self.sizes["in"].append(_shape(x["shape"], f"inputs[{i}].shape"))
        for i, c in enumerate(_list(p["consts"], "consts")):
            _dict(c, f"consts[{i}]", {"shape", "size"}, {"axes"})
            if _shape(c["shape"], f"consts[{i}].shape") != _int(c["size"], f"consts[{i}].size"):
                raise _fail(f"consts[{i}]", "size does not match the shape")
            if "axes" in c and (not isinstance(c["axes"], list) or any(type(a) is not int for a in c["axes"])
                                or sorted(c["axes"]) != list(range(len(c["shape"])))):
                raise _fail(f"consts[{i}].axes", "expected a permutation of the shape's axes")
            self.sizes["const"].append(c["size"])
        self.sizes["out"] = [_int(s, "out_sizes", 1) for s in _list(p["out_sizes"], "out_sizes")]
        for i, o in enumerate(_list(p["outputs"], "outputs")):
            where = f"outputs[{i}]"
            _dict(o, where, {"name", "shape", "buf", "offset"})
            if not isinstance(o["name"], str):
                raise _fail(f"{where}.name", "expected a string")
            size = _shape(o["shape"], f"{where}.shape")
            buf = _int(o["buf"], f"{where}.buf")
            if buf >= len(self.sizes["out"]) or _int(o["offset"], f"{where}.offset") + size > self.sizes["out"][buf]:
                raise _fail(where, "outside its output buffer")
        self.program = p
        self.weights = []
        for i, wt in enumerate(_list(p["weights"], "weights")):
            where = f"weights[{i}]"
            _dict(wt, where, {"ref", "m", "k", "ld"})
            m, k, ld = _int(wt["m"], where, 1), _int(wt["k"], where, 1), _int(wt["ld"], where, 1)
            if ld < k:
                raise _fail(where, "leading dimension < k")
            if wt["ref"][0:1] != ["const"] or wt["ref"][3:4] != [0]:
                raise _fail(where, "a weight is a block of a constant")
            self.ref(wt["ref"], f"{where}.ref", (m - 1) * ld + k, 1, False)
            self.weights.append((m, k))
        self.rows = []
        for i, segs in enumerate(_list(p["rows"], "rows")):
            where = f"rows[{i}]"
            total, reach = 0, 0
            for seg in _list(segs, where):
                start, count, stride = (_int(x, where) for x in _list(seg, where, 3))
                if count < 1:
                    raise _fail(where, "empty run")
                total += count
                reach = max(reach, start + (count - 1) * stride)
            if total == 0:
                raise _fail(where, "no rows")
            self.rows.append((total, reach))

    def ref(self, ref: Any, where: str, extent: int, count: int, write: bool) -> None:
        _list(ref, where, 4)
        kind = ref[0]
        if kind not in _KINDS:
            raise _fail(where, f"unknown buffer kind {kind!r}")
        if write and kind not in _WRITABLE:
            raise _fail(where, f"writes into a read-only {kind!r} buffer")
        index = _int(ref[1], where)
        if index >= len(self.sizes[kind]):
            raise _fail(where, f"no {kind} buffer #{index}")
        off, nstride = _int(ref[2], where), _int(ref[3], where)
        if extent <= 0:
            raise _fail(where, "empty access")
        end = off + (count - 1) * nstride + extent
        if end > self.sizes[kind][index]:
            raise _fail(where, f"reaches element {end} of a {kind} buffer of {self.sizes[kind][index]}")

    def arg(self, a: Any, where: str, n_operands: int, n_temps: int) -> None:
        _list(a, where, 2)
        if a[0] == "x":
            if _int(a[1], where) >= n_operands:
                raise _fail(where, "no such operand")
        elif a[0] == "t":
            if _int(a[1], where) >= n_temps:
                raise _fail(where, "temporary used before it is defined")
        elif a[0] == "l":
            _flt(a[1], where)
        else:
            raise _fail(where, f"bad argument kind {a[0]!r}")

    def step(self, st: Any, where: str, count: int, nested: str) -> None:
        if not isinstance(st, dict) or "kind" not in st:
            raise _fail(where, "a step must be an object with a kind")
        kind = st["kind"]
        info = st.get("info")
        if info is not None and (not isinstance(info, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in info.items())):
            raise _fail(f"{where}.info", "expected an object of strings")
        if kind == "batch":
            if nested:
                raise _fail(where, "batch loops do not nest")
            _dict(st, where, {"kind", "count", "steps"}, {"info"})
            n = _int(st["count"], f"{where}.count", 1)
            for i, sub in enumerate(_list(st["steps"], f"{where}.steps")):
                self.step(sub, f"{where}.steps[{i}]", n, "batch")
            return
        if kind == "par":
            if nested == "par":
                raise _fail(where, "parallel chunks do not nest")
            _dict(st, where, {"kind", "chunks"}, {"info"})
            for i, chunk in enumerate(_list(st["chunks"], f"{where}.chunks")):
                for j, sub in enumerate(_list(chunk, f"{where}.chunks[{i}]")):
                    if isinstance(sub, dict) and sub.get("kind") in ("batch", "par"):
                        raise _fail(f"{where}.chunks[{i}][{j}]", "chunks hold plain steps")
                    self.step(sub, f"{where}.chunks[{i}][{j}]", count, "par")
            return
        if kind == "ew":
            self.ew(st, where, count)
        elif kind == "gemm":
            self.gemm(st, where, count)
        elif kind == "wgemm":
            self.wgemm(st, where, count)
        elif kind in FIXED:
            self.fixed(st, where, count)
        else:
            raise _fail(where, f"unknown step kind {kind!r}")

    def ew(self, st: dict, where: str, count: int) -> None:
        _dict(st, where, {"kind", "dims", "operands", "outputs", "code", "results"}, {"info"})
        dims = [_int(d, f"{where}.dims", 1) for d in _list(st["dims"], f"{where}.dims")]
        if not 1 <= len(dims) <= 8:
            raise _fail(f"{where}.dims", "1 to 8 dimensions")
        for group, write in (("operands", False), ("outputs", True)):
            for i, o in enumerate(_list(st[group], f"{where}.{group}")):
                w = f"{where}.{group}[{i}]"
                _dict(o, w, {"ref", "strides"})
                strides = [_int(s, f"{w}.strides") for s in _list(o["strides"], f"{w}.strides", len(dims))]
                extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
                self.ref(o["ref"], f"{w}.ref", extent, count, write)
        n_ops = len(st["operands"])
        for t, ins in enumerate(_list(st["code"], f"{where}.code")):
            w = f"{where}.code[{t}]"
            _list(ins, w, 3)
            op, args, attrs = ins
            if op not in INSTRUCTIONS:
                raise _fail(w, f"unknown instruction {op!r}")
            if len(_list(args, w)) != INSTRUCTIONS[op][0]:
                raise _fail(w, f"{op} takes {INSTRUCTIONS[op][0]} arguments")
            for a in args:
                self.arg(a, w, n_ops, t)
            if not isinstance(attrs, dict) or set(attrs) - _ATTRS:
                raise _fail(w, "bad attributes")
            for key, v in attrs.items():
                if v is not None:
                    _flt(v, f"{w}.{key}")
                elif key not in ("lo", "hi"):
                    raise _fail(w, f"attribute {key} must be a number")
            needed = {"leaky": {"alpha"}, "hsig": {"alpha", "beta"}, "elu": {"alpha"}, "selu": {"alpha", "gamma"}}
            if not needed.get(op, set()) <= set(attrs):
                raise _fail(w, f"{op} needs attributes {sorted(needed[op])}")
        results = _list(st["results"], f"{where}.results", len(st["outputs"]))
        for i, a in enumerate(results):
            self.arg(a, f"{where}.results[{i}]", n_ops, len(st["code"]))

    def gemm(self, st: dict, where: str, count: int) -> None:
        _dict(st, where, {"kind", "a", "b", "c", "args", "fargs", "trans"}, {"info"})
        m, n, k, lda, ldb, ldc = (_int(v, f"{where}.args", 1) for v in _list(st["args"], f"{where}.args", 6))
        for v in _list(st["fargs"], f"{where}.fargs", 2):
            if not math.isfinite(_flt(v, f"{where}.fargs")):
                raise _fail(f"{where}.fargs", "alpha and beta must be finite")
        ta, tb = (_int(v, f"{where}.trans") for v in _list(st["trans"], f"{where}.trans", 2))
        if ta > 1 or tb > 1:
            raise _fail(f"{where}.trans", "flags are 0 or 1")
        a_rows, a_cols = (k, m) if ta else (m, k)
        b_rows, b_cols = (n, k) if tb else (k, n)
        for name, rows, cols, ld, write in (("a", a_rows, a_cols, lda, False), ("b", b_rows, b_cols, ldb, False),
                                            ("c", m, n, ldc, True)):
            if ld < cols:
                raise _fail(f"{where}.{name}", f"leading dimension {ld} < {cols} columns")
            self.ref(st[name], f"{where}.{name}", (rows - 1) * ld + cols, count, write)

    def wgemm(self, st: dict, where: str, count: int) -> None:
        _dict(st, where, {"kind", "w", "b", "c", "rows", "args"}, {"info"})
        wi, ri = _int(st["w"], f"{where}.w"), _int(st["rows"], f"{where}.rows")
        if wi >= len(self.weights) or ri >= len(self.rows):
            raise _fail(where, "no such weight or row table")
        m, k = self.weights[wi]
        total, reach = self.rows[ri]
        if total != k:
            raise _fail(where, f"the row table has {total} rows, the weight {k} columns")
        args = st["args"]
        n_args = 6 if isinstance(args, list) and len(args) == 6 else 4  # + period, valid (shifted convolutions)
        ldc, lo, hi, acc, *rowed = (_int(v, f"{where}.args") for v in _list(args, f"{where}.args", n_args))
        if not lo < hi <= ldc or acc > 1:
            raise _fail(f"{where}.args", "bad column range or flag")
        if rowed and not 1 <= rowed[1] <= rowed[0]:
            raise _fail(f"{where}.args", "bad column period or count")
        self.ref(st["b"], f"{where}.b", reach + hi, count, False)
        self.ref(st["c"], f"{where}.c", (m - 1) * ldc + hi, count, True)

    def fixed(self, st: dict, where: str, count: int) -> None:
        kind = st["kind"]
        n_int, n_float = _FIXED_SHAPE[kind]
        keys = ({"kind", "x", "y", "args"} | ({"fargs"} if n_float else set()) | ({"w"} if kind in _WEIGHTED else set())
                | ({"b", "r"} if kind in _BLOCKS else set()))
        _dict(st, where, keys, {"info"})
        a = [_int(v, f"{where}.args") for v in _list(st["args"], f"{where}.args", n_int)]
        for v in st.get("fargs", []) if n_float else []:
            _flt(v, f"{where}.fargs")
        if n_float:
            _list(st["fargs"], f"{where}.fargs", n_float)
        x_ext, y_ext = _FIXED_EXTENTS[kind](a, where)
        self.ref(st["x"], f"{where}.x", x_ext, count, False)
        self.ref(st["y"], f"{where}.y", y_ext, count, True)
        if kind == "conv_direct" and not a[15] < a[16] <= a[3]:
            raise _fail(f"{where}.args", "bad output channel range")
        if kind in _BLOCKS and not (a[10] < a[11] <= -(-a[8] // _BLOCKS[kind]) and 0 <= a[12] < a[13]):
            raise _fail(f"{where}.args", "bad output channel block or row range")
        if kind in _BLOCKS:  # the bias of every channel of the blocks; the residual laid out as the output
            self.ref(st["b"], f"{where}.b", -(-a[8] // _BLOCKS[kind]) * _BLOCKS[kind], 1, False)
            self.ref(st["r"], f"{where}.r", y_ext, count, False)
        if kind in _WEIGHTED:
            self.ref(st["w"], f"{where}.w", _WEIGHTED[kind](a), 1, False)
            if st["w"][2] != 0 or st["w"][3] != 0:
                raise _fail(f"{where}.w", "the weight is passed without an offset")

    def run(self) -> None:
        for i, st in enumerate(_list(self.program["steps"], "steps")):
            self.step(st, f"steps[{i}]", 1, "")


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise _fail(where, what)


def _pad(a, w):
    c, h, wd, ldp, hp, wp, pt, pl = a
    _need(c >= 1 and h >= 1 and wd >= 1 and hp >= pt + h and wp >= pl + wd and ldp >= hp * wp, w, "bad padding")
    return c * h * wd, c * ldp


def _phase(a, w):
    c, h, wd, ldq, sh, sw, pt, pl, hq, wq = a
    _need(min(c, h, wd, sh, sw, hq, wq) >= 1 and min(pt, pl) >= 0 and ldq >= sh * sw * hq * wq, w, "bad phase planes")
    return c * h * wd, c * ldq


def _im2col(a, w):
    c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1 = a
    _need(min(c, h, wd, kh, kw, sh, sw, dh, dw, ow) >= 1 and r1 > r0, w, "bad geometry")
    return c * h * wd, c * kh * kw * (r1 - r0) * ow


def _subsample(a, w):
    c, h, wd, sh, sw, oh, ow = a
    _need(min(a) >= 1 and (oh - 1) * sh < h and (ow - 1) * sw < wd, w, "bad geometry")
    return c * h * wd, c * oh * ow


def _direct(a, w):
    c, h, wd, m, cg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, m0, m1 = a
    _need(min(c, h, wd, m, cg, kh, kw, sh, sw, dh, dw, oh, ow) >= 1 and c % cg == 0 and m % (c // cg) == 0, w,
          "bad geometry")
    return c * h * wd, m * oh * ow


def _maxpool(a, w):
    c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = a
    _need(min(c, h, wd, kh, kw, sh, sw, dh, dw, oh, ow) >= 1, w, "bad geometry")
    return c * h * wd, c * oh * ow


def _avgpool(a, w):
    c, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, hpe, wpe, inc = a
    _need(min(c, h, wd, kh, kw, sh, sw, oh, ow) >= 1 and inc <= 1, w, "bad geometry")
    return c * h * wd, c * oh * ow


def _gpool(a, w):
    rows, cols, is_max = a
    _need(rows >= 1 and cols >= 1 and is_max <= 1, w, "bad geometry")
    return rows * cols, rows


def _softmax(a, w):
    rows, cols, log = a
    _need(rows >= 1 and cols >= 1 and log <= 1, w, "bad geometry")
    return rows * cols, rows * cols


def _lrn(a, w):
    c, hw, size = a
    _need(min(a) >= 1, w, "bad geometry")
    return c * hw, c * hw


def _copy(a, w):
    s_stride, d_stride, nblocks, blen = a
    _need(nblocks >= 1 and blen >= 1, w, "bad geometry")
    return (nblocks - 1) * s_stride + blen, (nblocks - 1) * d_stride + blen


def _winograd(a, w):
    c, h, wd, m, pt, pl, oh, ow, mt = a
    # the kernel pads into (oh rounded up to mt) + 2 rows: the input must fit there
    _need(min(c, h, wd, m, oh, ow) >= 1 and mt in (2, 4) and pt <= 2 and pl <= 2
          and h + pt - 2 <= oh <= h + pt and wd + pl - 2 <= ow <= wd + pl, w, "bad geometry")
    return c * h * wd, m * oh * ow


def _reorder8(a, w):
    c, h, wd, plane, hq, wq, sh, sw, pt, pl = a
    _need(min(c, h, wd, hq, wq, sh, sw) >= 1 and plane >= sh * sw * hq * wq, w, "bad planes")
    # stride 1 writes the input's rows at their padded place (strided: only inside the phases)
    _need(sh * sw > 1 or (hq >= pt + h and wq >= pl + wd), w, "bad padding")
    return c * h * wd, -(-c // CB) * plane * CB


#: the blocked kernels: kind -> output channels per weight block
_BLOCKS = {"conv8": MB, "conv16": MB_WIDE}


def _blocked_extents(mb):
    def extents(a, w):
        cb, plane, wq, hq, sh, sw, kh, kw, m, ldc, mb0, mb1, r0, r1, ow, ep = a
        _need(min(cb, plane, wq, hq, sh, sw, kh, kw, m, ow) >= 1 and ow <= wq and ldc >= r1 * ow, w, "bad geometry")
        _need(0 <= ep <= 3, w, "bad epilogue")
        # the farthest tap: the last phase a tap reads, then its row and column offsets; the
        # last tile starts before the last position and reads every tap up to mr - 1 past its
        # start (the plane's slack). Rows of the planes' width run as one run of positions.
        mr = tile_pixels(mb)
        last = (min(sh, kh) - 1) * sw + min(sw, kw) - 1
        reach = last * hq * wq + (kh - 1) // sh * wq + (kw - 1) // sw
        end = r0 * wq + -(-(r1 - r0) * wq // mr) * mr if ow == wq else (r1 - 1) * wq + -(-ow // mr) * mr
        _need((kw - 1) // sw < wq and reach + end <= plane, w, "bad geometry")
        return cb * plane * CB, (min(m, mb1 * mb) - 1) * ldc + r1 * ow

    return extents


#: fixed kinds that take a constant weight array (``w``): kind -> elements it reads
_WEIGHTED = {
    "conv_direct": lambda a: a[3] * a[4] * a[5] * a[6],  # m * cg * kh * kw
    "winograd": lambda a: a[3] * a[0] * 9,  # m * c * 3 * 3
    # blocks of m * cb * kh * kw * 8 * (16 or 32)
    **{kind: (lambda a, mb=mb: -(-a[8] // mb) * a[0] * a[6] * a[7] * CB * mb) for kind, mb in _BLOCKS.items()},
}

_FIXED_EXTENTS = {
    "pad": _pad, "phase": _phase, "im2col": _im2col, "subsample": _subsample, "conv_direct": _direct, "maxpool": _maxpool,
    "avgpool": _avgpool, "gpool": _gpool, "softmax": _softmax, "lrn": _lrn, "copy": _copy, "winograd": _winograd,
    "reorder8": _reorder8, **{kind: _blocked_extents(mb) for kind, mb in _BLOCKS.items()},
}


def verify(program: Any) -> None:
    """Raise :class:`ProgramError` unless ``program`` is well-formed and stays inside its buffers."""
    _Checker(program).run()


__all__ = ["ProgramError", "verify"]
