"""byoc vs onnxruntime on the model-zoo architectures from the onnx wheel, side by side.

Every model gets seeded random weights (``byoc.testing.zoo``). For each engine, in this one
process: compile/session time, the first run ("cold": JIT or cache load, allocations) and the
median of the following warm runs. Ratios are byoc / onnxruntime (lower is better for byoc).

    python benchmarks/bench_models.py                       # all nine, host only
    python benchmarks/bench_models.py -m resnet50 -r 20
    python benchmarks/bench_models.py --targets cpu         # a plugin target vs host vs onnxruntime
    python benchmarks/bench_models.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def _time_runs(fn, runs: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    fn()
    cold = time.perf_counter() - t0
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return cold, statistics.median(samples)


def bench_model(name: str, runs: int, target_sets: list[list[str]]) -> dict:
    import onnxruntime as ort

    import byoc
    from byoc.testing.zoo import load_zoo, zoo_inputs

    model = load_zoo(name)
    feeds = zoo_inputs(model)
    row: dict = {"model": name}

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    t0 = time.perf_counter()
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    row["ort_session_s"] = time.perf_counter() - t0
    ort_out = sess.run(None, feeds)[0]
    row["ort_cold_s"], row["ort_warm_s"] = _time_runs(lambda: sess.run(None, feeds), runs)

    for targets in target_sets:
        key = "+".join(targets) or "host"
        t0 = time.perf_counter()
        compiled = byoc.compile(model, targets=targets)
        row[f"{key}_compile_s"] = time.perf_counter() - t0
        out_name = compiled.output_names[0]
        cold, warm = _time_runs(lambda c=compiled: c.run(feeds), runs)
        out = compiled.run(feeds)[out_name]
        row[f"{key}_cold_s"], row[f"{key}_warm_s"] = cold, warm
        row[f"{key}_ratio"] = warm / row["ort_warm_s"]
        denom = np.maximum(np.abs(ort_out), 1e-6)
        row[f"{key}_max_rel_err"] = float(np.max(np.abs(out - ort_out) / denom))
        row[f"{key}_regions"] = len(compiled.regions)
    return row


def main(argv: list[str] | None = None) -> int:
    from byoc.testing.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", action="append", choices=sorted(ZOO), help="model(s); default all nine")
    parser.add_argument("-r", "--runs", type=int, default=10, help="warm runs per engine (median reported)")
    parser.add_argument("-t", "--targets", action="append", default=None,
                        help="comma-separated target list to compare besides host-only (repeatable)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)

    target_sets = [[]] + [[t for t in s.split(",") if t] for s in (args.targets or [])]
    rows = []
    names = args.model or list(ZOO)
    cols = ["+".join(t) or "host" for t in target_sets]
    print(f"byoc vs onnxruntime, {os.cpu_count()} cores, warm = median of {args.runs} runs (ms)")
    head = f"{'model':<14}{'ort cold':>10}{'ort warm':>10}"
    for c in cols:
        head += f"{c + ' cmpl':>12}{c + ' cold':>12}{c + ' warm':>12}{'ratio':>8}"
    print(head)
    for name in names:
        row = bench_model(name, args.runs, target_sets)
        rows.append(row)
        line = f"{name:<14}{row['ort_cold_s'] * 1e3:>10.1f}{row['ort_warm_s'] * 1e3:>10.1f}"
        for c in cols:
            line += (f"{row[f'{c}_compile_s'] * 1e3:>12.0f}{row[f'{c}_cold_s'] * 1e3:>12.1f}"
                     f"{row[f'{c}_warm_s'] * 1e3:>12.1f}{row[f'{c}_ratio']:>8.2f}")
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
