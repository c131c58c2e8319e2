"""``placement="measure"``: candidate regions are compiled and timed on each device that can take them.

After the priority partition has formed each target's regions (its maximal supported regions,
after its rules), :func:`refine` decides, for every such region, between

* the whole region on its target,
* the same nodes on the host (byoc's own kernels),
* the whole region on every other target that supports all of its nodes and whose rules keep it
  whole (its codegen sees the plain nodes: the first target's pattern matches are not its own), and
* a split at pattern boundaries: the region cut into at most :data:`MAX_SEGMENTS` contiguous
  sub-regions (never inside a composite pattern; a contiguous range of a convex region in
  topological order is convex, so no cycle can form), each on the target or the host, chosen by
  the placement dynamic programme (:func:`byoc.partition.placement.solve`) with transfers over
  ``Target.bandwidth``.

Every candidate is compiled (the target's ``byoc_codegen``/``byoc_runtime`` hooks; the host's
kernels) and run on random inputs of its input shapes and dtypes (floats normal, integers 0, so
index inputs are always in range; every array checked against the Budget first): one warm-up
run, then :data:`REPEATS` timed runs in turns with the alternatives (so a change of load hits
them alike), the median counts; a split that mixes devices is then timed end to end, in turns
with the whole region on either device. Times are cached on disk
(``$BYOC_CACHE_DIR/placement-measure.json``, default ``~/.cache/byoc``; plain JSON, read and
written only in a folder the user owns and no one else may write to, newest
:data:`MAX_CACHE_ENTRIES` kept) under a key of the candidate's content hash (nodes,
attributes, patterns, input types, and a SHA-256 of every weight), the device's name, plugin
version and options, and :func:`byoc.partition.placement.machine_fingerprint`: a second compile
of the same model measures nothing.

Measuring stops when ``measure_budget_s`` seconds of wall time are spent: the rest of the
candidates are priced by byoc's estimates (:mod:`byoc.partition.costs`), and the report says
which times were measured, read from the cache or estimated. The choice is deterministic given
the times: the fastest plan wins unless a simpler one (the whole region on its target, then all
on the host, then another target, then a split) is within :data:`MARGIN` (5%) of it, or
:data:`SPLIT_MARGIN` (15%) when the fastest is a split; the simpler one is then kept (times that
close are noise on a loaded machine; a split adds device switches that no sub-region shows).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from byoc.contract.folders import atomic_write, ensure_private, read_private
from byoc.contract import environment as _env
from byoc.budget import Budget
from byoc.runtime.isolation import compile_region
from byoc.contract.helpers import host_callable
from byoc.contract.types import Region, SupportContext, Target
from byoc.partition.partitioner import Partitioner, _Faults, outline
from byoc.partition.placement import HOST, Problem, machine_fingerprint, solve

#: default wall-clock seconds one compile may spend measuring
MEASURE_BUDGET_S = 60.0
#: a region is split into at most this many sub-regions (at pattern boundaries)
MAX_SEGMENTS = 6
#: a plan other than the simplest (whole region on its target, then all on the host, then a
#: split) must be faster by more than this fraction: closer times are measurement noise
MARGIN = 0.05
#: a split (device switches inside a region) must beat the best single-device plan by more than
#: this: on a loaded machine a split timed on its own came out 5-40% more optimistic than the
#: same split inside the compiled model (squeezenet, CPU time: 1.08x vs 1.19x cpu-only)
SPLIT_MARGIN = 0.15
#: timed runs per candidate (after one warm-up run); the median counts
REPEATS = 3
_CACHE_FILE = "placement-measure.json"
_KEY_VERSION = "measure-1"
#: what this process did, for tests and benchmarks: candidates timed, and read from the cache
STATS = {"measured": 0, "cached": 0}


#: the cache keeps at most this many times (the oldest go first)
MAX_CACHE_ENTRIES = 50_000
#: the largest cache file read (its entries are about 100 bytes each)
MAX_CACHE_BYTES = 200 * MAX_CACHE_ENTRIES


@dataclass
class Timing:
    """One candidate's time on one device: ``source`` is measured, cached or estimated."""

    seconds: float
    source: str
    note: str = ""


