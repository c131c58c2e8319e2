"""The machine's sgemm roof, and how close the biggest convolutions of ResNet-50 come to it.

Roof: OpenBLAS (the library numpy ships) float32 GEMM at a large square size and at the GEMM
shapes of ResNet-50's biggest convolutions (M = output channels, K = in-channels x kernel area,
N = output pixels), with 1 and with ``--threads`` OpenBLAS threads, GFLOP/s (2 x M x K x N per
product), best of ``-r`` runs. The roof is the highest of these.

Convolutions: each of those convolutions as a one-node ONNX model (batch 1, bias), run by
onnxruntime, byoc host-only and each ``--targets`` set, interleaved round-robin, median of
``-r``; GFLOP/s and % of the roof.

    python benchmarks/sgemm_roof.py
    python benchmarks/sgemm_roof.py -t cpu -r 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

#: ResNet-50's largest convolutions by work: (name, C_in, H, W, C_out, k, stride, pad)
CONVS = [
    ("conv1 7x7/2", 3, 224, 224, 64, 7, 2, 3),
    ("res2 3x3", 64, 56, 56, 64, 3, 1, 1),
    ("res3 3x3", 128, 28, 28, 128, 3, 1, 1),
    ("res4 3x3", 256, 14, 14, 256, 3, 1, 1),
    ("res5 3x3", 512, 7, 7, 512, 3, 1, 1),
    ("res2 1x1 expand", 64, 56, 56, 256, 1, 1, 0),
    ("res4 1x1 expand", 256, 14, 14, 1024, 1, 1, 0),
]


def _gemm_shape(c, h, w, co, k, s, p):
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    return co, c * k * k, oh * ow


def _best(fn, runs):
    fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def roof(runs: int, threads: int) -> tuple[float, list[str]]:
    from byoc_cpu.host import threads as pool

    rng = np.random.default_rng(0)
    shapes = [("square 2048", 2048, 2048, 2048)] + [(n, *_gemm_shape(*g)) for n, *g in CONVS]
    lines, top = [], 0.0
    for label, m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        rates = []
        for t in (1, threads):
            pool.set_blas_threads(t)
            sec = _best(lambda a=a, b=b, c=c: np.matmul(a, b, out=c), runs)
            rates.append(2.0 * m * k * n / sec / 1e9)
        pool.set_blas_threads(1)  # byoc's policy: OpenBLAS single-threaded, byoc's pool splits
        top = max(top, *rates)
        lines.append(f"  {label:<18} M={m:<5} K={k:<5} N={n:<6} {rates[0]:7.1f} {rates[1]:7.1f}")
    return top, lines


def conv_model(c, h, w, co, k, s, p):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    wt = (rng.standard_normal((co, c, k, k)) * np.sqrt(2.0 / (c * k * k))).astype(np.float32)
    bias = rng.uniform(-0.1, 0.1, co).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def convs(runs: int, threads: int, target_sets: list[list[str]], top: float) -> list[str]:
    import byoc
    from byoc.testing.oracle import ort_peer_session

    lines = []
    for label, *g in CONVS:
        m, k, n = _gemm_shape(*g)
        model = conv_model(*g)
        x = np.random.default_rng(2).standard_normal((1, g[0], g[1], g[2]), dtype=np.float32)
        sess = ort_peer_session(model, threads)
        engines = [("ort", lambda s=sess, x=x: s.run(None, {"x": x}))]
        for targets in target_sets:
            cm = byoc.compile(model, wait=True, targets=targets)
            engines.append(("+".join(targets) or "host", lambda c=cm, x=x: c.run({"x": x})))
        times: dict[str, list[float]] = {e: [] for e, _ in engines}
        for _, fn in engines:
            fn()
        for r in range(runs):
            for i in range(len(engines)):
                e, fn = engines[(r + i) % len(engines)]
                t0 = time.perf_counter()
                fn()
                times[e].append(time.perf_counter() - t0)
        cells = []
        for e, _ in engines:
            sec = statistics.median(times[e])
            rate = 2.0 * m * k * n / sec / 1e9
            cells.append(f"{e} {sec * 1e3:6.2f} ms {rate:6.1f} GF/s {100 * rate / top:4.0f}%")
        lines.append(f"  {label:<18} " + " | ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-r", "--runs", type=int, default=10)
    parser.add_argument("-t", "--targets", action="append", default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ["BYOC_NUM_THREADS"] = str(args.threads)
    from byoc_cpu.host import threads as pool

    info = pool.blas_info()
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load {load:.1f}, OpenBLAS core {info.get('openblas_core', '?')}")
    print(f"sgemm GFLOP/s (best of {args.runs}): {'1 thr':>7} {f'{args.threads} thr':>7}")
    top, lines = roof(args.runs, args.threads)
    print("\n".join(lines))
    print(f"roof: {top:.1f} GFLOP/s")
    target_sets = [[]] + [[t for t in s.split(",") if t] for s in (args.targets or [])]
    print(f"ResNet-50 convolutions, interleaved, median of {args.runs}, % of roof:")
    print("\n".join(convs(args.runs, args.threads, target_sets, top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
