"""Epilogue fusion on the host: a Conv followed by an Add/Sum and/or a Relu runs as one step.

Where the convolution runs on the blocked kernel's wide form, written in place, the kernel applies
the Add and the Relu as it stores its tiles; elsewhere the nodes' own kernels run after it. The
result must be bit for bit the unfused one (the same float32 operations in the same order), and
the plan must only fuse where nothing else can see the intermediate tensors.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc_cpu.host.conv import fused_conv
from byoc.kernels.registry import NodeSpec
from cpu_helpers import host_kernel as make_kernel
from byoc.testing.oracle import assert_close, run_onnxruntime

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def wide_blocked(monkeypatch):
    """The wide blocked form where it applies, on any CPU (it only runs slower where 16-float
    vectors are split): the kernel's epilogue is then exercised everywhere."""
    monkeypatch.setattr("byoc_cpu.host.blocked.PAYS", True)
    monkeypatch.setattr("byoc_cpu.host.blocked.WIDE", True)
    monkeypatch.setattr("byoc_cpu.host.blocked._ENV", "")


def _relu(v: np.ndarray) -> np.ndarray:
    return np.where(v < 0, np.float32(0), v)  # as the host's Relu: keeps NaN


LAYERS = [
    # (x shape, w shape, attrs, the blocked kernel applies the epilogue): 3x3 in rows of their
    # own with a short rest (20 = 14 + 6), strided, 1x1 over a flat run, 7x7 in tiles of 7;
    # 16 output channels (the 8-wide form, no epilogue) and a grouped conv (direct) fall back
    ((2, 16, 12, 20), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
    ((1, 16, 13, 12), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True),
    ((1, 24, 20, 20), (64, 24, 1, 1), {}, True),
    ((1, 64, 7, 7), (32, 64, 3, 3), {"pads": [1, 1, 1, 1]}, True),
    ((1, 16, 9, 9), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    ((1, 8, 9, 9), (8, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, False),
]


@pytest.mark.parametrize("res_kind, relu", [("none", True), ("residual", False), ("residual", True)])
def test_fused_epilogue_equals_unfused_bitwise(res_kind, relu):
    rng = np.random.default_rng(5)
    add = make_kernel(NodeSpec("Add", name="a", n_inputs=2)) if res_kind == "residual" else None
    rl = make_kernel(NodeSpec("Relu", name="r", n_inputs=1)) if relu else None
    for xshape, wshape, attrs, kernel_applies in LAYERS:
        run = make_kernel(NodeSpec("Conv", name="c", attrs=attrs, n_inputs=3))
        x = rng.standard_normal(xshape).astype(np.float32)
        w = (rng.standard_normal(wshape) / np.sqrt(np.prod(wshape[1:]))).astype(np.float32)
        b = rng.standard_normal(wshape[0]).astype(np.float32)
        assert run.fuses(x, w) is kernel_applies, (xshape, wshape)
        res = None
        if res_kind == "residual":
            res = rng.standard_normal(run.out_shape(x, w)).astype(np.float32)
            res.flat[::7] = np.nan  # NaN must come through the add and the Relu as unfused
        (got,) = fused_conv(run, add, rl)(x, w, b, res)
        (want,) = run(x, w, b)
        if res is not None:
            want = want + res
        np.testing.assert_array_equal(got, _relu(want) if relu else want, err_msg=f"{xshape} {wshape}")


# -------------------------------------------------------------------------------------------------
# models


def _conv(name, x, out, w_name, b_name, **attrs):
    return helper.make_node("Conv", [x, w_name, b_name], [out], name=name, **attrs)


def _init(name, arr):
    return numpy_helper.from_array(arr.astype(np.float32), name)


def _bottleneck(rng, extra_outputs=(), add_op="Add", residual_shape=None):
    """X -> conv_a -> relu_a -> conv_b --+--> add -> relu -> Y
    X -> conv_s (the shortcut, after conv_b in node order) --+"""
    c, m, h = 16, 32, 10
    inits = []
    for name, shape in [("wa", (m, c, 1, 1)), ("wb", (m, m, 3, 3)), ("ws", (m, c, 1, 1))]:
        inits.append(_init(name, rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))))
    for name in ("ba", "bb", "bs"):
        inits.append(_init(name, rng.standard_normal(m)))
    nodes = [
        _conv("conv_a", "X", "A", "wa", "ba"),
        helper.make_node("Relu", ["A"], ["Ar"], name="relu_a"),
        _conv("conv_b", "Ar", "B", "wb", "bb", pads=[1, 1, 1, 1]),
    ]
    if residual_shape is None:
        nodes.append(_conv("conv_s", "X", "S", "ws", "bs"))
        other = "S"
    else:
        inits.append(_init("R", rng.standard_normal(residual_shape)))
        other = "R"
    nodes += [helper.make_node(add_op, ["B", other], ["Z"], name="add"),
              helper.make_node("Relu", ["Z"], ["Y"], name="relu")]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in extra_outputs]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, c, h, h])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    feeds = {"X": rng.standard_normal((1, c, h, h)).astype(np.float32)}
    return model, feeds


