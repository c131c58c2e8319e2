"""The bundle format: member names, limits, and the checks that the writer and reader share.

A bundle is a zip archive with a fixed set of members::

    manifest.json                 format version, byoc version, plugin per target, SHA-256 + size per member
    compiled.json                 options, targets, regions, per-node records, plugin faults
    model.onnx                    the partitioned host graph (regions are ``byoc::Region`` nodes)
    regions/NNNN/artifact.bin     the vendor artifact's bytes, as the code generator returned them
    regions/NNNN/artifact.json    the artifact's target, format and metadata
    regions/NNNN/region.onnx      the region's original subgraph (runs on the host when its plugin is missing)

A model with symbolic input dimensions whose static-shape targets compile per input shapes
(:mod:`byoc.runtime.specialize`) also holds, with ``compiled.json``'s ``specialisation`` section::

    source.onnx                   the model with its symbolic dimensions (shapes first seen after loading)
    weights.bin                   every large weight of these graphs once (they refer to it: byoc.bundle.shared)
    specs/NNNN/compiled.json      one specialisation (its input shapes are in the section), laid out
    specs/NNNN/model.onnx         like the model itself: compiled.json, model.onnx, regions/...
    specs/NNNN/regions/MMMM/...
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path

import onnx

from byoc.errors import BundleError

FORMAT = "byoc-bundle"
#: 2: a region subgraph may refer to its artifact's bytes for its weights (byoc.bundle.shared)
#: 3: a model with symbolic input dimensions keeps its per-shape specialisations (SOURCE, SPEC_DIR);
#: only such a bundle is written as version 3, others stay readable by a byoc that reads version 2
FORMAT_VERSION = 3
PLAIN_FORMAT_VERSION = 2
SUFFIX = ".byoc"

MANIFEST = "manifest.json"
COMPILED = "compiled.json"
HOST_GRAPH = "model.onnx"
REGION_DIR = "regions/{:04d}"
ARTIFACT_BIN = "artifact.bin"
ARTIFACT_JSON = "artifact.json"
REGION_ONNX = "region.onnx"
SOURCE = "source.onnx"
#: the weight pool of a bundle with specialisations (byoc.bundle.shared.POOL)
WEIGHTS = "weights.bin"
SPEC_DIR = "specs/{:04d}/"
#: more specialisations than this is not a bundle byoc wrote (a target's limit is a small number)
MAX_SPECIALISATIONS = 4096

#: the manifest is small JSON; anything bigger is not one byoc wrote
MAX_MANIFEST_BYTES = 16 << 20
#: protobuf cannot parse a message of 2 GiB or more
PROTOBUF_LIMIT = (1 << 31) - 1
#: more members than this is not a bundle byoc wrote (3 per region + 3)
MAX_MEMBERS = 3 * 100_000 + 3
#: zip bookkeeping allowed on top of the contents when checking a file's size against the budget
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")

SAFE_COMPRESSION = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


class BundleFallbackWarning(UserWarning):
    """A bundle's region runs on the host because its plugin is missing or cannot load it."""


def is_bundle(path: str | os.PathLike) -> bool:
    """``True`` if ``path`` names a bundle: a ``.byoc`` suffix, or a file starting like a zip archive."""
    p = Path(path)
    if p.suffix.lower() == SUFFIX:
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False



def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def region_members(index: int, prefix: str = "") -> tuple[str, str, str]:
    """The members of region ``index`` of the compiled model whose members start with ``prefix``
    (``""``: the model itself; ``specs/NNNN/``: one of its specialisations)."""
    base = prefix + REGION_DIR.format(index)
    return f"{base}/{ARTIFACT_BIN}", f"{base}/{ARTIFACT_JSON}", f"{base}/{REGION_ONNX}"


def expected_region_members(n_regions: int, prefix: str = "") -> set[str]:
    out = set()
    for i in range(n_regions):
        out.update(region_members(i, prefix))
    return out


def check_member_name(name: str) -> None:
    """Refuse a member name that could escape a folder or is not one byoc writes."""
    why = None
    if not name:
        why = "is empty"
    elif "\x00" in name:
        why = "contains a NUL byte"
    elif "\\" in name:
        why = "contains a backslash"
    elif name.startswith("/"):
        why = "is an absolute path"
    elif re.match(r"[A-Za-z]:", name) or ":" in name:
        why = "contains a drive letter or colon"
    elif any(part in ("..", ".") for part in name.split("/")):
        why = "contains a '..' or '.' path component and would escape its folder"
    elif name.endswith("/"):
        why = "is a directory entry"
    elif len(name) > 255 or not NAME_RE.fullmatch(name):
        why = "is not a name byoc writes (letters, digits, '_', '.', '-' and '/' only)"
    if why is not None:
        raise BundleError(f"unsafe member name {name!r}: it {why}; refused")


def external_tensor(graph: onnx.GraphProto, depth: int = 0) -> str | None:
    """The first tensor of ``graph`` (subgraphs included) that keeps its data outside the proto."""
    if depth > 64:
        return f"graph {graph.name!r} (nested too deeply)"
    ext = onnx.TensorProto.EXTERNAL
    for t in graph.initializer:
        if t.data_location == ext:
            return f"initializer {t.name!r}"
    for st in graph.sparse_initializer:
        if ext in (st.values.data_location, st.indices.data_location):
            return f"sparse initializer {st.values.name!r}"
    for node in graph.node:
        for attr in node.attribute:
            tensors = [attr.t, *attr.tensors]
            for sp in [attr.sparse_tensor, *attr.sparse_tensors]:
                tensors += [sp.values, sp.indices]
            if any(t.data_location == ext for t in tensors):
                return f"attribute {attr.name!r} of node {node.name!r}"
            for sub in [attr.g, *attr.graphs]:
                found = external_tensor(sub, depth + 1)
                if found is not None:
                    return found
    return None



__all__ = [
    "ARTIFACT_BIN",
    "ARTIFACT_JSON",
    "COMPILED",
    "FORMAT",
    "FORMAT_VERSION",
    "HOST_GRAPH",
    "MANIFEST",
    "MAX_SPECIALISATIONS",
    "REGION_ONNX",
    "SOURCE",
    "SPEC_DIR",
    "SUFFIX",
    "WEIGHTS",
    "BundleFallbackWarning",
    "check_member_name",
    "expected_region_members",
    "external_tensor",
    "is_bundle",
    "region_members",
    "sha256",
]
