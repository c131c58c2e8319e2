"""The jetson plugin's hook implementations (entry point ``byoc: jetson = byoc_jetson.plugin``).

byoc calls the target-scoped hooks only for ``jetson`` and hands them options it validated
against :data:`byoc_jetson.options.OPTIONS`, so no hook checks the target name or the options.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from byoc.contract import HOOK_API_VERSION, Artifact, Pattern, Region, Rule, Target, hookimpl
from byoc_jetson import __version__
from byoc_jetson.codegen import FORMAT, generate
from byoc_jetson.options import OPTIONS, registered_runtime_path, runtime_path, tensorrt_available
from byoc_jetson.patterns import patterns
from byoc_jetson.rules import rules
from byoc_jetson.support import NOT_SUPPORTED, OPERATORS, make_check, node_macs

TARGET = "jetson"

#: fp16 engines: 10 bits of mantissa, rounded at every layer (see README, "Tolerance")
RTOL = 1e-2
ATOL = 1e-3


def make_target() -> Target:
    return Target(
        name=TARGET,
        version=__version__,
        description="NVIDIA TensorRT (Jetson): TensorRT engines on a CUDA GPU, a float16 CPU emulation without one",
        device="gpu",
        options=OPTIONS,
        rtol=RTOL,
        atol=ATOL,
        priority=20,
        api_version=HOOK_API_VERSION,
        # found without initialising CUDA: registration may come before a user's fork()
        runtime_path=registered_runtime_path(),
        # the device is there only when TensorRT and a CUDA GPU answer; probed lazily (at the
        # first compile with targets=None or `byoc targets`), never at registration
        available=tensorrt_available,
        # Jetson's unified memory is shared with the CPU but engines still copy in and out
        bandwidth=_BANDWIDTH,
        launch_overhead=_LAUNCH,
    )


@hookimpl
def byoc_register_targets(register: Callable[[Target], None]) -> None:
    register(make_target())


@hookimpl
def byoc_register_operators(register: Callable[..., None]) -> None:
    # the refused ones too, so the report gives TensorRT's reason
    for op_type in sorted(set(OPERATORS) | NOT_SUPPORTED):
        register(op_type, make_check(op_type))


@hookimpl
def byoc_register_patterns(register: Callable[[Pattern], None]) -> None:
    for pattern in patterns():
        register(pattern)


@hookimpl
def byoc_register_rules(register: Callable[[Rule], None]) -> None:
    for rule in rules():
        register(rule)


@hookimpl
def byoc_codegen(region: Region, options: Mapping[str, Any]) -> Artifact | None:
    return generate(region, dict(options))


@hookimpl
def byoc_runtime(artifact: Artifact, options: Mapping[str, Any]) -> Callable[..., Any] | None:
    if artifact.format != FORMAT:
        raise ValueError(f"jetson artifact of format {artifact.format!r}, expected {FORMAT!r}")
    opts = dict(options)
    if runtime_path(opts) == "tensorrt":
        from byoc_jetson.tensorrt_rt import TensorRTRegion

        return TensorRTRegion(artifact, opts)
    from byoc_jetson.emulation import EmulatedRegion

    return EmulatedRegion(artifact.data, opts["precision"])


#: rough Jetson AGX Orin figures for byoc_cost: dense fp16 throughput, fp32, DRAM bandwidth,
#: and the fixed cost of one engine launch plus its host<->device copies
_FLOPS = {"fp16": 20e12, "fp32": 5e12}
_BANDWIDTH = 150e9
_LAUNCH = 50e-6


@hookimpl
def byoc_cost(region: Region, options: Mapping[str, Any]) -> float | None:
    macs = sum(node_macs(n) for n in region.nodes)
    moved = 0
    for v in list(region.inputs) + list(region.outputs):
        if v.shape is not None:
            n = 1
            for d in v.shape:
                n *= d if isinstance(d, int) else 1
            moved += 4 * n
    flops = _FLOPS.get(str(options.get("precision", "fp16")), _FLOPS["fp32"])
    return _LAUNCH + 2.0 * macs / flops + moved / _BANDWIDTH
