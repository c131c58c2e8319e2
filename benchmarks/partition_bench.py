"""Partitioning speed and per-region call overhead.

Measures ``Partitioner(...).run()`` (support verdicts, patterns, region formation, rules and
outlining; no shared passes, no codegen) for ResNet-50 from the ``onnx`` wheel and for synthetic
graphs of 1k/10k/100k elementwise nodes with a random support mask and realistic fan-in, and
the cost of one call into an offloaded region compared with running the same nodes on the host.

    python benchmarks/partition_bench.py            # full table (100k nodes takes a while)
    python benchmarks/partition_bench.py --quick    # 1k and 10k only

Exit status 1 if partitioning grows clearly super-linearly or a 10k-node graph takes over 1 s.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

import byoc
from byoc.partition.partitioner import Partitioner, ensure_node_names
from byoc.plugins import build_registry
from byoc.contract import host_callable, region_model_bytes

UNARY = ("Relu", "Neg", "Sigmoid", "Tanh")
BINARY = ("Add", "Mul")
MAC_LIKE = ("Conv", "Gemm", "MatMul", "Relu", "Add", "BatchNormalization", "MaxPool", "GlobalAveragePool",
            "AveragePool", "Flatten", "Reshape", "Sum", "Concat")


class BenchPlugin:
    """Target ``bench``: supports the listed op types, except node names in ``reject``."""

    def __init__(self, ops, reject=frozenset()):
        self.ops = tuple(ops)
        self.reject = frozenset(reject)

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("bench", version="1", device="npu"))

    @byoc.hookimpl
    def byoc_register_operators(self, register):
        reject = self.reject

        def check(node, ctx):
            return "masked out" if node.name in reject else None

        for op_type in self.ops:
            register(op_type, check if reject else None)

    @byoc.hookimpl
    def byoc_codegen(self, region, options):
        return byoc.Artifact("bench", "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, artifact, options):
        return host_callable(artifact.data)


def synthetic(n: int, seed: int = 0, width: int = 64, shape=(1, 8)) -> onnx.ModelProto:
    """A random DAG of ``n`` elementwise nodes; each binary node reads a recent value and an older one."""
    rng = random.Random(seed)
    nodes = []
    values = ["x"]
    for i in range(n):
        out = f"v{i}"
        recent = values[-1] if rng.random() < 0.7 else values[max(0, len(values) - 1 - rng.randrange(width))]
        if rng.random() < 0.35 and len(values) > 1:
            other = values[max(0, len(values) - 1 - rng.randrange(1, width))]
            nodes.append(helper.make_node(rng.choice(BINARY), [recent, other], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node(rng.choice(UNARY), [recent], [out], name=f"n{i}"))
        values.append(out)
    # every value nobody reads becomes a graph output so nothing is dead code
    used = {i for node in nodes for i in node.input}
    outs = [v for v in values[1:] if v not in used]
    graph = helper.make_graph(
        nodes, "synthetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, list(shape)) for v in outs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def prepare(model: onnx.ModelProto, passes: bool = False) -> ir.Model:
    """What ``byoc.compile`` hands the partitioner: loaded, optionally optimised, nodes named."""
    if passes:
        from byoc.frontend import load_model
        from byoc.passes import run_passes

        irm = load_model(model)
        run_passes(irm)
    else:
        irm = ir.from_proto(model)
    ensure_node_names(irm.graph)
    return irm


def time_partition(model: onnx.ModelProto, registry, repeat: int,
                   passes: bool = False) -> tuple[float, float, int, int]:
    """Best-of-``repeat`` (CPU seconds, wall seconds) of ``Partitioner(...).run()`` on a fresh IR copy each time.

    CPU time is the figure to compare: wall time also counts whatever else the machine runs.
    """
    times, walls, n_regions, n_nodes = [], [], 0, 0
    targets = registry.ordered_targets()
    options = {t.name: dict(t.options) for t in targets}
    for _ in range(repeat):
        irm = prepare(model, passes)
        n_nodes = len(irm.graph)
        gc.collect()  # garbage of the previous repetition is not this run's cost
        w0, t0 = time.perf_counter(), time.process_time()
        result = Partitioner(irm, registry, targets, options).run()
        times.append(time.process_time() - t0)
        walls.append(time.perf_counter() - w0)
        n_regions = len(result.regions)
    return min(times), min(walls), n_nodes, n_regions


def partition_table(sizes, repeat: int) -> list[tuple[str, int, int, float, float]]:
    rows = []
    from byoc.testing.zoo import load_zoo

    resnet = load_zoo("resnet50")
    reg = build_registry([("bench", BenchPlugin(MAC_LIKE))], entry_points=False)
    t, w, n, r = time_partition(resnet, reg, repeat, passes=True)
    rows.append(("resnet50", n, r, t, w))
    for size in sizes:
        model = synthetic(size, seed=size)
        rng = random.Random(size + 1)
        reject = {f"n{i}" for i in range(size) if rng.random() < 0.2}
        reg = build_registry([("bench", BenchPlugin(UNARY + BINARY, reject))], entry_points=False)
        t, w, n, r = time_partition(model, reg, repeat if size <= 10_000 else 1)
        rows.append((f"synthetic-{size // 1000}k", n, r, t, w))
    return rows


def chain(n_regions: int, offload: bool) -> onnx.ModelProto:
    """Relu/Neg alternating chain: with the bench target taking only Relu, each Relu is one region."""
    nodes = []
    prev = "x"
    for i in range(n_regions):
        nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
        nodes.append(helper.make_node("Neg", [f"r{i}"], [f"n{i}"], name=f"neg{i}"))
        prev = f"n{i}"
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def region_overhead(n_regions: int = 200, repeat: int = 30) -> tuple[float, float, int]:
    """Microseconds per region call: (offloaded run - host run) / number of regions."""
    model = chain(n_regions, True)
    reg = build_registry([("bench", BenchPlugin(("Relu",)))], entry_points=False)
    offloaded = byoc.compile(model, wait=True, registry=reg, passes=[])
    host = byoc.compile(model, wait=True, targets=[], passes=[])
    assert len(offloaded.regions) == n_regions, len(offloaded.regions)
    feeds = {"x": np.ones((1, 4), np.float32)}
    for cm in (offloaded, host):  # warm up (JIT)
        cm.run(feeds)

    def best(cm):
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            cm.run(feeds)
            samples.append(time.perf_counter() - t0)
        return min(samples)  # the least disturbed run

    t_off, t_host = best(offloaded), best(host)
    return (t_off - t_host) / n_regions * 1e6, t_host / (2 * n_regions) * 1e6, n_regions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 100k-node graph")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rows = partition_table(sizes, args.repeat)
    print(f"{'graph':<16}{'nodes':>9}{'regions':>9}{'CPU s':>10}{'wall s':>10}{'CPU us/node':>13}")
    for name, n, r, t, w in rows:
        print(f"{name:<16}{n:>9}{r:>9}{t:>10.4f}{w:>10.4f}{t / n * 1e6:>13.1f}")
    synth = [(n, t) for name, n, _, t, _ in rows if name.startswith("synthetic")]
    ok = True
    for (n0, t0), (n1, t1) in zip(synth, synth[1:]):
        growth = (t1 / t0) / (n1 / n0)
        print(f"growth {n0}->{n1} nodes: time x{t1 / t0:.1f} for size x{n1 / n0:.0f} "
              f"(per-node ratio {growth:.2f}; 1.0 = linear)")
        ok &= growth < 2.0
    t10k = next((t for n, t in synth if n == 10_000), None)
    if t10k is not None and t10k >= 1.0:
        print(f"FAIL: 10k-node graph took {t10k:.3f} CPU s (limit 1 s)")
        ok = False
    per_call, host_per_node, k = region_overhead()
    print(f"region call overhead: {per_call:.1f} us per region call over host ({k} one-node regions; "
          f"host step {host_per_node:.1f} us/node)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
