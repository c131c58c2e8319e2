"""Zero-size tensors everywhere: what onnxruntime runs with a 0 in some dimension, byoc runs too.

* every operator the conformance kit generates, drawn with a 0 in some dimension where ONNX
  allows one (``op_cases(op, zero_dims=1.0)``: batch, channels, K of a product, reduced axes,
  empty index lists, ...), gives onnxruntime's result on byoc's reference kernels
  (``host="reference"``) and on the installed host executor (byoc-cpu's, where installed); where
  onnxruntime refuses an instance, byoc raises a ByocError naming the node;
* hand-written edges: instances onnxruntime runs (compared) and ones it refuses (byoc raises a
  ByocError naming the node, never a foreign exception).

byoc-cpu's code generator is checked on the same instances in its own tests
(plugins/byoc-cpu/tests/test_zero_size.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import byoc
from byoc.errors import ByocError
from byoc.kernels import is_supported
from byoc.plugins import host_executor
from byoc.testing.cases import GENERATORS, OpCase, op_cases
from byoc.testing.oracle import assert_close, run_onnxruntime, single_node_model

#: the host's kernels: the reference, and the installed executor where there is one
HOSTS = [{"host": "reference"}] + ([{}] if host_executor() is not None else [])
OPS = sorted(op for op in GENERATORS if is_supported(op, ""))
F = np.float32


def outcome(model, feeds, **options) -> list[np.ndarray] | ByocError:
    """byoc's outputs for ``feeds``, or the ByocError it raised (anything else propagates)."""
    try:
        cm = byoc.compile(model, **{"targets": [], **options})
        out = cm.run(feeds)
    except ByocError as exc:
        return exc
    return [out[o.name] for o in model.graph.output]


def check_like_onnxruntime(model, feeds, node: str, hosts=HOSTS) -> None:
    """byoc gives onnxruntime's outputs; where onnxruntime refuses, a ByocError naming ``node``."""
    try:
        want: list[np.ndarray] | str = run_onnxruntime(model, feeds)
    except Exception as exc:  # onnxruntime's own errors: Fail, InvalidArgument, RuntimeException
        want = str(exc)  # not the exception: its traceback would keep the session (and its threads) alive
    for options in hosts:
        got = outcome(model, feeds, **options)
        if isinstance(want, str):
            assert isinstance(got, ByocError), f"{options}: onnxruntime refuses ({want}), byoc ran"
            assert node in str(got), f"{options}: the error does not name node {node!r}: {got}"
        else:
            assert not isinstance(got, ByocError), f"{options}: onnxruntime runs it, byoc raised {got!r}"
            assert_close(got, want)


def onnxruntime_departs(case: OpCase) -> bool:
    """Instances where onnxruntime departs from the ONNX spec whatever the sizes: auto_pad SAME_*
    with dilations (its Conv refuses them, its pools compute another output size), a ConvTranspose
    output_padding not below the stride (it allows less than the dilation too; onnxruntime refuses)."""
    a = case.attrs
    if str(a.get("auto_pad", "NOTSET")).startswith("SAME") and any(d != 1 for d in a.get("dilations", [])):
        return True
    strides = a.get("strides", [1] * len(a.get("output_padding", [])))
    return any(p >= s for p, s in zip(a.get("output_padding", []), strides))


@pytest.mark.parametrize("op_type", OPS)
def test_zero_size_instances_run_like_onnxruntime(op_type):
    @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(op_cases(op_type, zero_dims=1.0))
    def check(case):
        if onnxruntime_departs(case):
            return
        g = case.graph()
        check_like_onnxruntime(g.model(), g.feeds, g.nodes[0].name)

    check()


def test_the_kit_draws_zero_size_instances():
    """``zero_dims=1.0`` puts a zero-size tensor into (nearly) every instance, ``0.0`` into none."""

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(op_cases("Conv", zero_dims=1.0), op_cases("MatMul", zero_dims=1.0), op_cases("Add"))
    def check(conv, matmul, add):
        for case in (conv, matmul):
            assert any(a is not None and a.size == 0 for a in case.inputs), case.describe()
        assert all(a.size for a in add.inputs), add.describe()

    check()


def _i64(*v):
    return np.array(v, dtype=np.int64)


