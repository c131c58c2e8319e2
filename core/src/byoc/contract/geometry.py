"""Sliding-window geometry shared by convolutions and pooling (ONNX's rules, one copy).

Errors name the node through its :class:`~byoc.contract.NodeSpec`.
"""

from __future__ import annotations

import numpy as np

from byoc.contract.host import NodeSpec


def auto_pad_mode(spec: NodeSpec) -> str:
    v = spec.attr("auto_pad", "NOTSET")
    if isinstance(v, bytes):
        v = v.decode()
    v = str(v).upper() or "NOTSET"
    if v not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise spec.error(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {v!r}")
    return v


def int_list(spec: NodeSpec, name: str, n: int, default: int, *, minimum: int | None = None) -> list[int]:
    """An INTS attribute of length ``n`` (``default`` repeated when absent)."""
    v = spec.attr(name)
    if v is None:
        return [default] * n
    v = [int(x) for x in (v if isinstance(v, (list, tuple, np.ndarray)) else [v])]
    if len(v) != n:
        raise spec.error(f"attribute {name} has {len(v)} values, expected {n}")
    if minimum is not None and any(x < minimum for x in v):
        raise spec.error(f"attribute {name} must be >= {minimum}, got {v}")
    return v


def window_geometry(spec: NodeSpec, in_sp, kernel, strides, dilations, pads, auto_pad, ceil_mode=False):
    """Output size and begin/end pads of a sliding window (Conv and pooling), per ONNX.

    Returns ``(out, pads_begin, pads_end)``, lists with one entry per spatial axis.
    """
    nd = len(in_sp)
    out, pb, pe = [], [], []
    for i in range(nd):
        n, k, s, d = in_sp[i], kernel[i], strides[i], dilations[i]
        ek = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + ek - n)
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            b = e = 0
            o = (n - ek) // s + 1 if n >= ek else 0
        else:
            b, e = pads[i], pads[i + nd]
            span = n + b + e - ek
            if span < 0:
                raise spec.error(
                    f"the kernel window ({ek} with dilation) is larger than the padded input ({n + b + e}) on spatial axis {i}"
                )
            if ceil_mode:
                o = -(-span // s) + 1
                # the last window must start inside the input or the leading padding
                if (o - 1) * s >= n + b:
                    o -= 1
            else:
                o = span // s + 1
        out.append(int(o))
        pb.append(int(b))
        pe.append(int(e))
    return out, pb, pe


def canon5(x: np.ndarray) -> np.ndarray:
    """``(N, C, *spatial)`` with 1-3 spatial axes viewed as ``(N, C, D, H, W)``."""
    return x.reshape(x.shape[:2] + (1,) * (5 - x.ndim) + x.shape[2:])


def pad3(v: list[int], fill: int) -> list[int]:
    return [fill] * (3 - len(v)) + list(v)


__all__ = ["auto_pad_mode", "canon5", "int_list", "pad3", "window_geometry"]
