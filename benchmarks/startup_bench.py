"""Time to first result: byoc compile and first-run times next to onnxruntime session creation.

The table of issue 19, re-measured:

* warm compile (same process, caches warm, median of ``--repeats``): ResNet-50 on the host and
  with the ``cpu`` target, VGG-19 on the host; onnxruntime's session creation beside them;
* fresh install: a new process with an empty ``NUMBA_CACHE_DIR`` (and an empty byoc-cpu cache)
  compiles ResNet-50 and runs it once (median of ``--cold-repeats`` processes, the rows
  interleaved), with the default helper processes and with the other choice (one helper where
  the default is none, else none); the CPU time of helper processes is reported apart
  (``helper_processes_cpu``); each row also gives the number of Numba compilations (nested ones included);
* after ``byoc warmup``: the same in a new process whose empty cache was first filled by
  ``byoc warmup``.

Each figure is wall time, with the CPU time of the process beside it (on a shared, busy
machine the CPU time is the steadier of the two).

    python benchmarks/startup_bench.py                  # everything (a few minutes)
    python benchmarks/startup_bench.py --warm-only      # only the in-process figures
    python benchmarks/startup_bench.py --cold-only      # only the fresh-install rows
    python benchmarks/startup_bench.py --first-run-only # compile + first run with the current cache,
                                                        # and the CPU seconds of each Numba compilation
    python benchmarks/startup_bench.py --cpu-models densenet121,alexnet  # fresh-install cpu rows for these too
    python benchmarks/startup_bench.py --cold-only --model bert-base.onnx --shape sequence=128 --demo
    python benchmarks/startup_bench.py --json out.json

Fresh-install rows report ``compile_and_first_run`` (what a user waits for: with byoc-cpu a first
tier answers while its compiled code builds in the background) and ``until_full_speed`` (compile,
first run and ``CompiledModel.wait()``: until the compiled code serves).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

#: run in a fresh process: import byoc, compile the model, run it once; prints one JSON line
_CHILD = r"""
import json, resource, sys, time
def helpers_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
from numba.core import event
jit_log, started = [], {}
class Compiles(event.Listener):  # CPU seconds of each Numba compilation, top level and nested
    def on_start(self, ev):
        started[id(ev.data["dispatcher"])] = time.process_time()
    def on_end(self, ev):
        d = ev.data["dispatcher"]
        jit_log.append([f"{d.py_func.__module__}.{d.py_func.__qualname__}", time.process_time() - started.pop(id(d))])
event.register("numba:compile", Compiles())
w0, c0 = time.perf_counter(), time.process_time()
import byoc
from byoc.testing.zoo import load_zoo, zoo_inputs
w1, c1 = time.perf_counter(), time.process_time()
import onnx
model = onnx.load(sys.argv[1]) if sys.argv[1].endswith(".onnx") else load_zoo(sys.argv[1])
feeds = zoo_inputs(model, shapes=json.loads(sys.argv[3]))
targets = None if sys.argv[2] == "default" else [t for t in sys.argv[2].split(",") if t]
w2, c2 = time.perf_counter(), time.process_time()
compiled = byoc.compile(model, targets=targets)
w3, c3 = time.perf_counter(), time.process_time()
compiled.run(feeds)
w4, c4 = time.perf_counter(), time.process_time()
compiled.wait()  # the compiled code, when a first tier answered the first run
w5, c5 = time.perf_counter(), time.process_time()
print(json.dumps({"import": [w1 - w0, c1 - c0], "compile": [w3 - w2, c3 - c2], "first_run": [w4 - w3, c4 - c3],
                  "compile_and_first_run": [w4 - w2, (c4 - c3) + (c3 - c2)],
                  "until_full_speed": [w5 - w2, c5 - c2],
                  "helper_processes_cpu": [0.0, helpers_cpu()], "numba_compiles": len(jit_log),
                  "numba_compiles_cpu": sorted(jit_log, key=lambda c: -c[1])}))
