"""Cost-aware placement: which device runs each node, chosen over the whole DAG.

``byoc.compile(..., placement="cost")`` calls :func:`place` before regions form; the
partitioner then forms cycle-free regions (:mod:`byoc.partition.regions`) only over the nodes
given to each target, so the result is a DAG whatever the costs say.

**The objective** (what :func:`evaluate` computes and :func:`solve` minimises), for an
assignment ``dev[i]`` of every node to ``"host"`` or a target that supports it:

* each node's cost on its device: the target's ``byoc_cost`` hook on the one-node region where
  the plugin gives one, else byoc's model: estimated FLOPs (:mod:`byoc.report.flops`) over the
  device's FLOP/s plus the bytes it reads and writes over the host's memory bandwidth (the
  host's figures are byoc's own host kernels timed once per machine and cached on disk,
  :func:`host_throughput`);
* a transfer for each edge between different devices: bytes over the ``Target.bandwidth`` of
  each non-host end (host<->host, same device and ``bandwidth=None`` devices are free); graph
  inputs start on the host and graph outputs end there;
* ``Target.launch_overhead`` for each node on a target none of whose predecessors is on that
  target (each such node starts a region).

**The search** is dynamic programming over the topological order. A state is the device of
every *live* node (placed, with a consumer still to place); the objective only couples a node to
its predecessors, which are live when it is placed, so the DP is exact as long as the number of
states stays under ``beam`` (beyond it the cheapest ``beam`` states are kept: a beam search,
deterministic by cost then state). Work is ``O(nodes x states x devices x in-degree)``: linear
in graph size for a bounded frontier.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from byoc.contract.folders import atomic_write, ensure_private, read_private
from byoc.contract import environment as _env

HOST = "host"
PLACEMENTS = ("priority", "cost", "measure")
#: states kept per step; exact while the frontier's combinations stay below it
DEFAULT_BEAM = 2048


@dataclass
class Problem:
    """A placement problem on an index DAG (nodes ``0..n-1`` in topological order).

    :param devices: device names; ``devices[0]`` is the host.
    :param preds: predecessor node indices of each node.
    :param cost: ``cost[i][d]`` seconds of node ``i`` on device ``d``; ``math.inf`` where the
        device cannot take it (the host takes everything).
    :param edge_bytes: ``{(p, c): bytes}`` flowing from node ``p`` to node ``c``.
    :param in_bytes: bytes of graph inputs each node reads (they live on the host).
    :param out_bytes: bytes of graph outputs each node writes (they end on the host).
    :param bandwidth: per device, bytes/s to and from the host; ``None``: crossings are free.
    :param launch: per device, seconds per region start.
    """

    devices: list[str]
    preds: list[list[int]]
    cost: list[list[float]]
    edge_bytes: dict[tuple[int, int], float] = field(default_factory=dict)
    in_bytes: list[float] = field(default_factory=list)
    out_bytes: list[float] = field(default_factory=list)
    bandwidth: list[float | None] = field(default_factory=list)
    launch: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n, k = len(self.preds), len(self.devices)
        self.in_bytes = list(self.in_bytes) or [0.0] * n
        self.out_bytes = list(self.out_bytes) or [0.0] * n
        self.bandwidth = list(self.bandwidth) or [None] * k
        self.launch = list(self.launch) or [0.0] * k

    @property
    def n(self) -> int:
        return len(self.preds)

    def allowed(self, i: int) -> list[int]:
        return [d for d in range(len(self.devices)) if self.cost[i][d] < math.inf]

    def transfer(self, a: int, b: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to device ``b`` (through the host)."""
        if a == b or nbytes <= 0:
            return 0.0
        t = 0.0
        for d in (a, b):
            bw = self.bandwidth[d]
            if d != 0 and bw:
                t += nbytes / bw
        return t

    def step_cost(self, i: int, d: int, pred_dev: Sequence[int]) -> float:
        """Cost of placing node ``i`` on ``d`` given its predecessors' devices (``preds[i]`` order)."""
        c = self.cost[i][d] + self.transfer(0, d, self.in_bytes[i]) + self.transfer(d, 0, self.out_bytes[i])
        for p, pd in zip(self.preds[i], pred_dev):
            c += self.transfer(pd, d, self.edge_bytes.get((p, i), 0.0))
        if d != 0 and d not in pred_dev:
            c += self.launch[d]
        return c


def evaluate(problem: Problem, assign: Sequence[int]) -> float:
    """The objective of a full assignment (device index per node)."""
    total = 0.0
    for i in range(problem.n):
        total += problem.step_cost(i, assign[i], [assign[p] for p in problem.preds[i]])
    return total


