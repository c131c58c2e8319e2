"""The jetson plugin's hook implementations (entry point ``byoc: jetson = byoc_jetson.plugin``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import byoc
from byoc.partition.types import Artifact, Region
from byoc_jetson import __version__
from byoc_jetson.codegen import FORMAT, generate
from byoc_jetson.options import DEFAULT_OPTIONS, registered_runtime_path, runtime_path, validate_options
from byoc_jetson.patterns import patterns
from byoc_jetson.rules import begin_partition, rules
from byoc_jetson.support import NOT_SUPPORTED, OPERATORS, make_check, node_macs

TARGET = "jetson"

#: fp16 engines: 10 bits of mantissa, rounded at every layer (see README, "Tolerance")
RTOL = 1e-2
ATOL = 1e-3


def make_target() -> byoc.Target:
    return byoc.Target(
        name=TARGET,
        version=__version__,
        description="NVIDIA TensorRT (Jetson): TensorRT engines on a CUDA GPU, a float16 CPU emulation without one",
        device="gpu",
        options=dict(DEFAULT_OPTIONS),
        rtol=RTOL,
        atol=ATOL,
        priority=20,
        api_version=byoc.HOOK_API_VERSION,
        # found without initialising CUDA: registration may come before a user's fork()
        runtime_path=registered_runtime_path(),
    )


@byoc.hookimpl
def byoc_register_targets(register: Callable[[byoc.Target], None]) -> None:
    register(make_target())


@byoc.hookimpl
def byoc_register_operators(target: str, register: Callable[..., None]) -> None:
    if target != TARGET:
        return
    # the refused ones too, so the report gives TensorRT's reason
    for op_type in sorted(set(OPERATORS) | NOT_SUPPORTED):
        register(op_type, make_check(op_type))


@byoc.hookimpl
def byoc_register_patterns(target: str, register: Callable[[byoc.Pattern], None]) -> None:
    if target != TARGET:
        return
    for pattern in patterns():
        register(pattern)


@byoc.hookimpl
def byoc_register_rules(target: str, register: Callable[[byoc.Rule], None]) -> None:
    if target != TARGET:
        return
    for rule in rules():
        register(rule)


@byoc.hookimpl
def byoc_pre_partition(target: str, model: Any, options: Mapping[str, Any]) -> None:
    if target != TARGET:
        return
    # hand the options to the partition rules; an invalid option is reported here (the support
    # checks then keep every node on the host with the same message)
    begin_partition(options)
    validate_options(options)


@byoc.hookimpl
def byoc_codegen(target: str, region: Region, options: Mapping[str, Any]) -> Artifact | None:
    if target != TARGET:
        return None
    return generate(region, validate_options(options))


@byoc.hookimpl
def byoc_runtime(target: str, artifact: Artifact, options: Mapping[str, Any]) -> Callable[..., Any] | None:
    if target != TARGET:
        return None
    if artifact.format != FORMAT:
        raise ValueError(f"jetson artifact of format {artifact.format!r}, expected {FORMAT!r}")
    opts = validate_options(options)
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


@byoc.hookimpl
def byoc_cost(target: str, region: Region, options: Mapping[str, Any]) -> float | None:
    if target != TARGET:
        return None
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