def _compile(model, fuse: bool, monkeypatch=None):
    if fuse:
        return byoc.compile(model, wait=True, targets=[])
    with monkeypatch.context() as mp:  # byoc-cpu's host executor offers no fusion
        mp.setattr("byoc_cpu.host.fusion.fusions", lambda nodes, is_host: [])
        return byoc.compile(model, wait=True, targets=[])


def _ops(compiled) -> list[str]:
    return [s.op_type for s in compiled._plan.steps]


@pytest.mark.parametrize("add_op", ["Add", "Sum"])
def test_bottleneck_fuses_and_matches(add_op, monkeypatch):
    model, feeds = _bottleneck(np.random.default_rng(1), add_op=add_op)
    fused, plain = _compile(model, True), _compile(model, False, monkeypatch)
    # conv_a + relu_a, conv_b + add + relu; the shortcut conv stays a step of its own
    assert _ops(fused) == ["Conv", "Conv", "Conv"]
    assert len(_ops(plain)) == 6
    got, want = fused.run(feeds)["Y"], plain.run(feeds)["Y"]
    np.testing.assert_array_equal(got, want)
    assert_close([got], run_onnxruntime(model, feeds)[:1], rtol=1e-4, atol=1e-4)


def test_a_tensor_seen_elsewhere_is_not_fused_away(monkeypatch):
    # B (conv_b's output) and Ar are graph outputs too: they must exist
    model, feeds = _bottleneck(np.random.default_rng(2), extra_outputs=("B", "Ar"))
    fused = _compile(model, True)
    out = fused.run(feeds)
    want = run_onnxruntime(model, feeds)
    for name, ref in zip(["Y", "B", "Ar"], want):
        assert_close([out[name]], [ref], rtol=1e-4, atol=1e-4)
    # conv_a + relu_a (Ar is the chain's last output), conv_b alone (B is seen), and the
    # shortcut conv_s takes the Add and the Relu instead
    assert _ops(fused) == ["Conv", "Conv", "Conv"]


def test_broadcast_residual_falls_back_to_the_nodes_own_kernels(monkeypatch):
    # the Add's other input broadcasts (1, M, 1, 1): the fused step runs the Add kernel itself
    model, feeds = _bottleneck(np.random.default_rng(3), residual_shape=(1, 32, 1, 1))
    fused, plain = _compile(model, True), _compile(model, False, monkeypatch)
    assert len(_ops(fused)) < len(_ops(plain))
    np.testing.assert_array_equal(fused.run(feeds)["Y"], plain.run(feeds)["Y"])
    assert_close([fused.run(feeds)["Y"]], run_onnxruntime(model, feeds)[:1], rtol=1e-4, atol=1e-4)