def solve(problem: Problem, beam: int = DEFAULT_BEAM) -> tuple[list[int], float]:
    """``(device index per node, total cost)`` minimising :func:`evaluate` (exact under ``beam``)."""
    n = problem.n
    last_use = list(range(n))  # a node stays live until its last consumer is placed
    has_succ = [False] * n
    for c in range(n):
        for p in problem.preds[c]:
            last_use[p] = max(last_use[p], c)
            has_succ[p] = True
    live: list[int] = []
    # state: devices of the live nodes (in ``live`` order) -> (cost, back-pointer chain)
    states: dict[tuple[int, ...], tuple[float, tuple | None]] = {(): (0.0, None)}
    for i in range(n):
        pos = {v: k for k, v in enumerate(live)}
        pred_pos = [pos[p] for p in problem.preds[i]]
        keep_live = [k for k, v in enumerate(live) if last_use[v] > i]
        nxt: dict[tuple[int, ...], tuple[float, tuple | None]] = {}
        allowed = problem.allowed(i)
        for state, (cost, chain) in states.items():
            pred_dev = [state[k] for k in pred_pos]
            for d in allowed:
                c = cost + problem.step_cost(i, d, pred_dev)
                new = tuple(state[k] for k in keep_live) + ((d,) if has_succ[i] else ())
                old = nxt.get(new)
                if old is None or c < old[0]:
                    nxt[new] = (c, (d, chain))
        if len(nxt) > beam:
            nxt = dict(sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[0]))[:beam])
        states = nxt
        live = [live[k] for k in keep_live] + ([i] if has_succ[i] else [])
    best_cost, chain = min(states.values(), key=lambda v: v[0])
    assign: list[int] = []
    while chain is not None:
        assign.append(chain[0])
        chain = chain[1]
    assign.reverse()
    return assign, best_cost


# -- the host's throughput ------------------------------------------------------------------------

_HOST: tuple[float, float] | None = None
_CACHE_FILE = "host-throughput.json"
#: FLOP/s and bytes/s a cached host figure may have; outside, a miss (it would price nodes at 0 or inf s)
_PLAUSIBLE = (1e6, 1e16)


def _cache_path() -> Path:
    return _env.cache_root() / _CACHE_FILE


def _read_cache(path: Path) -> dict:
    """The cached figures, from a private folder and a regular file of bounded size only
    (byoc.contract.folders); anything else reads as empty (measured again)."""
    data = read_private(path, 1 << 20)
    try:
        table = json.loads(data) if data is not None else {}
    except (ValueError, RecursionError):
        return {}
    return table if isinstance(table, dict) else {}


def machine_fingerprint() -> str:
    """What the host's figures depend on: CPU, core count, the versions of byoc and numba, and the
    host executor that runs the host's nodes."""
    try:
        import numba

        nb = numba.__version__
    except Exception:  # pragma: no cover
        nb = "-"
    from byoc._version import __version__

    from byoc.plugins import host_executor

    try:
        executor = host_executor()
    except Exception:  # noqa: BLE001 - an unknown BYOC_HOST_EXECUTOR is reported where it is used
        executor = None
    name = "reference" if executor is None else f"{executor.plugin}:{executor.name}"
    text = f"{platform.machine()}|{platform.processor()}|{os.cpu_count()}|{__version__}|{nb}|{name}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _measure_host() -> tuple[float, float]:
    """Time byoc's own host kernels: a 3x3 Conv (FLOP/s) and a Relu over 4 MiB (bytes/s)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from byoc.contract.helpers import host_callable

    def one(node, x_shape, y_shape, inits=()):
        graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], list(inits))
        return host_callable(helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32), "w")
    conv = one(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), [1, 32, 28, 28], [1, 32, 28, 28], [w])
    relu = one(helper.make_node("Relu", ["x"], ["y"]), [1 << 20], [1 << 20])
    xc = rng.standard_normal((1, 32, 28, 28)).astype(np.float32)
    xr = rng.standard_normal(1 << 20).astype(np.float32)
    conv(xc), relu(xr)  # compile (numba's cache makes later processes fast)
    best_c = best_r = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        conv(xc)
        t1 = time.perf_counter()
        relu(xr)
        t2 = time.perf_counter()
        best_c, best_r = min(best_c, t1 - t0), min(best_r, t2 - t1)
    flops = 2.0 * 32 * 28 * 28 * 32 * 9
    return flops / max(best_c, 1e-9), 2.0 * xr.nbytes / max(best_r, 1e-9)


def host_throughput() -> tuple[float, float]:
    """``(FLOP/s, bytes/s)`` of byoc's host kernels on this machine: measured once (about a
    second, numba compiling included) and cached on disk per :func:`machine_fingerprint` in
    ``$BYOC_CACHE_DIR/host-throughput.json`` (default ``~/.cache/byoc``; plain JSON)."""
    global _HOST
    if _HOST is not None:
        return _HOST
    key, path = machine_fingerprint(), _cache_path()
    cached = _read_cache(path).get(key)
    if (isinstance(cached, list) and len(cached) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                    and _PLAUSIBLE[0] <= v <= _PLAUSIBLE[1] for v in cached)):
        _HOST = (float(cached[0]), float(cached[1]))
        return _HOST
    _HOST = _measure_host()
    try:
        table = _read_cache(path)
        table[key] = list(_HOST)
        ensure_private(path.parent)
        atomic_write(path, json.dumps(table, indent=1).encode("utf-8"))
    except OSError:
        pass  # a read-only home: measured again by the next process
    return _HOST


__all__ = ["DEFAULT_BEAM", "HOST", "PLACEMENTS", "Problem", "evaluate", "host_throughput", "machine_fingerprint", "solve"]
