"""The main job: compile a real model with every installed target, run it, check it, explain it.

    python examples/demo.py                # ResNet-50 from the onnx wheel, seeded random weights
    python examples/demo.py -m squeezenet  # any of the nine model-zoo architectures
    python examples/demo.py --model path/to/model.onnx
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import byoc
    from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--zoo", default="resnet50", choices=sorted(ZOO), help="model-zoo architecture")
    parser.add_argument("--model", help="an ONNX file instead (inputs: seeded random data)")
    parser.add_argument("-t", "--target", action="append", help="targets in priority order (default: all installed)")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)

    import onnx

    model = onnx.load(args.model) if args.model else load_zoo(args.zoo)
    feeds = zoo_inputs(model)
    label = args.model or f"{args.zoo} (onnx wheel, seeded random weights)"
    print(f"byoc {byoc.__version__}: {label}")
    targets = byoc.list_targets()
    print("installed targets:", ", ".join(f"{t.name} {t.version} ({t.device})" for t in targets) or "none (host only)")

    t0 = time.perf_counter()
    compiled = byoc.compile(model, targets=args.target)
    print(f"compiled in {time.perf_counter() - t0:.2f} s: {compiled}")
    totals = compiled.report_data()["totals"]
    print("placement (byoc explain shows every node):")
    for device, t in totals["by_device"].items():
        print(f"  {device:<10} {t['nodes']:>5} nodes  {t['regions']:>3} regions  {100 * t['flops_share']:5.1f}% of FLOPs")
    for name, reason in compiled.options.get("skipped_targets", {}).items():
        print(f"  skipped target {name}: {reason}")
    for fault in compiled.faults:
        print(f"  fallback: {fault}")

    t0 = time.perf_counter()
    out = compiled.run(feeds)
    cold = time.perf_counter() - t0
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        out = compiled.run(feeds)
        times.append(time.perf_counter() - t0)
    print(f"latency: first run {cold * 1e3:.1f} ms, warm median {np.median(times) * 1e3:.1f} ms")

    try:
        from byoc.testing.oracle import run_onnxruntime

        expected = run_onnxruntime(model, feeds)
    except ImportError:
        print("onnxruntime not installed: skipping the comparison")
        return 0
    worst = 0.0
    for (name, got), want in zip(out.items(), expected):
        err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-6)))
        worst = max(worst, err)
        top = int(np.argmax(got.reshape(-1)))
        print(f"output {name}: {list(got.shape)}  top-1 {top}  max rel. error vs onnxruntime {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
