"""Operator numerics: generated code vs byoc's host kernels and onnxruntime, float32 tolerance.

Every example is a small model compiled for the cpu target alone (strict: a code-generation
fault fails the test instead of falling back to the host), so each exercises lowering, fusion,
the memory plan, the emitter, the verifier and the runtime end to end.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import assert_close, compile_cpu, cpu_nodes, make_model, onnxruntime_run, run_both
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

UNARY = {
    "Relu": {}, "Neg": {}, "Abs": {}, "Tanh": {}, "Sigmoid": {}, "Erf": {}, "Softsign": {}, "HardSwish": {},
    "LeakyRelu": {"alpha": 0.2}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "Elu": {"alpha": 0.7}, "Selu": {},
    "Softplus": {}, "Exp": {}, "Floor": {}, "Ceil": {},
}
POSITIVE = ["Log", "Sqrt", "Reciprocal"]  # fed |x| + 0.5
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu", "Sum", "Mean"]


@st.composite
def elementwise_models(draw):
    """A chain of 1-5 elementwise operators; binary operands are constants or inputs of any
    broadcastable shape, or an earlier value of the chain (a DAG inside one fused loop)."""
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    inputs, inits, nodes, feeds = {"x": shape}, {}, [], {}
    feeds["x"] = rng.uniform(-3, 3, shape).astype(np.float32)
    values, cur = ["x"], "x"
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unary", "binary", "positive", "clip"]))
        out = f"v{i}"
        if kind == "unary":
            op = draw(st.sampled_from(sorted(UNARY)))
            nodes.append(helper.make_node(op, [cur], [out], **UNARY[op]))
        elif kind == "positive":
            nodes.append(helper.make_node("Abs", [cur], [f"a{i}"]))
            inits[f"h{i}"] = np.float32(0.5)
            nodes.append(helper.make_node("Add", [f"a{i}", f"h{i}"], [f"p{i}"]))
            nodes.append(helper.make_node(draw(st.sampled_from(POSITIVE)), [f"p{i}"], [out]))
        elif kind == "clip":
            lo = draw(st.one_of(st.none(), st.floats(-2, 0, width=32)))
            hi = draw(st.one_of(st.none(), st.floats(0, 2, width=32)))
            names = [cur, "", ""]
            if lo is not None:
                inits[f"lo{i}"] = np.float32(lo)
                names[1] = f"lo{i}"
            if hi is not None:
                inits[f"hi{i}"] = np.float32(hi)
                names[2] = f"hi{i}"
            while names and names[-1] == "":
                names.pop()
            nodes.append(helper.make_node("Clip", names, [out]))
        else:
            op = draw(st.sampled_from(BINARY))
            # the other operand: a shape that broadcasts against the chain's shape
            k = draw(st.integers(0, rank))
            oshape = tuple(d if draw(st.booleans()) else 1 for d in shape[rank - k:])
            if op == "PRelu":
                oshape = oshape or (1,)
            source = draw(st.sampled_from(["const", "input", "earlier"]))
            if source == "earlier":
                other = draw(st.sampled_from(values))
            elif source == "const":
                other = f"c{i}"
                arr = rng.uniform(0.5, 2, oshape).astype(np.float32)
                inits[other] = arr * np.where(rng.random(oshape) < 0.5, -1, 1).astype(np.float32)
            else:
                other = f"y{i}"
                inputs[other] = oshape
                feeds[other] = rng.uniform(0.5, 2, oshape).astype(np.float32)
            args = [other, cur] if (op != "PRelu" and draw(st.booleans())) else [cur, other]
            if op in ("Sum", "Mean") and draw(st.booleans()):
                args.append(cur)
            nodes.append(helper.make_node(op, args, [out]))
        values.append(out)
        cur = out
    outputs = [cur]
    if len(values) > 2 and draw(st.booleans()):
        extra = draw(st.sampled_from(values[1:-1]))
        if extra != cur:
            outputs.append(extra)  # an intermediate is also an output: the loop writes two
    return make_model(nodes, inputs, outputs, inits), feeds


@settings(max_examples=25)
@given(elementwise_models())
def test_elementwise_chains_match_host(case):
    model, feeds = case
    cpu, got, want = run_both(model, feeds)
    assert cpu_nodes(cpu) == len(cpu.records)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@st.composite
def conv_models(draw):
    """Conv (+bias) (+residual Add) (+activation) over random geometry and every strategy."""
    group = draw(st.sampled_from([1, 1, 2, 3]))
    depthwise = group > 1 and draw(st.booleans())
    cg = 1 if depthwise else draw(st.sampled_from([1, 3, 4, 16, 17]))
    c = cg * group
    mg = 1 if depthwise else draw(st.sampled_from([1, 5, 8, 9]))
    m = mg * group
    n = draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    h = draw(st.integers((kh - 1) * dh + 1, 11))
    w = draw(st.integers((kw - 1) * dw + 1, 11))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    inits = {"W": (rng.standard_normal((m, cg, kh, kw)) / np.sqrt(cg * kh * kw)).astype(np.float32)}
    conv_in = ["x", "W"]
    if draw(st.booleans()):
        inits["B"] = rng.standard_normal(m).astype(np.float32)
        conv_in.append("B")
    nodes = [helper.make_node("Conv", conv_in, ["c"], group=group, strides=[sh, sw], dilations=[dh, dw],
                              pads=pads, kernel_shape=[kh, kw])]
    inputs = {"x": (n, c, h, w)}
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    cur = "c"
    oh = (h + pads[0] + pads[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pads[1] + pads[3] - (kw - 1) * dw - 1) // sw + 1
    if draw(st.booleans()):
        inputs["r"] = (n, m, oh, ow)
        feeds["r"] = rng.standard_normal((n, m, oh, ow)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["r", cur] if draw(st.booleans()) else [cur, "r"], ["s"]))
        cur = "s"
    act = draw(st.sampled_from([None, "Relu", "Clip", "LeakyRelu", "HardSwish", "Sigmoid"]))
    if act == "Clip":
        inits["lo"], inits["hi"] = np.float32(0), np.float32(6)
        nodes.append(helper.make_node("Clip", [cur, "lo", "hi"], ["y"]))
        cur = "y"
    elif act is not None:
        nodes.append(helper.make_node(act, [cur], ["y"]))
        cur = "y"
    strategy = draw(st.sampled_from(["auto", "auto", "im2col", "shift", "direct", "winograd", "blocked", "phase"]))
    return make_model(nodes, inputs, [cur], inits), feeds, strategy


@settings(max_examples=30)
@given(conv_models())
def test_conv_with_epilogues_matches_onnxruntime(case):
    model, feeds, strategy = case
    cpu = compile_cpu(model, conv_strategy=strategy)
    assert cpu_nodes(cpu) == len(cpu.records)  # the whole model is one cpu region
    got = cpu.run(feeds)
    assert_close(got, onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@settings(max_examples=12)
@given(conv_models())
def test_conv_on_the_core_micro_kernel_matches_onnxruntime(case):
    # the packed GEMM byoc-cpu runs where the CPU has AVX-512 is the core's
    # (byoc_cpu.host.gemm.gemm_table); force it here whatever this machine has
    model, feeds, strategy = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("byoc_cpu.host.gemm.FULL_WIDTH", True)
        cpu = compile_cpu(model, conv_strategy=strategy)
        got = cpu.run(feeds)
    assert_close(got, onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strategy", ["shift", "im2col"])
def test_core_micro_kernel_is_the_one_called(strategy):
    import byoc_cpu.host.gemm as core_gemm

    rng = np.random.default_rng(3)
    model = make_model([helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 16, 12, 12)},
                       ["y"], {"W": rng.standard_normal((20, 16, 3, 3)).astype(np.float32),
                               "B": rng.standard_normal(20).astype(np.float32)})
    feeds = {"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)}
    calls = []
    real = core_gemm.gemm_table
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core_gemm, "FULL_WIDTH", True)
        mp.setattr(core_gemm, "gemm_table", lambda *a: (calls.append(1), real(*a)))
        got = compile_cpu(model, conv_strategy=strategy).run(feeds)
    assert calls
    assert_close(got, onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@st.composite
def blocked_convs(draw):
    """Convolutions the channel-blocked kernel takes (stride 1 or 2, channels in blocks of 8 and
    16), with a bias, a residual Add and an activation in some, batch 1 or 2."""
    c, m = 8 * draw(st.integers(1, 3)), 16 * draw(st.integers(1, 4))  # m = 32, 64: the wide form too
    kh, kw = draw(st.sampled_from([(3, 3), (1, 3), (3, 1), (2, 2), (5, 5)]))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    h, w = draw(st.integers(kh, 20)), draw(st.integers(kw, 20))
    sh, sw = draw(st.integers(1, min(2, kh))), draw(st.integers(1, min(2, kw)))
    n = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    inits = {"W": (rng.standard_normal((m, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32),
             "B": rng.standard_normal(m).astype(np.float32)}
    oh, ow = (h + pads[0] + pads[2] - kh) // sh + 1, (w + pads[1] + pads[3] - kw) // sw + 1
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=pads, kernel_shape=[kh, kw], strides=[sh, sw])]
    inputs = {"x": (n, c, h, w), "r": (n, m, oh, ow)}
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in inputs.items()}
    nodes += [helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return make_model(nodes, inputs, ["y"], inits), feeds, draw(st.sampled_from([1, 2]))


@pytest.mark.parametrize("wide", [False, True])
@settings(max_examples=20)
@given(blocked_convs())
def test_blocked_conv_matches_onnxruntime(wide, case):
    # both forms on any CPU (the wide one for m a multiple of 32; its 16-float vectors are split
    # where the CPU has no AVX-512)
    model, feeds, threads = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("byoc_cpu.host.blocked.WIDE", wide)
        cpu = compile_cpu(model, conv_strategy="blocked", threads=threads)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wide, kind", [(False, "conv8"), (True, "conv16")])
def test_auto_takes_the_blocked_kernel_where_it_applies(wide, kind):
    rng = np.random.default_rng(4)
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 16, 30, 30)},
                       ["y"], {"W": (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)})
    feeds = {"x": rng.standard_normal((1, 16, 30, 30)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("byoc_cpu.host.blocked.PAYS", True)  # the rule where the kernel pays, on any CPU
        mp.setattr("byoc_cpu.host.blocked.WIDE", wide)
        mp.setattr("byoc_cpu.host.blocked._ENV", "")
        cpu = compile_cpu(model, threads=2)
    (region,) = cpu.regions
    assert "conv, blocked" in region.artifact.metadata["source"]
    assert f"K.{kind}(" in region.artifact.metadata["source"]
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tail, ep", [((), 0), (("Relu",), 1), (("Add",), 2), (("Add", "Relu"), 3),
                                      (("AddBroadcast", "Relu"), None), (("Sigmoid",), None)])
def test_blocked_kernel_applies_add_and_relu_as_it_stores(tail, ep):
    # Conv -> Add (a tensor laid out as the output) -> Relu: the wide blocked kernel's epilogue
    # (ep: 2 the residual, 1 Relu), no loop of its own; anything else (a broadcast Add, another
    # activation) keeps its fused loop. Batch 2: the residual's offset follows the image.
    # (A constant per-channel Add would be folded into the bias.)
    rng = np.random.default_rng(7)
    nodes, cur, inits = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1])], "c", {
        "W": (rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "B": rng.standard_normal(32).astype(np.float32)}
    for i, op in enumerate(tail):
        other = "s" if op == "AddBroadcast" else "x"
        nodes.append(helper.make_node(op.replace("Broadcast", ""), [cur] + ([other] if op.startswith("Add") else []), [f"t{i}"]))
        cur = f"t{i}"
    # rows of 20: a tile of 14, a rest of 6; s broadcasts over the rows
    model = make_model(nodes, {"x": (2, 32, 6, 20), "s": (2, 32, 1, 20)}, [cur], inits)
    feeds = {"x": rng.standard_normal((2, 32, 6, 20)).astype(np.float32),
             "s": rng.standard_normal((2, 32, 1, 20)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("byoc_cpu.host.blocked.WIDE", True)
        cpu = compile_cpu(model, conv_strategy="blocked", threads=2)
    (region,) = cpu.regions
    steps = [s for s in _flat(region.artifact.metadata["program"]["steps"]) if s["kind"] == "conv16"]
    assert steps and {s["args"][-1] for s in steps} == {ep or 0}
    assert any(s["kind"] == "ew" for s in _flat(region.artifact.metadata["program"]["steps"])) == (ep is None)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("later, placed", [(None, True), ("Sigmoid", False), ("output", False), ("input", False)])
def test_conv_writes_over_a_residual_that_dies_there(later, placed):
    # a -> Conv -> Add(., a) -> Relu -> Conv, the wide blocked kernel adding a as it stores: where a dies
    # at the Add, the output takes a's buffer (each element read just before it is overwritten);
    # where a is read later (a Sigmoid after, a region output) or is the Conv's own input, it keeps
    # its own. Batch 2: the residual's offset follows the image.
    rng = np.random.default_rng(11)
    w = {k: (rng.standard_normal((32, 32, kh, kh)) * 0.1).astype(np.float32) for k, kh in (("W0", 1), ("W1", 3))}
    src = "c0" if later != "input" else "a"
    nodes = [helper.make_node("Conv", ["x", "W0"], ["a"]),
             helper.make_node("Relu", ["a"], ["c0"]),
             helper.make_node("Conv", [src, "W1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "a"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "W0"], ["y"])]
    outs = ["y"]
    if later == "Sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["a"], ["z"]))
        outs.append("z")
    elif later == "output":
        outs.append("a")
    model = make_model(nodes, {"x": (2, 32, 6, 20)}, outs, w)
    feeds = {"x": rng.standard_normal((2, 32, 6, 20)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("byoc_cpu.host.blocked.WIDE", True)
        cpu = compile_cpu(model, conv_strategy="blocked", threads=2)
    (region,) = cpu.regions
    steps = [s for s in _flat(region.artifact.metadata["program"]["steps"]) if s["kind"] == "conv16" and s["args"][-1] == 3]
    assert steps and all((s["y"] == s["r"]) == placed for s in steps)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2])
def test_rgb_stem_takes_the_wide_blocked_kernel(n):
    # 3 input channels, a 3x3/2 stem (SqueezeNet's): the channels zero-padded to one block of 8
    rng = np.random.default_rng(9)
    model = make_model([helper.make_node("Conv", ["x", "W", "B"], ["c"], strides=[2, 2]),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": (n, 3, 33, 31)}, ["y"],
                       {"W": (rng.standard_normal((64, 3, 3, 3)) * 0.3).astype(np.float32),
                        "B": rng.standard_normal(64).astype(np.float32)})
    feeds = {"x": rng.standard_normal((n, 3, 33, 31)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("byoc_cpu.host.blocked.PAYS", True)
        mp.setattr("byoc_cpu.host.blocked.WIDE", True)
        mp.setattr("byoc_cpu.host.blocked._ENV", "")
        cpu = compile_cpu(model, threads=2)
    (region,) = cpu.regions
    assert "K.conv16(" in region.artifact.metadata["source"]
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_small_output_im2col_splits_channels(threads):
    # 7x7 output, 14M multiply-adds: with two threads the channels are split (one shared patch
    # matrix) rather than the 49 columns; batch 2 runs the program per image
    rng = np.random.default_rng(5)
    model = make_model([helper.make_node("Conv", ["x", "W", "B"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": (2, 256, 14, 14)}, ["y"],
                       {"W": (rng.standard_normal((136, 256, 3, 3)) * 0.05).astype(np.float32),
                        "B": rng.standard_normal(136).astype(np.float32)})
    feeds = {"x": rng.standard_normal((2, 256, 14, 14)).astype(np.float32)}
    cpu = compile_cpu(model, conv_strategy="im2col", threads=threads)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


def test_conv_1d_and_batch():
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": (3, 4, 9)}, ["y"],
                       {"W": rng.standard_normal((6, 4, 3)).astype(np.float32),
                        "B": rng.standard_normal(6).astype(np.float32)})
    feeds = {"x": rng.standard_normal((3, 4, 9)).astype(np.float32)}
    cpu = compile_cpu(model)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@settings(max_examples=15)
@given(st.data())
def test_gemm_and_matmul_match_onnxruntime(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    m, k, n = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 40)), data.draw(st.integers(1, 70))
    kind = data.draw(st.sampled_from(["gemm", "matmul_const", "matmul_batched", "matmul_values"]))
    act = data.draw(st.sampled_from([None, "Relu", "Sigmoid", "Tanh"]))
    inits, inputs, feeds = {}, {}, {}
    if kind == "gemm":
        ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
        alpha, beta = data.draw(st.sampled_from([1.0, 0.5])), data.draw(st.sampled_from([1.0, 2.0]))
        inputs["a"] = (k, m) if ta else (m, k)
        inits["b"] = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        names = ["a", "b"]
        c_shape = data.draw(st.sampled_from([None, (n,), (1, n), (m, 1), (m, n), ()]))
        if c_shape is not None:
            if data.draw(st.booleans()):
                inits["c"] = rng.standard_normal(c_shape).astype(np.float32)
            else:
                inputs["c"] = c_shape
                feeds["c"] = rng.standard_normal(c_shape).astype(np.float32)
            names.append("c")
        nodes = [helper.make_node("Gemm", names, ["g"], transA=int(ta), transB=int(tb), alpha=alpha, beta=beta)]
    else:
        lead = (2, 3) if kind != "matmul_values" else ()
        inputs["a"] = lead + (m, k)
        if kind == "matmul_const":
            inits["b"] = rng.standard_normal((k, n)).astype(np.float32)
        else:
            inputs["b"] = lead + (k, n)
            feeds["b"] = rng.standard_normal(lead + (k, n)).astype(np.float32)
        nodes = [helper.make_node("MatMul", ["a", "b"], ["g"])]
    feeds["a"] = rng.standard_normal(inputs["a"]).astype(np.float32)
    out = "g"
    if act is not None:
        nodes.append(helper.make_node(act, ["g"], ["y"]))
        out = "y"
    model = make_model(nodes, inputs, [out], inits)
    cpu = compile_cpu(model)
    assert cpu_nodes(cpu) == len(cpu.records)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


@settings(max_examples=20)
@given(st.data())
def test_pooling_matches_onnxruntime(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    op = data.draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 5))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(kh, 12)), data.draw(st.integers(kw, 12))
    attrs = {}
    if op in ("MaxPool", "AveragePool"):
        pads = [data.draw(st.integers(0, min(kh, kw) - 1)) for _ in range(4)]
        attrs = dict(kernel_shape=[kh, kw], strides=[data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))],
                     pads=pads, ceil_mode=int(data.draw(st.booleans())))
        if op == "AveragePool":
            attrs["count_include_pad"] = int(data.draw(st.booleans()))
        elif data.draw(st.booleans()):
            attrs["dilations"] = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))]
            attrs["pads"] = [0, 0, 0, 0]
            attrs["ceil_mode"] = 0
            kh_eff = (kh - 1) * attrs["dilations"][0] + 1
            kw_eff = (kw - 1) * attrs["dilations"][1] + 1
            h, w = max(h, kh_eff), max(w, kw_eff)
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": (n, c, h, w)}, ["y"])
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    cpu = compile_cpu(model)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_and_layout_ops_match_host(axis):
    """Concat (pieces written in place when contiguous), Transpose, Reshape, Flatten, Softmax,
    LRN, standalone BatchNormalization."""
    rng = np.random.default_rng(axis + 5)
    shape = (1, 4, 3, 5)
    inits = {"s": np.array([1, -1], dtype=np.int64), "sc": rng.uniform(0.5, 1.5, 4).astype(np.float32),
             "bi": rng.standard_normal(4).astype(np.float32), "mu": rng.standard_normal(4).astype(np.float32),
             "va": rng.uniform(0.5, 2, 4).astype(np.float32)}
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Sigmoid", ["x"], ["b"]),
        helper.make_node("Concat", ["a", "b", "a"], ["cat"], axis=axis),
        helper.make_node("Transpose", ["cat"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["t", "s"], ["r"]),
        helper.make_node("Softmax", ["r"], ["sm"], axis=-1),
        helper.make_node("LRN", ["x"], ["l"], size=3),
        helper.make_node("BatchNormalization", ["l", "sc", "bi", "mu", "va"], ["bn"], epsilon=1e-3),
        helper.make_node("Flatten", ["bn"], ["f"], axis=2),
    ]
    model = make_model(nodes, {"x": shape}, ["sm", "f", "cat"], inits)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    cpu, got, want = run_both(model, feeds)
    assert cpu_nodes(cpu) == len(cpu.records)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_close(got, onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-5)


def test_dense_block_concats_are_written_in_place():
    """DenseNet's growing concats: every piece lands in the last concat's buffer, no copies."""
    rng = np.random.default_rng(1)
    nodes, inits, cur = [], {}, "x"
    for i in range(3):
        inits[f"w{i}"] = rng.standard_normal((2, 2 + 2 * i, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [cur, f"w{i}"], [f"c{i}"]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        nodes.append(helper.make_node("Concat", [cur, f"r{i}"], [f"cat{i}"], axis=1))
        cur = f"cat{i}"
    model = make_model(nodes, {"x": (1, 2, 5, 5)}, [cur], inits)
    feeds = {"x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32)}
    cpu, got, want = run_both(model, feeds)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    program = cpu.regions[0].artifact.metadata["program"]
    copies = [s for s in _flat(program["steps"]) if s["kind"] == "copy"]
    assert len(copies) == 1  # only the region input x is copied into the final buffer


def test_gelu_opset20():
    rng = np.random.default_rng(3)
    for approx in ("none", "tanh"):
        model = make_model([helper.make_node("Gelu", ["x"], ["y"], approximate=approx)], {"x": (2, 7)}, ["y"],
                           opset=20)
        feeds = {"x": rng.standard_normal((2, 7)).astype(np.float32)}
        assert_close(compile_cpu(model).run(feeds), onnxruntime_run(model, feeds), rtol=1e-5, atol=1e-6)


def test_nan_and_inf_propagate_like_the_host():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Max", ["a", "x"], ["b"]),
                        helper.make_node("MaxPool", ["b"], ["y"], kernel_shape=[2, 2])], {"x": (1, 1, 2, 4)}, ["y"])
    x = np.array([[[[np.nan, 1, -np.inf, 2], [0, 0, np.inf, -1]]]], dtype=np.float32)
    _, got, want = run_both(model, {"x": x})
    assert_close(got, want, rtol=0, atol=0)


def _flat(steps):
    for s in steps:
        if s["kind"] == "batch":
            yield from _flat(s["steps"])
        elif s["kind"] == "par":
            for chunk in s["chunks"]:
                yield from _flat(chunk)
        else:
            yield s


@pytest.mark.parametrize("size,beta", [(1, 0.75), (4, 0.75), (5, 0.6), (3, 1.0)])
def test_lrn_matches_the_spec(size, beta):
    """Against the formula of the ONNX specification (onnxruntime refuses even sizes, and
    onnx.reference deviates from the formula for some sizes) and against the host."""
    rng = np.random.default_rng(size)
    model = make_model([helper.make_node("LRN", ["x"], ["y"], size=size, beta=beta, alpha=1e-3, bias=2.0)],
                       {"x": (2, 7, 3, 4)}, ["y"])
    x = rng.standard_normal((2, 7, 3, 4)).astype(np.float32) * 3
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    spec = np.empty_like(x)
    for c in range(7):
        sq = (x[:, max(0, c - lo):min(6, c + hi) + 1].astype(np.float64) ** 2).sum(1)
        spec[:, c] = x[:, c] / (2.0 + 1e-3 / size * sq) ** beta
    _, got, want = run_both(model, {"x": x})
    assert_close(got, [spec], rtol=1e-5, atol=1e-6)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n, side, pads", [(1, 42, [1, 1, 1, 1]), (2, 44, [0, 2, 2, 0]), (1, 9, [1, 1, 1, 1])])
def test_winograd_with_epilogue_matches_onnxruntime(n, side, pads):
    """3x3 stride-1 convolutions through the core's Winograd: F(4x4) from a 40-pixel output side
    (chosen by "auto" where the GEMMs are OpenBLAS's and channels in x out reach 64 x 128), F(2x2)
    below (forced)."""
    from byoc_cpu.host.gemm import FULL_WIDTH

    rng = np.random.default_rng(side)
    c, m = (64, 128) if side >= 40 else (16, 24)
    inits = {"W": (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
             "B": rng.standard_normal(m).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3, 3], pads=pads),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, {"x": (n, c, side, side)}, ["y"], inits)
    feeds = {"x": rng.standard_normal((n, c, side, side)).astype(np.float32)}
    strategy = "auto" if side >= 40 else "winograd"
    cpu = compile_cpu(model, conv_strategy=strategy)
    kinds = {s["kind"] for s in _flat(cpu.regions[0].artifact.metadata["program"]["steps"])}
    assert ("winograd" in kinds) == (strategy == "winograd" or not FULL_WIDTH)
    assert_close(cpu.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)
    again = compile_cpu(model, conv_strategy=strategy)  # the weights' Winograd form is per loaded program
    assert_close(again.run(feeds), onnxruntime_run(model, feeds), rtol=1e-4, atol=1e-4)


def test_verifier_refuses_a_winograd_step_outside_its_buffers():
    import copy

    from byoc_cpu.verify import ProgramError, verify

    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((8, 8, 3, 3)).astype(np.float32)}
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                       {"x": (1, 8, 12, 12)}, ["y"], inits)
    program = compile_cpu(model, conv_strategy="winograd").regions[0].artifact.metadata["program"]
    verify(program)
    (path,) = [i for i, s in enumerate(program["steps"]) if s["kind"] == "winograd"]
    for arg, value in ((4, 3), (6, 15), (7, 9), (8, 3), (3, 9), (0, 9)):  # pt, oh, ow, tile, m, c
        bad = copy.deepcopy(program)
        bad["steps"][path]["args"][arg] = value
        with pytest.raises(ProgramError):
            verify(bad)


@settings(max_examples=25)
@given(st.integers(1, 12), st.integers(2, 4), st.integers(2, 4), st.integers(1, 7), st.integers(0, 3),
       st.integers(1, 2), st.integers(1, 2), st.integers(0, 2**31))
def test_phase_strategy_matches_onnxruntime(c, sh, sw, k, pad, dil, n, seed):
    # strided convolutions over stride phases (an implicit GEMM, no patch matrix), with a bias
    # and ReLU epilogue; the rule picks it for strided KxK convolutions where it applies
    rng = np.random.default_rng(seed)
    kh, kw = k, max(1, k - 1)
    size = (max(kh, kw) - 1) * dil + 1 + 3 * max(sh, sw)
    m = 16
    inits = {"W": (rng.standard_normal((m, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32),
             "B": rng.standard_normal(m).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], strides=[sh, sw], pads=[pad, pad, pad, pad],
                              dilations=[dil, dil], kernel_shape=[kh, kw]), helper.make_node("Relu", ["c"], ["y"])]
    x = rng.standard_normal((n, c, size, size + 1)).astype(np.float32)
    model = make_model(nodes, {"x": x.shape}, ["y"], inits)
    cpu = compile_cpu(model, conv_strategy="phase", threads=2)
    assert_close(cpu.run({"x": x}), onnxruntime_run(model, {"x": x}), rtol=1e-4, atol=1e-4)
    ow = (x.shape[3] + 2 * pad - (kw - 1) * dil - 1) // sw + 1
    # where the phase planes waste little and the padding stays inside the first phase row/column
    if kh * kw > 1 and ow + ((kw - 1) * dil) // sw <= 1.5 * ow and pad < sh * kh and pad < sw * kw:
        (region,) = cpu.regions
        assert "conv, phase" in region.artifact.metadata["source"]


@pytest.mark.parametrize("stride", [1, 2])
def test_shifted_convolution_skips_its_padding_columns(stride):
    # a 3x3 convolution onto a 7x7 map (ResNet-50's last stage): the accumulator is 9 (shift) or
    # 8 (phase) columns wide per output row; the GEMM is told to compute only the first 7 of each
    import copy

    from byoc_cpu.verify import ProgramError, verify

    rng = np.random.default_rng(3)
    c, m, size = 40, 48, 7 * stride
    inits = {"W": (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
             "B": rng.standard_normal(m).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[stride, stride]), helper.make_node("Relu", ["c"], ["y"])]
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    model = make_model(nodes, {"x": x.shape}, ["y"], inits)
    cpu = compile_cpu(model, conv_strategy="shift" if stride == 1 else "phase", threads=2)
    assert_close(cpu.run({"x": x}), onnxruntime_run(model, {"x": x}), rtol=1e-4, atol=1e-4)
    program = cpu.regions[0].artifact.metadata["program"]

    def wgemms(steps):
        for step in steps:
            if step["kind"] == "wgemm":
                yield step
            for chunk in step.get("chunks", ()):
                yield from wgemms(chunk)

    gemm = next(wgemms(program["steps"]))
    assert gemm["args"][4:] == [9 if stride == 1 else 8, 7]
    for period, valid in ((7, 8), (9, 0)):  # more columns per row than the row has; none
        bad = copy.deepcopy(program)
        next(wgemms(bad["steps"]))["args"][4:] = [period, valid]
        with pytest.raises(ProgramError, match="period"):
            verify(bad)
