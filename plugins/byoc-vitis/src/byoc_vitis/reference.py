"""A plain numpy int64 reference of the DPU arithmetic (README.md, "Arithmetic").

Independent of :mod:`byoc_vitis.engine`: whole-array numpy in int64, written for clarity, not
speed. The engine must equal it bit for bit on every program; the tests check that with
hypothesis. Select it at run time with ``target_options={"vitis": {"engine": "reference"}}``.
"""

from __future__ import annotations

import numpy as np

from byoc_vitis.program import ACT_LEAKY, ACT_RELU, ACT_RELU6, HSIG_BITS, LEAKY_NUM, LEAKY_SHIFT


def requant(v: np.ndarray, m, s) -> np.ndarray:
    """``saturate_int8((v * m + (s > 0 ? 2**(s-1) : 0)) >> s)``, elementwise; ``m``/``s`` broadcast."""
    v = np.asarray(v, dtype=np.int64) * np.asarray(m, dtype=np.int64)
    s = np.asarray(s, dtype=np.int64)
    half = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    v = np.right_shift(v + half, s)
    return np.clip(v, -128, 127).astype(np.int8)


def output(acc: np.ndarray, m, s, act: int, act_max: int) -> np.ndarray:
    """Fused activation + requantisation of an accumulator."""
    acc = np.asarray(acc, dtype=np.int64)
    m = np.broadcast_to(np.asarray(m, dtype=np.int64), acc.shape)
    s = np.broadcast_to(np.asarray(s, dtype=np.int64), acc.shape)
    if act in (ACT_RELU, ACT_RELU6):
        acc = np.maximum(acc, 0)
    if act == ACT_LEAKY:
        neg = acc < 0
        return np.where(neg, requant(acc * LEAKY_NUM, m, s + LEAKY_SHIFT), requant(acc, m, s))
    q = requant(acc, m, s)
    if act == ACT_RELU6:
        q = np.minimum(q, np.int8(act_max))
    return q


def _channel(a: np.ndarray, ndim: int) -> np.ndarray:
    """Per-output-channel values shaped to broadcast against ``(N, C, ...)``."""
    return np.asarray(a, dtype=np.int64).reshape((1, -1) + (1,) * (ndim - 2))


