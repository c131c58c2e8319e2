"""Rows/s of a bundle run locally vs on a local Ray cluster with 1 and 2 actors.

    python benchmarks/ray_bench.py [-m squeezenet] [--rows 128] [--batch-size 8] [--cpus 2]

Needs ``byoc-core[ray]`` (``tox -e ray`` has it). Reports, per setting:

* local: a loop of ``CompiledModel.run`` over the rows in this process (after one warm-up run),
  with byoc's default threads and with one thread (what a 1-CPU actor gets);
* Ray: end-to-end rows/s from ``predict`` to the last row (actor start, bundle fetch and load,
  first batch included) and steady rows/s (rows after each actor's first batch over the time
  after the first batch ended), the bundle's ``ray.put`` time and, per actor, the time to fetch
  it from the object store, to load it, and its first batch (Numba cache load included).

Every Ray run starts fresh actors; the Numba cache is warm (``NUMBA_CACHE_DIR`` of this process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import byoc
import byoc.ray
from byoc.testing.zoo import ZOO, load_zoo


def _local(bundle: Path, feeds: list[dict], threads: int | None) -> float:
    """rows/s of a local loop, in a child process so the thread count is its own."""
    env = dict(os.environ)
    if threads is not None:
        env["BYOC_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        name = next(iter(feeds[0]))
        np.save(Path(tmp) / "rows.npy", np.stack([f[name] for f in feeds]))
        code = (
            "import sys, time, numpy as np, byoc\n"
            "m = byoc.load(sys.argv[1]); rows = np.load(sys.argv[2]); name = sys.argv[3]\n"
            "m.run({name: rows[0]})\n"
            "t = time.perf_counter()\n"
            "for r in rows: m.run({name: r})\n"
            "print(len(rows) / (time.perf_counter() - t))\n"
        )
        out = subprocess.run([sys.executable, "-c", code, str(bundle), str(Path(tmp) / "rows.npy"), name],
                             env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="squeezenet", choices=sorted(ZOO))
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--targets", nargs="*", default=None, help="compile targets (default: every installed)")
    args = parser.parse_args(argv)

    import ray

    model = load_zoo(args.model, seed=0)
    tmp = tempfile.TemporaryDirectory()
    bundle = Path(tmp.name) / f"{args.model}.byoc"
    compiled = byoc.compile(model, wait=True, targets=args.targets)
    compiled.save(bundle)
    spec = compiled.inputs[0]
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((args.rows, *spec.shape), dtype=np.float32)
    feeds = [{spec.name: r} for r in rows]
    print(f"model {args.model}: bundle {bundle.stat().st_size / 1e6:.1f} MB, "
          f"regions {[(r.region.name, r.region.target) for r in compiled.regions]}, {args.rows} rows, "
          f"batch size {args.batch_size}; load average {os.getloadavg()[0]:.1f}")

    for threads in (None, 1):
        label = "default threads" if threads is None else f"{threads} thread"
        print(f"local ({label}): {_local(bundle, feeds, threads):.1f} rows/s")

    class TimedPredictor(byoc.ray.BundlePredictor):
        """Adds the actor's own timings to each row (the benchmark's probe, not part of byoc)."""

        def __call__(self, batch):
            out = super().__call__(batch)
            n = len(out["row"])
            out["t_done"] = np.full(n, time.time())
            out["pid"] = np.full(n, os.getpid())
            out["first"] = np.full(n, self.rows == n)
            for key in ("fetch_seconds", "load_seconds", "first_batch_seconds"):
                out[key] = np.full(n, getattr(self, key))
            return out

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        start = time.perf_counter()
        ref = ray.put(bundle.read_bytes())
        put_seconds = time.perf_counter() - start
        del ref
        print(f"ray.put of the bundle: {put_seconds * 1e3:.1f} ms")
        for actors in (1, 2):
            ds = ray.data.from_items([{"row": i, spec.name: rows[i]} for i in range(args.rows)])
            ds = ds.materialize()  # the input is in the object store before the clock starts
            start_wall, start = time.time(), time.perf_counter()
            out = byoc.ray.predict(ds, bundle, batch_size=args.batch_size, concurrency=actors,
                                   numba_cache_dir=os.environ.get("NUMBA_CACHE_DIR"), predictor=TimedPredictor)
            table = out.drop_columns([n for n in compiled.output_names]).to_pandas()
            total = time.perf_counter() - start
            assert sorted(table["row"]) == list(range(args.rows))
            steady = table[~table["first"]]
            first_end = table[table["first"]]["t_done"].min()
            steady_rate = len(steady) / (table["t_done"].max() - first_end) if len(steady) else float("nan")
            per_actor = table.groupby("pid").first()
            print(f"ray, {actors} actor(s): {args.rows / total:.1f} rows/s end to end ({total:.1f} s, "
                  f"first row after {first_end - start_wall:.1f} s), {steady_rate:.1f} rows/s after the first batch")
            print(f"  per actor: fetch {statistics.median(per_actor['fetch_seconds']) * 1e3:.0f} ms, "
                  f"load {statistics.median(per_actor['load_seconds']):.2f} s, "
                  f"first batch {statistics.median(per_actor['first_batch_seconds']):.2f} s "
                  f"(medians over {len(per_actor)} actor(s))")
    finally:
        ray.shutdown()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
