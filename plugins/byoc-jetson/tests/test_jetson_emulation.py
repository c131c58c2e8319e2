"""The CPU emulation path against the host reference, with float16 tolerance.

Tolerance: ``|got - want| <= 1e-3 + 1e-2 * |want|`` (rtol 1e-2, atol 1e-3). Operators that sum
many rounded terms (Conv, Gemm, MatMul, Add/Sub, pooling averages, reductions) get one more
term, justified by the float16 rounding of their inputs and weights: each is moved by at most
2**-11 of itself, so a sum of products moves by at most ``2**-10 * sum(|x| * |w|)``, which is the
same operator run on the absolute values (computed here on the host). Floor/Ceil/Round are not
drawn: they are discontinuous, so rounding an input near an integer legitimately changes them
by 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jetson_helpers import (
    FP16_EPS,
    assert_fp16_close,
    compile_jetson,
    host_run,
    jetson_callable,
    make_model,
    require_kernels,
)
from onnx import TensorProto, helper

from byoc.kernels import is_supported
from byoc.testing.oracle import run_onnxruntime
from byoc_jetson.emulation import EmulatedRegion, to_fp16

FLOAT = TensorProto.FLOAT


@dataclass
class Case:
    """One random single-operator instance."""

    op: str
    nodes: list
    inputs: dict[str, np.ndarray]
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: tuple[str, ...] = ("y",)
    #: the op sums rounded terms: add the absolute-value bound (module docstring)
    linear: bool = False
    opset: int = 17
    #: values of initializers that are sign-sensitive and must stay as they are in the |.| model
    keep_sign: tuple[str, ...] = ()

    def model(self, absolute: bool = False):
        feeds = {k: (np.abs(v) if absolute else v) for k, v in self.inputs.items()}
        inits = {k: (np.abs(v) if absolute and k not in self.keep_sign and v.dtype.kind == "f" else v)
                 for k, v in self.inits.items()}
        m = make_model(self.nodes, {k: (FLOAT, v.shape) for k, v in feeds.items()}, list(self.outputs), inits,
                       opset=self.opset)
        return m, feeds


def _u(rng, shape, lo=-4.0, hi=4.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


UNARY = {
    "Relu": {}, "Sigmoid": {}, "Tanh": {}, "Softsign": {}, "Softplus": {}, "Erf": {}, "Abs": {}, "Neg": {},
    "LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Exp": {}, "Log": {}, "Sqrt": {},
}
POSITIVE = {"Log": (0.05, 4.0), "Sqrt": (0.0, 4.0)}
BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min")


@st.composite
def unary_case(draw):
    op = draw(st.sampled_from(sorted(UNARY)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    lo, hi = POSITIVE.get(op, (-4.0, 4.0))
    return Case(op, [helper.make_node(op, ["x"], ["y"], **UNARY[op])], {"x": _u(rng, shape, lo, hi)})


@st.composite
def binary_case(draw):
    op = draw(st.sampled_from(BINARY))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    # b broadcasts: some of its leading dims dropped, some dims set to 1
    b_shape = tuple(d if draw(st.booleans()) else 1 for d in shape[draw(st.integers(0, len(shape) - 1)):])
    b = _u(rng, b_shape)
    if op == "Div":  # keep the divisor away from zero
        b = (np.sign(b) + (b == 0)) * rng.uniform(0.5, 2.0, b_shape).astype(np.float32)
    case = Case(op, [helper.make_node(op, ["a", "b"], ["y"])], {"a": _u(rng, shape), "b": b.astype(np.float32)},
                linear=op in ("Add", "Sub"))
    return case


@st.composite
def softmax_case(draw):
    op = draw(st.sampled_from(["Softmax", "LogSoftmax"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    # LogSoftmax is x - max - log(sum): an absolute error of the order of 2**-10 * |x| (linear bound)
    return Case(op, [helper.make_node(op, ["x"], ["y"], axis=axis)], {"x": _u(rng, shape)}, linear=op == "LogSoftmax")


@st.composite
def conv_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    nd = draw(st.sampled_from([2, 2, 3]))
    group = draw(st.sampled_from([1, 1, 2]))
    cin = group * draw(st.integers(1, 3))
    cout = group * draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel] * 2
    strides = [draw(st.integers(1, 2)) for _ in range(nd)]
    spatial = [(k - 1) * d + 1 + draw(st.integers(0, 4)) for k, d in zip(kernel, dil)]
    x = _u(rng, (draw(st.integers(1, 2)), cin, *spatial), -1, 1)
    w = _u(rng, (cout, cin // group, *kernel), -1, 1)
    inits = {"w": w}
    names = ["x", "w"]
    if draw(st.booleans()):
        inits["b"] = _u(rng, (cout,), -1, 1)
        names.append("b")
    node = helper.make_node("Conv", names, ["y"], group=group, kernel_shape=kernel, dilations=dil, pads=pads,
                            strides=strides)
    return Case("Conv", [node], {"x": x}, inits, linear=True)


@st.composite
def gemm_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    m, k, n = (draw(st.integers(1, 8)) for _ in range(3))
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    a = _u(rng, (k, m) if trans_a else (m, k), -1, 1)
    b = _u(rng, (n, k) if trans_b else (k, n), -1, 1)
    inits = {"b": b}
    names = ["a", "b"]
    if draw(st.booleans()):
        inits["c"] = _u(rng, draw(st.sampled_from([(n,), (1, n), (m, n)])), -1, 1)
        names.append("c")
    alpha, beta = draw(st.sampled_from([1.0, 0.5])), draw(st.sampled_from([1.0, 2.0]))
    node = helper.make_node("Gemm", names, ["y"], transA=int(trans_a), transB=int(trans_b), alpha=alpha, beta=beta)
    return Case("Gemm", [node], {"a": a}, inits, linear=True)


@st.composite
def matmul_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
    const_b = draw(st.booleans())
    a = _u(rng, (*batch, m, k), -1, 1)
    b = _u(rng, (k, n), -1, 1)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    if const_b:
        return Case("MatMul", [node], {"a": a}, {"b": b}, linear=True)
    return Case("MatMul", [node], {"a": a, "b": b}, linear=True)


@st.composite
def pool_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    op = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    nd = draw(st.sampled_from([2, 3]))
    if op.startswith("Global"):
        x = _u(rng, (1, draw(st.integers(1, 3)), *(draw(st.integers(1, 5)) for _ in range(nd))))
        return Case(op, [helper.make_node(op, ["x"], ["y"])], {"x": x}, linear=op == "GlobalAveragePool")
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel] * 2
    strides = [draw(st.integers(1, 2)) for _ in range(nd)]
    x = _u(rng, (1, draw(st.integers(1, 3)), *(k + draw(st.integers(0, 4)) for k in kernel)))
    attrs = {"kernel_shape": kernel, "pads": pads, "strides": strides}
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    return Case(op, [helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, linear=op == "AveragePool")


@st.composite
def reduce_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    op = draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax"]))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    axes = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=draw(st.integers(0, 1)))
    return Case(op, [node], {"x": _u(rng, shape)}, {"axes": np.array(axes, dtype=np.int64)},
                linear=op != "ReduceMax", opset=18, keep_sign=("axes",))


def _ops_available(case: Case) -> bool:
    return all(is_supported(n.op_type, "") for n in case.nodes)


def _check_case(case: Case) -> None:
    if not _ops_available(case):
        return  # the core's host kernel for this op is not written yet
    model, feeds = case.model()
    artifact, run = jetson_callable(model)
    assert isinstance(run, EmulatedRegion) and artifact.metadata["runtime_path"] == "emulation"
    got = run(*(feeds[name] for name in artifact.metadata["inputs"]))
    want = host_run(model, feeds)
    bound = None
    if case.linear:
        abs_model, abs_feeds = case.model(absolute=True)
        magnitude = np.abs(host_run(abs_model, abs_feeds)[0])
        if case.op == "LogSoftmax":  # the shift by max(x) and log(sum): bounded by |x|'s largest rounding
            magnitude = np.full_like(magnitude, 2 * np.abs(feeds["x"]).max())
        bound = 1.01 * 2 * FP16_EPS * magnitude
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        # every layer's output is rounded to float16
        np.testing.assert_array_equal(g, to_fp16(g))
        assert_fp16_close(g, w, bound, what=f"{case.op} {[a.shape for a in case.inputs.values()]}")


@settings(max_examples=40)
@given(case=st.one_of(unary_case(), binary_case(), softmax_case()))
def test_pointwise_and_softmax_fp16(case):
    _check_case(case)


@settings(max_examples=30)
@given(case=st.one_of(conv_case(), gemm_case(), matmul_case()))
def test_mac_ops_fp16(case):
    _check_case(case)


@settings(max_examples=25)
@given(case=st.one_of(pool_case(), reduce_case()))
def test_pool_and_reduce_fp16(case):
    _check_case(case)


@settings(max_examples=15)
@given(case=st.one_of(unary_case(), binary_case(), conv_case(), gemm_case(), pool_case()))
def test_fp32_emulation_is_the_host_reference(case):
    """With precision fp32 the emulation runs the host kernels untouched: bit-identical outputs."""
    if not _ops_available(case):
        return
    model, feeds = case.model()
    artifact, run = jetson_callable(model, precision="fp32")
    got = run(*(feeds[name] for name in artifact.metadata["inputs"]))
    for g, w in zip(got, host_run(model, feeds)):
        np.testing.assert_array_equal(g, w)


def test_fp16_overflow_becomes_inf():
    model = make_model([helper.make_node("Mul", ["a", "b"], ["y"])], {"a": (FLOAT, [2]), "b": (FLOAT, [2])}, ["y"])
    artifact, run = jetson_callable(model)
    (y,) = run(np.array([300.0, 1.0], np.float32), np.array([300.0, 2.0], np.float32))
    assert np.isinf(y[0]) and y[1] == 2.0


# -- small graphs through byoc.compile, against onnxruntime --------------------------------------

ACTS = ["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip"]


@st.composite
def small_graph(draw):
    """MAC (Conv or MatMul/Gemm) + bias + activation, then an elementwise chain, optionally a softmax."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    nodes, inits = [], {}
    kind = draw(st.sampled_from(["conv", "gemm", "matmul"]))
    if kind == "conv":
        c, k = draw(st.integers(1, 4)), draw(st.sampled_from([1, 3]))
        x = _u(rng, (1, c, 6, 6), -1, 1)
        cout = draw(st.integers(1, 4))
        # He-scaled weights keep activations of order 1, as in a trained network
        inits["w"] = (rng.standard_normal((cout, c, k, k)) * np.sqrt(2.0 / (c * k * k))).astype(np.float32)
        inits["bias"] = _u(rng, (cout,), -0.1, 0.1)
        nodes.append(helper.make_node("Conv", ["x", "w", "bias"], ["h0"], pads=[k // 2] * 4))
        softmax_axis = 1
    else:
        d, n = draw(st.integers(1, 16)), draw(st.integers(1, 16))
        x = _u(rng, (draw(st.integers(1, 3)), d), -1, 1)
        inits["w"] = (rng.standard_normal((d, n)) * np.sqrt(1.0 / d)).astype(np.float32)
        inits["bias"] = _u(rng, (n,), -0.1, 0.1)
        if kind == "gemm":
            nodes.append(helper.make_node("Gemm", ["x", "w", "bias"], ["h0"]))
        else:
            nodes.append(helper.make_node("MatMul", ["x", "w"], ["m0"]))
            nodes.append(helper.make_node("Add", ["m0", "bias"], ["h0"]))
        softmax_axis = -1
    last = "h0"
    for i, op in enumerate(draw(st.lists(st.sampled_from(ACTS + ["Add", "Mul"]), min_size=1, max_size=4))):
        out = f"h{i + 1}"
        if op == "Clip":
            inits.setdefault("lo", np.array(0.0, np.float32))
            inits.setdefault("hi", np.array(6.0, np.float32))
            nodes.append(helper.make_node("Clip", [last, "lo", "hi"], [out]))
        elif op in ("Add", "Mul"):
            inits[f"k{i}"] = _u(rng, (), 0.5, 1.5)
            nodes.append(helper.make_node(op, [last, f"k{i}"], [out]))
        else:
            nodes.append(helper.make_node(op, [last], [out]))
        last = out
    if draw(st.booleans()):
        nodes.append(helper.make_node("Softmax", [last], ["y"], axis=softmax_axis))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    model = make_model(nodes, {"x": (FLOAT, x.shape)}, ["y"], inits)
    return model, {"x": x}


@settings(max_examples=15)
@given(graph=small_graph())
def test_small_graphs_vs_onnxruntime(registry, graph):
    require_kernels("Conv", "Gemm", "MatMul")
    model, feeds = graph
    cm = compile_jetson(registry, model)
    # the MAC with everything after it is one jetson region
    assert len(cm.regions) == 1 and cm.regions[0].artifact.metadata["runtime_path"] == "emulation"
    assert all(r.device == "jetson" for r in cm.records.values())
    (want,) = run_onnxruntime(model, feeds)
    assert_fp16_close(cm.run(feeds)["y"], want, what="small graph")


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_old_opsets_vs_onnxruntime(registry, opset):
    """Softmax below opset 13 flattens from ``axis``: onnxruntime is the oracle (onnx.reference is wrong there)."""
    require_kernels("MatMul")
    rng = np.random.default_rng(opset)
    x = _u(rng, (2, 3, 4), -2, 2)
    w = _u(rng, (4, 4), -1, 1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=1)],
                       {"x": (FLOAT, x.shape)}, ["y"], {"w": w}, opset=opset)
    cm = compile_jetson(registry, model)
    assert cm.records[next(n for n in cm.records if cm.records[n].op_type == "Softmax")].device == "jetson"
    (want,) = run_onnxruntime(model, {"x": x})
    assert_fp16_close(cm.run({"x": x})["y"], want, what=f"Softmax opset {opset}")


def test_emulation_callable_checks_arity():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (FLOAT, [2])}, ["y"])
    _, run = jetson_callable(model)
    with pytest.raises(ValueError, match="expected 1 inputs"):
        run()


def test_fused_pattern_interior_stays_float32():
    """Inside a fused pattern (here conv + bias-Add + activation) only the pattern's end is rounded."""
    require_kernels("Conv")
    rng = np.random.default_rng(3)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        {"x": (FLOAT, [1, 2, 3, 3])}, ["y"],
        {"w": _u(rng, (2, 2, 1, 1), -1, 1), "b": _u(rng, (1, 2, 1, 1), -1, 1)},
    )
    from byoc_jetson.emulation import _fused_interior
    from jetson_helpers import whole_region

    region = whole_region(model)
    for node in region.model.graph:
        node.metadata_props["byoc.pattern"] = "jetson.conv2d_bias_act"
    assert [_fused_interior(n) for n in region.model.graph] == [True, True, False]


def test_region_inputs_are_rounded(monkeypatch):
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": (FLOAT, [3])}, ["y"])
    _, run = jetson_callable(model)
    x = np.array([1.0001, 2049.0, -0.1], np.float32)
    np.testing.assert_array_equal(run(x)[0], to_fp16(x))

