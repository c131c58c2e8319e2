"""Helpers for the vitis tests: an in-process registry with only this plugin, model builders.

(Not named conftest.py: several test folders run in one pytest session.)"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import byoc
import byoc_vitis.plugin as vitis_plugin
from byoc.plugins import build_registry
from byoc.contract import host_callable


def make_registry():
    """A registry holding only this plugin (no entry points: the tests do not depend on what is installed)."""
    reg = build_registry([("byoc-vitis", vitis_plugin)], entry_points=False)
    assert not reg.faults, reg.faults
    return reg


def model(nodes, inputs, outputs, inits=(), opset=21):
    """A ModelProto from node/value lists; ``inputs``/``outputs`` are ``(name, shape)`` pairs."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in inits],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def samples(shapes: dict, n=8, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return [{k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in shapes.items()} for _ in range(n)]


def compile_vitis(m, registry, cal, **options):
    return byoc.compile(m, targets=["vitis"], registry=registry, calibration=cal,
                        target_options={"vitis": options} if options else None)


def simulate(cm):
    """The host QDQ simulation of each region, keyed by region name."""
    return {cr.region.name: host_callable(cr.region.model) for cr in cm.regions}


def output_steps(cm, feeds):
    """|DPU - QDQ simulation| of every region output, in steps of that output's scale (max over elements).

    The regions' inputs must be graph inputs (single-region test models).
    """
    out = {}
    sims = simulate(cm)
    for cr in cm.regions:
        args = [feeds[v.name] for v in cr.region.inputs]
        got = cr.fn(*args)
        want = sims[cr.region.name](*args)
        for v, g, w in zip(cr.region.outputs, got, want):
            scale = cr.artifact.metadata["output_scales"][v.name]
            out[v.name] = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))) / scale)
    return out
