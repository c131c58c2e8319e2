"""byoc's Conv kernel against onnxruntime on ResNet-50's convolution layers, one node at a time.

Each layer is a single-node model (Conv with constant weights and bias, as after BatchNorm
folding) run through ``byoc.compile`` and through an onnxruntime session; the two are timed
interleaved and the minimum over the repetitions is reported (the minimum is the figure least
disturbed by other work on a shared machine).

    python benchmarks/conv_micro.py [--threads N] [--reps R] [--layers all|3x3|1x1]
    python benchmarks/conv_micro.py --model resnet50 [--threads N] [--reps R]

``--model NAME`` times a whole model-zoo architecture instead (byoc.testing.zoo, seeded random
weights) against onnxruntime with its default (all) graph optimisations, interleaved runs.

``--threads N`` sets byoc's pool (``BYOC_NUM_THREADS``) and onnxruntime's intra-op threads to N;
``--threads 1`` compares one core against one core, which stays meaningful on a busy machine.

``--cold MB`` writes a buffer of that many megabytes before every timed run (untimed), so that
each layer starts with its weights and buffers out of the caches, as a layer inside a whole
model does (its weights were last read one run ago); ``--cold 600`` evicts a 480 MB L3.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

# (input C, H, W), (M, C, KH, KW), stride, pad, how many times ResNet-50 has the layer
RESNET50_LAYERS = [
    ((3, 224, 224), (64, 3, 7, 7), 2, 3, 1),
    ((64, 56, 56), (64, 64, 1, 1), 1, 0, 1),
    ((64, 56, 56), (64, 64, 3, 3), 1, 1, 3),
    ((64, 56, 56), (256, 64, 1, 1), 1, 0, 4),
    ((256, 56, 56), (64, 256, 1, 1), 1, 0, 2),
    ((256, 56, 56), (128, 256, 1, 1), 1, 0, 1),
    ((128, 56, 56), (128, 128, 3, 3), 2, 1, 1),
    ((256, 56, 56), (512, 256, 1, 1), 2, 0, 1),
    ((128, 28, 28), (512, 128, 1, 1), 1, 0, 4),
    ((512, 28, 28), (128, 512, 1, 1), 1, 0, 3),
    ((128, 28, 28), (128, 128, 3, 3), 1, 1, 3),
    ((512, 28, 28), (256, 512, 1, 1), 1, 0, 1),
    ((256, 28, 28), (256, 256, 3, 3), 2, 1, 1),
    ((512, 28, 28), (1024, 512, 1, 1), 2, 0, 1),
    ((256, 14, 14), (1024, 256, 1, 1), 1, 0, 6),
    ((1024, 14, 14), (256, 1024, 1, 1), 1, 0, 5),
    ((256, 14, 14), (256, 256, 3, 3), 1, 1, 5),
    ((1024, 14, 14), (512, 1024, 1, 1), 1, 0, 1),
    ((512, 14, 14), (512, 512, 3, 3), 2, 1, 1),
    ((1024, 14, 14), (2048, 1024, 1, 1), 2, 0, 1),
    ((512, 7, 7), (2048, 512, 1, 1), 1, 0, 3),
    ((2048, 7, 7), (512, 2048, 1, 1), 1, 0, 2),
    ((512, 7, 7), (512, 512, 3, 3), 1, 1, 2),
]


def conv_model(xshape, wshape, stride, pad, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(wshape) * np.sqrt(2.0 / np.prod(wshape[1:]))).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32) * 0.1
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[stride] * 2, pads=[pad] * 4,
                            kernel_shape=list(wshape[2:]))
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, *xshape])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = rng.standard_normal((1, *xshape)).astype(np.float32)
    return model, {"x": x}


def best_of(fn, reps, flush=None):
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        if flush is not None:
            flush()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def time_model(name: str, ort_threads: int | None, reps: int) -> None:
    import byoc
    from byoc.testing.oracle import ort_peer_session
    from byoc.testing.zoo import load_zoo, zoo_inputs

    model = load_zoo(name)
    feeds = zoo_inputs(model)
    compiled = byoc.compile(model, wait=True, targets=[])
    sess = ort_peer_session(model, ort_threads)
    ours, ref = list(compiled.run(feeds).values()), sess.run(None, feeds)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    tb, to = [], []
    for i in range(reps + 3):
        t = time.perf_counter()
        compiled.run(feeds)
        t1 = time.perf_counter()
        sess.run(None, feeds)
        t2 = time.perf_counter()
        if i >= 3:  # warm-up
            tb.append(t1 - t)
            to.append(t2 - t1)
    tb, to = np.array(tb) * 1e3, np.array(to) * 1e3
    print(f"{name}: byoc min {tb.min():.1f} ms, median {np.median(tb):.1f} ms; onnxruntime min {to.min():.1f} ms, "
          f"median {np.median(to):.1f} ms; ratio of minima {tb.min() / to.min():.2f}, "
          f"of medians {np.median(tb) / np.median(to):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="threads for OpenBLAS and onnxruntime (0: default)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", choices=["all", "3x3", "1x1"], default="all")
    ap.add_argument("--model", help="a model-zoo name (e.g. resnet50): time the whole model")
    ap.add_argument("--cold", type=int, default=0, metavar="MB",
                    help="write MB megabytes before every timed run: layers start with cold caches")
    args = ap.parse_args()
    flush = None
    if args.cold:
        junk = np.zeros(args.cold << 18, np.float32)  # MB * 2**20 bytes

        def flush() -> None:
            junk[::16] += 1.0  # one write per 64-byte line

    if args.threads:
        os.environ["BYOC_NUM_THREADS"] = str(args.threads)  # read when byoc's kernels load
    import byoc
    from byoc_cpu.host import threads
    from byoc.testing.oracle import ort_peer_session
    print("thread policy:", threads.blas_info())
    ort_threads = args.threads or None
    if args.model:
        time_model(args.model, ort_threads, max(args.reps, 10))
        return

    total_b = total_o = 0.0
    print(f"{'input':>16} {'weight':>20} s  n   byoc ms    ort ms   ratio")
    for xshape, wshape, stride, pad, count in RESNET50_LAYERS:
        k = wshape[2]
        if (args.layers == "3x3" and k == 1) or (args.layers == "1x1" and k != 1):
            continue
        model, feeds = conv_model(xshape, wshape, stride, pad)
        compiled = byoc.compile(model, wait=True, targets=[])
        sess = ort_peer_session(model, ort_threads)
        ours = compiled.run(feeds)["y"]
        ref = sess.run(None, feeds)[0]
        np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-3)
        tb = best_of(lambda c=compiled, f=feeds: c.run(f), args.reps, flush)
        to = best_of(lambda s=sess, f=feeds: s.run(None, f), args.reps, flush)
        total_b += tb * count
        total_o += to * count
        print(f"{str(xshape):>16} {str(wshape):>20} {stride} {count:2d} {tb * 1e3:9.3f} {to * 1e3:9.3f} {tb / to:7.2f}")
    print(f"ResNet-50 convolutions (weighted by count): byoc {total_b * 1e3:.2f} ms, onnxruntime {total_o * 1e3:.2f} ms,"
          f" ratio {total_b / total_o:.2f}")


if __name__ == "__main__":
    main()