def test_two_convs_into_one_add_fuse_once():
    # A = conv_a(X), S = conv_s(X), Y = Relu(A + S): only one of the two convs takes the Add
    rng = np.random.default_rng(4)
    c, m = 8, 16
    inits = [_init("wa", rng.standard_normal((m, c, 1, 1))), _init("ws", rng.standard_normal((m, c, 3, 3))),
             _init("ba", rng.standard_normal(m)), _init("bs", rng.standard_normal(m))]
    nodes = [_conv("conv_a", "X", "A", "wa", "ba"), _conv("conv_s", "X", "S", "ws", "bs", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["A", "S"], ["Z"], name="add"), helper.make_node("Relu", ["Z"], ["Y"], name="r")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, c, 6, 6])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"X": rng.standard_normal((2, c, 6, 6)).astype(np.float32)}
    compiled = byoc.compile(model, wait=True, targets=[])
    assert _ops(compiled) == ["Conv", "Conv"]
    assert_close([compiled.run(feeds)["Y"]], run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


def test_a_kernel_wrapper_sees_every_node():
    # host_callable(wrap=...) observes each node's output: nothing may be fused away there
    from byoc.contract import host_callable

    model, feeds = _bottleneck(np.random.default_rng(6))
    seen = []

    def wrap(node, kernel):
        seen.append(node.op_type)
        return kernel

    out = host_callable(model.SerializeToString(), wrap=wrap)(feeds["X"])
    assert sorted(seen) == sorted(["Conv", "Relu", "Conv", "Conv", "Add", "Relu"])
    assert_close(out, run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


def test_calibration_still_sees_the_conv_outputs():
    from byoc.quantize.calibrate import calibrate

    model, feeds = _bottleneck(np.random.default_rng(7))
    table = calibrate(onnx.ModelProto.FromString(model.SerializeToString()), [feeds])
    assert {"A", "B", "Z", "S"} <= set(table.stats)


@st.composite
def chains(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    c = draw(st.sampled_from([3, 8, 16, 24]))
    m = draw(st.sampled_from([8, 16, 20, 32]))
    k = draw(st.sampled_from([1, 3]))
    s = draw(st.sampled_from([1, 2]))
    h = draw(st.integers(k + 1, 16))
    n = draw(st.integers(1, 2))
    kind = draw(st.sampled_from(["relu", "add", "add_relu", "sum_relu"]))
    return rng, c, m, k, s, h, n, kind


@SETTINGS
@given(chains())
def test_fused_chains_property(case):
    """Random Conv (+ Add/Sum of a graph input) (+ Relu) chains: fused host == onnxruntime."""
    rng, c, m, k, s, h, n, kind = case
    pad = k // 2
    inits = [_init("w", rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)), _init("b", rng.standard_normal(m))]
    oh = (h + 2 * pad - k) // s + 1
    nodes = [helper.make_node("Conv", ["X", "w", "b"], ["A"], name="conv", pads=[pad] * 4, strides=[s, s])]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n, c, h, h])]
    feeds = {"X": rng.standard_normal((n, c, h, h)).astype(np.float32)}
    last = "A"
    if kind != "relu":
        inputs.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, [n, m, oh, oh]))
        feeds["R"] = rng.standard_normal((n, m, oh, oh)).astype(np.float32)
        nodes.append(helper.make_node("Sum" if kind == "sum_relu" else "Add", ["R", "A"], ["Z"], name="add"))
        last = "Z"
    if kind != "add":
        nodes.append(helper.make_node("Relu", [last], ["Y"], name="relu"))
        last = "Y"
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = byoc.compile(model, wait=True, targets=[])
    assert _ops(compiled) == ["Conv"]
    assert_close([compiled.run(feeds)[last]], run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


# -------------------------------------------------------------------------------------------------
# writing over a residual that dies at its Add


def _over(compiled) -> list[bool]:
    return [bool(getattr(s.run, "over", False)) for s in compiled._plan.steps]


def test_a_residual_that_dies_at_its_add_is_written_over(monkeypatch):
    # S (the shortcut conv's output) is read by the Add alone: conv_b writes Y over it
    model, feeds = _bottleneck(np.random.default_rng(11))
    fused, plain = _compile(model, True), _compile(model, False, monkeypatch)
    assert _over(fused) == [False, False, True]
    want = plain.run(feeds)["Y"]
    for _ in range(3):  # the first run lays the job out, the later ones reuse it
        np.testing.assert_array_equal(fused.run(feeds)["Y"], want)
    assert_close([want], run_onnxruntime(model, feeds)[:1], rtol=1e-4, atol=1e-4)


def _residual_read_by(op: str, rng):
    """The bottleneck with S also read by ``op`` (a graph output T), before the Add in node order."""
    model, feeds = _bottleneck(rng)
    g = model.graph
    node = helper.make_node(op, ["S"], ["T"], name="other")
    nodes = list(g.node)
    at = [n.name for n in nodes].index("conv_s") + 1
    nodes.insert(at, node)
    del g.node[:]
    g.node.extend(nodes)
    g.output.append(helper.make_tensor_value_info("T", TensorProto.FLOAT, None))
    return model, feeds


@pytest.mark.parametrize("case", ["graph_output", "read_by_sigmoid", "read_by_identity", "graph_input"])
def test_a_residual_seen_elsewhere_is_not_written_over(case):
    rng = np.random.default_rng(12)
    if case == "graph_output":
        model, feeds = _bottleneck(rng, extra_outputs=("S",))
        names = ["Y", "S"]
    elif case == "graph_input":  # the residual is a feed: the caller's array
        model, feeds = _feed_residual(rng)
        names = ["Y"]
    else:
        model, feeds = _residual_read_by("Sigmoid" if case == "read_by_sigmoid" else "Identity", rng)
        names = ["Y", "T"]
    copies = {k: v.copy() for k, v in feeds.items()}
    compiled = byoc.compile(model, wait=True, targets=[])
    assert not any(_over(compiled))
    want = run_onnxruntime(model, feeds)
    for _ in range(2):
        out = compiled.run(feeds)
        for name, ref in zip(names, want):
            assert_close([out[name]], [ref], rtol=1e-4, atol=1e-4)
    for k, v in feeds.items():
        np.testing.assert_array_equal(v, copies[k])  # the feeds are never written


def _feed_residual(rng):
    c, m, h = 16, 32, 10
    inits = [_init("w", rng.standard_normal((m, c, 3, 3)) / np.sqrt(c * 9)), _init("b", rng.standard_normal(m))]
    nodes = [_conv("conv", "X", "A", "w", "b", pads=[1, 1, 1, 1]), helper.make_node("Add", ["A", "R"], ["Y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, c, h, h]),
                                           helper.make_tensor_value_info("R", TensorProto.FLOAT, [1, m, h, h])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"X": rng.standard_normal((1, c, h, h)).astype(np.float32),
             "R": rng.standard_normal((1, m, h, h)).astype(np.float32)}
    return model, feeds


def test_a_residual_that_is_the_convs_own_input_is_not_written_over():
    # Y = conv(A) + A with A a conv's output: A is the conv's input as well
    rng = np.random.default_rng(13)
    c = 32
    inits = [_init(n, rng.standard_normal((c, c, k, k)) / np.sqrt(c * k * k)) for n, k in (("w1", 1), ("w2", 3))]
    inits += [_init("b1", rng.standard_normal(c)), _init("b2", rng.standard_normal(c))]
    nodes = [_conv("c1", "X", "A", "w1", "b1"), _conv("c2", "A", "B", "w2", "b2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["B", "A"], ["Y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, c, 9, 9])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"X": rng.standard_normal((1, c, 9, 9)).astype(np.float32)}
    compiled = byoc.compile(model, wait=True, targets=[])
    assert not any(_over(compiled))
    for _ in range(2):
        assert_close([compiled.run(feeds)["Y"]], run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


def test_blocked_jobs_and_overwritten_residuals_on_several_threads_at_once():
    # one compiled model run from four threads: each call its own argument block and per-thread
    # reorder buffer, the pool taken by one caller at a time (the others run their jobs alone)
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(14)
    model, feeds = _bottleneck(rng)
    compiled = byoc.compile(model, wait=True, targets=[])
    assert any(_over(compiled))
    inputs = [rng.standard_normal(feeds["X"].shape).astype(np.float32) for _ in range(6)]
    expected = [compiled.run({"X": v})["Y"] for v in inputs]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda v: compiled.run({"X": v})["Y"], inputs * 4))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, expected[i % len(inputs)])
    assert_close([expected[0]], run_onnxruntime(model, {"X": inputs[0]})[:1], rtol=1e-4, atol=1e-4)


def test_input_shapes_that_change_between_runs_keep_their_own_jobs():
    rng = np.random.default_rng(15)
    c, m = 16, 32
    inits = [_init("w", rng.standard_normal((m, c, 3, 3)) / np.sqrt(c * 9)), _init("b", rng.standard_normal(m))]
    nodes = [_conv("conv", "X", "A", "w", "b", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["A"], ["Y"], name="r")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", c, "h", "w"])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = byoc.compile(model, wait=True, targets=[])
    shapes = [(1, c, 9, 12), (2, c, 14, 14), (1, c, 9, 12), (3, c, 7, 5), (2, c, 14, 14)]
    for shape in shapes:
        feeds = {"X": rng.standard_normal(shape).astype(np.float32)}
        assert_close([compiled.run(feeds)["Y"]], run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)
