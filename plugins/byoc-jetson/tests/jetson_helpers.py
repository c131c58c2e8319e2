"""Model builders and runners shared by the jetson tests."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import byoc
from byoc.frontend import load_model
from byoc.contract import Region, SupportContext
from byoc.passes import run_passes
from byoc.contract import host_callable

import byoc_jetson.plugin as plugin
from byoc_jetson.options import validate_options
from byoc_jetson.support import check_node

RTOL = 1e-2
ATOL = 1e-3
#: float16 has a 10-bit mantissa: rounding an input or weight moves it by at most 2**-11 relatively
FP16_EPS = 2.0**-11


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, tuple[int, Sequence[Any]]],
    outputs: Sequence[str],
    inits: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model from nodes; ``inputs`` maps name -> (TensorProto type, shape); output types are inferred."""
    graph = helper.make_graph(
        list(nodes),
        "jetson_test",
        [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in inputs.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def load(model: onnx.ModelProto, passes: Sequence[str] = ("shape_inference",)) -> ir.Model:
    m = load_model(model, require_kernels=False)
    run_passes(m, list(passes))
    return m


def verdicts(model: onnx.ModelProto, options: Mapping[str, Any] | None = None) -> dict[str, str | None]:
    """op_type (or node name when an op repeats) -> the jetson verdict, straight from the checks."""
    m = load(model)
    # the emulation's verdicts unless a test names other options (it also needs host kernels)
    ctx = SupportContext("jetson", dict(options) if options is not None else validate_options({"runtime": "emulation"}))
    out: dict[str, str | None] = {}
    for node in m.graph:
        key = node.op_type if node.op_type not in out else node.name
        out[key] = check_node(node, ctx)
    return out


def whole_region(model: onnx.ModelProto) -> Region:
    """The whole (shape-inferred) model as one jetson region, as the partitioner would outline it."""
    m = load(model)
    g = m.graph
    return Region(name="jetson_0", target="jetson", nodes=list(g), inputs=list(g.inputs), outputs=list(g.outputs),
                  model=m)


def jetson_callable(model: onnx.ModelProto, runtime: str = "emulation", **options):
    """(artifact, callable) from the plugin's own codegen and runtime hooks, on the whole model.

    ``runtime`` is the CPU emulation unless a test names another path: "auto" would pick
    TensorRT on a machine that has it, and these tests are about the emulation's numbers.
    """
    opts = validate_options({"runtime": runtime, **options})
    region = whole_region(model)
    artifact = plugin.byoc_codegen(region, opts)
    return artifact, plugin.byoc_runtime(artifact, opts)


def host_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The host reference: byoc's kernels on the same (shape-inferred) model."""
    m = load(model)
    fn = host_callable(m)
    return fn(*(feeds[name] for name in fn.input_names))


def compile_jetson(registry, model, runtime: str = "emulation", passes=None, **options) -> byoc.CompiledModel:
    """``byoc.compile`` for jetson; the CPU emulation unless the test names ``runtime`` (see above);
    ``passes``: the shared passes to run (default: all)."""
    return byoc.compile(model, targets=["jetson"], registry=registry, passes=passes,
                        target_options={"jetson": {"runtime": runtime, **options}})


def require_kernels(*ops: str) -> None:
    """Skip when byoc's host kernels for ``ops`` (written in the core) are not there yet."""
    from byoc.kernels import is_supported

    missing = [op for op in ops if not is_supported(op, "")]
    if missing:
        pytest.skip(f"byoc host kernel(s) not available yet: {missing}")


def assert_fp16_close(actual, expected, bound=None, rtol: float = RTOL, atol: float = ATOL, what: str = "") -> None:
    """|actual - expected| <= atol + rtol*|expected| (+ ``bound``: an op's own justified error bound)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    tol = atol + rtol * np.abs(expected)
    if bound is not None:
        tol = tol + np.asarray(bound, dtype=np.float64)
    err = np.abs(actual - expected)
    bad = ~(err <= tol)
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err - tol, -np.inf))), err.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} of {err.size} elements out of tolerance; worst at {i}: "
                             f"got {actual[i]}, expected {expected[i]}, tolerance {tol[i]}")
