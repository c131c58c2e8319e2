"""``byoc warmup``: fill the Numba cache for the common host kernels, once.

byoc's host kernels are Numba functions compiled on first use and cached on disk (in
``NUMBA_CACHE_DIR``, else next to the installed package). After a fresh install the first run
of a model compiles every kernel it touches, which takes seconds. :func:`warmup` compiles the
common ones ahead of time by running one small model per kernel family through the normal
compile-and-run path, so the cached signatures are exactly those real models use (float32
tensors; the convolution, pooling, GEMM and elementwise paths of the model-zoo networks). A
deployment image or a CI cache can carry the result: run ``byoc warmup`` after installing.

Progress goes to stderr, one line per family. With ``jobs > 1`` the families compile in
parallel worker processes (Numba compiles under the interpreter lock, so threads would not
help); the parent then runs every family once more, which loads from the cache and compiles
whatever a worker could not store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h

from byoc.compiler import compile as byoc_compile
from byoc.errors import ByocError, OptionError

_F = TensorProto.FLOAT


def _rand(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


class _Builder:
    """A tiny helper to write one float32 model: nodes, weights, one input, several outputs."""

    def __init__(self, name: str, x_shape: Sequence[int], seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.outputs: list[str] = []
        self.x_shape = list(x_shape)
        self.more_inputs: dict[str, list[int]] = {}  # further float32 inputs: name -> shape
        self._n = 0

    def w(self, shape, positive: bool = False) -> str:
        self._n += 1
        name = f"w{self._n}"
        arr = _rand(self.rng, shape)
        self.inits.append(onnx.numpy_helper.from_array(np.abs(arr) + 0.5 if positive else arr * 0.1, name))
        return name

    def ints(self, values) -> str:
        self._n += 1
        name = f"i{self._n}"
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], out: bool = True, n_out: int = 1, **attrs) -> str:
        self._n += 1
        outs = [f"t{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(h.make_node(op_type, list(inputs), outs, name=f"{op_type.lower()}{self._n}", **attrs))
        if out:
            self.outputs.extend(outs)
        return outs[0]

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, pad: int = 0, group: int = 1,
             bias: bool = True, out: bool = True) -> str:
        inputs = [x, self.w([c_out, c_in // group, k, k])] + ([self.w([c_out])] if bias else [])
        return self.op("Conv", inputs, out=out, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                       group=group)

    def model(self) -> onnx.ModelProto:
        inputs = [h.make_tensor_value_info(n, _F, shape) for n, shape in {"x": self.x_shape, **self.more_inputs}.items()]
        graph = h.make_graph(self.nodes, self.name, inputs,
                             [h.make_tensor_value_info(o, _F, None) for o in self.outputs], initializer=self.inits)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])


def _conv() -> onnx.ModelProto:
    b = _Builder("warmup_conv", [1, 8, 32, 32])
    shapes = [
        dict(c_out=16, k=7, stride=2, pad=3),  # ResNet stem
        dict(c_out=16, k=11, stride=4, pad=2),  # AlexNet stem
        dict(c_out=16, k=1),  # pointwise (a GEMM)
        dict(c_out=16, k=1, stride=2, bias=False),
        dict(c_out=16, k=3, pad=1),
        dict(c_out=16, k=3, stride=2, pad=1),
        dict(c_out=16, k=3),
        dict(c_out=16, k=5, pad=2),
        dict(c_out=8, k=3, pad=1, group=8),  # depthwise
        dict(c_out=16, k=1, group=4),  # grouped pointwise (ShuffleNet)
    ]
    for kw in shapes:
        b.conv("x", 8, **kw)
    # the convolution picks its loops by channels and plane size too (Winograd, shifted and
    # phase-plane GEMMs from 16 channels; column blocks from 256 output columns per thread,
    # which 64x64 outputs give 16 threads): ResNet-like layers on a large and a small plane
    b.more_inputs = {"x_large": [1, 32, 128, 128], "x_small": [1, 32, 16, 16], "x_deep": [1, 32, 7, 7]}
    # a 7x7 map into 32 channels: the narrow GEMM form (pointwise, and shifted with its padding columns)
    for kw in (dict(c_out=32, k=1), dict(c_out=32, k=3, pad=1)):
        b.conv("x_deep", 32, **kw)
    for x in ("x_large", "x_small"):
        for kw in (dict(c_out=16, k=7, stride=2, pad=3), dict(c_out=16, k=3, stride=2, pad=1),
                   dict(c_out=16, k=3, pad=1), dict(c_out=16, k=5, pad=2), dict(c_out=16, k=1, stride=2, bias=False),
                   dict(c_out=16, k=1)):
            y = b.conv(x, 32, **kw)
            if kw["k"] > 1:  # and with folded (writable) weights
                b.outputs.remove(y)
                b.op("BatchNormalization", [y, b.w([16], True), b.w([16]), b.w([16]), b.w([16], True)])
    # the channel-blocked kernel's wide form (AVX-512 at full rate: output channels in blocks of
    # 32), stride 1 and over stride phases (elsewhere these take the 8-wide form, as the 16s above)
    for x in ("x_large", "x_small"):
        for kw in (dict(c_out=32, k=3, pad=1), dict(c_out=32, k=3, stride=2, pad=1)):
            b.conv(x, 32, **kw)
    _blocks(b)
    # the same again followed by BatchNormalization: folding gives writable weights, which
    # Numba compiles separately from the read-only ones the frontend hands out
    for kw in shapes:
        y = b.conv("x", 8, **kw)
        c = kw["c_out"]
        b.outputs.remove(y)
        b.op("BatchNormalization", [y, b.w([c], True), b.w([c]), b.w([c]), b.w([c], True)])
    return b.model()


def _blocks(b: _Builder) -> None:
    """ResNet-like blocks as they are after BatchNormalization folding (Conv with bias, Relu, a
    residual Add), on the large and the small input, only the block's end an output: a plugin
    target then caches the fused epilogues such models run (byoc-cpu shares one compiled loop
    between every region that runs the same loop body)."""
    for x in b.more_inputs:
        # 32 channels and more: the blocked kernel's wide form where it runs (which applies the
        # Relu and the residual Add as it stores), its 8-wide form elsewhere
        y = b.op("Relu", [b.conv(x, 32, 32, 1, out=False)], out=False)
        y = b.op("Relu", [b.conv(y, 32, 32, 3, pad=1, out=False)], out=False)
        y = b.op("Relu", [b.conv(y, 32, 32, 3, stride=2, pad=1, out=False)], out=False)
        y = b.conv(y, 32, 64, 1, out=False)
        b.op("Relu", [b.op("Add", [y, b.conv(x, 32, 64, 1, stride=2, out=False)], out=False)])


def _pool() -> onnx.ModelProto:
    b = _Builder("warmup_pool", [1, 8, 32, 32])
    b.op("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.op("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2])
    b.op("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    b.op("MaxPool", ["x"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b.op("AveragePool", ["x"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b.op("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2])
    b.op("AveragePool", ["x"], kernel_shape=[7, 7], strides=[1, 1])
    b.op("GlobalAveragePool", ["x"])
    b.op("GlobalMaxPool", ["x"])
    return b.model()


def _gemm() -> onnx.ModelProto:
    b = _Builder("warmup_gemm", [2, 64])
    b.op("Gemm", ["x", b.w([32, 64]), b.w([32])], transB=1)
    b.op("Gemm", ["x", b.w([64, 32]), b.w([32])])
    b.op("MatMul", ["x", b.w([64, 32])])
    r = b.op("Reshape", ["x", b.ints([2, 8, 8])], out=False)
    b.op("MatMul", [r, b.w([2, 8, 8])])
    return b.model()


def _elementwise() -> onnx.ModelProto:
    b = _Builder("warmup_elementwise", [1, 8, 16, 16])
    y = b.op("Relu", ["x"])
    for op in ("Add", "Mul", "Sub", "Div"):
        b.op(op, ["x", y])  # same shapes
        b.op(op, ["x", b.w([8, 1, 1], positive=True)])  # per-channel
        b.op(op, ["x", b.w([1], positive=True)])  # scalar
    b.op("Sum", ["x", y, y])
    b.op("Max", ["x", y])
    b.op("Min", ["x", y])
    for op in ("Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Floor", "Ceil", "Softplus", "Erf"):
        b.op(op, ["x"])
    b.op("Sqrt", [y])
    b.op("Log", [b.op("Add", [y, b.w([1], positive=True)], out=False)])
    b.op("LeakyRelu", ["x"], alpha=0.1)
    b.op("Clip", ["x", b.w([]), b.w([], positive=True)])
    b.op("HardSigmoid", ["x"])
    b.op("Pow", [y, b.w([1], positive=True)])
    return b.model()


def _activation() -> onnx.ModelProto:
    b = _Builder("warmup_activation", [2, 10, 6])
    b.op("Softmax", ["x"])
    b.op("Softmax", ["x"], axis=1)
    b.op("LogSoftmax", ["x"])
    b.op("Elu", ["x"])
    b.op("Selu", ["x"])
    b.op("PRelu", ["x", b.w([6])])
    b.op("Gelu", ["x"])
    return b.model()


def _norm() -> onnx.ModelProto:
    b = _Builder("warmup_norm", [1, 8, 12, 12])
    b.op("BatchNormalization", ["x", b.w([8], True), b.w([8]), b.w([8]), b.w([8], True)])
    b.op("LRN", ["x"], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    b.op("InstanceNormalization", ["x", b.w([8], True), b.w([8])])
    b.op("LayerNormalization", ["x", b.w([12], True), b.w([12])], axis=-1)
    return b.model()


def _reduce() -> onnx.ModelProto:
    b = _Builder("warmup_reduce", [2, 8, 6, 6])
    axes = b.ints([2, 3])
    for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        b.op(op, ["x", axes], keepdims=1)
    b.op("ReduceMean", ["x", b.ints([1])], keepdims=0)
    b.op("ArgMax", ["x"], axis=1)
    return b.model()


def _tensor() -> onnx.ModelProto:
    b = _Builder("warmup_tensor", [1, 8, 6, 6])
    y = b.op("Relu", ["x"], out=False)
    b.op("Concat", ["x", y], axis=1)
    b.op("Flatten", ["x"], axis=1)
    b.op("Reshape", ["x", b.ints([1, 4, 2, 36])])
    b.op("Transpose", ["x"], perm=[0, 2, 3, 1])
    b.op("Transpose", [b.op("Reshape", ["x", b.ints([1, 2, 4, 36])], out=False)], perm=[0, 2, 1, 3])
    b.op("Pad", ["x", b.ints([0, 0, 1, 1, 0, 0, 1, 1])])
    b.op("Slice", ["x", b.ints([1]), b.ints([5]), b.ints([2])])
    b.op("Split", ["x", b.ints([4, 4])], n_out=2, axis=1)
    b.op("Dropout", ["x"])
    b.op("Identity", ["x"])
    return b.model()


#: kernel family -> the model whose run compiles it (ResNet, VGG, Inception, DenseNet, ... paths)
FAMILIES: dict[str, Callable[[], onnx.ModelProto]] = {
    "conv": _conv,
    "pool": _pool,
    "gemm": _gemm,
    "elementwise": _elementwise,
    "activation": _activation,
    "norm": _norm,
    "reduce": _reduce,
    "tensor": _tensor,
}


@dataclass
class FamilyResult:
    family: str
    seconds: float
    compiled: int  # Numba signatures compiled, here or by helper processes (0: all from the cache)
    error: str | None = None


class _CompileCounter:
    """Counts top-level Numba compilations while installed (cache hits are not compilations)."""

    def __init__(self) -> None:
        from numba.core import event

        self._event = event
        self.count = 0
        self._depth = 0
        counter = self

        class Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                counter._depth += 1

            def on_end(self, ev: Any) -> None:
                counter._depth -= 1
                if counter._depth == 0:
                    counter.count += 1

        self._listener = Listener()

    def __enter__(self) -> _CompileCounter:
        self._event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._event.unregister("numba:compile", self._listener)


def _cache_location() -> str:
    from numba.core import config

    return config.CACHE_DIR


def run_family(name: str, targets: Sequence[str] = ()) -> FamilyResult:
    """Compile and run the model of one kernel family in this process."""
    model = FAMILIES[name]()
    rng = np.random.default_rng(1)
    feeds = {i.name: _rand(rng, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input}
    t0 = time.perf_counter()
    with _CompileCounter() as counter:
        try:
            byoc_compile(model, targets=list(targets), wait=True).run(feeds)
        except ByocError as exc:
            return FamilyResult(name, time.perf_counter() - t0, counter.count, f"{type(exc).__name__}: {exc}")
    return FamilyResult(name, time.perf_counter() - t0, counter.count)


def _in_workers(names: list[str], targets: Sequence[str], jobs: int, say: Callable[[str], None]) -> None:
    """Run each family in a worker process, ``jobs`` at a time (their results land in the shared cache)."""
    pending = list(names)
    running: list[tuple[str, subprocess.Popen, float]] = []
    code = "import sys, byoc.jitcache as w; r = w.run_family(sys.argv[1], sys.argv[2:]); sys.exit(1 if r.error else 0)"
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            proc = subprocess.Popen([sys.executable, "-c", code, name, *targets], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=os.environ.copy())
            running.append((name, proc, time.perf_counter()))
        time.sleep(0.05)
        for item in list(running):
            name, proc, t0 = item
            if proc.poll() is not None:
                running.remove(item)
                say(f"byoc warmup: {name:<12} compiled in a worker ({time.perf_counter() - t0:.1f} s)")


def warmup(
    families: Sequence[str] | None = None,
    *,
    targets: Sequence[str] = (),
    jobs: int = 1,
    progress: TextIO | None = sys.stderr,
) -> list[FamilyResult]:
    """Compile the common host kernels into the Numba cache (see the module documentation).

    :param families: kernel families to warm (default: all of :data:`FAMILIES`).
    :param targets: also compile the family models for these targets (e.g. ``["cpu"]``), so a
        plugin's own cached code is warmed too; the host kernels are warmed either way.
    :param jobs: worker processes compiling families in parallel (1: all in this process).
    :param progress: where one line per family goes (``None``: silent).
    :returns: per family: seconds, signatures compiled in this process, error if any.
    :raises OptionError: an unknown family or ``jobs < 1``.
    """
    names = list(FAMILIES) if families is None else list(families)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise OptionError(f"unknown kernel famil{'ies' if len(unknown) > 1 else 'y'} {unknown}; "
                          f"known: {list(FAMILIES)}")
    if jobs < 1:
        raise OptionError(f"jobs must be at least 1, got {jobs}")

    def say(line: str) -> None:
        if progress is not None:
            print(line, file=progress, flush=True)

    say(f"byoc warmup: {len(names)} kernel families into the Numba cache at {_cache_location()}")
    if jobs > 1 and len(names) > 1:
        _in_workers(names, targets, jobs, say)
    results = []
    for name in names:
        result = run_family(name, targets)
        results.append(result)
        status = f"FAILED: {result.error}" if result.error else (
            f"{result.compiled} signature(s) compiled" if result.compiled else "all from the cache")
        say(f"byoc warmup: {name:<12} {result.seconds:6.2f} s  {status}")
    return results


def cmd_warmup(args: Any) -> int:
    jobs = args.jobs if args.jobs is not None else 1
    results = warmup(args.family, targets=args.target or (), jobs=jobs)
    failed = [r.family for r in results if r.error]
    total = sum(r.seconds for r in results)
    print(f"byoc warmup: done in {total:.1f} s" + (f"; failed: {', '.join(failed)}" if failed else ""),
          file=sys.stderr)
    return 1 if failed else 0


def add_command(sub: Any) -> None:
    """Add ``warmup`` to the ``byoc`` sub-parsers."""
    p = sub.add_parser("warmup", help="compile the common host kernels into the Numba cache (after installing)")
    p.add_argument("--family", "-f", action="append", choices=list(FAMILIES),
                   help="a kernel family to warm (repeat; default: all)")
    p.add_argument("--target", "-t", action="append", metavar="TARGET",
                   help="also warm a plugin target's cached code (repeat), e.g. cpu")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="worker processes compiling families in parallel (default 1)")
    p.set_defaults(func=cmd_warmup)


__all__ = ["FAMILIES", "FamilyResult", "add_command", "run_family", "warmup"]
