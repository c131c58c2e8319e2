"""byoc-cpu vs byoc host-only vs onnxruntime on the model-zoo architectures, interleaved.

On a shared or throttling machine, timing one engine for N runs and then the next compares
different moments. Here every round runs each engine once, in turn, in this one process, and
the medians (and minima) over the rounds are compared, so a slow moment hits all three.

Also measured per model: byoc-cpu compile time, and loading a saved bundle in a fresh process
twice — "cold" (empty cache folder: the generated modules are compiled) and "warm" (the same
folder again: Numba's cached machine code is loaded). Load times are the whole ``byoc.load``
(reading and checking the bundle: mostly decompressing the weights) with the plugin's share in
parentheses (verify the program, regenerate and compare the source, import the module from the
cache or compile it, pack the weights).

    python benchmarks/bench_cpu.py                         # all nine
    python benchmarks/bench_cpu.py -m resnet50 -r 30
    python benchmarks/bench_cpu.py --no-load --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np


def _load_child(bundle: str, cache: str) -> dict:
    """Load ``bundle`` in a fresh interpreter with ``cache`` as the cpu cache folder; time it."""
    code = (
        "import time, json, sys\n"
        "t0 = time.perf_counter()\n"
        "import byoc\n"
        "import byoc_cpu.runtime as rt\n"
        "spent = []\n"
        "real = rt.load\n"
        "def timed(*a, **k):\n"
        "    t = time.perf_counter()\n"
        "    try:\n"
        "        return real(*a, **k)\n"
        "    finally:\n"
        "        spent.append(time.perf_counter() - t)\n"
        "rt.load = timed\n"
        "t1 = time.perf_counter()\n"
        "cm = byoc.load(sys.argv[1])\n"
        "t2 = time.perf_counter()\n"
        "print(json.dumps({'import_s': t1 - t0, 'load_s': t2 - t1, 'plugin_s': sum(spent)}))\n"
    )
    env = dict(os.environ, BYOC_CPU_CACHE=cache)
    env.pop("NUMBA_CACHE_DIR", None)  # Numba's cache beside the generated files, in the folder under test
    out = subprocess.run([sys.executable, "-c", code, bundle], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_model(name: str, rounds: int, load: bool) -> dict:
    import onnxruntime as ort

    import byoc
    from byoc.testing.zoo import load_zoo, zoo_inputs

    model = load_zoo(name)
    feeds = zoo_inputs(model)
    row: dict = {"model": name}
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)[0]

    host = byoc.compile(model, wait=True, targets=[])
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = byoc.compile(model, wait=True, targets=["cpu"])
    row["cpu_compile_s"] = time.perf_counter() - t0
    row["cpu_regions"] = len(cpu.regions)
    row["cpu_nodes"] = sum(r.device == "cpu" for r in cpu.records.values())
    row["nodes"] = len(cpu.records)
    out_name = cpu.output_names[0]
    got = cpu.run(feeds)[out_name]
    row["cpu_max_rel_err"] = float(np.max(np.abs(got - expected) / np.maximum(np.abs(expected), 1e-6)))

    engines = {
        "ort": lambda: sess.run(None, feeds),
        "host": lambda: host.run(feeds),
        "cpu": lambda: cpu.run(feeds),
    }
    for fn in engines.values():  # warm-up: first runs allocate, JIT or load caches
        fn()
        fn()
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for key, fn in engines.items():
            t0 = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - t0)
    for key, ts in samples.items():
        row[f"{key}_median_s"] = statistics.median(ts)
        row[f"{key}_min_s"] = min(ts)
    row["cpu_vs_host"] = row["cpu_median_s"] / row["host_median_s"]
    row["cpu_vs_ort"] = row["cpu_median_s"] / row["ort_median_s"]
    row["host_vs_ort"] = row["host_median_s"] / row["ort_median_s"]

    if load:
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, f"{name}.byoc")
            cpu.save(bundle)
            cache = os.path.join(tmp, "cache")
            cold = _load_child(bundle, cache)
            warm = _load_child(bundle, cache)
            row["load_cold_s"], row["load_warm_s"] = cold["load_s"], warm["load_s"]
            # the plugin's share: verify, regenerate, import (compile or cached machine code), pack
            row["plugin_load_cold_s"], row["plugin_load_warm_s"] = cold["plugin_s"], warm["plugin_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    from byoc_cpu.host.threads import blas_info
    from byoc.testing.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", action="append", choices=sorted(ZOO), help="model(s); default all nine")
    parser.add_argument("-r", "--rounds", type=int, default=15, help="interleaved rounds (one run per engine each)")
    parser.add_argument("--no-load", action="store_true", help="skip the bundle cold/warm load measurement")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)

    info = blas_info()
    print(f"{os.cpu_count()} cores; OpenBLAS core {info.get('openblas_core')}, {info.get('openblas_threads')} threads; "
          f"medians of {args.rounds} interleaved rounds (ms)")
    head = (f"{'model':<13}{'ort':>8}{'host':>8}{'cpu':>8}{'cpu/host':>9}{'cpu/ort':>8}{'host/ort':>9}"
            f"{'compile':>9}{'load cold':>16}{'load warm':>16}{'max rel err':>12}")
    print(head)
    rows = []
    for name in args.model or list(ZOO):
        row = bench_model(name, args.rounds, not args.no_load)
        rows.append(row)
        load = (f"{row['load_cold_s']:>7.2f}s ({row['plugin_load_cold_s']:.2f}s)"
                f"{row['load_warm_s']:>7.2f}s ({row['plugin_load_warm_s']:.2f}s)" if "load_cold_s" in row
                else f"{'-':>16}{'-':>16}")
        print(f"{name:<13}{row['ort_median_s'] * 1e3:>8.1f}{row['host_median_s'] * 1e3:>8.1f}"
              f"{row['cpu_median_s'] * 1e3:>8.1f}{row['cpu_vs_host']:>9.2f}{row['cpu_vs_ort']:>8.2f}"
              f"{row['host_vs_ort']:>9.2f}{row['cpu_compile_s']:>8.1f}s{load}{row['cpu_max_rel_err']:>12.1e}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"blas": info, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
