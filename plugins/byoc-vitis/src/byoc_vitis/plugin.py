"""The vitis plugin's hook implementations (entry point ``byoc: vitis = byoc_vitis.plugin``).

byoc calls the target-scoped hooks only for ``vitis`` and hands them options it validated
against :data:`OPTIONS`, so no hook checks the target name or the options.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from byoc.contract import HOOK_API_VERSION, Artifact, Option, Region, Rule, Target, hookimpl, option_defaults
from byoc_vitis import __version__
from byoc_vitis.codegen import generate
from byoc_vitis.program import FORMAT, loads
from byoc_vitis.support import OPERATORS, make_check, rule_needs_mac

TARGET = "vitis"

#: the scheme the DPU asks the shared quantiser for: power-of-two (fixed-point) scales
#: everywhere, one scale per weight tensor, thresholds by percentile with the power of two
#: chosen by histogram MSE (see README.md, "Calibration")
QUANTIZATION = {"activations": "pow2", "weights": "per_tensor", "method": "percentile", "percentile": 99.99}

OPTIONS = [
    Option("quantization", {}, type=dict,
           doc='overrides of the quantisation scheme\'s keys, e.g. {"weights": "per_channel"}'),
    Option("engine", "numba", choices=("numba", "reference"),
           doc='"numba" (the integer engine) or "reference" (the numpy int64 reference: slow, same bits)'),
    Option("grouped_conv", False, type=bool, doc="accept grouped convolutions other than depthwise (a real DPU "
                                                 "does not)"),
]

#: ``{name: default}``
DEFAULT_OPTIONS: dict[str, Any] = option_defaults(OPTIONS)

#: int8 outputs: about one quantisation step of a typical output range (README.md, "Tolerance")
RTOL = 0.05
ATOL = 0.05


def make_target() -> Target:
    return Target(
        name=TARGET,
        version=__version__,
        description="Xilinx/AMD Vitis-AI DPU (int8): DPU programs on a bit-accurate integer engine",
        device="dpu",
        options=OPTIONS,
        rtol=RTOL,
        atol=ATOL,
        priority=10,
        api_version=HOOK_API_VERSION,
        needs_calibration=True,
        quantization=dict(QUANTIZATION),
        runtime_path="emulation",
        # no DPU driver path here: always the bit-accurate emulation, run only when named
        available=False,
    )


@hookimpl
def byoc_register_targets(register: Callable[[Target], None]) -> None:
    register(make_target())


@hookimpl
def byoc_register_operators(register: Callable[..., None]) -> None:
    for op_type in OPERATORS:
        register(op_type, make_check(op_type))


@hookimpl
def byoc_register_rules(register: Callable[[Rule], None]) -> None:
    register(Rule("needs_mac", rule_needs_mac, "drop regions without a Conv/ConvTranspose/Gemm/MatMul"))


@hookimpl
def byoc_codegen(region: Region, options: Mapping[str, Any]) -> Artifact | None:
    return generate(region, options)


@hookimpl
def byoc_runtime(artifact: Artifact, options: Mapping[str, Any]) -> Callable[..., Any] | None:
    if artifact.format != FORMAT:
        raise ValueError(f"vitis artifact of format {artifact.format!r}, expected {FORMAT!r}")
    from byoc_vitis.engine import DPURegion

    return DPURegion(loads(artifact.data), options["engine"])