#: (op, inputs, attributes, constant inputs, outputs) that onnxruntime runs
RUNS = [
    ("Conv", [np.zeros((1, 2, 0, 4), F), np.ones((3, 2, 1, 1), F), np.ones(3, F)], {"pads": [1, 0, 1, 0]}, (1, 2), 1),
    ("Conv", [np.ones((1, 2, 3, 4), F), np.ones((0, 2, 2, 2), F)], {}, (1,), 1),
    ("Conv", [np.ones((1, 0, 4, 4), F), np.ones((3, 0, 2, 2), F), np.ones(3, F)], {}, (1, 2), 1),
    ("ConvTranspose", [np.zeros((1, 2, 0, 4), F), np.ones((2, 3, 2, 2), F)], {}, (1,), 1),
    ("ConvTranspose", [np.ones((1, 2, 3, 4), F), np.ones((2, 0, 2, 2), F)], {}, (1,), 1),
    ("Gemm", [np.ones((3, 0), F), np.ones((0, 4), F), np.ones(4, F)], {"beta": 0.5}, (2,), 1),
    ("MatMul", [np.ones((2, 3, 0), F), np.ones((0, 4), F)], {}, (), 1),
    ("ReduceMax", [np.ones((2, 0), F), _i64(1)], {}, (1,), 1),
    ("ReduceMin", [np.ones((2, 0), np.int32), _i64(1)], {}, (1,), 1),
    ("ReduceMean", [np.ones((2, 0), F), _i64(1)], {}, (1,), 1),
    ("ReduceProd", [np.ones((2, 0), F), _i64(1)], {}, (1,), 1),
    ("ReduceLogSumExp", [np.ones((0, 3), F)], {"keepdims": 0}, (), 1),
    ("ReduceL2", [np.ones((0, 3), F)], {}, (), 1),
    ("Einsum", [np.ones((2, 0), F), np.ones((0, 3), F)], {"equation": "ij,jk->ik"}, (), 1),
    ("TopK", [np.ones((2, 0), F), _i64(0)], {"axis": 1}, (1,), 2),
    ("Resize", [np.ones((1, 1, 0, 2), F), None, np.array([1, 1, 2, 2], F)], {"mode": "linear"}, (1, 2), 1),
    ("LayerNormalization", [np.ones((0, 3), F), np.ones(3, F)], {}, (1,), 1),
    ("Split", [np.ones((2, 0), F), _i64(0, 0)], {"axis": 1}, (1,), 2),
    ("Pad", [np.ones((0, 3), F), _i64(0, 1, 0, 1)], {"mode": "edge"}, (1,), 1),
    ("CumSum", [np.ones((3, 0), F), _i64(1)], {}, (1,), 1),
]

#: instances onnxruntime refuses: no value to pool, normalise, pick, replicate or scale
REFUSED = [
    ("MaxPool", [np.ones((1, 0, 4, 4), F)], {"kernel_shape": [2, 2]}, (), 1),
    ("AveragePool", [np.ones((1, 2, 0, 3), F)], {"kernel_shape": [1, 1], "pads": [1, 0, 1, 0]}, (), 1),
    ("GlobalAveragePool", [np.ones((1, 0, 4, 4), F)], {}, (), 1),
    ("GlobalMaxPool", [np.ones((1, 2, 0, 4), F)], {}, (), 1),
    ("LayerNormalization", [np.ones((2, 0), F), np.ones(0, F)], {}, (1,), 1),
    ("ArgMax", [np.ones((3, 0), F)], {"axis": 1}, (), 1),
    ("ArgMin", [np.ones((0,), np.int32)], {}, (), 1),
    ("Pad", [np.ones((2, 0), F), _i64(0, 1, 0, 1)], {"mode": "edge"}, (1,), 1),
    ("Pad", [np.ones((2, 0), F), _i64(0, 1, 0, 1)], {"mode": "reflect"}, (1,), 1),
    ("Resize", [np.ones((1, 1, 0, 2), F), None, None, _i64(1, 1, 3, 4)], {"mode": "nearest"}, (1, 2, 3), 1),
    ("TopK", [np.ones((2, 0), F), _i64(1)], {"axis": 1}, (), 2),  # K an input: the model itself is valid
    ("Gather", [np.ones((0, 3), F), _i64(0)], {"axis": 0}, (1,), 1),
    ("Conv", [np.ones((1, 2, 0, 4), F), np.ones((3, 2, 1, 1), F)], {}, (1,), 1),
]


def _model(op, inputs, attrs, const, n_outputs):
    model, feeds = single_node_model(op, inputs, attrs, const_inputs=const, n_outputs=n_outputs)
    return model, feeds, model.graph.node[0].name


@pytest.mark.parametrize("op,inputs,attrs,const,n_outputs", RUNS, ids=[f"{c[0]}-{i}" for i, c in enumerate(RUNS)])
def test_edges_onnxruntime_runs(op, inputs, attrs, const, n_outputs):
    model, feeds, node = _model(op, inputs, attrs, const, n_outputs)
    run_onnxruntime(model, feeds)  # the list stays honest
    check_like_onnxruntime(model, feeds, node)


@pytest.mark.parametrize("op,inputs,attrs,const,n_outputs", REFUSED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSED)])
def test_edges_onnxruntime_refuses(op, inputs, attrs, const, n_outputs):
    model, feeds, node = _model(op, inputs, attrs, const, n_outputs)
    try:
        run_onnxruntime(model, feeds)
        refused = False
    except Exception:  # onnxruntime's own exception types
        refused = True
    assert refused, "onnxruntime runs it: the list is out of date"
    check_like_onnxruntime(model, feeds, node)
