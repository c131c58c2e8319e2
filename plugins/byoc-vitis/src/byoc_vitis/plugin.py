"""The vitis plugin's hook implementations (entry point ``byoc: vitis = byoc_vitis.plugin``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import byoc
from byoc.errors import OptionError
from byoc.partition.types import Artifact, Region
from byoc_vitis import __version__
from byoc_vitis.codegen import generate
from byoc_vitis.program import FORMAT, loads
from byoc_vitis.support import OPERATORS, make_check, rule_needs_mac

TARGET = "vitis"

#: the scheme the DPU asks the shared quantiser for: power-of-two (fixed-point) scales
#: everywhere, one scale per weight tensor, thresholds by percentile with the power of two
#: chosen by histogram MSE (see README.md, "Calibration")
QUANTIZATION = {"activations": "pow2", "weights": "per_tensor", "method": "percentile", "percentile": 99.99}

DEFAULT_OPTIONS: dict[str, Any] = {
    # overrides of QUANTIZATION keys, e.g. {"weights": "per_channel"}
    "quantization": {},
    # "numba" (the integer engine) or "reference" (the numpy int64 reference: slow, same bits)
    "engine": "numba",
    # accept grouped convolutions other than depthwise (a real DPU does not)
    "grouped_conv": False,
}

#: int8 outputs: about one quantisation step of a typical output range (README.md, "Tolerance")
RTOL = 0.05
ATOL = 0.05


def make_target() -> byoc.Target:
    return byoc.Target(
        name=TARGET,
        version=__version__,
        description="Xilinx/AMD Vitis-AI DPU (int8): DPU programs on a bit-accurate integer engine",
        device="dpu",
        options=dict(DEFAULT_OPTIONS),
        rtol=RTOL,
        atol=ATOL,
        priority=10,
        api_version=byoc.HOOK_API_VERSION,
        needs_calibration=True,
        quantization=dict(QUANTIZATION),
        runtime_path="emulation",
    )


def validate_options(options: Mapping[str, Any]) -> dict[str, Any]:
    opts = {**DEFAULT_OPTIONS, **dict(options)}
    if opts["engine"] not in ("numba", "reference"):
        raise OptionError(f"vitis: option engine must be 'numba' or 'reference', got {opts['engine']!r}")
    if not isinstance(opts["grouped_conv"], bool):
        raise OptionError(f"vitis: option grouped_conv must be a bool, got {opts['grouped_conv']!r}")
    return opts


@byoc.hookimpl
def byoc_register_targets(register: Callable[[byoc.Target], None]) -> None:
    register(make_target())


@byoc.hookimpl
def byoc_register_operators(target: str, register: Callable[..., None]) -> None:
    if target != TARGET:
        return
    for op_type in OPERATORS:
        register(op_type, make_check(op_type))


@byoc.hookimpl
def byoc_register_rules(target: str, register: Callable[[byoc.Rule], None]) -> None:
    if target != TARGET:
        return
    register(byoc.Rule("needs_mac", rule_needs_mac, "drop regions without a Conv/ConvTranspose/Gemm/MatMul"))


@byoc.hookimpl
def byoc_pre_partition(target: str, model: Any, options: Mapping[str, Any]) -> None:
    if target == TARGET:
        validate_options(options)


@byoc.hookimpl
def byoc_codegen(target: str, region: Region, options: Mapping[str, Any]) -> Artifact | None:
    if target != TARGET:
        return None
    validate_options(options)
    return generate(region, options)


@byoc.hookimpl
def byoc_runtime(target: str, artifact: Artifact, options: Mapping[str, Any]) -> Callable[..., Any] | None:
    if target != TARGET:
        return None
    if artifact.format != FORMAT:
        raise ValueError(f"vitis artifact of format {artifact.format!r}, expected {FORMAT!r}")
    from byoc_vitis.engine import DPURegion

    return DPURegion(loads(artifact.data), validate_options(options)["engine"])
