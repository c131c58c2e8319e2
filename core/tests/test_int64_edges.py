"""Integer attributes and inputs at the int64 edges (INT64_MIN, INT64_MAX), operator by operator,
against onnxruntime.

Where ONNX clamps (Slice starts/ends/steps, Shape start/end, Trilu's k: a diagonal past the
matrix keeps all or nothing, a stride past the input: one window), byoc gives onnxruntime's
result; where the value is out of range (axes, K, indices, split sizes, groups) or asks for more
than any budget (Range, Pad, Resize, Tile, ConstantOfShape, pads, dilations), byoc raises a
ByocError naming the node, as onnxruntime refuses: never a foreign exception (an OverflowError
from numpy's C longs, a MemoryError). Each instance runs with its integers as inputs and with
every input constant (constant folding computes it), on the reference and the installed host
executor.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from byoc.errors import ByocError
from byoc.testing.oracle import assert_close, run_onnxruntime, single_node_model
from test_zero_size import HOSTS, outcome

MIN, MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
F = np.float32
X = np.arange(12, dtype=F).reshape(3, 4)
X4 = X.reshape(1, 1, 3, 4)
W = np.ones((1, 1, 2, 2), F)


def i64(*v) -> np.ndarray:
    return np.array(v if len(v) != 1 else v[0], dtype=np.int64)


#: (op, inputs, attributes, constant inputs, outputs): onnxruntime's results
CLAMPED = [
    ("Trilu", [X, i64(MIN)], {}, (1,), 1),
    ("Trilu", [X, i64(MAX)], {}, (1,), 1),
    ("Trilu", [X, i64(MIN)], {"upper": 0}, (1,), 1),
    ("Trilu", [X, i64(MAX)], {"upper": 0}, (1,), 1),
    ("Trilu", [np.ones((2, 3, 4), F), i64(MIN + 1)], {}, (1,), 1),
    ("Slice", [X, i64([MIN]), i64([MAX])], {}, (1, 2), 1),
    ("Slice", [X, i64([MAX]), i64([MIN]), i64([1]), i64([-1])], {}, (1, 2, 3, 4), 1),
    ("Slice", [X, i64(MIN, MIN), i64(MAX, MAX), i64(0, 1), i64(MAX, MAX)], {}, (1, 2, 3, 4), 1),
    ("Slice", [X, i64([MAX]), i64([MIN]), i64([0]), i64([MIN])], {}, (1, 2, 3, 4), 1),
    ("Shape", [X], {"start": MIN, "end": MAX}, (), 1),
    ("Shape", [X], {"start": MAX, "end": MIN}, (), 1),
    ("Shape", [X], {"start": MAX}, (), 1),
    ("Range", [i64(MIN), i64(MAX), i64(MAX)], {}, (), 1),
    ("Range", [i64(MAX), i64(MIN), i64(MIN)], {}, (), 1),
    ("Range", [i64(0), i64(MAX), i64(MAX)], {}, (), 1),
    ("Range", [i64(MAX - 2), i64(MAX), i64(1)], {}, (), 1),
    ("Clip", [i64(MIN, 0, MAX), i64(MIN), i64(MAX)], {}, (1, 2), 1),
    ("Conv", [X4, W], {"strides": [MAX, 1]}, (1,), 1),
    ("MaxPool", [X4], {"kernel_shape": [2, 2], "strides": [MAX, 1]}, (), 1),
    ("AveragePool", [X4], {"kernel_shape": [2, 2], "strides": [MAX, MAX]}, (), 1),
]

#: instances onnxruntime refuses
REFUSED = [
    ("TopK", [X, i64([MAX])], {}, (1,), 2),
    ("TopK", [X, i64([MIN])], {}, (1,), 2),
    ("CumSum", [X, i64(MAX)], {}, (1,), 1),
    ("CumSum", [X, i64(MIN)], {}, (1,), 1),
    ("Range", [i64(0), i64(MAX), i64(1)], {}, (), 1),
    ("Pad", [X, i64(0, MAX, 0, 0)], {}, (1,), 1),
    ("Pad", [X, i64(0, MIN, 0, 0)], {}, (1,), 1),
    ("Pad", [X, i64(0, 1, 0, 1), np.array(0, F), i64([MAX])], {}, (1, 2, 3), 1),
    ("Split", [X, i64(MAX, MIN + 4)], {"axis": 1}, (1,), 2),
    ("Split", [X], {"axis": MAX, "num_outputs": 2}, (), 2),
    ("Tile", [X, i64(MAX, 1)], {}, (1,), 1),
    ("Expand", [X, i64(MAX, 4)], {}, (1,), 1),
    ("Reshape", [X, i64(MAX, -1)], {}, (1,), 1),
    ("Resize", [X4, None, None, i64(1, 1, MAX, 4)], {}, (1, 2, 3), 1),
    ("ConstantOfShape", [i64([MAX])], {}, (0,), 1),
    ("Gather", [X, i64([MIN])], {}, (1,), 1),
    ("Gather", [X, i64([MAX])], {"axis": 1}, (1,), 1),
    ("Gather", [X, np.zeros(0, np.int64)], {"axis": MAX}, (1,), 1),
    ("GatherElements", [X, np.full((3, 4), MIN, np.int64)], {}, (1,), 1),
    ("ScatterElements", [X, np.full((1, 4), MAX, np.int64), np.ones((1, 4), F)], {}, (1,), 1),
    ("ScatterND", [X, np.full((1, 1), MIN, np.int64), np.ones((1, 4), F)], {}, (1,), 1),
    ("Unsqueeze", [X, i64([MAX])], {}, (1,), 1),
    ("Squeeze", [X.reshape(1, 3, 4), i64([MIN])], {}, (1,), 1),
    ("ReduceSum", [X, i64([MAX])], {}, (1,), 1),
    ("ReduceMax", [X, i64([MIN])], {}, (1,), 1),
    ("Flatten", [X], {"axis": MAX}, (), 1),
    ("Concat", [X, X], {"axis": MIN}, (), 1),
    ("ArgMax", [X], {"axis": MIN}, (), 1),
    ("Transpose", [X], {"perm": [MAX, 0]}, (), 1),
    ("LayerNormalization", [X, np.ones(4, F)], {"axis": MIN}, (1,), 1),
    ("Cast", [X], {"to": MAX}, (), 1),
    ("Conv", [X4, W], {"group": MAX}, (1,), 1),
    ("Conv", [X4, W], {"dilations": [MAX, 1]}, (1,), 1),
    ("Conv", [X4, W], {"pads": [0, MAX, 0, 0]}, (1,), 1),
    ("ConvTranspose", [X4, W], {"strides": [MAX, 1]}, (1,), 1),
    ("ConvTranspose", [X4, W], {"output_padding": [MAX, 0], "strides": [2, 2]}, (1,), 1),
    ("MaxPool", [X4], {"kernel_shape": [2, 2], "pads": [MAX, 0, 0, 0]}, (), 1),
    ("MaxPool", [X4], {"kernel_shape": [2, 2], "dilations": [MAX, 1]}, (), 1),
    ("AveragePool", [X4], {"kernel_shape": [MAX, 2]}, (), 1),
    ("DequantizeLinear", [X.astype(np.int8), np.array([0.5, 0.25], F), np.zeros(2, np.int8)],
     {"axis": 1, "block_size": MAX}, (1, 2), 1),
    ("LSTM", [X.reshape(3, 1, 4), np.ones((1, 8, 4), F), np.ones((1, 8, 2), F)], {"hidden_size": MAX}, (1, 2), 1),
]

#: onnxruntime runs these though ONNX allows an axis in [-r, r-1] only: byoc refuses them
OUT_OF_SPEC = [
    ("Softmax", [X], {"axis": MAX}, (), 1),
    ("Softmax", [X], {"axis": MIN}, (), 1),
    ("LogSoftmax", [X], {"axis": MAX}, (), 1),
    ("Hardmax", [X], {"axis": MAX}, (), 1),
]


def _ids(cases) -> list[str]:
    return [f"{c[0]}-{i}" for i, c in enumerate(cases)]


def _model(op, inputs, attrs, const, n_outputs, folded: bool):
    """The one-node model (every input constant when ``folded``); outputs typed, shapes left open
    (onnx's shape inference writes nonsense dimensions for some of these values)."""
    const = tuple(i for i, a in enumerate(inputs) if a is not None) if folded else const
    model, feeds = single_node_model(op, inputs, attrs, const_inputs=const, n_outputs=n_outputs)
    for k, out in enumerate(model.graph.output):
        int64 = op in ("ArgMax", "Shape") or (op == "TopK" and k == 1)
        out.type.tensor_type.elem_type = onnx.TensorProto.INT64 if int64 else \
            onnx.helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
        out.type.tensor_type.ClearField("shape")
    return model, feeds, model.graph.node[0].name


def _refused_by_onnxruntime(model, feeds) -> bool:
    try:
        run_onnxruntime(model, feeds)
    except Exception:  # onnxruntime's own exception types
        return True
    return False


def _raises_naming(model, feeds, node: str) -> None:
    for options in HOSTS:
        got = outcome(model, feeds, **options)
        assert isinstance(got, ByocError), f"{options}: byoc ran it"
        assert node in str(got), f"{options}: the error does not name node {node!r}: {got}"


@pytest.mark.parametrize("folded", [False, True], ids=["inputs", "folded"])
@pytest.mark.parametrize("op,inputs,attrs,const,n_outputs", CLAMPED, ids=_ids(CLAMPED))
def test_clamped_like_onnxruntime(op, inputs, attrs, const, n_outputs, folded):
    model, feeds, _ = _model(op, inputs, attrs, const, n_outputs, folded)
    want = run_onnxruntime(model, feeds)
    for options in HOSTS:
        got = outcome(model, feeds, **options)
        assert not isinstance(got, ByocError), f"{options}: {got!r}"
        assert_close(got, want)


@pytest.mark.parametrize("folded", [False, True], ids=["inputs", "folded"])
@pytest.mark.parametrize("op,inputs,attrs,const,n_outputs", REFUSED, ids=_ids(REFUSED))
def test_refused_like_onnxruntime(op, inputs, attrs, const, n_outputs, folded):
    model, feeds, node = _model(op, inputs, attrs, const, n_outputs, folded)
    assert _refused_by_onnxruntime(model, feeds), "onnxruntime runs it: the list is out of date"
    _raises_naming(model, feeds, node)


@pytest.mark.parametrize("op,inputs,attrs,const,n_outputs", OUT_OF_SPEC, ids=_ids(OUT_OF_SPEC))
def test_axes_out_of_spec_are_refused(op, inputs, attrs, const, n_outputs):
    model, feeds, node = _model(op, inputs, attrs, const, n_outputs, False)
    assert not _refused_by_onnxruntime(model, feeds), "onnxruntime refuses it now: move it to REFUSED"
    _raises_naming(model, feeds, node)


def test_lrn_of_an_int64_max_window_follows_the_spec():
    """onnxruntime overflows computing ``size = INT64_MAX``; ONNX's window is clipped to the
    channels and ``alpha / size`` is as good as 0: ``y = x / bias ** beta``."""
    model, feeds, _ = _model("LRN", [X4], {"size": MAX, "bias": 2.0, "beta": 0.5}, (), 1, False)
    assert _refused_by_onnxruntime(model, feeds)
    for options in HOSTS:
        (y,) = outcome(model, feeds, **options)
        np.testing.assert_allclose(y, X4 / np.sqrt(2.0), rtol=1e-6)