"""


def _median_pair(samples: list[list[float]]) -> list[float]:
    return [statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)]


def warm_compile(name: str, targets: list[str], repeats: int) -> list[float]:
    """Median [wall, cpu] seconds of ``byoc.compile`` with warm caches, in this process."""
    import byoc
    from byoc.testing.zoo import load_zoo, zoo_inputs

    model = load_zoo(name)
    byoc.compile(model, targets=targets, wait=True).run(zoo_inputs(model))  # kernels and plugin caches warm
    samples = []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        byoc.compile(model, targets=targets)
        samples.append([time.perf_counter() - w, time.process_time() - c])
    return _median_pair(samples)


def ort_session(name: str, repeats: int) -> list[float]:
    import onnxruntime as ort

    from byoc.testing.zoo import load_zoo

    data = load_zoo(name).SerializeToString()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    samples = []
    for _ in range(repeats + 1):
        w, c = time.perf_counter(), time.process_time()
        ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        samples.append([time.perf_counter() - w, time.process_time() - c])
    return _median_pair(samples[1:])


#: symbolic dimension sizes of the ``--model`` files' inputs (``--shape``)
_SHAPES: dict[str, int] = {}


def _child(name: str, targets: list[str] | None, env: dict[str, str]) -> dict:
    """``targets``: ``None`` for byoc's default selection."""
    out = subprocess.run([sys.executable, "-c", _CHILD, name, "default" if targets is None else ",".join(targets),
                          json.dumps(_SHAPES)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fresh_env(folder: str) -> dict[str, str]:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = os.path.join(folder, "numba")
    env["BYOC_CPU_CACHE"] = os.path.join(folder, "byoc-cpu")
    return env


def fresh_install(name: str, targets: list[str] | None, repeats: int, warm_first: bool, helpers: str | None = None,
                  extra_env: dict[str, str] | None = None) -> dict:
    """Compile + first run in new processes with empty caches (optionally filled by ``byoc warmup``);
    ``helpers``: ``BYOC_JIT_HELPERS`` for the run (``None``: the default); ``extra_env``: more
    variables for the child."""
    rows, warmups = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="byoc-startup-") as folder:
            env = _fresh_env(folder)
            env.update(extra_env or {})
            if helpers is not None:
                env["BYOC_JIT_HELPERS"] = helpers
            if warm_first:
                w = time.perf_counter()
                subprocess.run([sys.executable, "-m", "byoc.cli", "warmup", *(f"--target={t}" for t in targets)],
                               env=env, check=True, capture_output=True)
                warmups.append(time.perf_counter() - w)
            rows.append(_child(name, targets, env))
    out = {key: _median_pair([r[key] for r in rows]) for key in rows[0] if key not in ("numba_compiles_cpu", "numba_compiles")}
    out["numba_compiles"] = statistics.median(r["numba_compiles"] for r in rows)
    if warmups:
        out["warmup_wall"] = statistics.median(warmups)
    return out


def _fmt(pair: list[float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.2f} s (cpu {pair[1]:.2f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-r", "--repeats", type=int, default=5, help="warm compiles per row (median)")
    parser.add_argument("--cold-repeats", type=int, default=1, help="fresh processes per cold row (median)")
    parser.add_argument("--warm-only", action="store_true", help="only the in-process warm figures")
    parser.add_argument("--cold-only", action="store_true", help="only the fresh-install and after-warmup rows")
    parser.add_argument("--first-run-only", action="store_true",
                        help="only compile + first run of ResNet-50 in a new process with the current caches")
    parser.add_argument("--cpu-models", default="", metavar="NAMES",
                        help="comma-separated zoo models with a fresh-install cpu row each too (e.g. densenet121,alexnet)")
    parser.add_argument("--model", action="append", default=[], metavar="FILE.onnx",
                        help="fresh-install rows (default targets, host) for this model file too; repeatable "
                             "(a transformer: benchmarks/export_transformer.py)")
    parser.add_argument("--shape", action="append", default=[], metavar="DIM=SIZE",
                        help="a symbolic dimension's size in the --model files' feeds (others are 1), "
                             "e.g. --shape sequence=128")
    parser.add_argument("--demo", action="store_true",
                        help="also time examples/demo.py as a whole in a new process with empty caches")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    for item in args.shape:
        dim, _, size = item.partition("=")
        _SHAPES[dim] = int(size)

    results: dict = {}
    if args.first_run_only:
        results["resnet50 host, current caches"] = _child("resnet50", [], dict(os.environ))
        print(json.dumps(results, indent=1))
        return 0
    rows = []
    warm_rows = () if args.cold_only else (("ResNet-50, host", "resnet50", []), ("ResNet-50, cpu", "resnet50", ["cpu"]),
                                           ("VGG-19, host", "vgg19", []))
    for label, name, targets in warm_rows:
        try:
            fig = warm_compile(name, targets, args.repeats)
        except Exception as exc:  # e.g. byoc-cpu not installed
            print(f"{label}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        ort = ort_session(name, args.repeats) if not targets else None
        rows.append((f"`byoc.compile`, warm, {label}", fig, ort))
        results[f"warm compile {label}"] = {"byoc": fig, "onnxruntime_session": ort}
    if not args.warm_only:
        from byoc_cpu.host.jithelpers import helper_count

        other = "0" if helper_count() else "1"  # the default against the other choice
        r50 = "ResNet-50"
        ref = {"BYOC_HOST_EXECUTOR": "reference"}
        # "host": targets=[] (byoc-cpu's host executor where byoc-cpu is installed); "reference":
        # the core's reference kernels (what a core-only install runs)
        cold = [(r50, "fresh install, host", [], False, None, None),
                (r50, "fresh install, host, reference kernels", [], False, None, ref),
                (r50, f"fresh install, host, BYOC_JIT_HELPERS={other}", [], False, other, None),
                (r50, "fresh install, cpu", ["cpu"], False, None, None),
                (r50, "after `byoc warmup`, host", [], True, None, None)]
        cold += [(m, "fresh install, cpu", ["cpu"], False, None, None) for m in args.cpu_models.split(",") if m]
        for path in args.model:
            cold += [(path, "fresh install, default targets", None, False, None, None),
                     (path, "fresh install, host", [], False, None, None)]
        figs: dict[tuple[str, str], list[dict]] = {(m, label): [] for m, label, *_ in cold}
        for _ in range(args.cold_repeats):  # interleaved: one of each per round
            for model, label, targets, warm_first, helpers, extra in cold:
                name = "resnet50" if model == r50 else model
                figs[model, label].append(fresh_install(name, targets, 1, warm_first, helpers, extra))
        for model, label, *_ in cold:
            runs = figs[model, label]
            fig = {key: _median_pair([r[key] for r in runs]) for key in runs[0]
                   if key not in ("warmup_wall", "numba_compiles_cpu", "numba_compiles")}
            fig["numba_compilations"] = statistics.median(r["numba_compiles"] for r in runs)
            if "warmup_wall" in runs[0]:
                fig["warmup_wall"] = statistics.median(r["warmup_wall"] for r in runs)
            rows.append((f"{model} compile + first run, {label}", fig["compile_and_first_run"], None))
            rows.append((f"{model} until full speed, {label}", fig["until_full_speed"], None))
            results[f"{model} {label}"] = fig
    if args.demo:
        with tempfile.TemporaryDirectory(prefix="byoc-startup-") as folder:
            demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "demo.py")
            w, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, demo], env=_fresh_env(folder), check=True, capture_output=True)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            fig = [time.perf_counter() - w, (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)]
        rows.append(("examples/demo.py as a whole, fresh install (no pip install)", fig, None))
        results["demo"] = fig
    print("| step | byoc (wall, cpu) | onnxruntime session |")
    print("|---|---|---|")
    for label, fig, ort in rows:
        print(f"| {label} | {_fmt(fig)} | {_fmt(ort)} |")
    for key, fig in results.items():
        if "compile_and_first_run" in fig:
            parts = ", ".join(f"{k} {_fmt(v)}" for k, v in fig.items() if isinstance(v, list))
            extra = f", {fig['numba_compilations']:g} Numba compilations (nested ones included)"
            extra += f", warmup {fig['warmup_wall']:.1f} s" if "warmup_wall" in fig else ""
            print(f"  {key}: {parts}{extra}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
