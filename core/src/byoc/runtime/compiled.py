"""CompiledModel: the result of :func:`byoc.compile`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from byoc.arguments import check_run_args
from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.bundle.writer import save as save_bundle
from byoc.errors import InputError
from byoc.progress import active as progress_active
from byoc.progress import phase as progress_phase
from byoc.progress import ticking as progress_ticking
from byoc.runtime.control import CancelHandle, controlled
from byoc.runtime.plan import InputSpec, Plan, check_feeds, feed_array

if TYPE_CHECKING:  # pragma: no cover
    from byoc.codegen import CompiledRegion
    from byoc.partition.records import NodeRecord
    from byoc.contract import Target
    from byoc.plugins import PluginFault
    from byoc.runtime.tiers import Tiers


class CompiledModel:
    """A model lowered to an execution plan; ``run`` is safe from many threads at once.

    :ivar model: the partitioned IR model (regions are ``byoc::Region`` nodes).
    :ivar regions: the offloaded regions with their artifacts.
    :ivar records: per node (by name) where it runs and why.
    :ivar faults: plugin faults seen while compiling (each caused a fallback), and those of
        isolated region calls (:mod:`byoc.runtime.isolation`).
    """

    def __init__(
        self,
        model: ir.Model,
        plan: Plan,
        *,
        options: dict[str, Any] | None = None,
        regions: Sequence["CompiledRegion"] = (),
        records: dict[str, "NodeRecord"] | None = None,
        faults: Sequence["PluginFault"] = (),
        targets: Sequence["Target"] = (),
        budget: Budget = DEFAULT_BUDGET,
    ):
        self.model = model
        self._plan = plan
        self.options = dict(options or {})
        self.regions = list(regions)
        self.records = dict(records or {})
        self.faults = list(faults)
        for r in self.regions:  # isolated regions report their run-time faults here
            getattr(r.fn, "report_faults_to", lambda faults: None)(self.faults)
        self.targets = list(targets)
        self.budget = budget
        #: set when static-shape targets are specialised per input shapes (byoc.runtime.specialize)
        self.specializer = None
        #: region name -> why it runs on the host (set by ``byoc.load(..., fallback="host")``)
        self.host_fallback: dict[str, str] = {}
        #: set after the first run (which JIT-compiles or cache-loads the kernels)
        self._warm = False
        #: the first tier that answers while the JIT code compiles (byoc.runtime.tiers), or ``None``
        self.tiers: "Tiers | None" = None

    @property
    def inputs(self) -> list[InputSpec]:
        """The inputs a caller must (or may, when ``optional``) feed."""
        return self._plan.input_specs()

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs if not s.optional]

    @property
    def output_names(self) -> list[str]:
        return self._plan.output_names()

    def run(self, feeds: dict[str, np.ndarray], *, timeout: float | None = None,
            cancel: "CancelHandle | None" = None) -> dict[str, np.ndarray]:
        """Run the model.

        :param feeds: input name -> numpy array.
        :returns: output name -> numpy array, in the graph's output order.
        :param timeout: seconds after which the run stops with :class:`byoc.RunTimeoutError`
            (checked between nodes and on every Loop/Scan iteration).
        :param cancel: a :class:`byoc.CancelHandle`; ``cancel.cancel()`` from another thread stops
            the run with :class:`byoc.RunCancelledError`.
        :raises InputError: unknown or missing names, wrong dtype or shape (the message says
            what was expected).
        """
        check_run_args(feeds, timeout=timeout, cancel=cancel)
        if timeout is not None or cancel is not None:
            with controlled(timeout, cancel):
                return self.run(feeds)
        if self.specializer is not None and isinstance(feeds, dict):
            # refused feeds (names, dtypes, ranks) are refused here and use up no specialisation slot
            check_feeds(self._plan.input_specs(), feeds, self.budget)
            chosen = self.specializer.select(feeds)
            if chosen is not self:
                return chosen.run(feeds)
            try:
                out = self._run(feeds)
            except BaseException:
                self.specializer.drop_queued()  # feeds no plan runs are no reason to specialise
                raise
            self.specializer.start_queued()  # a specialisation for these shapes, in the background
            return out
        return self._run(feeds)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        checked = check_feeds(self._plan.input_specs(), feeds, self.budget)
        if self._warm:
            return self._plan.execute(checked)
        tiers = self.tiers
        if tiers is not None and not tiers.full:
            return tiers.run(checked)
        self._warm = True
        return self._first_run(checked) if tiers is None else self._plan.execute(checked)

    def _first_run(self, checked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The full plan's first run (JIT engines compile or cache-load their code)."""
        # a host-only plan's first run may be the executor's (compiling kernels in helper processes, say)
        first_run = getattr(self._plan.executor, "first_run", None)
        execute = (self._plan.execute if self.targets or first_run is None
                   else lambda c: first_run(lambda: self._plan.execute(c)))
        if not progress_active() or self.tiers is not None:  # a first tier answers: compile quietly
            return execute(checked)
        # shown only while a front end listens (byoc.progress): one unit per step
        with progress_phase("first run (Numba compiles or loads the kernels)", total=len(self._plan.steps)) as task, \
                progress_ticking(self._plan, task):
            return execute(checked)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the compiled code serves (a first tier answers runs until then, see
        :mod:`byoc.runtime.tiers`) and a specialisation compiling in the background
        (:mod:`byoc.runtime.specialize`) is done; whether both are now. ``True`` at once without
        either."""
        ready = True if self.tiers is None else self.tiers.wait(timeout)
        if self.specializer is not None:
            ready = self.specializer.wait(timeout) and ready
        return ready

    def run_batch(self, feeds: Iterable[Mapping[str, np.ndarray]], *, batch_size: int = 1,
                  timeout: float | None = None, cancel: "CancelHandle | None" = None) -> Iterator[dict[str, np.ndarray]]:
        """Run many inputs: yields one output dict per feed dict of ``feeds``, in order (lazily).

        With ``batch_size > 1``, up to that many consecutive feed dicts are concatenated along
        axis 0 and run at once when the model declares a batch axis: every input's and every
        output's first dimension is the same named dimension (e.g. ``"N"``). The outputs are
        split back per feed dict (a feed dict may itself hold several samples along axis 0).
        Feeds whose other dimensions or dtypes differ from the batch so far start a new batch.
        Without a named batch axis, each feed dict runs on its own. A model with static-shape
        targets is specialised per batch shape on first use (see :mod:`byoc.runtime.specialize`).

        :param timeout: seconds per :meth:`run` call (one batch).
        :raises OptionError: ``batch_size`` below 1.
        :raises InputError: as :meth:`run`; the message names the feed's index.
        """
        from byoc.errors import OptionError

        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise OptionError(f"batch_size must be an int >= 1, got {batch_size!r}")
        try:
            items = iter(feeds)
        except TypeError:
            raise InputError(f"run_batch: expected an iterable of dicts input name -> array, got "
                             f"{type(feeds).__name__}") from None
        return self._batches(items, batch_size, timeout, cancel)

    def _batch_axis(self) -> str | None:
        """The named dimension all inputs and outputs start with, else ``None``."""
        names = set()
        for spec in self.inputs:
            if spec.optional:
                continue
            if not spec.shape or not isinstance(spec.shape[0], str):
                return None
            names.add(spec.shape[0])
        for value in self.model.graph.outputs:
            dim = value.shape[0] if value.shape is not None and len(value.shape) else None
            if dim is None or isinstance(dim, int) or not dim.value:
                return None
            names.add(dim.value)
        return names.pop() if len(names) == 1 else None

    def _batches(self, feeds: Iterator[Mapping[str, np.ndarray]], batch_size: int, timeout, cancel):
        def run_one(index: int, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            if not isinstance(feed, Mapping):
                raise InputError(f"feed #{index}: expected a dict input name -> array, got {type(feed).__name__}")
            try:
                return self.run(dict(feed), timeout=timeout, cancel=cancel)
            except InputError as exc:
                raise InputError(f"feed #{index}: {exc}") from None

        if batch_size == 1 or self._batch_axis() is None:
            for index, feed in enumerate(feeds):
                yield run_one(index, feed)
            return
        pending: list[tuple[int, dict[str, np.ndarray]]] = []

        def fits(feed: dict[str, np.ndarray]) -> bool:
            first = pending[0][1]
            if set(feed) != set(first):
                return False
            return all(isinstance(feed[k], np.ndarray) and feed[k].ndim >= 1 and feed[k].dtype == first[k].dtype
                       and feed[k].shape[1:] == first[k].shape[1:] for k in first)

        def flush() -> Iterator[dict[str, np.ndarray]]:
            group = list(pending)
            pending.clear()
            if len(group) == 1:
                yield run_one(*group[0])
                return
            names = list(group[0][1])
            flat = not names or any(feed[k].ndim == 0 for _, feed in group for k in names)
            sizes = [0 if flat else len(feed[names[0]]) for _, feed in group]
            if flat or any(len(feed[k]) != n for (_, feed), n in zip(group, sizes) for k in names):
                for index, feed in group:  # inputs disagree on the batch size: run each alone
                    yield run_one(index, feed)
                return
            joined = {k: np.concatenate([feed[k] for _, feed in group], axis=0) for k in names}
            try:
                out = self.run(joined, timeout=timeout, cancel=cancel)
            except InputError as exc:
                raise InputError(f"feeds #{group[0][0]}..#{group[-1][0]} (batched): {exc}") from None
            total = sum(sizes)
            if any(arr.ndim == 0 or arr.shape[0] != total for arr in out.values()):
                for index, feed in group:  # the outputs do not follow the batch axis: run each alone
                    yield run_one(index, feed)
                return
            bounds = np.cumsum([0] + sizes)
            for i in range(len(group)):
                yield {k: arr[bounds[i]:bounds[i + 1]] for k, arr in out.items()}

        for index, feed in enumerate(feeds):
            if not isinstance(feed, Mapping):
                raise InputError(f"feed #{index}: expected a dict input name -> array, got {type(feed).__name__}")
            feed = {k: feed_array(k, v) for k, v in feed.items()}
            if pending and (len(pending) >= batch_size or not fits(feed)):
                yield from flush()
            pending.append((index, feed))
        if pending:
            yield from flush()

    def save(self, path: "str | os.PathLike") -> "Path":
        """Write the compiled model to one bundle file (a zip; see :mod:`byoc.bundle`).

        The file is replaced atomically: an existing file at ``path`` is intact until the new
        bundle is complete. ``byoc.load(path)`` gives back a model with bit-identical outputs.
        :returns: the path written.
        :raises BundleError: the model cannot be bundled or the file cannot be written.
        """
        return save_bundle(self, path)

    def placement(self) -> dict[str, str]:
        """Node name -> device (``"host"`` or a target name)."""
        return {name: rec.device for name, rec in self.records.items()}

    def report_data(self) -> dict[str, Any]:
        """The placement report as a JSON-ready dict (see ``byoc/report/schema.json``)."""
        from byoc.report import report_data

        return report_data(self)

    def report(self, format: str = "text") -> str:  # noqa: A002 - "format" is the documented keyword
        """The placement report: per node its device, region, pattern, every target's verdict and
        the rule that dropped it; totals per device, plugin faults and host fallbacks.

        :param format: ``"text"`` (a terminal table), ``"json"``, ``"dot"`` (Graphviz) or
            ``"html"`` (one self-contained page).
        :raises OptionError: an unknown format.
        """
        from byoc.report import render

        return render(self.report_data(), format)

    def __repr__(self) -> str:
        return (
            f"<CompiledModel inputs={self.input_names} outputs={self.output_names} "
            f"regions={[r.region.name for r in self.regions]} steps={len(self._plan.steps)}>"
        )