def conv(x, w, b, stride, dilation, pads, group, out_shape):
    """int64 accumulators of a grouped 2-D convolution (zero padding)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = out_shape[2], out_shape[3]
    sh, sw = stride
    dh, dw = dilation
    pt, pl = pads[0], pads[1]
    big_h = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    big_w = max(wd + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    xp = np.zeros((n, c, big_h, big_w), np.int64)
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    og = o // group
    acc = np.zeros((n, o, oh, ow), np.int64)
    w = w.astype(np.int64)
    for g in range(group):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                acc[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    return acc + _channel(b, 4)


def deconv(x, w, b, stride, dilation, pads, group, out_shape):
    n, ci, h, wd = x.shape
    _, og, kh, kw = w.shape
    oh, ow = out_shape[2], out_shape[3]
    sh, sw = stride
    dh, dw = dilation
    pt, pl = pads[0], pads[1]
    cg = ci // group
    full_h = (h - 1) * sh + (kh - 1) * dh + 1 + oh + pt
    full_w = (wd - 1) * sw + (kw - 1) * dw + 1 + ow + pl
    acc = np.zeros((n, og * group, full_h, full_w), np.int64)
    x = x.astype(np.int64)
    w = w.astype(np.int64)
    for g in range(group):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", xs, w[g * cg:(g + 1) * cg, :, i, j])
                acc[:, g * og:(g + 1) * og, i * dh:i * dh + (h - 1) * sh + 1:sh,
                    j * dw:j * dw + (wd - 1) * sw + 1:sw] += contrib
    return acc[:, :, pt:pt + oh, pl:pl + ow] + _channel(b, 4)


def _windows(x, kernel, stride, dilation, pads, out_shape, fill):
    """Stack of the pooling windows' elements, ``(kh*kw, N, C, OH, OW)``, padded with ``fill``."""
    n, c, h, wd = x.shape
    kh, kw = kernel
    sh, sw = stride
    dh, dw = dilation
    pt, pl = pads[0], pads[1]
    oh, ow = out_shape[2], out_shape[3]
    big_h = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    big_w = max(wd + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    xp = np.full((n, c, big_h, big_w), fill, np.int64)
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    return np.stack([xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                     for i in range(kh) for j in range(kw)])


def run_instruction(ins: dict, env: dict, arrays: dict, tensors: dict) -> np.ndarray:
    op = ins["op"]
    shape = tuple(tensors[ins["y"]]["shape"])
    act, act_max = int(ins.get("act", 0)), int(ins.get("act_max", 127))
    if op == "const":
        return np.array(arrays[ins["data"]], dtype=np.int8)
    if op == "conv":
        acc = conv(env[ins["x"]].astype(np.int64), arrays[ins["w"]], arrays[ins["b"]], ins["stride"],
                   ins["dilation"], ins["pads"], int(ins["group"]), shape)
        return output(acc, _channel(arrays[ins["M"]], 4), _channel(arrays[ins["S"]], 4), act, act_max)
    if op == "deconv":
        acc = deconv(env[ins["x"]], arrays[ins["w"]], arrays[ins["b"]], ins["stride"], ins["dilation"],
                     ins["pads"], int(ins["group"]), shape)
        return output(acc, _channel(arrays[ins["M"]], 4), _channel(arrays[ins["S"]], 4), act, act_max)
    if op == "fc":
        acc = env[ins["x"]].astype(np.int64) @ arrays[ins["w"]].astype(np.int64).T + _channel(arrays[ins["b"]], 2)
        return output(acc, _channel(arrays[ins["M"]], 2), _channel(arrays[ins["S"]], 2), act, act_max)
    if op == "maxpool":
        win = _windows(env[ins["x"]], ins["kernel"], ins["stride"], ins["dilation"], ins["pads"], shape, -129)
        return requant(win.max(axis=0), int(ins["M"]), int(ins["S"]))
    if op == "avgpool":
        x = env[ins["x"]]
        args = (ins["kernel"], ins["stride"], (1, 1), ins["pads"], shape)
        total = _windows(x, *args, 0).sum(axis=0)
        if ins["count_include_pad"]:
            count = np.full(total.shape, ins["kernel"][0] * ins["kernel"][1], np.int64)
        else:
            count = _windows(np.ones(x.shape, np.int64), *args, 0).sum(axis=0)
        return requant(total, arrays[ins["M"]][count], arrays[ins["S"]][count])
    if op == "eltwise":
        m = arrays[ins["M"]]
        acc = sum(np.broadcast_to(env[t], shape).astype(np.int64) * int(m[i]) for i, t in enumerate(ins["x"]))
        return output(acc, 1, int(ins["S"]), act, act_max)
    if op == "mul":
        a, b = (np.broadcast_to(env[t], shape).astype(np.int64) for t in ins["x"])
        return output(a * b, int(ins["M"]), int(ins["S"]), act, act_max)
    if op == "concat":
        m, s = arrays[ins["M"]], arrays[ins["S"]]
        return np.concatenate([requant(env[t], int(m[i]), int(s[i])) for i, t in enumerate(ins["x"])],
                              axis=int(ins["axis"]))
    if op == "act":
        return output(env[ins["x"]], int(ins["M"]), int(ins["S"]), act, act_max)
    if op in ("hsigmoid", "hswish"):
        x = env[ins["x"]].astype(np.int64)
        t = np.clip(x * int(ins["A"]) + int(ins["B"]), 0, 1 << HSIG_BITS)
        return requant(x * t if op == "hswish" else t, int(ins["M"]), int(ins["S"]))
    if op == "reshape":
        return requant(env[ins["x"]], int(ins["M"]), int(ins["S"])).reshape(shape)
    if op == "resize":
        x = env[ins["x"]]
        g = x[:, :, arrays[ins["map_h"]].astype(np.int64)][:, :, :, arrays[ins["map_w"]].astype(np.int64)]
        return requant(g, int(ins["M"]), int(ins["S"]))
    raise ValueError(f"unknown DPU instruction {op!r}")


__all__ = ["conv", "deconv", "output", "requant", "run_instruction"]
