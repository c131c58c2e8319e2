"""What ``isolation="process"`` costs per region call: the same one-node region (Relu) on the
same target, in this process and in the isolation worker, interleaved call by call so that a
slow moment hits both; medians (and minima) per tensor size.

The target is byoc-faulty's working ``faultchip`` (install tests/plugins/byoc-faulty; the script
sets ``BYOC_FAULT=ok``; its runtime runs the region on byoc's host kernels), so the difference is
isolation's own cost: a round trip to the worker and the copies of inputs into and outputs out
of the shared segment.

    python benchmarks/bench_isolation.py                 # a 64-byte tensor and a 4 MB activation
    python benchmarks/bench_isolation.py -r 500 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from onnx import TensorProto, helper

SIZES = {"small (16 float32, 64 B)": [1, 16], "4 MB activation (1x256x64x64 float32)": [1, 256, 64, 64]}


def relu_model(shape):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-r", "--rounds", type=int, default=300, help="calls per variant and size")
    ap.add_argument("--target", default="faultchip")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.target == "faultchip":
        os.environ.setdefault("BYOC_PLUGINS", "faulty")
        os.environ.setdefault("BYOC_FAULT", "ok")
    import byoc

    results = {}
    for label, shape in SIZES.items():
        model = relu_model(shape)
        x = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        variants = {"in-process": byoc.compile(model, targets=[args.target]),
                    "isolated": byoc.compile(model, targets=[args.target],
                                             target_options={args.target: {"isolation": "process"}})}
        assert all(cm.records["relu"].device == args.target for cm in variants.values())
        np.testing.assert_array_equal(variants["in-process"].run(x)["y"], variants["isolated"].run(x)["y"])
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, cm in variants.items():
                t0 = time.perf_counter()
                cm.run(x)
                times[name].append(time.perf_counter() - t0)
        row = {name: {"median_us": statistics.median(t) * 1e6, "min_us": min(t) * 1e6} for name, t in times.items()}
        row["overhead_us"] = row["isolated"]["median_us"] - row["in-process"]["median_us"]
        results[label] = row
        print(f"{label}: in-process {row['in-process']['median_us']:.0f} us (min {row['in-process']['min_us']:.0f}), "
              f"isolated {row['isolated']['median_us']:.0f} us (min {row['isolated']['min_us']:.0f}): "
              f"+{row['overhead_us']:.0f} us per call (median of {args.rounds})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
