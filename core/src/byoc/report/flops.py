"""Static FLOP estimates per node, from shapes known at compile time.

The estimates are for the placement report's "share of FLOPs", not a performance model:

* ``Conv``: ``2 * N * Cout * Hout * Wout * (Cin / groups) * kh * kw`` (any number of spatial dims),
* ``ConvTranspose``: ``2 * N * Cin * Hin * Win * (Cout / groups) * kh * kw``,
* ``Gemm``: ``2 * M * N * K``; ``MatMul`` (batched): ``2 * batch * M * N * K``,
* every other operator: its number of output elements (one operation per element produced).

Symbolic dimensions (a dynamic batch size, say) count as 1, so the figure is "per unit of every
dynamic dimension". A node whose needed shapes are unknown gets ``None``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

Shape = tuple  # of int | None (None: symbolic or unknown dimension)


def _prod(dims: Sequence[int | None]) -> int:
    return math.prod(d if isinstance(d, int) and d >= 0 else 1 for d in dims)


def _shape(shapes: Mapping[str, Shape | None], names: Sequence[str], i: int) -> Shape | None:
    if i >= len(names) or not names[i]:
        return None
    return shapes.get(names[i])


def _int_attr(attrs: Mapping[str, Any], name: str, default: int) -> int:
    value = attrs.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _dim(shape: Shape, i: int) -> int | None:
    try:
        d = shape[i]
    except IndexError:
        return None
    return d if isinstance(d, int) else None


def estimate_flops(
    op_type: str,
    attrs: Mapping[str, Any],
    inputs: Sequence[str],
    outputs: Sequence[str],
    shapes: Mapping[str, Shape | None],
) -> int | None:
    """Estimated floating-point operations of one node.

    :param op_type: the ONNX operator type.
    :param attrs: attribute values by name (ints, int lists, ...).
    :param inputs: input value names ("" for an absent optional input).
    :param outputs: output value names.
    :param shapes: value name -> static shape (ints, ``None`` for unknown dims) or ``None``.
    :returns: the estimate, or ``None`` when the shapes it needs are unknown.
    """
    out = _shape(shapes, outputs, 0)
    if op_type == "Conv":
        w = _shape(shapes, inputs, 1)
        if out is None:
            return None
        if w is not None and len(w) >= 2:
            per_output = _prod(w[1:])
        else:
            x = _shape(shapes, inputs, 0)
            kernel = attrs.get("kernel_shape")
            cin = _dim(x, 1) if x is not None else None
            if cin is None or not kernel:
                return None
            per_output = (cin // max(_int_attr(attrs, "group", 1), 1)) * _prod(list(kernel))
        return 2 * _prod(out) * per_output
    if op_type == "ConvTranspose":
        x, w = _shape(shapes, inputs, 0), _shape(shapes, inputs, 1)
        if x is None or w is None or len(w) < 2:
            return None
        return 2 * _prod(x) * _prod(w[1:])
    if op_type == "Gemm":
        if out is None:
            return None
        a, b = _shape(shapes, inputs, 0), _shape(shapes, inputs, 1)
        k = None
        if a is not None and len(a) == 2:
            k = _dim(a, 0 if _int_attr(attrs, "transA", 0) else 1)
        if k is None and b is not None and len(b) == 2:
            k = _dim(b, 1 if _int_attr(attrs, "transB", 0) else 0)
        if k is None:
            return None
        return 2 * _prod(out) * k
    if op_type in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        if out is None:
            return None
        a_idx, b_idx = (0, 3) if op_type == "QLinearMatMul" else (0, 1)
        a, b = _shape(shapes, inputs, a_idx), _shape(shapes, inputs, b_idx)
        k = _dim(a, -1) if a else None
        if k is None and b:
            k = _dim(b, 0 if len(b) == 1 else -2)
        if k is None:
            return None
        return 2 * _prod(out) * k
    known = [shapes.get(name) for name in outputs if name]
    if not known or any(s is None for s in known):
        return None
    return sum(_prod(s) for s in known)


def format_flops(flops: int | float | None) -> str:
    """``1234567 -> "1.23M"``; ``None -> "?"``."""
    if flops is None:
        return "?"
    value = float(flops)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{int(value)}"


__all__ = ["estimate_flops", "format_flops"]
