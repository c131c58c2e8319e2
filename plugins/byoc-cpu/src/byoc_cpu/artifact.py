"""The ``cpu`` artifact: generated source + program in JSON metadata, constants as raw bytes.

``Artifact.format`` is ``"python"``. ``Artifact.data`` is the packed constants: little-endian
float32, each one starting on a 64-byte boundary, in program order (no pickle, no npz: the
layout follows from ``metadata["program"]["consts"]``; an entry with ``axes`` is stored as the
source weights' bytes and transposed by those axes at load, so that a bundle can keep those
bytes once for the artifact and the region's subgraph). ``Artifact.metadata``::

    inputs, outputs     value names in call order (what byoc checks)
    region              the region's name
    program             the lowered program (JSON; :mod:`byoc_cpu.lower`)
    source              the generated Python source (``byoc explain --show-code`` prints it)
    source_sha256       SHA-256 of the source's UTF-8 bytes: the cache key of the compiled module
    constants_sha256    SHA-256 of ``data``
    codegen             :data:`byoc_cpu.CODEGEN_VERSION`
    stats               counts for humans: steps, fused loops, GEMMs, arena bytes
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from byoc.contract import PluginError

from byoc_cpu import CODEGEN_VERSION, __version__

FORMAT = "python"
TARGET = "cpu"
_ALIGN_BYTES = 64


def const_layout(sizes: list[int]) -> tuple[list[int], int]:
    """Byte offset of each constant (float32 elements ``sizes``) and the total length."""
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos += -(-4 * n // _ALIGN_BYTES) * _ALIGN_BYTES
    return offsets, pos


def pack_constants(consts: list[np.ndarray]) -> bytes:
    offsets, total = const_layout([int(a.size) for a in consts])
    parts = []
    for i, arr in enumerate(consts):
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        end = offsets[i + 1] if i + 1 < len(offsets) else total
        parts.append(raw)
        parts.append(bytes(end - offsets[i] - len(raw)))
    return b"".join(parts)


def unpack_constants(data: bytes, program: dict[str, Any]) -> list[np.ndarray]:
    """Writable, aligned float32 copies of the constants (flat, as the kernels take them); a
    constant whose program entry has ``axes`` is stored untransposed and transposed here."""
    sizes = [int(c["size"]) for c in program["consts"]]
    offsets, total = const_layout(sizes)
    if len(data) != total:
        raise PluginError(f"cpu artifact: {len(data)} bytes of constants, the program needs {total}")
    out = []
    for c, off, n in zip(program["consts"], offsets, sizes):
        arr = np.frombuffer(data, dtype="<f4", count=n, offset=off)
        if "axes" in c:  # stored as the weights' own bytes; the program uses them transposed
            t = arr.reshape([int(d) for d in c["shape"]]).transpose(c["axes"])
            out.append(np.ascontiguousarray(t, dtype=np.float32).reshape(-1))  # a copy (transposed)
        else:
            out.append(arr.astype(np.float32))
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_metadata(region_name: str, inputs: list[str], outputs: list[str], program: dict[str, Any], source: str,
                   data: bytes) -> dict[str, Any]:
    steps = _all_steps(program["steps"])
    return {
        "inputs": list(inputs),
        "outputs": list(outputs),
        "region": region_name,
        "program": program,
        "source": source,
        "source_sha256": sha256(source.encode("utf-8")),
        "constants_sha256": sha256(data),
        "codegen": CODEGEN_VERSION,
        "plugin_version": __version__,
        "stats": {
            "steps": len(steps),
            "gemms": sum(s["kind"] == "gemm" for s in steps),
            "fused_loops": sum(s["kind"] == "ew" for s in steps),
            "arena_bytes": 4 * int(program["arena"]),
            "constant_bytes": len(data),
            "source_lines": source.count("\n"),
        },
    }


def _all_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in steps:
        if s["kind"] == "batch":
            out.extend(_all_steps(s["steps"]))
        else:
            out.append(s)
    return out


__all__ = ["FORMAT", "TARGET", "build_metadata", "const_layout", "pack_constants", "sha256", "unpack_constants"]
