"""The jetson plugin on a real GPU: one script, PASS/FAIL per step, a summary, about 8 minutes.

    python benchmarks/gpu_check.py                 # or: nox -s gpu
    python benchmarks/gpu_check.py --skip-install  # the pinned extra is already installed
    python benchmarks/gpu_check.py --cuda 13       # choose the extra (default: from nvidia-smi)

Steps: install byoc-jetson with the extra pinned to the driver's CUDA major (cu12: TensorRT
10.x + cuda-python 12.8+; cu13: TensorRT 10/11 + cuda-python 13), check that TensorRT and the
GPU answer, run the jetson tests with ``BYOC_REQUIRE_GPU=1`` (a GPU test that cannot run fails),
compile ResNet-50 (the onnx wheel's, seeded weights) for jetson on TensorRT, compare it with
onnxruntime within the target's tolerance, time it, and prove that a fresh process finds the
engine in the cache (its builder is made to fail: only a cache hit passes). Exit status 0 only
when every step passes. The fake-TensorRT tests prove the plumbing without a GPU; this proves it
with one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS: list[tuple[str, bool, str]] = []


def step(name: str, ok: bool, detail: str = "") -> bool:
    RESULTS.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def cuda_major() -> str | None:
    """The driver's CUDA major from nvidia-smi ("CUDA Version: 12.8"), or None."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"CUDA Version:\s*(\d+)\.", out)
    return m.group(1) if m else None


def install(cuda: str) -> bool:
    extra = f"cu{cuda}"
    r = _run([sys.executable, "-m", "pip", "install", "-q", "-e", "./core[test]",
              "-e", f"./plugins/byoc-jetson[{extra},test]"], timeout=240)
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    return step(f"install byoc-jetson[{extra}]", r.returncode == 0, " | ".join(tail))


def probe() -> bool:
    code = ("import json, importlib.metadata as md; from byoc_jetson.options import tensorrt_probe;"
            "p = tensorrt_probe(); out = {'ok': p.ok, 'reason': p.reason}\n"
            "if p.ok:\n"
            "    from byoc_jetson.tensorrt_rt import get_backend; b = get_backend()\n"
            "    out.update(tensorrt=b.version(), gpu=b.device_name(0), cc=b.compute_capability(0),\n"
            "               strongly_typed=b.strongly_typed, cuda_python=md.version('cuda-python'))\n"
            "print(json.dumps(out))")
    r = _run([sys.executable, "-c", code], timeout=120)
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return step("TensorRT and the GPU answer", False, (r.stdout + r.stderr)[-500:])
    return step("TensorRT and the GPU answer", bool(info.get("ok")), json.dumps(info))


def tests(full: bool) -> bool:
    what = ["plugins/byoc-jetson/tests"] if full else [
        "plugins/byoc-jetson/tests/test_jetson_tensorrt.py", "plugins/byoc-jetson/tests/test_jetson_fake_trt.py",
        "plugins/byoc-jetson/tests/test_jetson_cache.py", "plugins/byoc-jetson/tests/test_jetson_codegen.py"]
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *what], timeout=300,
             env={"BYOC_REQUIRE_GPU": "1"})
    last = (r.stdout.strip().splitlines() or [""])[-1]
    return step("jetson tests with BYOC_REQUIRE_GPU=1", r.returncode == 0, last)


