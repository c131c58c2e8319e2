"""Reading user arrays from ``.npy`` and ``.npz`` files, as untrusted input.

A header is checked before anything is allocated: Python objects (which would need unpickling)
are refused, and the size it claims must be present in the file and within the
:class:`~byoc.Budget`. Every problem is an :class:`~byoc.InputError` naming the file (and the
array inside an ``.npz``).
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib import format as npy_format

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.errors import InputError, ResourceLimitError


def _fmt_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover


def _read_header(f: IO[bytes], what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npy_format.read_magic(f)
        if version == (1, 0):
            return npy_format.read_array_header_1_0(f)
        if version == (2, 0):
            return npy_format.read_array_header_2_0(f)
        read = getattr(npy_format, "_read_array_header", None)
        if read is None:  # pragma: no cover - numpy without version 3 support
            raise ValueError(f"unsupported .npy format version {version}")
        return read(f, version)
    except (ValueError, OSError, SyntaxError, TypeError, EOFError) as exc:
        raise InputError(f"{what} is not a .npy array ({exc})") from None


def check_header(f: IO[bytes], available: int, what: str, budget: Budget = DEFAULT_BUDGET) -> None:
    """Read and check a ``.npy`` header at the start of ``f``, of which ``available`` bytes exist in all."""
    shape, _, dtype = _read_header(f, what)
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects (dtype {dtype}): byoc never unpickles; save a numeric array")
    nbytes = math.prod(shape) * dtype.itemsize
    present = available - f.tell()
    if nbytes > budget.max_tensor_bytes:
        raise ResourceLimitError(f"{what}: its header declares {list(shape)} {dtype} ({_fmt_bytes(nbytes)}), more "
                                 f"than max_tensor_bytes={_fmt_bytes(budget.max_tensor_bytes)}")
    if nbytes > present:
        raise InputError(f"{what}: its header declares {list(shape)} {dtype} ({_fmt_bytes(nbytes)}) but the file holds "
                         f"{_fmt_bytes(max(present, 0))} of data: truncated or not a .npy array")


def _regular_file(path: str | os.PathLike, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what}: file not found: {p}")
    if p.is_dir():
        raise InputError(f"{what}: {p} is a directory, expected a file")
    if not p.is_file():
        raise InputError(f"{what}: {p} is not a regular file")
    return p


def load_npy(path: str | os.PathLike, what: str = "", budget: Budget = DEFAULT_BUDGET) -> np.ndarray:
    """One array from a ``.npy`` file; ``what`` names it in errors (e.g. ``"input 'x'"``)."""
    what = what or str(path)
    p = _regular_file(path, what)
    where = f"{what} ({p})" if str(p) not in what else what
    try:
        with p.open("rb") as f:
            check_header(f, p.stat().st_size, where, budget)
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except PermissionError:
        raise InputError(f"{where}: permission denied") from None
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{where} is not a plain .npy array ({exc})") from None


def npz_members(path: str | os.PathLike, what: str = "", budget: Budget = DEFAULT_BUDGET) -> list[str]:
    """The array names in an ``.npz`` file, each header checked (nothing is loaded)."""
    what = what or str(path)
    p = _regular_file(path, what)
    names = []
    try:
        with zipfile.ZipFile(p) as zf:
            for member in zf.infolist():
                if not member.filename.endswith(".npy"):
                    raise InputError(f"{what}: member {member.filename!r} is not a .npy array")
                name = member.filename[:-4]
                with zf.open(member) as f:
                    check_header(f, member.file_size, f"{what}: array {name!r}", budget)
                names.append(name)
    except zipfile.BadZipFile as exc:
        raise InputError(f"{what}: not an .npz file ({exc})") from None
    except PermissionError:
        raise InputError(f"{what}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{what}: cannot read ({exc.strerror or exc})") from None
    if not names:
        raise InputError(f"{what}: the .npz file holds no arrays")
    return names


def load_npz(path: str | os.PathLike, what: str = "", budget: Budget = DEFAULT_BUDGET) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file (array name -> array), headers checked first."""
    what = what or str(path)
    names = npz_members(path, what, budget)
    out = {}
    try:
        with np.load(Path(path), allow_pickle=False) as npz:
            for name in names:
                try:
                    out[name] = npz[name]
                except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                    raise InputError(f"{what}: array {name!r} cannot be read ({exc})") from None
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{what}: not an .npz file ({exc})") from None
    return out


__all__ = ["check_header", "load_npy", "load_npz", "npz_members"]
