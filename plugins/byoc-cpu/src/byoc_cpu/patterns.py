"""The ``cpu`` composite patterns: what the code generator fuses into one GEMM plus one loop.

Patterns name the fusions in the placement report (``cpu.conv_bias_act`` on a node means it
runs inside that Conv's epilogue) and keep the fused nodes in one region. The code generator
fuses more than these trees can say: any elementwise chain after a GEMM, and chains of
elementwise and broadcasting operators on their own (see :mod:`byoc_cpu.lower`).

Every pattern's check re-runs the operator checks on each node it covers: a composite is
placed as a unit, so it must not smuggle in a node the code generator cannot compile.
"""

from __future__ import annotations

from byoc.contract.patterns import alt, any_value, const, op, tail
from byoc.contract import Pattern

from byoc_cpu.ops import ACTIVATIONS
from byoc_cpu.support import check

TARGET = "cpu"


def _all_supported(match, ctx):
    for node in match.nodes:
        verdict = check(node, ctx)
        if verdict is not True:
            return verdict
    return True


_conv = op("Conv", any_value(), const(), const().optional(), label="conv")
_gemm = alt(
    op("Gemm", any_value(), any_value(), label="gemm"),
    op("Add", op("MatMul", any_value(), const(), label="matmul"), const(), label="bias"),
    op("MatMul", any_value(), const(), label="matmul"),
)
_residual = alt(op(("Add", "Sum"), _conv, any_value(), label="add"), op(("Add", "Sum"), any_value(), _conv, label="add"))


def patterns() -> list[Pattern]:
    return [
        Pattern(f"{TARGET}.conv_bias_act", tail(_conv, *ACTIVATIONS, label="act"), check=_all_supported,
                description="Conv (+bias) with its activation in the GEMM epilogue"),
        Pattern(f"{TARGET}.conv_residual_act", tail(_residual, *ACTIVATIONS, label="act"), check=_all_supported,
                description="Conv (+bias) + residual Add (+activation) in the GEMM epilogue"),
        Pattern(f"{TARGET}.gemm_bias_act", tail(_gemm, *ACTIVATIONS, label="act"), check=_all_supported,
                description="Gemm/MatMul (+bias) with its activation in the GEMM epilogue"),
    ]


__all__ = ["patterns"]
