"""Calibration: run the float model on the host over user samples and collect per-tensor statistics.

The model is lowered once to a host :class:`~byoc.runtime.plan.Plan` whose steps are wrapped by
an observer: every float tensor a node produces (and every float graph input) updates that
tensor's :class:`TensorStats` the moment it exists, and is then released as usual. Memory is
bounded by the statistics, not by the samples: a running min/max and a fixed-size histogram of
magnitudes per tensor (``bins`` counts whose range doubles, merging neighbouring bins, when a
larger value arrives), whatever the number of samples.

Thresholds (the magnitude mapped to the largest integer) come from the statistics:
``minmax`` (largest magnitude), ``percentile`` (of the magnitudes, read off the histogram),
``entropy`` (the threshold minimising the KL divergence between the magnitude histogram and its
128-level quantisation, as in TensorRT's int8 calibrator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sized

import numba
import numpy as np
import onnx
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.errors import ByocError, CalibrationRequiredError, InputError
from byoc.progress import start as progress_start
from byoc.runtime.plan import build_plan, check_feeds, host_step

#: default number of histogram bins per tensor
DEFAULT_BINS = 2048
_FLOAT_KINDS = (np.float16, np.float32, np.float64)


@dataclass
class TensorStats:
    """Running statistics of one tensor over all calibration samples."""

    count: int = 0
    min: float = math.inf
    max: float = -math.inf
    #: counts of ``|x|`` in ``bins`` equal bins over ``[0, hist_max]``; ``hist_max`` is 0 until
    #: a nonzero value is seen, then a power of two that doubles as needed
    hist: np.ndarray = field(default_factory=lambda: np.zeros(DEFAULT_BINS, np.int64))
    hist_max: float = 0.0
    #: NaN/inf values seen (excluded from every statistic)
    nonfinite: int = 0
    #: exact zeros seen (in ``hist[0]`` too; the entropy method leaves them out: zero is exact)
    zeros: int = 0

    @property
    def absmax(self) -> float:
        if self.count == 0:
            return 0.0
        return max(abs(self.min), abs(self.max))

    def update(self, x: np.ndarray) -> None:
        a = np.asarray(x, dtype=np.float32).ravel()
        finite = np.isfinite(a)
        if not finite.all():
            self.nonfinite += int(a.size - np.count_nonzero(finite))
            a = a[finite]
        if a.size == 0:
            return
        self.count += int(a.size)
        self.zeros += int(a.size - np.count_nonzero(a))
        self.min = min(self.min, float(a.min()))
        self.max = max(self.max, float(a.max()))
        a = np.abs(a)
        amax = float(a.max())
        bins = self.hist.size
        if amax > 0 and self.hist_max == 0.0:
            self.hist_max = 2.0 ** math.ceil(math.log2(amax))
        while amax > self.hist_max:
            merged = self.hist.reshape(-1, 2).sum(axis=1)
            self.hist = np.concatenate([merged, np.zeros(bins - merged.size, np.int64)])
            self.hist_max *= 2.0
        if self.hist_max == 0.0:  # all zeros so far: bin 0 holds zero whatever the final range
            self.hist[0] += a.size
            return
        idx = np.minimum((a * np.float32(bins / self.hist_max)).astype(np.int64), bins - 1)
        self.hist += np.bincount(idx, minlength=bins)

    def threshold(self, method: str = "minmax", percentile: float = 99.99) -> float:
        """The magnitude to map to the largest integer, by ``method``."""
        absmax = self.absmax
        if absmax == 0.0 or method == "minmax":
            return absmax
        width = self.hist_max / self.hist.size
        if method == "percentile":
            cum = np.cumsum(self.hist)
            k = int(np.searchsorted(cum, cum[-1] * (float(percentile) / 100.0)))
            return float(min(absmax, (k + 1) * width))
        if method == "entropy":
            hist = self.hist.astype(np.float64)
            hist[0] -= self.zeros
            if not hist.any():
                return absmax
            last = int(np.nonzero(hist)[0][-1]) + 1
            k = _kl_threshold(hist[:last], 128)
            return float(min(absmax, k * width))
        raise ValueError(f"unknown calibration method {method!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count, "min": self.min, "max": self.max, "hist_max": self.hist_max,
            "nonfinite": self.nonfinite, "zeros": self.zeros, "hist": self.hist.tolist(),
        }


@numba.njit(cache=True, nogil=True)
def _kl_threshold(hist, levels):  # pragma: no cover - compiled
    """Number of leading bins whose ``levels``-level quantisation loses the least information."""
    n = hist.size
    if n <= levels:
        return n
    best_i = n
    best_kl = np.inf
    # tail[i] = sum(hist[i:]) for the clipped-outlier bin
    tail = np.zeros(n + 1)
    for j in range(n - 1, -1, -1):
        tail[j] = tail[j + 1] + hist[j]
    for i in range(levels, n + 1):
        p = hist[:i].copy()
        p[i - 1] += tail[i]
        # quantise hist[:i] into `levels` groups, spreading each group's mass over its nonzero bins
        q = np.zeros(i)
        for g in range(levels):
            lo = (g * i) // levels
            hi = ((g + 1) * i) // levels
            mass = 0.0
            nz = 0
            for j in range(lo, hi):
                mass += hist[j]
                if hist[j] != 0:
                    nz += 1
            if nz > 0:
                for j in range(lo, hi):
                    if hist[j] != 0:
                        q[j] = mass / nz
        ps = 0.0
        qs = 0.0
        for j in range(i):
            ps += p[j]
            qs += q[j]
        if ps == 0 or qs == 0:
            continue
        kl = 0.0
        for j in range(i):
            if p[j] > 0:
                if q[j] == 0:
                    kl += (p[j] / ps) * 30.0  # a bin the quantisation emptied: heavy penalty
                else:
                    kl += (p[j] / ps) * np.log((p[j] / ps) / (q[j] / qs))
        if kl < best_kl:
            best_kl = kl
            best_i = i
    return best_i


@dataclass
class CalibrationTable:
    """Statistics per tensor name, from :func:`calibrate`."""

    stats: dict[str, TensorStats] = field(default_factory=dict)
    samples: int = 0

    def __contains__(self, name: str) -> bool:
        return name in self.stats

    def __getitem__(self, name: str) -> TensorStats:
        return self.stats[name]

    def threshold(self, name: str, method: str = "minmax", percentile: float = 99.99) -> float:
        return self.stats[name].threshold(method, percentile)


class _Observer:
    def __init__(self, bins: int):
        self.bins = bins
        self.table = CalibrationTable()

    def observe(self, name: str, value: Any) -> None:
        if not isinstance(value, np.ndarray) or value.dtype.type not in _FLOAT_KINDS or not name:
            return
        stats = self.table.stats.get(name)
        if stats is None:
            stats = self.table.stats[name] = TensorStats(hist=np.zeros(self.bins, np.int64))
        stats.update(value)

    def step_factory(self, node: ir.Node, spec):
        run = host_step(spec)
        names = [v.name for v in node.outputs]
        observe = self.observe

        def observed(*args):
            outs = run(*args)
            for name, value in zip(names, outs):
                observe(name, value)
            return outs

        return observed


def calibrate(
    model: ir.Model | onnx.ModelProto,
    samples: Iterable[Mapping[str, np.ndarray]],
    *,
    budget: Budget | None = None,
    bins: int = DEFAULT_BINS,
) -> CalibrationTable:
    """Run ``model`` (float) on the host over ``samples`` and collect statistics of every float tensor.

    :param model: an ``onnx_ir.Model`` (as ``byoc.compile`` has it after the shared passes) or an
        ``onnx.ModelProto``; not modified.
    :param samples: an iterable of feed dicts ``{input name: array}``, consumed once.
    :param budget: resource limits for the host run.
    :param bins: histogram bins per tensor (a power of two, at least 256).
    :raises CalibrationRequiredError: ``samples`` is ``None`` or empty.
    :raises InputError: a sample does not fit the model's inputs (names the sample).
    """
    if samples is None:
        raise CalibrationRequiredError("calibration samples are required: pass an iterable of feed dicts")
    if isinstance(samples, Mapping):
        raise InputError("calibration must be an iterable of feed dicts, not one feed dict (wrap it in a list)")
    if bins < 256 or bins & (bins - 1):
        raise ValueError(f"bins must be a power of two >= 256, got {bins}")
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    budget = budget or DEFAULT_BUDGET
    obs = _Observer(bins)
    plan = build_plan(model.graph, budget=budget, step_factory=obs.step_factory)
    specs = plan.input_specs()
    n = 0
    task = progress_start("calibration (float model on the host)", len(samples) if isinstance(samples, Sized) else None)
    for i, feeds in enumerate(samples):
        try:
            feeds = check_feeds(specs, dict(feeds) if isinstance(feeds, Mapping) else feeds)
        except InputError as exc:
            raise InputError(f"calibration sample #{i}: {exc}") from None
        for name, value in feeds.items():
            obs.observe(name, value)
        try:
            plan.execute(feeds)
        except ByocError as exc:
            raise type(exc)(f"calibration sample #{i}: {exc}") from exc
        n += 1
        task.advance()
    task.finish()
    if n == 0:
        raise CalibrationRequiredError("calibration has no samples: pass at least one feed dict")
    # graph inputs that are initializers (overridable) and constants are not statistics
    obs.table.samples = n
    return obs.table


__all__ = ["CalibrationTable", "DEFAULT_BINS", "TensorStats", "calibrate"]
