"""OpenVINO through byoc vs OpenVINO called directly vs onnxruntime vs byoc-cpu vs placement="measure".

Per model, in this one process, the engines are built and run once ("cold"), then timed
**interleaved** (each repeat runs every engine once, the starting engine rotating: a load drift
from other processes hits all alike), as ``bench_models.py`` does. Every engine gets the same
number of threads (``--threads``, default 2): onnxruntime's intra-op pool (not spinning),
OpenVINO's ``INFERENCE_NUM_THREADS`` (direct and through byoc), byoc's pool
(``BYOC_NUM_THREADS``, set before byoc is imported).

Columns (median wall ms; ratio = time / onnxruntime's):

* ``ort``       onnxruntime, CPU execution provider
* ``ov``        OpenVINO called directly: read_model, compile_model("CPU", the same properties the
                plugin sets: f32, LATENCY, one stream, N threads, no pinning), one infer request
* ``byoc-ov``   ``byoc.compile(model, wait=True, targets=["openvino"])``
* ``byoc-cpu``  ``byoc.compile(model, wait=True, targets=["cpu"])``
* ``measure``   ``byoc.compile(model, wait=True, targets=["openvino", "cpu"], placement="measure")`` (the host
                takes what neither does)
* ``overhead``  byoc-ov / ov: what byoc adds on top of OpenVINO (meaningful where OpenVINO takes
                the model whole: ``whole`` says so)

    python benchmarks/bench_openvino.py                     # the nine zoo models, 15 repeats
    python benchmarks/bench_openvino.py -m resnet50 -r 30
    python benchmarks/bench_openvino.py --onnx path/to/model.onnx --json out.json

Needs byoc-openvino and byoc-cpu installed. Run it on a quiet machine: the numbers are only
comparable within one run.
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

COLUMNS = ["ort", "ov", "byoc-ov", "byoc-cpu", "measure"]


def _ov_direct(model_bytes: bytes, feeds: dict, threads: int):
    import openvino as ov

    core = ov.Core()
    props = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
             "INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": False}
    compiled = core.compile_model(core.read_model(model_bytes), "CPU", props)
    request = compiled.create_infer_request()
    names = [p.get_any_name() for p in compiled.inputs]
    ordered = [feeds[n] for n in names]
    return lambda: request.infer(ordered, share_inputs=True, share_outputs=False)[0]


def _engines(model, feeds: dict, threads: int, skip: set[str]) -> tuple[list[tuple[str, object]], dict]:
    import byoc
    from byoc.testing.oracle import ort_peer_session

    info: dict = {}
    engines: list[tuple[str, object]] = []
    t0 = time.perf_counter()
    sess = ort_peer_session(model, threads)
    info["ort_build_s"] = time.perf_counter() - t0
    engines.append(("ort", lambda: sess.run(None, feeds)[0]))
    if "ov" not in skip:
        t0 = time.perf_counter()
        engines.append(("ov", _ov_direct(model.SerializeToString(), feeds, threads)))
        info["ov_build_s"] = time.perf_counter() - t0
    builds = {"byoc-ov": dict(targets=["openvino"]), "byoc-cpu": dict(targets=["cpu"]),
              "measure": dict(targets=["openvino", "cpu"], placement="measure")}
    for label, kwargs in builds.items():
        if label in skip:
            continue
        t0 = time.perf_counter()
        compiled = byoc.compile(model, wait=True, **kwargs)
        info[f"{label}_build_s"] = time.perf_counter() - t0
        by_device = compiled.report_data()["totals"]["by_device"]
        info[f"{label}_placement"] = {d: t["nodes"] for d, t in by_device.items() if t["nodes"]}
        if label == "byoc-ov":
            info["whole"] = set(info[f"{label}_placement"]) == {"openvino"} and len(compiled.regions) == 1
        out = compiled.output_names[0]
        engines.append((label, lambda c=compiled, o=out: c.run(feeds)[o]))
    return engines, info


def bench_model(name: str, model, feeds: dict, runs: int, threads: int, skip: set[str]) -> dict:
    engines, row = _engines(model, feeds, threads, skip)
    row["model"] = name
    ref = None
    for label, fn in engines:
        t0 = time.perf_counter()
        out = np.asarray(fn())
        row[f"{label}_cold_s"] = time.perf_counter() - t0
        if ref is None:
            ref = out
        else:
            row[f"{label}_max_abs_err"] = float(np.max(np.abs(out - ref))) if out.size else 0.0
    wall: dict[str, list[float]] = {label: [] for label, _ in engines}
    for r in range(runs):
        for i in range(len(engines)):
            label, fn = engines[(r + i) % len(engines)]
            t0 = time.perf_counter()
            fn()
            wall[label].append(time.perf_counter() - t0)
    for label, _ in engines:
        row[f"{label}_s"] = statistics.median(wall[label])
        row[f"{label}_ratio"] = row[f"{label}_s"] / statistics.median(wall["ort"])
    if "ov_s" in row and "byoc-ov_s" in row:
        row["overhead"] = row["byoc-ov_s"] / row["ov_s"]
    singles = [row[f"{c}_s"] for c in ("byoc-ov", "byoc-cpu") if f"{c}_s" in row]
    if singles and "measure_s" in row:
        row["measure_vs_best_single"] = row["measure_s"] / min(singles)
    return row


def main(argv: list[str] | None = None) -> int:
    # byoc sizes its pool when its kernels are imported: set it before importing byoc
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=2)
    os.environ["BYOC_NUM_THREADS"] = str(pre.parse_known_args(argv)[0].threads)
    from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", action="append", choices=sorted(ZOO), help="zoo model(s); default all nine")
    parser.add_argument("--onnx", action="append", default=[], help="an ONNX file (repeatable; seeded random inputs)")
    parser.add_argument("-r", "--runs", type=int, default=15, help="interleaved repeats (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    parser.add_argument("--skip", action="append", default=[], choices=COLUMNS[1:], help="leave an engine out")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)

    jobs = []
    for name in (args.model or ([] if args.onnx else list(ZOO))):
        model = load_zoo(name)
        jobs.append((name, model, zoo_inputs(model)))
    for path in args.onnx:
        import onnx

        model = onnx.load(path)
        jobs.append((os.path.basename(path), model, zoo_inputs(model)))

    skip = set(args.skip)
    cols = [c for c in COLUMNS if c not in skip]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    import openvino

    print(f"byoc-openvino benchmark: OpenVINO {openvino.get_version()}, {os.cpu_count()} cores, {args.threads} "
          f"threads per engine, load {load:.1f}; interleaved, median of {args.runs} (ms; ratio = / ort)")
    head = f"{'model':<16}" + "".join(f"{c:>10}{'':>6}" for c in cols) + f"{'overhead':>10}{'whole':>7}{'meas/best':>10}"
    print(head)
    rows = []
    for name, model, feeds in jobs:
        row = bench_model(name, model, feeds, args.runs, args.threads, skip)
        rows.append(row)
        line = f"{name:<16}"
        for c in cols:
            line += f"{row[f'{c}_s'] * 1e3:>10.2f}{row[f'{c}_ratio']:>6.2f}"
        line += f"{row.get('overhead', float('nan')):>10.3f}{str(row.get('whole', '-')):>7}"
        line += f"{row.get('measure_vs_best_single', float('nan')):>10.3f}"
        print(line, flush=True)
    if len(rows) > 1:
        line = f"{'geomean':<16}"
        for c in cols:
            g = math.exp(statistics.fmean(math.log(r[f"{c}_ratio"]) for r in rows))
            line += f"{'':>10}{g:>6.2f}"
        print(line)
    for row in rows:
        placements = {k[:-10]: v for k, v in row.items() if k.endswith("_placement")}
        builds = {k[:-8]: round(v, 2) for k, v in row.items() if k.endswith("_build_s")}
        print(f"  {row['model']}: placement {placements}; build s {builds}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