def _cache_path() -> Path:
    return _env.cache_root() / _CACHE_FILE


def _read_table(path: Path) -> dict[str, float]:
    """The cached times, read only from a private folder (byoc.contract.folders) and a regular
    file of bounded size; anything else reads as empty (measured again)."""
    data = read_private(path, MAX_CACHE_BYTES)
    try:
        table = json.loads(data) if data is not None else {}
    except (ValueError, RecursionError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: float(v) for k, v in table.items() if isinstance(k, str) and isinstance(v, (int, float))
            and not isinstance(v, bool) and 0 < v < math.inf}


@dataclass
class Session:
    """One compile's measuring: the wall-clock budget, the disk cache, the decisions for the report."""

    budget_s: float = MEASURE_BUDGET_S
    budget: Budget | None = None
    registry: Any = None
    hook_timeout: float | None = None
    started: float = field(default_factory=time.perf_counter)
    counts: dict[str, int] = field(default_factory=lambda: {"measured": 0, "cached": 0, "estimated": 0, "failed": 0})
    decisions: list[dict[str, Any]] = field(default_factory=list)
    budget_spent: bool = False
    _table: dict[str, float] | None = None
    _new: dict[str, float] = field(default_factory=dict)
    _weights: dict[int, str] = field(default_factory=dict)
    #: runners of whole regions, kept while a compile decides (dropped by :func:`refine`)
    runners: dict[str, Callable[[], Any]] = field(default_factory=dict)

    def remaining(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def cached(self, key: str) -> float | None:
        if self._table is None:
            self._table = _read_table(_cache_path())
        return self._new.get(key, self._table.get(key))

    def store(self, key: str, seconds: float) -> None:
        self._new[key] = seconds

    def save(self) -> None:
        """Merge this compile's new times into the cache file (atomic replace; best effort)."""
        if not self._new:
            return
        path = _cache_path()
        table = _read_table(path)
        for key in self._new:  # a re-measured time moves to the newest end
            table.pop(key, None)
        table.update(self._new)
        if len(table) > MAX_CACHE_ENTRIES:
            table = dict(list(table.items())[-MAX_CACHE_ENTRIES:])
        try:
            ensure_private(path.parent)
            atomic_write(path, json.dumps(table, indent=0).encode("utf-8"))  # oldest first
        except OSError:
            pass  # a read-only cache folder: measured again next time
        self._new.clear()
        self._table = None

    def summary(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "spent_s": round(time.perf_counter() - self.started, 3),
                "budget_exhausted": self.budget_spent, **self.counts}

    def weight_hash(self, value: ir.Value) -> str:
        key = id(value.const_value)
        if key not in self._weights:
            self._weights[key] = hashlib.sha256(np.ascontiguousarray(value.const_value.numpy()).tobytes()).hexdigest()
        return self._weights[key]


class _QuietFaults(_Faults):
    """Plugin faults while measuring: they make a candidate unmeasurable, not a compile warning."""

    def __init__(self) -> None:
        super().__init__(strict=False)

    def add(self, plugin: str, hook: str, message: str, kind: str = "error"):  # type: ignore[override]
        self.items.append(f"{plugin}.{hook}: {message}")
        return None


def region_hash(region: Region, session: Session) -> str:
    """Content hash of an outlined candidate: its nodes (op, attributes, wiring), patterns, input
    types and shapes, and the SHA-256 of every bound constant."""
    h = hashlib.sha256()
    for node in region.nodes:
        h.update(ir.serde.serialize_node(node).SerializeToString(deterministic=True))
        h.update(str(region.patterns.get(node.name, "")).encode())
    for v in region.inputs:
        h.update(f"in {v.name} {v.dtype} {v.shape}".encode())
    for v in region.model.graph.initializers.values() if region.model is not None else ():
        h.update(f"w {v.name} {v.const_value.dtype} {v.const_value.shape} ".encode())
        h.update(session.weight_hash(v).encode())
    return h.hexdigest()


def cache_key(content: str, device: str, version: str, options: Mapping[str, Any]) -> str:
    env = {k: _env.get(k) for k in ("BYOC_OWN_GEMM", "BYOC_NUM_THREADS")}
    text = json.dumps([_KEY_VERSION, content, device, version, dict(options), env, machine_fingerprint()],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def random_inputs(values: Sequence[ir.Value], budget: Budget | None, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for a candidate's inputs; ``ValueError`` names an input without a static shape."""
    rng = np.random.default_rng(seed)
    out = []
    for v in values:
        if v.shape is None or not all(isinstance(d, int) and d >= 0 for d in v.shape) or v.dtype is None:
            raise ValueError(f"input {v.name!r} has no static shape and type")
        dims = tuple(int(d) for d in v.shape)
        dtype = np.dtype(v.dtype.numpy())
        if budget is not None:
            budget.check_alloc(dims, dtype, f"placement measurement input {v.name!r}")
        if dtype.kind == "f":
            out.append(rng.standard_normal(dims).astype(dtype))
        elif dtype == np.bool_:
            out.append(rng.random(dims) < 0.5)
        else:  # integers (indices, shapes, counts) and the rest: 0 is valid wherever an index is
            out.append(np.zeros(dims, dtype))
    return out


@dataclass
class _Job:
    """One thing to time: its cache key, the estimate used when it cannot be timed, and how to
    build a zero-argument runner for it."""

    key: str
    #: the estimate used when the job cannot be timed (computed only then: it may call hooks)
    estimate: Callable[[], float]
    build: Callable[[], Callable[[], Any]]
    #: keep the runner for this compile (a whole region: timed again next to its split)
    keep: bool = False
    #: what runs it: ``"host"``, a target's name, or ``"plan:<target>"`` for a split end to end
    device: str = ""


def _compiled(session: Session, region: Region, device: str, options: Mapping[str, Any]) -> Callable[..., Any]:
    if device == HOST:
        return host_callable(region.model, session.budget)
    faults = _QuietFaults()
    cr = compile_region(session.registry, region, options, faults, hook_timeout=session.hook_timeout)
    if cr is None:
        raise RuntimeError("; ".join(faults.items) or "no code generated")
    return cr.fn


def _runner(session: Session, parts: Sequence[tuple[Region, str, Mapping[str, Any]]]) -> Callable[[], None]:
    """Run outlined regions in order (a topological order), each on its device, passing values by
    name; what comes from outside gets random inputs."""
    steps, feeds, produced = [], {}, set()
    for region, device, options in parts:
        fn = _compiled(session, region, device, options)
        missing = [v for v in region.inputs if v.name not in produced and v.name not in feeds]
        feeds.update(zip([v.name for v in missing], random_inputs(missing, session.budget)))
        steps.append((fn, [v.name for v in region.inputs], [v.name for v in region.outputs]))
        produced.update(v.name for v in region.outputs)

    def run() -> None:
        env = dict(feeds)
        for fn, ins, outs in steps:
            env.update(zip(outs, fn(*[env[n] for n in ins])))

    return run


def time_jobs(session: Session, jobs: Sequence[_Job], use_cache: bool = True, repeats: int = REPEATS) -> list[Timing]:
    """Each job's time: from the cache, else built, warmed up once and timed in :data:`REPEATS`
    interleaved rounds (the jobs compared take turns, so a load change hits them alike), median;
    estimated when the budget is spent or the job cannot run."""
    out: list[Timing | None] = [None] * len(jobs)
    runners: dict[int, Callable[[], Any]] = {}
    for k, job in enumerate(jobs):
        hit = session.cached(job.key) if use_cache else None
        if hit is not None:
            session.counts["cached"] += 1
            STATS["cached"] += 1
            out[k] = Timing(hit, "cached")
        elif session.remaining() <= 0:
            session.budget_spent = True
            session.counts["estimated"] += 1
            out[k] = Timing(job.estimate(), "estimated", "measure budget spent")
        else:
            try:
                runner = session.runners.get(job.key) or job.build()
                runner()  # warm-up: JIT, caches, first allocations
                runners[k] = runner
            except Exception as exc:  # a candidate that cannot run here is priced by the estimate
                out[k] = _failed(session, job, exc)
    samples: dict[int, list[float]] = {k: [] for k in runners}
    for r in range(repeats):
        if r and session.remaining() <= 0:  # out of time: fewer repeats, but each job timed
            session.budget_spent = True
            break
        for k in list(runners):
            t0 = time.perf_counter()
            try:
                runners[k]()
            except Exception as exc:
                out[k] = _failed(session, jobs[k], exc)
                del runners[k]
                continue
            samples[k].append(time.perf_counter() - t0)
    for k in runners:
        seconds = statistics.median(samples[k])
        session.counts["measured"] += 1
        STATS["measured"] += 1
        session.store(jobs[k].key, seconds)
        if jobs[k].keep:
            session.runners[jobs[k].key] = runners[k]
        out[k] = Timing(seconds, "measured")
    return out  # type: ignore[return-value]  (every job has its timing by now)


def _failed(session: Session, job: _Job, exc: Exception) -> Timing:
    session.counts["failed"] += 1
    return Timing(job.estimate(), "estimated", f"could not be measured: {type(exc).__name__}: {exc}"[:300])


def region_job(session: Session, region: Region, device: str, target: Target | None,
               options: Mapping[str, Any], estimate: Callable[[], float]) -> _Job:
    """``region`` (outlined) on ``device`` (``"host"`` or its target)."""
    version = target.version if target is not None else _byoc_version()
    key = cache_key(region_hash(region, session), device, str(version), options)
    return _Job(key, estimate, lambda: _runner(session, [(region, device, options)]), device=device)


def plan_job(session: Session, parts: Sequence[tuple[Region, str]], target: Target,
             options: Mapping[str, Any], estimate: Callable[[], float]) -> _Job:
    """Several outlined regions run one after the other, each on its device (a split, end to end)."""
    content = hashlib.sha256("|".join(f"{d}:{region_hash(r, session)}" for r, d in parts).encode()).hexdigest()
    key = cache_key(content, f"plan:{target.name}", f"{target.version}|{_byoc_version()}", options)
    return _Job(key, estimate, lambda: _runner(session, [(r, d, options if d != HOST else {}) for r, d in parts]),
                device=f"plan:{target.name}")


def _byoc_version() -> str:
    from byoc._version import __version__

    return __version__


def segments(members: Sequence[int], composite_of: Mapping[int, int], weight: Sequence[float],
             max_segments: int = MAX_SEGMENTS) -> list[list[int]]:
    """``members`` (sorted node indices of a region) cut into at most ``max_segments`` contiguous
    runs of about equal ``weight``, never inside a composite pattern."""
    n = len(members)
    if n < 2 or max_segments < 2:
        return [list(members)]
    span: dict[int, tuple[int, int]] = {}
    for pos, i in enumerate(members):
        c = composite_of.get(i)
        if c is not None:
            lo, hi = span.get(c, (pos, pos))
            span[c] = (min(lo, pos), max(hi, pos))
    blocked = [False] * (n + 1)
    for lo, hi in span.values():
        for j in range(lo + 1, hi + 1):
            blocked[j] = True  # a cut before position j would split this composite
    total = sum(weight) or float(n)
    w = list(weight) if sum(weight) else [1.0] * n
    out, cur, acc = [], [], 0.0
    for pos, i in enumerate(members):
        if cur and not blocked[pos] and len(out) < max_segments - 1 and acc >= total * (len(out) + 1) / max_segments:
            out.append(cur)
            cur = []
        cur.append(i)
        acc += w[pos]
    out.append(cur)
    return out


__all__ = ["MARGIN", "MAX_SEGMENTS", "SPLIT_MARGIN", "MEASURE_BUDGET_S", "REPEATS", "STATS", "Session", "Timing", "cache_key",
           "plan_job", "random_inputs", "refine", "region_hash", "region_job", "segments", "time_jobs"]


# -- the decision per region ----------------------------------------------------------------------

@dataclass
class _Candidate:
    target: Target
    members: list[int]
    patterns: dict[int, str]
    whole: dict[str, Timing] = field(default_factory=dict)
    segs: list[list[int]] = field(default_factory=list)
    seg_times: list[dict[str, Timing]] = field(default_factory=list)
    #: the jobs timing the whole region on the target and the host
    whole_jobs: list[_Job] = field(default_factory=list)
    #: the best split: runs of (0 host / 1 target, members), its time, and what it was made of
    split: tuple[list[tuple[int, list[int]]], Timing, list[Timing]] | None = None


def _rule_verdict(p: Partitioner, target: Target, group: Sequence[int], patterns: Mapping[int, str]) -> str | None:
    """``None`` when every rule of ``target`` keeps ``group`` whole, else why not (nothing recorded)."""
    ctx = SupportContext(target.name, p.options.get(target.name, {}))
    view = p._region_view(target.name, group, patterns)
    for _, rule in p.registry.rules.get(target.name, []):
        try:
            verdict = rule.fn(view, ctx)
        except Exception as exc:
            return f"rule {rule.name!r} raised {type(exc).__name__}"
        if verdict is not None and verdict is not True:
            return f"rule {rule.name!r} does not keep it whole"
    return None


def _outlined(p: Partitioner, target: Target, group: Sequence[int], patterns: Mapping[int, str]) -> Region:
    nodes = [p.nodes[i] for i in group]
    region = Region(name=f"{target.name}_measure", target=target.name, nodes=nodes,
                    patterns={p.nodes[i].name: patterns[i] for i in group if i in patterns})
    outline(region, p.model)
    return region


def _group_jobs(p: Partitioner, session: Session, problems: _Problems, cand: _Candidate,
                group: Sequence[int]) -> tuple[list[_Job], list[str], dict[str, Timing]]:
    """Jobs timing ``group`` on the candidate's target (unless a rule refuses it), on the host and,
    for the whole region, on every other target that supports all of it and whose rules keep it;
    with the device of each job, and the devices already decided (refused)."""
    t = cand.target
    whole = list(group) == cand.members
    region = _outlined(p, t, group, cand.patterns)
    refused = None if whole else _rule_verdict(p, t, group, cand.patterns)
    jobs = [region_job(session, region, HOST, None, {}, problems.estimate(group, HOST))]
    names = [HOST]
    fixed = {} if refused is None else {t.name: Timing(math.inf, "refused", refused)}
    if refused is None:
        jobs.insert(0, region_job(session, region, t.name, t, p.options.get(t.name, {}),
                                  problems.estimate(group, t.name, t.launch_overhead)))
        names.insert(0, t.name)
    for other in (p.targets if whole else ()):
        if other.name == t.name:
            continue
        d = problems.light.devices.index(other.name)
        if any(problems.light.cost[i][d] == math.inf for i in group) or _rule_verdict(p, other, group, {}) is not None:
            continue
        jobs.append(region_job(session, _outlined(p, other, group, {}), other.name, other,
                               p.options.get(other.name, {}),
                               problems.estimate(group, other.name, other.launch_overhead)))
        names.append(other.name)
    for job in jobs:
        job.keep = whole
    return jobs, names, fixed


class _Problems:
    """The graph's placement problem: ``light`` (byoc's own model, no plugin hooks; for structure,
    bytes and where to cut) at once, the full one (``byoc_cost`` hooks) only when an estimate is
    needed, i.e. when something could not be timed."""

    def __init__(self, p: Partitioner):
        self.p = p
        self.light = p.cost_problem(hooks=False)
        self._full: Problem | None = None

    def estimate(self, group: Sequence[int], device: str, launch: float = 0.0) -> Callable[[], float]:
        members = list(group)

        def value() -> float:
            if self._full is None:
                self._full = self.p.cost_problem()
            d = self._full.devices.index(device)
            return sum(self._full.cost[i][d] for i in members) + float(launch)

        return value


def _time_groups(p: Partitioner, session: Session, problems: _Problems, cand: _Candidate,
                 groups: Sequence[Sequence[int]]) -> list[dict[str, Timing]]:
    """Every group on its devices, all timed in one interleaved batch."""
    batches = [_group_jobs(p, session, problems, cand, g) for g in groups]
    if len(groups) == 1 and groups[0] == cand.members and len(batches[0][0]) >= 2:
        cand.whole_jobs = batches[0][0][:2]  # on the target and on the host
    timings = iter(time_jobs(session, [j for jobs, _, _ in batches for j in jobs]))
    out = []
    for _, names, fixed in batches:
        times = dict(fixed)
        times.update((name, next(timings)) for name in names)
        out.append(times)
    return out


def _io_bytes(p: Partitioner, group: Sequence[int]) -> tuple[float, float]:
    from byoc.partition.costs import value_bytes
    from byoc.partition.partitioner import region_io

    inputs, outputs, _ = region_io([p.nodes[i] for i in group])
    return sum(value_bytes(v) for v in inputs), sum(value_bytes(v) for v in outputs)


def _split_plan(p: Partitioner, problem: Problem, cand: _Candidate) -> tuple[list[int], float]:
    """The best device per segment (0: host, 1: target) and its time, transfers included."""
    seg_of = {i: k for k, seg in enumerate(cand.segs) for i in seg}
    preds: list[set[int]] = [set() for _ in cand.segs]
    edge: dict[tuple[int, int], float] = {}
    in_b = [0.0] * len(cand.segs)
    out_b = [0.0] * len(cand.segs)
    for k, seg in enumerate(cand.segs):
        for i in seg:
            for q in p.preds[i]:
                b = problem.edge_bytes.get((q, i), 0.0)
                if q in seg_of and seg_of[q] != k:
                    preds[k].add(seg_of[q])
                    edge[(seg_of[q], k)] = edge.get((seg_of[q], k), 0.0) + b
                elif q not in seg_of:
                    in_b[k] += b
            in_b[k] += problem.in_bytes[i]
            out_b[k] += problem.out_bytes[i] + sum(b for (q, c), b in _out_edges(problem, i) if c not in seg_of)
    t = cand.target
    cost = [[times[HOST].seconds, times[t.name].seconds] for times in cand.seg_times]
    sub = Problem([HOST, t.name], [sorted(s) for s in preds], cost, edge, in_b, out_b, [None, t.bandwidth], [0.0, 0.0])
    return solve(sub)


def _out_edges(problem: Problem, i: int) -> list[tuple[tuple[int, int], float]]:
    succ = getattr(problem, "_succ", None)
    if succ is None:
        succ = {}
        for (q, c), b in problem.edge_bytes.items():
            succ.setdefault(q, []).append(((q, c), b))
        problem._succ = succ  # type: ignore[attr-defined]
    return succ.get(i, [])


def _alt(plan: str, seconds: float, parts: Sequence[Timing]) -> dict[str, Any]:
    sources = sorted({x.source for x in parts} - ({"refused"} if len(parts) > 1 else set()))
    notes = sorted({x.note for x in parts if x.note})
    out: dict[str, Any] = {"plan": plan, "seconds": seconds if seconds < math.inf else None,
                           "source": "+".join(sources)}
    if notes:
        out["note"] = "; ".join(notes)
    return out


def _decide(p: Partitioner, problem: Problem, cand: _Candidate) -> tuple[str, list[tuple[str, list[int]]], dict]:
    """``(chosen plan, [(device, members)], decision record)`` for one candidate region."""
    t = cand.target
    in_b, out_b = _io_bytes(p, cand.members)
    move = (in_b + out_b) / t.bandwidth if t.bandwidth else 0.0
    alts = [("whole", cand.whole[t.name].seconds + move, [cand.whole[t.name]], [(t.name, cand.members)]),
            ("host", cand.whole[HOST].seconds, [cand.whole[HOST]], [(HOST, cand.members)])]
    labels = {"whole": f"all on {t.name}", "host": f"all on {HOST}"}
    for other in p.targets:  # another target that can take the whole region
        if other.name != t.name and other.name in cand.whole:
            move2 = (in_b + out_b) / other.bandwidth if other.bandwidth else 0.0
            alts.append((f"other:{other.name}", cand.whole[other.name].seconds + move2, [cand.whole[other.name]],
                         [(other.name, cand.members)]))
            labels[f"other:{other.name}"] = f"all on {other.name}"
    shown = list(alts)
    if cand.split is not None:
        runs, timing, _ = cand.split
        named = [(t.name if d else HOST, seg) for d, seg in runs]
        if len(runs) == 1:  # the best split uses one device: shown, but not a plan of its own
            labels["split"] = (f"split in {len(cand.segs)}: every sub-region on one device, "
                               f"as all on {named[0][0]}")
        else:
            labels["split"] = f"split in {len(cand.segs)}, best mix: " + " | ".join(
                f"{len(seg)} nodes on {dev}" for dev, seg in named)
            alts.append(("split", timing.seconds, [timing], named))
        shown.append(("split", timing.seconds, [timing], named))
    fastest = min(range(len(alts)), key=lambda k: (alts[k][1], k))
    # within MARGIN of the fastest, times are noise: the simplest plan (listed first) is kept;
    # a split must win by SPLIT_MARGIN
    margin = SPLIT_MARGIN if alts[fastest][0] == "split" else MARGIN
    best = min(k for k, a in enumerate(alts) if a[1] <= alts[fastest][1] * (1 + margin))
    plan, seconds, _, groups = alts[best]
    others = [a for k, a in enumerate(alts) if k != best]
    runner = min(others, key=lambda a: a[1]) if others else None
    if best != fastest:
        why = (f"{labels[plan]} is kept: within {margin:.0%} of the fastest, {labels[alts[fastest][0]]} "
               f"({(seconds - alts[fastest][1]) * 1e3:.3f} ms more), too close to call and simpler")
    else:
        why = f"{labels[plan]} is fastest"
    if best == fastest and runner is not None and runner[1] < math.inf:
        gain = runner[1] - seconds
        why += f": {gain * 1e3:.3f} ms less than {labels[runner[0]]} (more than {margin:.0%})"
        if len({x.source for x in alts[best][2]} | {x.source for x in runner[2]}) > 1:
            why += " (compares measured with estimated times)"
    record = {"target": t.name, "nodes": [p.nodes[i].name for i in cand.members], "chosen": labels[plan],
              "alternatives": [_alt(labels[a[0]], a[1], a[2]) for a in shown], "why": why,
              "segments": len(cand.segs)}
    return plan, groups, record


def _best_split(p: Partitioner, session: Session, problem: Problem,
                cand: _Candidate) -> tuple[list[tuple[int, list[int]]], Timing, list[Timing]]:
    """The split the dynamic programme picks from the sub-regions' times; a real mix of devices is
    then timed end to end (switching devices costs what no sub-region's time shows: another
    thread pool waking up, caches, layout changes), else its time is the sum of its parts."""
    assign, total = _split_plan(p, problem, cand)
    runs: list[tuple[int, list[int]]] = []
    for d, seg in zip(assign, cand.segs):
        if runs and runs[-1][0] == d:
            runs[-1][1].extend(seg)
        else:
            runs.append((d, list(seg)))
    parts = [x for times in cand.seg_times for x in times.values()]
    sources = {x.source for x in parts} - {"refused"}
    notes = sorted({x.note for x in parts if x.note and x.source != "refused"})
    summed = "sum of its sub-regions" + (f": {'; '.join(notes)}" if notes else "")
    if len(runs) == 1:
        return runs, Timing(total, "+".join(sorted(sources)), summed), parts
    t = cand.target
    regions = [(_outlined(p, t, seg, cand.patterns), t.name if d else HOST) for d, seg in runs]
    job = plan_job(session, regions, t, p.options.get(t.name, {}), lambda: total)
    if session.cached(job.key) is not None or session.remaining() <= 0 or len(cand.whole_jobs) != 2:
        (timing,) = time_jobs(session, [job])
    else:
        # the split end to end, timed in turns with the whole region on either device: the three
        # finalists under the same load (their new times replace the whole region's in the cache)
        timing, on_target, on_host = time_jobs(session, [job] + cand.whole_jobs, use_cache=False,
                                               repeats=2 * REPEATS + 1)
        if on_target.source == "measured" and on_host.source == "measured":
            cand.whole.update({t.name: on_target, HOST: on_host})
    if timing.source == "estimated":
        timing = Timing(total, "+".join(sorted(sources)), f"{summed}; end to end: {timing.note}")
    return runs, timing, parts


def refine(p: Partitioner, session: Session) -> None:
    """Re-decide every region the priority partition formed (see the module doc); nodes given
    back to the host are freed, the kept runs become the regions."""
    if not p.placed:
        return
    problems = _Problems(p)
    problem = problems.light
    by_name = {t.name: t for t in p.targets}
    cands = [_Candidate(by_name[name], list(members), dict(patterns)) for name, members, patterns in p.placed]
    for cand in cands:  # the whole regions first: they matter most when the budget runs out
        cand.whole = _time_groups(p, session, problems, cand, [cand.members])[0]
    for cand in cands:
        d = problem.devices.index(cand.target.name)
        cand.segs = segments(cand.members, p.composite_of, [problem.cost[i][d] for i in cand.members])
        if len(cand.segs) > 1:
            cand.seg_times = _time_groups(p, session, problems, cand, cand.segs)
    for cand in cands:
        # a split needs a device for every sub-region (none where both timings failed or were refused)
        if len(cand.segs) > 1 and all(min((x.seconds for x in t.values()), default=math.inf) < math.inf
                                      for t in cand.seg_times):
            cand.split = _best_split(p, session, problem, cand)
    session.runners.clear()
    placed: list[tuple[str, list[int], dict[int, str]]] = []
    for cand in cands:
        _, groups, record = _decide(p, problem, cand)
        session.decisions.append(record)
        for dev, members in groups:
            if dev == HOST:
                continue
            if dev != cand.target.name:  # another target takes the whole region (its rules kept it)
                placed.append((dev, sorted(members), {}))
                continue
            parts = [members]
            if members != cand.members and _rule_verdict(p, cand.target, members, cand.patterns) is not None:
                parts = [seg for seg in cand.segs if seg[0] in members]  # each of these passed the rules
            for part in parts:
                placed.append((dev, sorted(part), {i: cand.patterns[i] for i in part if i in cand.patterns}))
    p.placed = placed
    p.region_of = [-1] * len(p.nodes)
    for rid, (_, members, _) in enumerate(placed):
        for i in members:
            p.region_of[i] = rid
