"""The DPU program: what the code generator writes and the integer engines execute.

A program is a list of instructions over named int8 tensors, plus the integer constants they
use (int8 weights, int32 biases, int64 requantisation multipliers, int32 shifts and index
maps). It is serialised without pickle, deterministically::

    b"BYOCDPU\\0"                     8 bytes, magic
    uint32 little-endian             version (1)
    uint32 little-endian             length H of the header
    H bytes                          the header: JSON, ASCII, sorted keys, no whitespace
    padding to a multiple of 8
    arrays                           raw little-endian C-order bytes, each starting at a multiple of 8

The header holds ``inputs``/``outputs`` (region value name, tensor, shape, scale),
``tensors`` (name -> shape, scale, fix_pos), ``instructions`` (each a JSON object with ``op``
and its fields; array-valued fields name an entry of ``arrays``) and ``arrays`` (name -> dtype,
shape, offset, nbytes). :func:`loads` checks every offset, size, dtype and reference before
anything runs, and raises :class:`ProgramError` naming what is wrong.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAGIC = b"BYOCDPU\x00"
VERSION = 1
FORMAT = "vitis-dpu-program"
_DTYPES = {"int8": np.dtype("<i1"), "int32": np.dtype("<i4"), "int64": np.dtype("<i8")}
#: instruction opcodes and the fields that name arrays
OPCODES = {
    "conv": ("w", "b", "M", "S"),
    "deconv": ("w", "b", "M", "S"),
    "fc": ("w", "b", "M", "S"),
    "maxpool": (),
    "avgpool": ("M", "S"),
    "eltwise": ("M",),
    "mul": (),
    "concat": ("M", "S"),
    "act": (),
    "hsigmoid": (),
    "hswish": (),
    "reshape": (),
    "resize": ("map_h", "map_w"),
    "const": ("data",),
}
#: activation codes of fused instructions
ACT_NONE, ACT_RELU, ACT_RELU6, ACT_LEAKY = 0, 1, 2, 3
ACT_NAMES = {"none": ACT_NONE, "relu": ACT_RELU, "relu6": ACT_RELU6, "leaky": ACT_LEAKY}
#: the DPU's LeakyRelu slope, 26/256
LEAKY_NUM, LEAKY_SHIFT = 26, 8
LEAKY_ALPHA = LEAKY_NUM / (1 << LEAKY_SHIFT)
#: fixed-point bits of the hard-sigmoid intermediate
HSIG_BITS = 16


class ProgramError(ValueError):
    """A DPU program that cannot be read or does not hold together; the message says where."""


@dataclass
class Program:
    """An in-memory DPU program (see the module docstring)."""

    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    instructions: list[dict[str, Any]] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def add_array(self, base: str, array: np.ndarray, dtype: str) -> str:
        """Store ``array`` as ``dtype`` under a fresh name derived from ``base``; returns the name."""
        name, k = base, 1
        while name in self.arrays:
            name = f"{base}_{k}"
            k += 1
        arr = np.asarray(array)
        cast = arr.astype(_DTYPES[dtype])
        if not np.array_equal(cast.astype(np.int64), arr.astype(np.int64)):
            raise ProgramError(f"array {name!r} does not fit {dtype}")
        self.arrays[name] = np.ascontiguousarray(cast)
        return name

    def header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "tensors": self.tensors,
            "instructions": self.instructions,
        }


def dumps(program: Program) -> bytes:
    """Serialise ``program`` (deterministic: same program, same bytes)."""
    layout, blobs, offset = {}, [], 0
    for name in sorted(program.arrays):
        arr = program.arrays[name]
        dtype = next(k for k, v in _DTYPES.items() if v == arr.dtype.newbyteorder("<"))
        data = np.ascontiguousarray(arr, dtype=_DTYPES[dtype]).tobytes()
        layout[name] = {"dtype": dtype, "shape": list(arr.shape), "offset": offset, "nbytes": len(data)}
        pad = (-len(data)) % 8
        blobs.append(data + b"\x00" * pad)
        offset += len(data) + pad
    header = dict(program.header(), arrays=layout)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    head = MAGIC + struct.pack("<II", VERSION, len(text)) + text
    head += b"\x00" * ((-len(head)) % 8)
    return head + b"".join(blobs)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ProgramError(msg)


def loads(data: bytes) -> Program:
    """Read and validate a serialised program."""
    data = bytes(data)
    _need(len(data) >= 16 and data[:8] == MAGIC, "not a DPU program (bad magic)")
    version, hlen = struct.unpack_from("<II", data, 8)
    _need(version == VERSION, f"DPU program version {version}; this plugin reads version {VERSION}")
    _need(16 + hlen <= len(data), "truncated DPU program header")
    try:
        header = json.loads(data[16:16 + hlen].decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProgramError(f"malformed DPU program header: {exc}") from None
    _need(isinstance(header, dict) and header.get("format") == FORMAT, "the header is not a DPU program header")
    base = 16 + hlen + ((-(16 + hlen)) % 8)
    arrays = {}
    layout = header.get("arrays")
    _need(isinstance(layout, dict), "header: 'arrays' is not an object")
    for name, info in layout.items():
        _need(isinstance(info, dict) and info.get("dtype") in _DTYPES, f"array {name!r}: bad dtype")
        shape, off, nbytes = info.get("shape"), info.get("offset"), info.get("nbytes")
        _need(isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape),
              f"array {name!r}: bad shape")
        dt = _DTYPES[info["dtype"]]
        want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        _need(isinstance(off, int) and isinstance(nbytes, int) and off >= 0 and nbytes == want
              and base + off + nbytes <= len(data), f"array {name!r}: offset/size out of the program's bytes")
        arrays[name] = np.frombuffer(data, dtype=dt, count=want // dt.itemsize, offset=base + off).reshape(shape)
    prog = Program(header.get("inputs"), header.get("outputs"), header.get("tensors"),
                   header.get("instructions"), arrays)
    validate(prog)
    return prog


def validate(prog: Program) -> None:
    """Check that every reference in ``prog`` resolves and every tensor is written before it is read."""
    _need(isinstance(prog.tensors, dict), "header: 'tensors' is not an object")
    for name, t in prog.tensors.items():
        _need(isinstance(t, dict) and isinstance(t.get("shape"), list)
              and all(isinstance(d, int) and d >= 0 for d in t["shape"])
              and isinstance(t.get("scale"), (int, float)) and t["scale"] > 0,
              f"tensor {name!r}: malformed (shape, scale)")
    _need(isinstance(prog.inputs, list) and isinstance(prog.outputs, list), "header: inputs/outputs are not lists")
    ready = set()
    for entry in prog.inputs:
        _need(isinstance(entry, dict) and entry.get("tensor") in prog.tensors and isinstance(entry.get("name"), str),
              f"input {entry!r}: malformed or unknown tensor")
        ready.add(entry["tensor"])
    _need(isinstance(prog.instructions, list), "header: 'instructions' is not a list")
    for k, ins in enumerate(prog.instructions):
        _need(isinstance(ins, dict) and ins.get("op") in OPCODES, f"instruction #{k}: unknown op {ins!r:.80}")
        op = ins["op"]
        srcs = ins.get("x")
        srcs = srcs if isinstance(srcs, list) else [srcs] if srcs is not None else []
        for s in srcs:
            _need(s in ready, f"instruction #{k} ({op}) reads tensor {s!r} before it is written")
        _need(ins.get("y") in prog.tensors, f"instruction #{k} ({op}) writes unknown tensor {ins.get('y')!r}")
        for f in OPCODES[op]:
            _need(ins.get(f) in prog.arrays, f"instruction #{k} ({op}): field {f!r} names no array")
        if op in ("conv", "deconv", "fc"):
            _need(prog.arrays[ins["w"]].dtype == _DTYPES["int8"] and prog.arrays[ins["b"]].dtype == _DTYPES["int32"],
                  f"instruction #{k} ({op}): weights must be int8, biases int32")
        ready.add(ins["y"])
    for entry in prog.outputs:
        _need(isinstance(entry, dict) and entry.get("tensor") in ready and isinstance(entry.get("name"), str),
              f"output {entry!r}: malformed or never written")


__all__ = [
    "ACT_LEAKY",
    "ACT_NAMES",
    "ACT_NONE",
    "ACT_RELU",
    "ACT_RELU6",
    "FORMAT",
    "HSIG_BITS",
    "LEAKY_ALPHA",
    "LEAKY_NUM",
    "LEAKY_SHIFT",
    "OPCODES",
    "Program",
    "ProgramError",
    "dumps",
    "loads",
    "validate",
]
