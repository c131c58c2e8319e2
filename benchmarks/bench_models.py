"""byoc vs onnxruntime on the model-zoo architectures from the onnx wheel, side by side.

Every model gets seeded random weights (``byoc.testing.zoo``). For each model, in this one
process: onnxruntime, byoc host-only and each ``--targets`` set are built, run once ("cold":
JIT or cache load, allocations), then timed **interleaved**: every repeat runs each engine once,
round-robin (ort, host, cpu, ort, host, cpu, ...; the starting engine rotates), so a load drift
from other processes hits all engines alike. Each engine gets the same number of threads
(``--threads``, default 2: onnxruntime's intra-op pool, byoc's ``BYOC_NUM_THREADS``).
onnxruntime's pool threads do not busy-wait after a run (``--ort-spin`` restores its default):
spinning, they take a core from the engine timed next, and onnxruntime measured faster without
it as well (``byoc.testing.oracle.ort_peer_session``). Reported:
median wall time, median CPU time of the process (all threads) per run, the wall ratio
byoc / onnxruntime (lower is better for byoc), and the geometric mean of the ratios.

    python benchmarks/bench_models.py                       # all nine, host only
    python benchmarks/bench_models.py -m resnet50 -r 20
    python benchmarks/bench_models.py -t cpu                # a plugin target vs host vs onnxruntime
    python benchmarks/bench_models.py -t cpu --json results.json
    python benchmarks/bench_models.py -t cpu --ort-extended  # + onnxruntime without NCHWc
    BYOC_HOST_EXECUTOR=reference python benchmarks/bench_models.py   # the core's reference kernels

The ``host`` column is ``targets=[]``: byoc-cpu's host executor where byoc-cpu is installed,
the core's reference kernels otherwise (or with ``BYOC_HOST_EXECUTOR=reference``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np


def _engines(name: str, target_sets: list[list[str]], threads: int,
             ort_extended: bool = False, ort_spin: bool = False) -> tuple[list[tuple[str, object]], dict]:
    """(label, run-callable) per engine, onnxruntime first, and the build facts."""
    import byoc
    from byoc.testing.oracle import ort_peer_session
    from byoc.testing.zoo import load_zoo, zoo_inputs

    model = load_zoo(name)
    feeds = zoo_inputs(model)
    info: dict = {"model": name}
    t0 = time.perf_counter()
    sess = ort_peer_session(model, threads, spin=ort_spin)
    info["ort_build_s"] = time.perf_counter() - t0
    engines: list[tuple[str, object]] = [("ort", lambda: sess.run(None, feeds)[0])]
    if ort_extended:
        # onnxruntime without its level-3 (layout) optimisations: no NCHWc blocked convolutions
        sess_x = ort_peer_session(model, threads, extended_only=True, spin=ort_spin)
        engines.append(("ortx", lambda: sess_x.run(None, feeds)[0]))
    for targets in target_sets:
        key = "+".join(targets) or "host"
        t0 = time.perf_counter()
        compiled = byoc.compile(model, wait=True, targets=targets)
        info[f"{key}_build_s"] = time.perf_counter() - t0
        info[f"{key}_regions"] = len(compiled.regions)
        out_name = compiled.output_names[0]
        engines.append((key, lambda c=compiled, o=out_name: c.run(feeds)[o]))
    return engines, info


def bench_model(name: str, runs: int, target_sets: list[list[str]], threads: int = 2,
                ort_extended: bool = False, ort_spin: bool = False) -> dict:
    """One row: per engine cold time, median warm wall and CPU time, ratio to onnxruntime."""
    engines, row = _engines(name, target_sets, threads, ort_extended, ort_spin)
    ref = None
    for label, fn in engines:
        t0 = time.perf_counter()
        out = fn()
        row[f"{label}_cold_s"] = time.perf_counter() - t0
        if ref is None:
            ref = out
        else:
            denom = np.maximum(np.abs(ref), 1e-6)
            row[f"{label}_max_rel_err"] = float(np.max(np.abs(out - ref) / denom))
    wall: dict[str, list[float]] = {label: [] for label, _ in engines}
    cpu: dict[str, list[float]] = {label: [] for label, _ in engines}
    for r in range(runs):
        for i in range(len(engines)):
            label, fn = engines[(r + i) % len(engines)]
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[label].append(time.perf_counter() - t0)
            cpu[label].append(time.process_time() - c0)
    for label, _ in engines:
        row[f"{label}_warm_s"] = statistics.median(wall[label])
        row[f"{label}_cpu_s"] = statistics.median(cpu[label])
    for label, _ in engines[1:]:
        row[f"{label}_ratio"] = row[f"{label}_warm_s"] / row["ort_warm_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    # byoc sizes its thread pool when its kernels are imported (any byoc import, the zoo's
    # included): read --threads and set the pool size before importing anything of byoc
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=2)
    os.environ["BYOC_NUM_THREADS"] = str(pre.parse_known_args(argv)[0].threads)
    from byoc.testing.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", action="append", choices=sorted(ZOO), help="model(s); default all nine")
    parser.add_argument("-r", "--runs", type=int, default=10, help="interleaved repeats (median reported)")
    parser.add_argument("-t", "--targets", action="append", default=None,
                        help="comma-separated target list to compare besides host-only (repeatable)")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--ort-extended", action="store_true",
                        help="also time onnxruntime without its layout optimisations (column ortx: no NCHWc "
                             "blocked convolutions), to show what its blocked layout is worth")
    parser.add_argument("--ort-spin", action="store_true",
                        help="leave onnxruntime's pool threads busy-waiting after each run (its default)")
    args = parser.parse_args(argv)

    target_sets = [[]] + [[t for t in s.split(",") if t] for s in (args.targets or [])]
    names = args.model or list(ZOO)
    cols = (["ortx"] if args.ort_extended else []) + ["+".join(t) or "host" for t in target_sets]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    from byoc.plugins import host_executor

    executor = host_executor()
    print(f"byoc vs onnxruntime, {os.cpu_count()} cores, {args.threads} threads per engine, host nodes on "
          f"{'byoc-' + executor.name + ' (host executor)' if executor else 'the reference kernels'}, onnxruntime "
          f"spinning {'on' if args.ort_spin else 'off'}, load {load:.1f}; interleaved, median of {args.runs} "
          f"(ms; cpu = process CPU time per run)")
    head = f"{'model':<14}{'ort':>9}{'ort cpu':>9}"
    for c in cols:
        head += f"{c:>9}{c + ' cpu':>10}{'ratio':>7}"
    print(head)
    rows = []
    for name in names:
        row = bench_model(name, args.runs, target_sets, args.threads, args.ort_extended, args.ort_spin)
        rows.append(row)
        line = f"{name:<14}{row['ort_warm_s'] * 1e3:>9.1f}{row['ort_cpu_s'] * 1e3:>9.1f}"
        for c in cols:
            line += f"{row[f'{c}_warm_s'] * 1e3:>9.1f}{row[f'{c}_cpu_s'] * 1e3:>10.1f}{row[f'{c}_ratio']:>7.2f}"
        print(line, flush=True)
    if len(rows) > 1:
        line = f"{'geomean':<14}{'':>18}"
        for c in cols:
            g = math.exp(statistics.fmean(math.log(r[f"{c}_ratio"]) for r in rows))
            line += f"{'':>19}{g:>7.2f}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
