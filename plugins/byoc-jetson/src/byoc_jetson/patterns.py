"""Composite patterns TensorRT fuses into one kernel (named ``jetson.<pattern>``).

A match is placed as one unit and shows in the report under its pattern name. byoc accepts a
match only when every member node has a "yes" verdict for jetson (the per-node checks in
:mod:`byoc_jetson.support`), so the checks here judge only the composite as a whole.
"""

from __future__ import annotations

from byoc.contract.patterns import Match, PatternExpr, alt, any_value, const, op, tail
from byoc.contract import Pattern, SupportContext
from byoc_jetson.support import MAC_OPS

#: activations TensorRT fuses into a convolution / fully connected layer's epilogue
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "HardSigmoid", "Softplus", "HardSwish")

#: pointwise operators TensorRT's pointwise fusion merges into one generated kernel
UNARY = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Softplus", "Softsign", "HardSigmoid", "HardSwish",
         "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Clip", "Gelu")
BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum")
ELEMENTWISE = UNARY + BINARY

#: longest elementwise chain one pattern covers
MAX_CHAIN = 4


def _conv() -> PatternExpr:
    conv = op("Conv", any_value(), const(), const().optional(), label="conv")
    # a bias given as a separate Add of a constant (exporters without bias folding)
    conv_add = op("Add", conv, const(), label="bias")
    return alt(conv_add, conv)


def _gemm() -> PatternExpr:
    gemm = op("Gemm", any_value(), const(), const().optional(), label="gemm")
    matmul_add = op("Add", op("MatMul", any_value(), const(), label="gemm"), const(), label="bias")
    return alt(matmul_add, gemm)


def _chain(length: int) -> PatternExpr:
    expr: PatternExpr = any_value()
    for _ in range(length):
        expr = op(ELEMENTWISE, expr)
    return expr


def _epilogue_of_mac(node, match: Match) -> str | None:
    """``node`` would fuse into the epilogue of a MAC just before the match: leave it to that MAC."""
    inside = {id(n) for n in match.nodes}
    fusable = node.op_type in ACTIVATIONS or (
        node.op_type == "Add" and any(v is not None and v.const_value is not None for v in node.inputs[1:])
    )
    if not fusable:
        return None
    for v in node.inputs[:1]:
        p = v.producer() if v is not None else None
        if p is not None and id(p) not in inside and len(v.uses()) == 1:
            feeds_mac = p.op_type in MAC_OPS or (p.op_type == "Add" and any(
                q.producer() is not None and q.producer().op_type in MAC_OPS for q in p.inputs if q is not None))
            if feeds_mac:
                return f"{node.name} belongs to the epilogue of {p.name} ({p.op_type})"
    return None


def _check_chain(match: Match, ctx: SupportContext):
    for node in match.nodes:
        # a chain never steals a convolution's / fully connected layer's bias or activation
        reason = _epilogue_of_mac(node, match)
        if reason:
            return reason
    return True


_MAC_PRIORITY = 30

PATTERNS: list[Pattern] = [
    Pattern(
        "jetson.conv2d_bias_act",
        tail(_conv(), *ACTIVATIONS, label="act"),
        priority=_MAC_PRIORITY,
        description="Conv (+ bias as an input or an Add of a constant) + optional activation: one TensorRT "
        "convolution with a fused epilogue",
    ),
    Pattern(
        "jetson.gemm_bias_act",
        tail(_gemm(), *ACTIVATIONS, label="act"),
        priority=_MAC_PRIORITY,
        description="Gemm, or MatMul + Add of a constant, + optional activation: one fully connected layer",
    ),
    # one pattern per length, longest first: when a long chain is refused a shorter one is tried;
    # a single pointwise node is not a pattern (nothing to fuse)
    *(
        Pattern(
            "jetson.elementwise_chain",
            _chain(n),
            check=_check_chain,
            priority=20 + n,
            description=f"{n} chained pointwise operators: one generated pointwise kernel",
        )
        for n in range(MAX_CHAIN, 1, -1)
    ),
    Pattern(
        "jetson.softmax",
        op(("Softmax", "LogSoftmax"), any_value(), label="softmax"),
        priority=10,
        description="Softmax / LogSoftmax: TensorRT's fused softmax layer",
    ),
]


def patterns() -> list[Pattern]:
    return list(PATTERNS)


__all__ = ["ACTIVATIONS", "ELEMENTWISE", "PATTERNS", "patterns"]
