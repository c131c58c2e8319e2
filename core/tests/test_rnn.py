"""LSTM, GRU and RNN against onnxruntime: directions, layouts, initial states, sequence lengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.testing.oracle import run_onnxruntime, run_reference

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(op, *, hidden, n_in, direction, layout, batch, seq, use_lens, use_init, extra=None, rng):
    n_dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = [
        nh.from_array((rng.standard_normal((n_dirs, g * hidden, n_in)) * 0.5).astype(np.float32), "W"),
        nh.from_array((rng.standard_normal((n_dirs, g * hidden, hidden)) * 0.5).astype(np.float32), "R"),
        nh.from_array((rng.standard_normal((n_dirs, 2 * g * hidden)) * 0.1).astype(np.float32), "B"),
    ]
    x_shape = [seq, batch, n_in] if layout == 0 else [batch, seq, n_in]
    inputs = [h.make_tensor_value_info("X", T.FLOAT, x_shape)]
    names = ["X", "W", "R", "B", "", ""]
    if use_lens:
        names[4] = "lens"
        inputs.append(h.make_tensor_value_info("lens", T.INT32, [batch]))
    if use_init:
        state = [n_dirs, batch, hidden] if layout == 0 else [batch, n_dirs, hidden]
        names[5] = "h0"
        inputs.append(h.make_tensor_value_info("h0", T.FLOAT, state))
        if op == "LSTM":
            names.append("c0")
            inputs.append(h.make_tensor_value_info("c0", T.FLOAT, state))
    while names and names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = h.make_node(op, names, outs, hidden_size=hidden, direction=direction, layout=layout, **(extra or {}))
    graph = h.make_graph([node], "rnn", inputs, [h.make_tensor_value_info(o, T.FLOAT, [None] * (4 if o == "Y" else 3)) for o in outs], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 14)])


def _feeds(model, rng, seq, batch, layout, use_lens):
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value if d.dim_value else seq for d in vi.type.tensor_type.shape.dim]
        if vi.name == "lens":
            feeds["lens"] = rng.integers(1, seq + 1, size=batch).astype(np.int32)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@settings(max_examples=30)
@given(
    op=st.sampled_from(sorted(GATES)),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    layout=st.sampled_from([0, 1]),
    hidden=st.integers(1, 6),
    n_in=st.integers(1, 5),
    batch=st.integers(1, 3),
    seq=st.integers(1, 6),
    use_lens=st.booleans(),
    use_init=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_recurrent_ops_match_onnxruntime(op, direction, layout, hidden, n_in, batch, seq, use_lens, use_init, seed):
    # onnxruntime refuses layout=1 for GRU/RNN: onnx.reference is the oracle there, and it
    # ignores sequence_lens, so those examples go without them
    oracle = run_onnxruntime if layout == 0 else run_reference
    use_lens = use_lens and layout == 0
    rng = np.random.default_rng(seed)
    extra = {"linear_before_reset": 1} if op == "GRU" and seed % 2 else {}
    model = _model(op, hidden=hidden, n_in=n_in, direction=direction, layout=layout, batch=batch, seq=seq,
                   use_lens=use_lens, use_init=use_init, extra=extra, rng=rng)
    feeds = _feeds(model, rng, seq, batch, layout, use_lens)
    expected = oracle(model, feeds)
    got = list(byoc.compile(model, targets=[]).run(feeds).values())
    for a, e in zip(got, expected):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("length", [1, 17, 200])
def test_lstm_with_dynamic_sequence_length_matches_onnxruntime(length):
    rng = np.random.default_rng(0)
    hidden, n_in, batch = 16, 8, 2
    inits = [
        nh.from_array((rng.standard_normal((1, 4 * hidden, n_in)) * 0.3).astype(np.float32), "W"),
        nh.from_array((rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R"),
        nh.from_array((rng.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32), "B"),
        nh.from_array((rng.standard_normal((hidden, 4)) * 0.3).astype(np.float32), "Wout"),
    ]
    nodes = [
        h.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"], hidden_size=hidden),
        h.make_node("Squeeze", ["Y_h", "axes0"], ["last"]),
        h.make_node("MatMul", ["last", "Wout"], ["logits"]),
    ]
    inits.append(nh.from_array(np.array([0], np.int64), "axes0"))
    graph = h.make_graph(nodes, "seq", [h.make_tensor_value_info("X", T.FLOAT, ["T", batch, n_in])],
                         [h.make_tensor_value_info("logits", T.FLOAT, [batch, 4]),
                          h.make_tensor_value_info("Y", T.FLOAT, ["T", 1, batch, hidden])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    compiled = byoc.compile(model, targets=[])  # compiled once, run at every length
    x = rng.standard_normal((length, batch, n_in)).astype(np.float32)
    expected = run_onnxruntime(model, {"X": x})
    got = compiled.run({"X": x})
    np.testing.assert_allclose(got["logits"], expected[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["Y"], expected[1], rtol=1e-4, atol=1e-5)
