"""Safe reading of ONNX external tensor data.

A tensor stored as external data names a file (``location``) relative to the model's folder,
plus an optional ``offset`` and ``length``. A hostile model can use that to make the loader
read any file on the machine, so byoc only reads a location that

* is relative, has no ``..`` component, no NUL byte and no drive letter;
* resolves to a regular file inside the model folder, reached without following any symbolic
  link (every path component is opened with ``O_NOFOLLOW`` relative to its parent folder);
* has exactly one hard link (a second link can point at a file outside the folder);
* holds ``offset + length`` bytes, where ``length`` equals the size the tensor's dims/dtype
  declare and is within :attr:`byoc.Budget.max_tensor_bytes`.

Every check runs for every tensor before a single byte of data is read.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from onnx import ModelProto, TensorProto

from byoc.budget import Budget, _fmt_bytes
from byoc.errors import ExternalDataError, ResourceLimitError
from byoc.frontend import validate

_DIGITS = re.compile(r"[0-9]{1,20}")
_DRIVE = re.compile(r"^[A-Za-z]:")
_CHUNK = 1 << 30  # bytes per read call (Linux caps a single read near 2 GiB)


@dataclass
class _Read:
    tensor: TensorProto
    what: str
    location: str
    fd: int
    offset: int
    length: int


class ExternalData:
    """The validated external tensors of one model, with their files open for reading.

    Use as a context manager (it closes the files); :meth:`stubbed` lets the ONNX checker
    see the model without the external references, :meth:`fill` reads the data into the
    tensors' ``raw_data``.
    """

    def __init__(self, reads: list[_Read], fds: list[int]):
        self._reads = reads
        self._fds = fds

    def __len__(self) -> int:
        return len(self._reads)

    def __enter__(self) -> ExternalData:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    @contextlib.contextmanager
    def stubbed(self):
        """Temporarily replace every external tensor by a one-element inline tensor of the same rank.

        The in-memory ONNX checker would otherwise look for the files relative to the current
        working directory; the stubs keep name, dtype and rank, which is all it inspects.
        """
        saved = []
        for r in self._reads:
            t = r.tensor
            saved.append((list(t.dims), [(e.key, e.value) for e in t.external_data]))
            validate.one_element_stand_in(t)
        try:
            yield
        finally:
            for r, (dims, entries) in zip(self._reads, saved):
                t = r.tensor
                t.ClearField("raw_data")
                del t.dims[:]
                t.dims.extend(dims)
                for key, value in entries:
                    e = t.external_data.add()
                    e.key, e.value = key, value
                t.data_location = TensorProto.EXTERNAL

    def fill(self, hold: Callable[[TensorProto, str], bool] | None = None) -> list[tuple[TensorProto, bytes]]:
        """Read every external tensor into its ``raw_data`` and drop the external reference.

        The tensors that ``hold(tensor, what)`` selects are not filled: they are returned with
        their bytes, for the caller to keep outside the proto (see :mod:`byoc.frontend.weights`).
        """
        held = []
        for r in self._reads:
            data = _pread_exact(r)
            t = r.tensor
            if hold is not None and hold(t, r.what):
                held.append((t, data))
                continue
            t.ClearField("external_data")
            t.data_location = TensorProto.DEFAULT
            t.raw_data = data
        self.close()
        return held


def prepare(proto: ModelProto, base_dir: str | os.PathLike | None, *, budget: Budget,
            skip: Callable[[TensorProto, str], bool] | None = None) -> ExternalData | None:
    """Validate every external tensor of ``proto`` and open its file; ``None`` if there are none.

    Call after :func:`byoc.frontend.validate.check_structure`.

    :raises ExternalDataError: a location escapes the model folder, is a link, is not a
        regular file, or its offset/length do not fit the file or the tensor.
    :raises ResourceLimitError: a declared length is over ``budget.max_tensor_bytes``.

    ``skip(tensor, what)`` leaves out the tensors it selects (byoc's own weight stubs).
    """
    tensors = validate.external_tensors(proto)
    if skip is not None:
        tensors = [ext for ext in tensors if not skip(ext.tensor, ext.what)]
    if not tensors:
        return None
    if base_dir is None:
        first = tensors[0]
        loc = _entries(first.tensor, first.what).get("location", "?")
        raise ExternalDataError(
            f"{first.what}: its data is in the external file {loc!r} ({len(tensors)} external tensor(s) in all), "
            f"but the model was given in memory, so byoc does not know the model folder; load the model "
            f"from its file path, or pass base_dir= (the folder holding the data files)"
        )
    # check every location before touching the file system
    planned = []
    for ext in tensors:
        entries = _entries(ext.tensor, ext.what)
        location = entries.get("location")
        if location is None or location == "":
            raise ExternalDataError(f"{ext.what}: declared as external data but has no 'location' entry")
        parts = _location_parts(location, ext.what)
        offset = _int_entry(entries, "offset", ext.what)
        offset = 0 if offset is None else offset
        length = _int_entry(entries, "length", ext.what)
        if length is not None:
            if length > budget.max_tensor_bytes:
                raise ResourceLimitError(
                    f"{ext.what}: external data length {length} ({_fmt_bytes(length)}) is over the budget "
                    f"max_tensor_bytes={_fmt_bytes(budget.max_tensor_bytes)}"
                )
            if length != ext.nbytes:
                raise ExternalDataError(
                    f"{ext.what}: external data length is {length} bytes but its shape {list(ext.tensor.dims)} of "
                    f"{validate.dtype_name(ext.tensor.data_type)} needs {ext.nbytes} bytes"
                )
        planned.append((ext, location, parts, offset))

    root = os.path.realpath(os.fspath(base_dir))
    if not os.path.isdir(root):
        raise ExternalDataError(f"the model folder {root!r} for external data is not a folder")
    fds: list[int] = []
    opened: dict[tuple[str, ...], tuple[int, os.stat_result]] = {}
    reads = []
    try:
        for ext, location, parts, offset in planned:
            key = tuple(parts)
            if key not in opened:
                fd = _open_inside(root, parts, location, ext.what)
                fds.append(fd)
                st = os.fstat(fd)
                _check_file(st, location, ext.what)
                opened[key] = (fd, st)
            fd, st = opened[key]
            if offset > st.st_size:
                raise ExternalDataError(
                    f"{ext.what}: offset {offset} is beyond the end of external data file {location!r} "
                    f"({st.st_size} bytes)"
                )
            if offset + ext.nbytes > st.st_size:
                raise ExternalDataError(
                    f"{ext.what}: needs bytes {offset}..{offset + ext.nbytes} of external data file {location!r}, "
                    f"which holds only {st.st_size} bytes (offset/length beyond the end of the file)"
                )
            if _int_entry(_entries(ext.tensor, ext.what), "length", ext.what) is None \
                    and st.st_size - offset != ext.nbytes:
                raise ExternalDataError(
                    f"{ext.what}: external data file {location!r} holds {st.st_size - offset} bytes after offset "
                    f"{offset}, but the tensor's shape {list(ext.tensor.dims)} needs {ext.nbytes} bytes; "
                    f"give a 'length' entry"
                )
            reads.append(_Read(ext.tensor, ext.what, location, fd, offset, ext.nbytes))
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return ExternalData(reads, fds)


def _entries(t: TensorProto, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in t.external_data:
        if e.key in out:
            raise ExternalDataError(f"{what}: external data entry {e.key!r} is given twice")
        out[e.key] = e.value
    return out


def _int_entry(entries: dict[str, str], key: str, what: str) -> int | None:
    value = entries.get(key)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        raise ExternalDataError(f"{what}: external data {key} {value!r} is not a non-negative integer")
    return int(value)


def _location_parts(location: str, what: str) -> list[str]:
    if "\x00" in location:
        raise ExternalDataError(f"{what}: external data location {location!r} contains a NUL byte")
    if location.startswith(("/", "\\")) or _DRIVE.match(location) or os.path.isabs(location):
        raise ExternalDataError(
            f"{what}: external data location {location!r} is an absolute path; it must be a path relative to "
            f"the model's folder"
        )
    parts = [p for p in re.split(r"[/\\]", location) if p not in ("", ".")]
    if ".." in parts:
        raise ExternalDataError(
            f"{what}: external data location {location!r} contains '..' and could escape the model's folder; "
            f"keep data files inside the folder"
        )
    if not parts:
        raise ExternalDataError(f"{what}: external data location {location!r} names no file")
    return parts


def _escape_error(what: str, location: str, root: str, why: str) -> ExternalDataError:
    return ExternalDataError(
        f"{what}: external data location {location!r} {why}; byoc only reads regular files inside the model's "
        f"folder {root!r}, reached without symbolic links"
    )


def _open_inside(root: str, parts: list[str], location: str, what: str) -> int:
    """Open ``root/parts...`` read-only without following any link; returns the file descriptor."""
    if not (hasattr(os, "O_NOFOLLOW") and os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd
            and os.stat in os.supports_follow_symlinks):
        return _open_inside_portable(root, parts, location, what)
    cloexec = getattr(os, "O_CLOEXEC", 0)
    dir_flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0) | cloexec
    dir_fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | cloexec)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                st = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise ExternalDataError(
                    f"{what}: external data file {location!r} not found in the model's folder {root!r}"
                ) from None
            except OSError as exc:
                raise ExternalDataError(f"{what}: cannot read external data file {location!r}: {exc}") from None
            if stat.S_ISLNK(st.st_mode):
                raise _escape_error(what, location, root, f"goes through the symbolic link {'/'.join(parts[:i + 1])!r}")
            if not last and not stat.S_ISDIR(st.st_mode):
                raise ExternalDataError(f"{what}: external data location {location!r}: {part!r} is not a folder")
            if last and not stat.S_ISREG(st.st_mode):
                raise ExternalDataError(f"{what}: external data location {location!r} is not a regular file")
            try:
                flags = (os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | cloexec) if last else dir_flags
                fd = os.open(part, flags, dir_fd=dir_fd)
            except OSError as exc:  # ELOOP: it became a link since lstat
                raise _escape_error(what, location, root, f"cannot be opened safely ({exc.strerror})") from None
            os.close(dir_fd)
            dir_fd = fd
        fd, dir_fd = dir_fd, -1
        return fd
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)


def _open_inside_portable(root: str, parts: list[str], location: str, what: str) -> int:
    """Fallback where ``dir_fd``/``O_NOFOLLOW`` are missing (Windows): lstat every component."""
    path = root
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise ExternalDataError(
                f"{what}: external data file {location!r} not found in the model's folder {root!r}"
            ) from None
        if stat.S_ISLNK(st.st_mode) or getattr(st, "st_reparse_tag", 0):
            raise _escape_error(what, location, root, f"goes through the symbolic link {'/'.join(parts[:i + 1])!r}")
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            raise ExternalDataError(f"{what}: external data location {location!r}: {part!r} is not a folder")
        if last and not stat.S_ISREG(st.st_mode):
            raise ExternalDataError(f"{what}: external data location {location!r} is not a regular file")
    if os.path.realpath(path) != os.path.normpath(path) or Path(root) not in Path(os.path.realpath(path)).parents:
        raise _escape_error(what, location, root, "resolves outside the folder")
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ExternalDataError(f"{what}: cannot open external data file {location!r}: {exc}") from None


def _check_file(st: os.stat_result, location: str, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ExternalDataError(f"{what}: external data location {location!r} is not a regular file")
    if st.st_nlink > 1:
        raise ExternalDataError(
            f"{what}: external data file {location!r} has {st.st_nlink} hard links; byoc refuses hard-linked data "
            f"files because a hard link can expose a file from outside the model's folder (copy the file instead)"
        )


def _pread_exact(r: _Read) -> bytes:
    chunks = []
    pos, left = r.offset, r.length
    while left > 0:
        try:
            chunk = os.pread(r.fd, min(left, _CHUNK), pos) if hasattr(os, "pread") else _seek_read(r.fd, left, pos)
        except OSError as exc:
            raise ExternalDataError(f"{r.what}: cannot read external data file {r.location!r}: {exc}") from None
        if not chunk:
            raise ExternalDataError(
                f"{r.what}: external data file {r.location!r} ended after {pos} bytes while reading "
                f"{r.length} bytes at offset {r.offset} (was it truncated?)"
            )
        chunks.append(chunk)
        pos += len(chunk)
        left -= len(chunk)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _seek_read(fd: int, n: int, pos: int) -> bytes:
    os.lseek(fd, pos, os.SEEK_SET)
    return os.read(fd, min(n, _CHUNK))
