"""PyTorch eager vs ``torch.compile`` (inductor) vs ``torch.compile(backend="byoc")``, side by side.

Models (seeded random weights, nothing downloaded): torchvision ResNet-18 and MobileNet-V3
(small) at 1x3x224x224, and a BERT-like encoder (Hugging Face ``BertModel`` from a config:
hidden 256, 4 layers, 4 heads, FFN 1024, batch 1, sequence 128, a padded attention mask).

Engines, each with the same threads (``--threads``, default 2: ``torch.set_num_threads`` and
byoc's ``BYOC_NUM_THREADS``), all under ``torch.no_grad()``:

* ``eager``: the module as it is;
* ``inductor``: ``torch.compile(model)`` with its default backend (it needs a C++ compiler;
  when it cannot compile here the row says why and the other engines go on);
* ``byoc``: ``torch.compile(model, backend="byoc", options={"targets": ["cpu"]})``.

Reported per engine: ``compile`` (seconds in the backend compiler: inductor's ``compile_fx``,
byoc's export + ``byoc.compile``), ``first call`` (the whole first call: Dynamo's trace, the
backend compile and the first run with its JIT or cache loads: what a user waits for), the
median wall time of the warm runs, timed **interleaved** (each repeat runs every engine once,
the starting engine rotating, so load from other processes hits all alike), the ratio to
eager (lower is faster) and the largest absolute difference from eager's outputs. Both
compilers keep on-disk caches (inductor's ``TORCHINDUCTOR_CACHE_DIR``, byoc's Numba kernels in
``NUMBA_CACHE_DIR``): the first run on a machine compiles far longer than later runs, so say
which one a table shows (point both variables at empty folders for a cold run). On a busy
machine multi-threaded pools collapse (docs: byoc.kernels.threads): time on a quiet one.

    python benchmarks/bench_torch.py                  # all three, 20 repeats
    python benchmarks/bench_torch.py -m resnet18 -r 50 --json torch.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import warnings

MODELS = ("resnet18", "mobilenet_v3", "bert")


def _torchvision():
    """torchvision without its C++ extension (the CPU torch wheel cannot load it; see tests/torch/torchfe.py)."""
    import torch

    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision

    torchvision._byoc_schema_lib = lib
    return torchvision


def build(name: str):
    """(module in eval mode, example inputs), seeded."""
    import torch

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name == "bert":
        import transformers

        config = transformers.BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=1024, max_position_embeddings=256)
        ids = torch.randint(0, 8000, (1, 128), generator=gen)
        mask = torch.ones(1, 128, dtype=torch.long)
        mask[0, 100:] = 0
        return transformers.BertModel(config).eval(), (ids, mask)
    tv = _torchvision().models
    model = tv.resnet18(weights=None) if name == "resnet18" else tv.mobilenet_v3_small(weights=None)
    with torch.no_grad():  # BatchNorm statistics off their defaults (MobileNet's outputs are ~1e-9 otherwise)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
            elif isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, 0.0, m.in_features ** -0.5, generator=gen)
    return model.eval(), (torch.randn(1, 3, 224, 224, generator=gen),)


def _first_tensor(out):
    import torch

    return next(t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))


def _timed_backend(backend, spent: list[float]):
    def compile_graph(gm, example_inputs, **kw):
        t0 = time.perf_counter()
        try:
            return backend(gm, example_inputs, **kw)
        finally:
            spent.append(time.perf_counter() - t0)
    return compile_graph


def engines(model, inputs) -> list[dict]:
    """One dict per engine: label, fn (or None and a note), compile_s, first_s, out."""
    import torch
    from torch._dynamo import lookup_backend

    import byoc.torch

    out = [{"label": "eager", "fn": lambda: model(*inputs), "compile_s": 0.0}]
    for label, backend in (("inductor", lookup_backend("inductor")),
                           ("byoc", functools.partial(lookup_backend("byoc"), options={"targets": ["cpu"]}))):
        spent: list[float] = []
        out.append({"label": label, "fn": torch.compile(model, backend=_timed_backend(backend, spent)), "spent": spent})
    for e in out:
        fn = e["fn"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", byoc.torch.FallbackWarning)
            t0 = time.perf_counter()
            try:
                e["out"] = _first_tensor(fn(*inputs) if e["label"] != "eager" else fn())
            except Exception as exc:  # inductor without a working C++ toolchain, say
                e["fn"], e["note"] = None, f"unavailable: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                continue
            e["first_s"] = time.perf_counter() - t0
        if "spent" in e:
            e["compile_s"] = sum(e["spent"])
            e["graphs"] = len(e["spent"])
        fallbacks = [str(w.message) for w in caught if issubclass(w.category, byoc.torch.FallbackWarning)]
        if fallbacks:
            e["note"] = f"{len(fallbacks)} graph(s) ran eagerly: {fallbacks[0][:120]}"
        if e["label"] != "eager":
            e["fn"] = functools.partial(fn, *inputs)
    return out


def bench(name: str, runs: int) -> list[dict]:
    import torch

    model, inputs = build(name)
    torch._dynamo.reset()
    with torch.no_grad():
        rows = engines(model, inputs)
        live = [e for e in rows if e["fn"] is not None]
        times: dict[str, list[float]] = {e["label"]: [] for e in live}
        for r in range(runs):
            for e in live[r % len(live):] + live[:r % len(live)]:
                t0 = time.perf_counter()
                e["fn"]()
                times[e["label"]].append(time.perf_counter() - t0)
    eager = rows[0]
    eager_ms = statistics.median(times["eager"]) * 1e3
    table = []
    for e in rows:
        row = {"model": name, "engine": e["label"], "note": e.get("note", "")}
        if e["fn"] is not None:
            ms = statistics.median(times[e["label"]]) * 1e3
            row.update(compile_s=round(e["compile_s"], 3), first_call_s=round(e["first_s"], 3), median_ms=round(ms, 3),
                       vs_eager=round(ms / eager_ms, 3), graphs=e.get("graphs", 0),
                       max_abs_diff=float((e["out"] - eager["out"]).abs().max()))
        table.append(row)
    torch._dynamo.reset()
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", action="append", choices=MODELS, help="model(s); default all three")
    parser.add_argument("-r", "--runs", type=int, default=20, help="interleaved repeats (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    os.environ["BYOC_NUM_THREADS"] = str(args.threads)  # before byoc's pool starts
    import torch

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s) per engine, interleaved median of {args.runs} "
          "(compile and first call in s, median in ms, vs eager: lower is faster)")
    print(f"{'model':<13}{'engine':<10}{'graphs':>7}{'compile':>9}{'first call':>12}{'median':>10}{'vs eager':>10}"
          f"{'max |diff|':>12}")
    rows = []
    for name in args.model or MODELS:
        for row in bench(name, args.runs):
            rows.append(row)
            if "median_ms" in row:
                print(f"{name:<13}{row['engine']:<10}{row['graphs']:>7}{row['compile_s']:>9.2f}"
                      f"{row['first_call_s']:>12.2f}{row['median_ms']:>10.2f}{row['vs_eager']:>10.2f}"
                      f"{row['max_abs_diff']:>12.2e}  {row['note']}")
            else:
                print(f"{name:<13}{row['engine']:<10}  {row['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
