"""Small models that ask an operator for a tensor past the budget, shared by the budget tests.

Every operator whose output (or work array) size is computed from attributes, input values or
a broadcast has cases here: run-time cases (the sizes arrive as feeds) and compile-time cases
(the same sizes as initializers, so constant folding meets them). Each case names the node
that must be named in the refusal.

Run as a script (``python budget_cases.py``) it measures, for every case in a fresh state, the
peak RSS growth (``VmHWM`` after a reset through ``/proc/self/clear_refs``, or ``ru_maxrss``) and
the tracemalloc peak of the refused call, and prints them as JSON; ``test_budget_memory.py``
runs it in a subprocess.
"""

from __future__ import annotations

import json
import re
import sys
import tracemalloc
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

MiB = 1 << 20
#: the budget every case runs under; each case asks for more than this
BUDGET_BYTES = 32 * MiB


def budget():
    import byoc

    return byoc.Budget(max_tensor_bytes=BUDGET_BYTES, max_total_bytes=4 * BUDGET_BYTES)


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    #: feeds for a run-time case; ``None``: the refusal happens while compiling
    feeds: dict | None
    #: the node (or input) the error must name
    names: str
    #: the byoc error class expected, by name
    error: str = "ResourceLimitError"
    tags: set = field(default_factory=set)


_NP_TO_ONNX = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float64): T.DOUBLE, np.dtype(np.int64): T.INT64,
               np.dtype(np.int8): T.INT8, np.dtype(np.uint8): T.UINT8, np.dtype(np.bool_): T.BOOL}


def _vi(name, arr):
    return h.make_tensor_value_info(name, _NP_TO_ONNX[np.asarray(arr).dtype], list(np.shape(arr)))


def _single(op: str, inputs: dict, attrs: dict | None = None, *, opset: int = 17, n_out: int = 1,
            out_type=T.FLOAT, consts: dict | None = None, name: str | None = None):
    """A model with one ``op`` node named after it; ``inputs`` become graph inputs, ``consts`` initializers."""
    name = name or op.lower()
    consts = consts or {}
    order = list(inputs) + list(consts)
    node = h.make_node(op, order, [f"y{i}" for i in range(n_out)], name=name, **(attrs or {}))
    graph = h.make_graph([node], name, [_vi(k, v) for k, v in inputs.items()],
                         [h.make_tensor_value_info(f"y{i}", out_type, None) for i in range(n_out)],
                         [nh.from_array(np.asarray(v), k) for k, v in consts.items()])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def _both(id_: str, op: str, inputs: dict, attrs=None, *, error="ResourceLimitError", **kw) -> list[Case]:
    """The run-time case (inputs fed) and the compile-time one (inputs as initializers: folding)."""
    run = Case(f"{id_}-run", _single(op, inputs, attrs, **kw), dict(inputs), kw.get("name") or op.lower(), error)
    fold = Case(f"{id_}-fold", _single(op, {}, attrs, consts=inputs, **kw), None, kw.get("name") or op.lower(), error)
    return [run, fold]


def _i64(*v):
    return np.array(v, dtype=np.int64)


