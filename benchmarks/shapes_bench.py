"""What a new input shape costs: the first run at each of 20 shapes against a warm run of it.

Models with symbolic input dimensions, run in a new process per engine with warm caches (a
priming process runs the same sizes first, untimed):

* ``ocr``: an OCR-like text detector built here (a strided conv backbone, a two-level feature
  pyramid with Resize, a sigmoid map at a quarter of the input), seeded random weights, input
  ``1 x 3 x H x W`` with ``H`` and ``W`` symbolic; 20 image sizes from 320 to 1280;
* ``--decoder FILE.onnx``: a decoder exported with a symbolic sequence length
  (``benchmarks/export_transformer.py gpt2-small FILE.onnx``), 20 lengths from 1 to 512.

Engines: onnxruntime, byoc with ``targets=[]`` (the host) and byoc's default targets (byoc-cpu
where installed). Each process compiles once, runs once at a size outside the list (the model's
first run is start-up's business: ``startup_bench.py``), then for each size: the first run at it
(timed), ``CompiledModel.wait()`` (a specialisation compiling in the background), and the
median of 3 warm runs. Reported per engine: the total of the 20 first runs and of 20 warm runs,
and the largest ``first - warm`` over the sizes, beside the allowance ``max(50 ms, 10% of warm)``;
for byoc, at three of the sizes, the symbolic model's warm runs against the model compiled for
that one shape (``input_shapes=``), interleaved medians of 5.

    python benchmarks/shapes_bench.py
    python benchmarks/shapes_bench.py --decoder /tmp/gpt2.onnx --json shapes.json
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

import numpy as np

OCR_SIZES = [(320 + 48 * i, 1280 - 48 * i) for i in range(20)]
DECODER_LENGTHS = [1 + round(i * 511 / 19) for i in range(20)]


def ocr_model():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def conv(x, cin, cout, k, stride, name, act=True):
        w = const(f"{name}.w", (rng.standard_normal((cout, cin, k, k)) * (2 / (cin * k * k)) ** 0.5).astype(np.float32))
        b = const(f"{name}.b", (rng.standard_normal(cout) * 0.1).astype(np.float32))
        nodes.append(helper.make_node("Conv", [x, w, b], [f"{name}.y"], kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[k // 2] * 4))
        if not act:
            return f"{name}.y"
        nodes.append(helper.make_node("Relu", [f"{name}.y"], [f"{name}.r"]))
        return f"{name}.r"

    def up(x, name, factor):
        scales = const(f"{name}.scales", np.array([1, 1, factor, factor], np.float32))
        nodes.append(helper.make_node("Resize", [x, "", scales], [f"{name}.y"], mode="nearest"))
        return f"{name}.y"

    s1 = conv(conv("x", 3, 16, 3, 2, "stem"), 16, 24, 3, 2, "s1")  # 1/4
    s2 = conv(conv(s1, 24, 48, 3, 2, "s2a"), 48, 48, 3, 1, "s2b")  # 1/8
    s3 = conv(conv(s2, 48, 96, 3, 2, "s3a"), 96, 96, 3, 1, "s3b")  # 1/16
    p3 = conv(s3, 96, 32, 1, 1, "lat3")
    nodes.append(helper.make_node("Add", [up(p3, "up3", 2), conv(s2, 48, 32, 1, 1, "lat2")], ["p2"]))
    nodes.append(helper.make_node("Add", [up("p2", "up2", 2), conv(s1, 24, 32, 1, 1, "lat1")], ["p1"]))
    head = conv(conv("p1", 32, 32, 3, 1, "head"), 32, 1, 1, 1, "prob", act=False)
    nodes.append(helper.make_node("Sigmoid", [head], ["y"]))
    graph = helper.make_graph(nodes, "ocr_det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(kind: str, size, model_inputs) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    if kind == "ocr":
        h, w = size
        return {"x": rng.standard_normal((1, 3, h, w)).astype(np.float32)}
    return {name: (rng.integers(0, 1000, (1, size)) if name == "input_ids" else np.ones((1, size))).astype(np.int64)
            for name in model_inputs}


def _child(kind: str, path: str, engine: str) -> dict:
    """One process: compile, one run at another size, then first and warm runs at every size."""
    import onnx

    model = onnx.load(path)
    names = [i.name for i in model.graph.input]
    sizes = OCR_SIZES if kind == "ocr" else DECODER_LENGTHS
    other = (256, 256) if kind == "ocr" else 600
    if engine == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(os.environ.get("BYOC_NUM_THREADS", "2"))
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

        def run(feeds):
            return session.run(None, feeds)

        def wait():
            return None
    else:
        import byoc

        compiled = byoc.compile(model, targets=[] if engine == "host" else None)
        run, wait = compiled.run, compiled.wait
    run(_feeds(kind, other, names))
    wait()
    rows = []
    for size in sizes:
        feeds = _feeds(kind, size, names)
        t = time.perf_counter()
        run(feeds)
        first = time.perf_counter() - t
        wait()
        warm = []
        for _ in range(3):
            t = time.perf_counter()
            run(feeds)
            warm.append(time.perf_counter() - t)
        rows.append({"size": size, "first": first, "warm": statistics.median(warm)})
    fixed = []
    if engine != "onnxruntime":  # the symbolic model's warm runs against the same model compiled for one shape
        for size in (sizes[0], sizes[len(sizes) // 2], sizes[-1]):
            feeds = _feeds(kind, size, names)
            one = byoc.compile(model, targets=[] if engine == "host" else None, wait=True,
                               input_shapes={name: value.shape for name, value in feeds.items()})
            one.run(feeds)
            times = {"symbolic": [], "fixed": []}
            for _ in range(5):
                for label, fn in (("symbolic", run), ("fixed", one.run)):
                    t = time.perf_counter()
                    fn(feeds)
                    times[label].append(time.perf_counter() - t)
            fixed.append({"size": size, **{k: statistics.median(v) for k, v in times.items()}})
    return {"rows": rows, "fixed": fixed}


def _measure(kind: str, path: str, engine: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, path, engine], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decoder", metavar="FILE.onnx", help="a decoder with a symbolic sequence length")
    parser.add_argument("--engines", default="onnxruntime,host,default")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0

    import onnx

    engines = [e for e in args.engines.split(",") if e]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        models = [("ocr", os.path.join(folder, "ocr.onnx"))]
        onnx.save(ocr_model(), models[0][1])
        if args.decoder:
            models.append(("decoder", args.decoder))
        for kind, path in models:
            for engine in engines:
                if engine != "onnxruntime":
                    _measure(kind, path, engine)  # priming: the caches hold this model's code afterwards
                fig = _measure(kind, path, engine)
                rows = fig["rows"]
                worst = max(rows, key=lambda r: (r["first"] - r["warm"]) - max(0.05, 0.1 * r["warm"]))
                fig.update(first_total=sum(r["first"] for r in rows), warm_total=sum(r["warm"] for r in rows),
                           worst=worst, within=all(r["first"] - r["warm"] <= max(0.05, 0.1 * r["warm"]) for r in rows))
                results[f"{kind} {engine}"] = fig
                print(f"{kind:8} {engine:12} 20 first runs {fig['first_total']:7.2f} s, 20 warm runs "
                      f"{fig['warm_total']:7.2f} s; worst first - warm {1e3 * (worst['first'] - worst['warm']):8.1f} ms "
                      f"at {worst['size']} (warm {1e3 * worst['warm']:.1f} ms); all within max(50 ms, 10%): "
                      f"{fig['within']}", flush=True)
                for f in fig["fixed"]:
                    print(f"{'':21} warm at {f['size']}: symbolic {1e3 * f['symbolic']:.1f} ms, compiled for that "
                          f"shape {1e3 * f['fixed']:.1f} ms (ratio {f['symbolic'] / f['fixed']:.3f})", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
