"""``placement="cost"`` against ``"priority"`` and the host alone, on model-zoo architectures.

For each model: compile host-only (``targets=[]``), ``targets=["cpu"]`` by priority and by
cost; then run the three side by side in one process, interleaved, and report warm medians,
the ratio of cost to the faster of the other two, compile times and the placement itself.

    python benchmarks/placement_bench.py                    # squeezenet, resnet50
    python benchmarks/placement_bench.py -m vgg19 --runs 9

``placement="measure"`` (acceptance 3 of issue 13) is not implemented; this compares estimates.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections import Counter

import byoc
from byoc.testing.zoo import load_zoo, zoo_inputs

VARIANTS = {"host": dict(targets=[]), "cpu priority": dict(targets=["cpu"]),
            "cpu cost": dict(targets=["cpu"], placement="cost")}


def bench(name: str, runs: int) -> None:
    model = load_zoo(name)
    feeds = zoo_inputs(model, seed=1)
    compiled, compile_s = {}, {}
    for label, kwargs in VARIANTS.items():
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled[label] = byoc.compile(model, **kwargs)
        compile_s[label] = time.perf_counter() - t0
        compiled[label].run(feeds)  # first run: JIT, caches
    times: dict[str, list[float]] = {k: [] for k in compiled}
    for _ in range(runs):
        for label, cm in compiled.items():
            t0 = time.perf_counter()
            cm.run(feeds)
            times[label].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    best_other = min(med["host"], med["cpu priority"])
    print(f"\n{name}: warm medians of {runs} interleaved runs")
    for label, cm in compiled.items():
        where = Counter(r.device for r in cm.records.values())
        print(f"  {label:13s} {med[label] * 1e3:8.1f} ms   compile {compile_s[label]:6.1f} s   "
              f"{len(cm.regions):3d} regions   {dict(where)}")
    print(f"  cost / faster of host and cpu-priority: {med['cpu cost'] / best_other:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", help="zoo architecture (repeat)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    for name in args.model or ["squeezenet", "resnet50"]:
        bench(name, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
