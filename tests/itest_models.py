"""Small ONNX models and registry helpers shared by the integration tests."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from byoc.plugins import build_registry

#: entry-point names of the test plugins (byoc-testplugin and byoc-faulty)
TEST_PLUGINS = "testchip,faulty,faulty_import,faulty_duplicate,faulty_api"
SHAPE = [2, 8]


def require_test_plugins() -> None:
    """Skip unless the test plugin packages are installed (``tox -e integration`` installs them)."""
    pytest.importorskip("byoc_testplugin", reason="install tests/plugins/byoc-testplugin (tox -e integration)")
    pytest.importorskip("byoc_faulty", reason="install tests/plugins/byoc-faulty (tox -e integration)")


def registry(monkeypatch, fault: str | None = None):
    """A registry built from the installed entry points of the test plugins only.

    ``fault`` switches a byoc-faulty mode on (``BYOC_FAULT``). Returns ``(registry, warnings)``.
    """
    monkeypatch.setenv("BYOC_PLUGINS", TEST_PLUGINS)
    if fault is None:
        monkeypatch.delenv("BYOC_FAULT", raising=False)
    else:
        monkeypatch.setenv("BYOC_FAULT", fault)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = build_registry()
    return reg, [str(w.message) for w in caught]


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def model(nodes, inputs=("x",), outputs=("y",), initializers=(), shape=SHAPE) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in outputs],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def fault_chain() -> onnx.ModelProto:
    """x -> Neg -> Relu -> Mul(c) -> Add(c) -> Tanh -> Sigmoid -> y; faultchip and testchip take all of it."""
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="n0"),
        helper.make_node("Relu", ["a"], ["b"], name="n1"),
        helper.make_node("Mul", ["b", "scale"], ["c"], name="n2"),
        helper.make_node("Add", ["c", "shift"], ["d"], name="n3"),
        helper.make_node("Tanh", ["d"], ["e"], name="n4"),
        helper.make_node("Sigmoid", ["e"], ["y"], name="n5"),
    ]
    return model(nodes, initializers=[_const("scale", np.full(SHAPE, 1.5)), _const("shift", np.full(SHAPE, -0.25))])


def mul_add_chain(n: int) -> onnx.ModelProto:
    """``n`` blocks of x * c + d -> Tanh: 3n nodes, n testchip.mul_add composites."""
    nodes, inits, prev = [], [], "x"
    rng = np.random.default_rng(n)
    for i in range(n):
        inits += [_const(f"s{i}", rng.uniform(0.5, 1.5, SHAPE)), _const(f"t{i}", rng.uniform(-0.5, 0.5, SHAPE))]
        nodes += [
            helper.make_node("Mul", [prev, f"s{i}"], [f"m{i}"], name=f"mul{i}"),
            helper.make_node("Add", [f"m{i}", f"t{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Tanh", [f"a{i}"], ["y" if i == n - 1 else f"h{i}"], name=f"tanh{i}"),
        ]
        prev = f"h{i}"
    return model(nodes, initializers=inits)


def feeds(m: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in m.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out
