"""The ``openvino`` target: Intel OpenVINO compiles byoc's regions (entry point
``byoc: openvino = byoc_openvino.plugin``).

``byoc_register_targets``    the target; ``available`` probes ``Core().available_devices`` lazily
``byoc_register_operators``  every ONNX operator, each judged by OpenVINO's ``query_model``
``byoc_register_rules``      regions worth a call, and regions OpenVINO takes as a whole
``byoc_codegen``             region -> ONNX -> ``compile_model`` -> exported blob (+ the ONNX)
``byoc_runtime``             blob -> ``import_model`` (recompiled from the ONNX when it does not fit)

Importing this module does not import ``openvino``.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Mapping

from byoc.contract import HOOK_API_VERSION, Region, Rule, SupportContext, Target, hookimpl

from byoc_openvino import __version__
from byoc_openvino.options import OPTIONS

TARGET = "openvino"

#: view operators: a region of only these has nothing for OpenVINO to compute
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Constant", "Shape",
                   "Size"})


def _available() -> bool:
    from byoc_openvino.engine import available

    return available()


def _runtime_path() -> str:
    if importlib.util.find_spec("openvino") is None:
        return "openvino not installed"
    return "openvino"


def make_target() -> Target:
    return Target(
        TARGET,
        version=__version__,
        description="Intel OpenVINO: regions compiled by OpenVINO for CPU/GPU/NPU, shipped as exported blobs",
        device="cpu",
        options=OPTIONS,
        # float32 (precision="f32"): OpenVINO's kernels (Winograd, blocked layouts, fused
        # epilogues) order sums differently from the host's; see the README's conformance notes
        rtol=1e-4,
        atol=1e-5,
        # above byoc-cpu (-10, the general CPU fallback), below the accelerators (vitis 10, jetson 20)
        priority=0,
        api_version=HOOK_API_VERSION,
        # OpenVINO compiles dynamic shapes once (regions with symbolic dimensions included)
        shape_policy="dynamic",
        available=_available,
        runtime_path=_runtime_path(),
        # a region call: input/output tensors set, one synchronous infer (measured ~20-40 us)
        launch_overhead=30e-6,
    )


@hookimpl
def byoc_register_targets(register):
    register(make_target())


@hookimpl
def byoc_register_operators(register):
    from byoc_openvino.support import all_operators, verdict

    for op_type in all_operators():
        register(op_type, verdict)


def has_compute(region: Region, ctx: SupportContext) -> Any:
    """Drop regions of views only: an OpenVINO call costs more than the host's reshapes."""
    if all(n.op_type in VIEWS for n in region.nodes):
        ops = ", ".join(sorted({n.op_type for n in region.nodes}))
        return f"only {ops}: nothing for OpenVINO to compute, not worth a call"
    return True


def taken_whole(region: Region, ctx: SupportContext) -> Any:
    """OpenVINO reads and supports the region as one model (its nodes were judged one graph at a
    time; a region is a part of it, whose frontend conversion can differ)."""
    from byoc_openvino import engine
    from byoc_openvino.support import _opsets, _ops_of, submodel, whole_graph_supported

    try:
        device = engine.resolve_device(str(ctx.options.get("device", "CPU")))
    except Exception as exc:
        return f"OpenVINO is not usable here: {exc}"
    graph = region.nodes[0].graph if region.nodes else None
    if graph is not None and len(region.nodes) == len(graph) and whole_graph_supported(graph, device):
        return True  # the region is the whole graph, which OpenVINO took in one query already
    try:
        data = submodel(region.nodes, list(region.inputs) or None, list(region.outputs) or None, _opsets(graph))
        model = engine.read_onnx(data)
        supported = engine.query(model, device)
    except Exception as exc:
        return f"OpenVINO's ONNX frontend refuses the region as a whole: {' '.join(str(exc).split())[:300]}"
    missing = sorted({op.get_type_name() for op in _ops_of(model) if op.get_friendly_name() not in supported})
    if missing:
        return f"as one model, OpenVINO's {device} plugin does not support {', '.join(missing)} (query_model)"
    return True


@hookimpl
def byoc_register_rules(register):
    register(Rule("has_compute", has_compute, "a region must compute something (not only reshape)"))
    register(Rule("taken_whole", taken_whole, "OpenVINO reads and supports the region as one model"))


@hookimpl
def byoc_codegen(region: Region, options: Mapping[str, Any]):
    from byoc_openvino.codegen import generate

    return generate(region, options)


@hookimpl
def byoc_runtime(artifact, options: Mapping[str, Any]):
    from byoc_openvino.runtime import load

    return load(artifact, options)