def resnet(cache: str, runs: int) -> bool:
    import numpy as np

    import byoc
    from byoc.testing.oracle import run_onnxruntime
    from byoc.testing.zoo import load_zoo, zoo_inputs

    model = load_zoo("resnet50")
    feeds = zoo_inputs(model)
    options = {"runtime": "tensorrt", "precompile": True, "cache_dir": cache}
    t0 = time.perf_counter()
    cm = byoc.compile(model, wait=True, targets=["jetson"], target_options={"jetson": options})
    built = time.perf_counter() - t0
    paths = {r.artifact.metadata.get("runtime_path") for r in cm.regions}
    ok = step("compile ResNet-50 for jetson on TensorRT", bool(cm.regions) and paths == {"tensorrt"} and not cm.faults,
              f"{len(cm.regions)} region(s), {built:.1f} s with engine builds, faults: {[str(f) for f in cm.faults]}")
    if not ok:
        return False
    out = cm.run(feeds)
    want = run_onnxruntime(model, feeds)
    target = byoc.list_targets()
    tol = next((t for t in target if t.name == "jetson"), None)
    rtol, atol = (tol.rtol, tol.atol) if tol else (1e-2, 1e-3)
    worst, same_top = 0.0, True
    for got, exp in zip(out.values(), want):
        err = np.abs(got.astype(np.float64) - exp) - (atol + rtol * np.abs(exp))
        worst = max(worst, float(np.max(err)))
        same_top = same_top and int(np.argmax(got)) == int(np.argmax(exp))
    step("ResNet-50 outputs vs onnxruntime", worst <= 0 and same_top,
         f"worst excess over rtol {rtol}/atol {atol}: {worst:.3g} (<= 0 passes), top-1 agrees: {same_top}")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        cm.run(feeds)
        times.append(time.perf_counter() - t0)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ort_times = []
    for _ in range(max(3, runs // 4)):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ort_times.append(time.perf_counter() - t0)
    step("ResNet-50 timing", True, f"byoc jetson median {np.median(times) * 1e3:.2f} ms over {runs} runs "
                                   f"(incl. host copies), onnxruntime CPU median {np.median(ort_times) * 1e3:.1f} ms")
    return True


FRESH = r"""
import json, sys, time
import byoc
import byoc_jetson.tensorrt_rt as rt
from byoc.testing.zoo import load_zoo
def refuse(*a, **k):
    raise rt.TensorRTError("gpu_check: the builder must not run in the fresh process (cache miss)")
rt.TensorRTBackend.build = refuse
t0 = time.perf_counter()
cm = byoc.compile(load_zoo("resnet50"), wait=True, targets=["jetson"],
                  target_options={"jetson": {"runtime": "tensorrt", "precompile": True, "cache_dir": sys.argv[1]}})
print(json.dumps({"faults": [str(f) for f in cm.faults], "regions": len(cm.regions),
                  "paths": sorted({r.artifact.metadata.get("runtime_path") for r in cm.regions}),
                  "seconds": time.perf_counter() - t0}))
"""


def fresh_process_hit(cache: str) -> bool:
    r = _run([sys.executable, "-c", FRESH, cache], timeout=180)
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return step("engine cache hit from a fresh process", False, (r.stdout + r.stderr)[-500:])
    ok = not info["faults"] and info["paths"] == ["tensorrt"] and info["regions"] > 0
    return step("engine cache hit from a fresh process", ok, json.dumps(info))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda", choices=["12", "13"], help="the extra to install (default: nvidia-smi's CUDA major)")
    parser.add_argument("--skip-install", action="store_true")
    parser.add_argument("--full", action="store_true", help="the whole jetson test suite, not only the GPU-path files")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba-cache"))
    go = True
    if not args.skip_install:
        cuda = args.cuda or cuda_major()
        if cuda not in ("12", "13"):
            go = step("find the driver's CUDA major", False, f"nvidia-smi says {cuda!r}; pass --cuda 12 or 13")
        else:
            go = install(cuda)
    go = go and probe()
    if go:
        tests(args.full)
        with tempfile.TemporaryDirectory(prefix="byoc-jetson-engines-") as cache:
            try:
                if resnet(cache, args.runs):
                    fresh_process_hit(cache)
            except Exception as exc:  # a step that raises is a FAIL with its reason, not a traceback
                step("ResNet-50 on TensorRT", False, f"{type(exc).__name__}: {exc}")
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"\nsummary: {len(RESULTS) - len(failed)} of {len(RESULTS)} steps passed in "
          f"{time.perf_counter() - start:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
