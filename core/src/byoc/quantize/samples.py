"""Calibration samples from files: ``byoc compile/run/explain --calibration DIR|FILE.npz``.

Two layouts:

* a folder with one ``.npz`` file per sample, each mapping input name -> array (files taken in
  name order; other files are ignored);
* one ``.npz`` file whose arrays carry a leading sample axis: sample ``i`` is
  ``{name: array[i]}`` (every array the same length along that axis).

:func:`load_calibration` checks every file's headers (names, dtypes, sizes against the budget)
before returning, and reads the arrays lazily, one sample at a time, when
:func:`byoc.compile` iterates over them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from byoc.arrays import load_npz, npz_members
from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.errors import InputError


class CalibrationSamples(Sequence[Mapping[str, np.ndarray]]):
    """Samples read from files on demand (a sequence of feed dicts)."""

    def __init__(self, source: Path, files: list[Path] | None, count: int, budget: Budget):
        self.source = source
        self._files = files
        self._count = count
        self._budget = budget
        self._stacked: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if not -self._count <= i < self._count:
            raise IndexError(i)
        i %= self._count
        if self._files is not None:
            return load_npz(self._files[i], f"calibration sample {self._files[i]}", self._budget)
        if self._stacked is None:
            self._stacked = load_npz(self.source, f"calibration file {self.source}", self._budget)
        return {name: arr[i] for name, arr in self._stacked.items()}

    def __iter__(self) -> Iterator[Mapping[str, np.ndarray]]:
        for i in range(self._count):
            yield self[i]

    def __repr__(self) -> str:
        return f"<CalibrationSamples {self.source} samples={self._count}>"


def load_calibration(path: str | os.PathLike, *, samples: int | None = None,
                     input_names: Sequence[str] | None = None,
                     budget: Budget | None = None) -> CalibrationSamples:
    """Calibration samples from a folder of ``.npz`` files or one stacked ``.npz`` (module docstring).

    :param samples: use at most this many (the first ones); ``None``: all.
    :param input_names: the model's inputs: every sample must name exactly these (checked here,
        so a wrong file fails before any compile work).
    :raises InputError: missing path, no samples, unreadable or inconsistent files (named).
    """
    budget = budget or DEFAULT_BUDGET
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        raise InputError(f"--calibration-samples must be at least 1, got {samples!r}")
    p = Path(path)
    if not p.exists():
        raise InputError(f"calibration: {p} does not exist (expected a folder of .npz files or one .npz file)")
    expected = set(input_names) if input_names is not None else None

    def check_names(names: list[str], where: str) -> None:
        if expected is not None and set(names) != expected:
            missing, extra = sorted(expected - set(names)), sorted(set(names) - expected)
            parts = ([f"missing {missing}"] if missing else []) + ([f"unknown {extra}"] if extra else [])
            raise InputError(f"{where}: {'; '.join(parts)}; the model's inputs are {sorted(expected)}")

    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".npz" and f.is_file())
        if not files:
            raise InputError(f"calibration: folder {p} holds no .npz files (one per sample: input name -> array)")
        files = files[:samples] if samples is not None else files
        for f in files:
            check_names(npz_members(f, f"calibration sample {f}", budget), f"calibration sample {f}")
        return CalibrationSamples(p, files, len(files), budget)
    what = f"calibration file {p}"
    names = npz_members(p, what, budget)
    check_names(names, what)
    arrays = load_npz(p, what, budget)
    lengths = {name: (arr.shape[0] if arr.ndim else None) for name, arr in arrays.items()}
    if None in lengths.values():
        scalar = next(name for name, n in lengths.items() if n is None)
        raise InputError(f"{what}: array {scalar!r} is a scalar; a stacked file needs a leading sample axis "
                         f"(or pass a folder with one .npz per sample)")
    if len(set(lengths.values())) != 1:
        raise InputError(f"{what}: the arrays disagree on the number of samples (leading axis): {lengths}")
    count = next(iter(lengths.values()))
    if count == 0:
        raise InputError(f"{what}: 0 samples (the leading axis is empty)")
    out = CalibrationSamples(p, None, min(count, samples) if samples is not None else count, budget)
    out._stacked = arrays
    return out


__all__ = ["CalibrationSamples", "load_calibration"]