def _loop_scan_accumulates() -> onnx.ModelProto:
    # every iteration emits a fresh 64 KiB tensor as a scan output: 2^20 iterations = 64 GiB
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
         h.make_node("Add", ["big", "fi"], ["scan"])],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, [])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("scan", T.FLOAT, [16384])],
        [nh.from_array(np.zeros(16384, np.float32), "big")],
    )
    node = h.make_node("Loop", ["M", "c"], ["ys"], body=body, name="loop")
    graph = h.make_graph([node], "loop_scan", [h.make_tensor_value_info("M", T.INT64, [])],
                         [h.make_tensor_value_info("ys", T.FLOAT, None)], [nh.from_array(np.array(True), "c")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _loop_doubles() -> onnx.ModelProto:
    # a loop-carried value that doubles every iteration: Concat(x, x)
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Concat", ["x_in", "x_in"], ["x_out"], axis=0, name="double")],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("x_in", T.FLOAT, None)],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("x_out", T.FLOAT, None)],
    )
    node = h.make_node("Loop", ["M", "c", "x0"], ["x"], body=body, name="loop")
    graph = h.make_graph([node], "loop_doubles", [h.make_tensor_value_info("x0", T.FLOAT, [1024])],
                         [h.make_tensor_value_info("x", T.FLOAT, None)],
                         [nh.from_array(np.array(True), "c"), nh.from_array(np.array(60, np.int64), "M")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _scan_accumulates() -> onnx.ModelProto:
    # each step tiles its 1-element slice to 4096 elements: 8192 steps = 128 MiB of scan output
    body = h.make_graph(
        [h.make_node("Tile", ["s", "reps"], ["out"])],
        "body",
        [h.make_tensor_value_info("s", T.FLOAT, [1])],
        [h.make_tensor_value_info("out", T.FLOAT, [4096])],
        [nh.from_array(_i64(4096), "reps")],
    )
    node = h.make_node("Scan", ["xs"], ["ys"], body=body, num_scan_inputs=1, name="scan")
    graph = h.make_graph([node], "scan_acc", [h.make_tensor_value_info("xs", T.FLOAT, [8192, 1])],
                         [h.make_tensor_value_info("ys", T.FLOAT, None)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _folded_total() -> onnx.ModelProto:
    # six 24 MiB constants, each under max_tensor_bytes, together over max_total_bytes (4 x 32 MiB)
    nodes, outs, inits = [], [], []
    for k in range(6):
        inits.append(nh.from_array(_i64(6 * MiB + k), f"shape{k}"))
        nodes.append(h.make_node("ConstantOfShape", [f"shape{k}"], [f"c{k}"], name=f"fill{k}",
                                 value=nh.from_array(np.ones(1, np.float32))))
        outs.append(h.make_tensor_value_info(f"c{k}", T.FLOAT, None))
    graph = h.make_graph(nodes, "folded_total", [], outs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _rnn_empty_features(op: str) -> onnx.ModelProto:
    # X has no features (size 0), so W is empty too, but Y = [seq, dirs, batch, hidden] is 256 MiB
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    hidden = 1
    node = h.make_node(op, ["X", "W", "R"], ["Y"], hidden_size=hidden, name=op.lower())
    graph = h.make_graph(
        [node], op, [h.make_tensor_value_info("X", T.FLOAT, [1 << 20, 64, 0])], [h.make_tensor_value_info("Y", T.FLOAT, None)],
        [nh.from_array(np.zeros((1, gates * hidden, 0), np.float32), "W"),
         nh.from_array(np.zeros((1, gates * hidden, hidden), np.float32), "R")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def cases() -> list[Case]:
    f32 = np.float32
    big = 1 << 26
    out: list[Case] = []
    # value-sized outputs
    out += _both("constant_of_shape", "ConstantOfShape", {"shape": _i64(4096, 4096)})
    out += _both("constant_of_shape-far", "ConstantOfShape", {"shape": _i64(1 << 30, 1 << 30)})
    out += _both("expand", "Expand", {"x": np.ones(1, f32), "shape": _i64(4096, 4096)})
    out += _both("tile", "Tile", {"x": np.ones((2, 2), f32), "repeats": _i64(2048, 2048)})
    out += _both("range-int", "Range", {"start": np.array(0, np.int64), "limit": np.array(1 << 23, np.int64),
                                        "delta": np.array(1, np.int64)}, out_type=T.INT64)
    out += _both("range-float", "Range", {"start": np.array(0, f32), "limit": np.array(1e7, f32),
                                          "delta": np.array(1, f32)})
    for mode in ("constant", "reflect", "edge", "wrap"):
        out += _both(f"pad-{mode}", "Pad", {"x": np.ones((1, 1), f32), "pads": _i64(big, big, big, big)},
                     {"mode": mode}, opset=19)
    out += _both("pad-wide-uint8", "Pad", {"x": np.ones((1, 1), np.uint8), "pads": _i64(0, 0, 0, big)},
                 {"mode": "reflect"}, opset=19, out_type=T.UINT8)
    for mode in ("nearest", "linear", "cubic"):
        out += _both(f"resize-{mode}", "Resize", {"x": np.ones((1, 1, 2, 2), f32), "roi": np.zeros(0, f32),
                                                  "scales": np.zeros(0, f32), "sizes": _i64(1, 1, 4096, 4096)},
                     {"mode": mode})
    out += _both("resize-scales", "Resize", {"x": np.ones((1, 1, 2, 2), f32), "roi": np.zeros(0, f32),
                                             "scales": np.array([1, 1, 4096, 4096], f32)}, {"mode": "linear"})
    out += _both("upsample", "Upsample", {"x": np.ones((1, 1, 1, 1), f32), "scales": np.array([1, 1, 4096, 4096], f32)},
                 {"mode": "nearest"}, opset=9)
    for c in out[-2:]:
        c.names = "Resize"  # onnx's version converter turns it into a Resize and drops its name
    # outputs that multiply small inputs
    out += _both("gather", "Gather", {"data": np.ones((1, 4096), f32), "indices": np.zeros(4096, np.int64)})
    out.append(Case("concat-run", _single("Concat", {"x": np.ones((512, 1024), f32)}, {"axis": 0}),
                    {"x": np.ones((512, 1024), f32)}, "concat"))
    out[-1].model.graph.node[0].input.extend(["x"] * 19)  # 20 x 2 MiB
    out += _both("einsum-outer", "Einsum", {"a": np.ones(4096, f32), "b": np.ones(4096, f32)}, {"equation": "i,j->ij"},
                 opset=12)
    out += _both("einsum-three", "Einsum", {"a": np.ones(256, f32), "b": np.ones(256, f32), "c": np.ones(256, f32)},
                 {"equation": "i,j,k->ijk"}, opset=12)
    out += _both("einsum-ellipsis", "Einsum", {"a": np.ones((64, 64), f32), "b": np.ones(4096, f32)},
                 {"equation": "...,k"}, opset=12)
    # (2-D: onnx's shape inference propagates 1-D values element by element, slowly)
    out += _both("nonzero", "NonZero", {"x": np.ones((2048, 4096), np.bool_)}, out_type=T.INT64)
    out += _both("matmul", "MatMul", {"a": np.ones((4096, 1), f32), "b": np.ones((1, 4096), f32)})
    out += _both("matmul-int", "MatMul", {"a": np.ones((4096, 1), np.int64), "b": np.ones((1, 4096), np.int64)},
                 out_type=T.INT64)
    out += _both("gemm", "Gemm", {"a": np.ones((4096, 1), f32), "b": np.ones((1, 4096), f32)})
    out += _both("add-broadcast", "Add", {"a": np.ones((4096, 1), f32), "b": np.ones((1, 4096), f32)})
    out += _both("where-broadcast", "Where", {"c": np.ones((4096, 1), np.bool_), "a": np.ones((1, 4096), f32),
                                              "b": np.ones(1, f32)})
    out += _both("cast-widens", "Cast", {"x": np.ones((2048, 4096), np.bool_)}, {"to": T.DOUBLE}, out_type=T.DOUBLE)
    out += _both("dequantize-block", "DequantizeLinear",
                 {"x": np.ones(2, np.int8), "scale": np.ones(1, f32)}, {"axis": 0, "block_size": 1 << 30}, opset=21)
    # windows
    out += _both("conv-pads", "Conv", {"x": np.ones((1, 1, 1, 1), f32), "w": np.ones((1, 1, 1, 1), f32)},
                 {"pads": [4096] * 4})
    out += _both("maxpool-pads", "MaxPool", {"x": np.ones((1, 1, 1, 1), f32)}, {"kernel_shape": [1, 1], "pads": [4096] * 4})
    out += _both("convtranspose-strides", "ConvTranspose",
                 {"x": np.ones((1, 1, 2, 2), f32), "w": np.ones((1, 1, 1, 1), f32)}, {"strides": [8192, 8192]})
    # recurrent: Y sized by X's sequence and batch axes
    for op in ("RNN", "GRU", "LSTM"):
        out.append(Case(f"{op.lower()}-empty-features", _rnn_empty_features(op),
                        {"X": np.zeros((1 << 20, 64, 0), f32)}, op.lower()))
    # control flow
    out.append(Case("loop-scan-output", _loop_scan_accumulates(), {"M": np.array(1 << 20, np.int64)}, "loop"))
    out.append(Case("loop-carried-doubles", _loop_doubles(), {"x0": np.ones(1024, f32)}, "double"))
    out.append(Case("scan-output", _scan_accumulates(), {"xs": np.ones((8192, 1), f32)}, "scan"))
    # feeds and folding
    # declared with symbolic dims: a declared shape over the budget is refused when the model loads
    relu = _single("Relu", {"x": np.ones((4096, 4096), f32)})
    relu.graph.input[0].CopyFrom(h.make_tensor_value_info("x", T.FLOAT, ["N", "M"]))
    out.append(Case("zero-stride-feed", relu, {"x": np.broadcast_to(np.ones(1, f32), (4096, 4096))}, "'x'"))
    out.append(Case("folded-constants-total", _folded_total(), None, "fill", tags={"total"}))
    return out


# -------------------------------------------------------------------------------------------------
# measuring (as a script)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) * 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _call(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the caller judges the type
        return exc
    return None


def attempt(case: Case):
    """Compile and run ``case``; returns the exception it raised (``None``: it was not refused)."""
    import byoc

    def go():
        compiled = byoc.compile(case.model, targets=[], budget=budget())
        if case.feeds is not None:
            compiled.run(case.feeds)

    return _call(go)


def measure(case: Case) -> dict:
    """Peak memory of the refused step: the compile (folding cases) or the run.

    The step runs once unmeasured first (imports, JIT and caches), and a run-time case is
    compiled outside the measurement (compiling JIT-compiles kernels, which is not what is measured).
    """
    import byoc

    if case.feeds is None:
        step = lambda: byoc.compile(case.model, targets=[], budget=budget())  # noqa: E731
    else:
        compiled = byoc.compile(case.model, targets=[], budget=budget())
        step = lambda: compiled.run(case.feeds)  # noqa: E731
    _call(step)
    exact = _reset_peak()
    base = _status("VmRSS") if exact else _status("VmHWM")
    tracemalloc.start()
    exc = _call(step)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    growth = _status("VmHWM") - base
    return {"id": case.id, "error": type(exc).__name__ if exc is not None else None,
            "message": str(exc)[:300] if exc is not None else "", "rss_growth": growth, "exact": exact,
            "traced_peak": traced}


def main(ids: list[str]) -> None:
    chosen = [c for c in cases() if not ids or c.id in ids]
    for case in chosen:
        print(json.dumps(measure(case)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
