"""The bit-accurate DPU-style integer engine (Numba).

Every instruction computes exactly what README.md ("Arithmetic") specifies: int8 x int8
products summed in an int32 accumulator (starting from the int32 bias), then requantised in
int64 by ``requant(v, M, S) = saturate_int8((v * M + (S > 0 ? 2**(S-1) : 0)) >> S)`` (``>>``
is an arithmetic shift: floor division by ``2**S``; adding half first rounds half up), with the
fused activation applied to the accumulator (ReLU/ReLU6 clamp at 0, LeakyRelu multiplies a
negative accumulator by 26 and shifts 8 more; ReLU6 clamps the result at ``act_max``). The code
generator guarantees that no int32 accumulator can overflow. :mod:`byoc_vitis.reference` is the
same arithmetic in plain numpy int64; the tests hold the two equal bit for bit.
"""

from __future__ import annotations

from typing import Sequence

import numba
import numpy as np
from numba import prange

from byoc_vitis.program import ACT_LEAKY, ACT_RELU, ACT_RELU6, HSIG_BITS, LEAKY_NUM, LEAKY_SHIFT, Program

_jit = numba.njit(cache=True, nogil=True)
_pjit = numba.njit(cache=True, nogil=True, parallel=True)
_inline = numba.njit(inline="always")


@_jit
def valid_range(o_n, s, off, n):
    """Outputs ``o`` in ``[0, o_n)`` whose input index ``o*s + off`` lies in ``[0, n)``."""
    lo = 0
    if off < 0:
        lo = (-off + s - 1) // s
    hi = 0
    if n - 1 - off >= 0:
        hi = (n - 1 - off) // s + 1
    hi = min(hi, o_n)
    return min(lo, hi), hi


@_jit
def im2col(x, xo, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1, col, co):
    """2-D patch matrix of output rows ``[r0, r1)`` of one image on flat buffers: ``x[xo:]``
    holds ``(c, h, w)``; ``col[co:]`` receives ``(c*kh*kw, (r1-r0)*ow)``, row ``(ci*kh + b)*kw
    + e``."""
    n_out = (r1 - r0) * ow
    for ci in range(c):
        for b in range(kh):
            for e in range(kw):
                row = co + ((ci * kh + b) * kw + e) * n_out
                lo, hi = valid_range(ow, sw, e * dw - pl, w)
                for i in range(r0, r1):
                    ih = i * sh - pt + b * dh
                    dst = row + (i - r0) * ow
                    if ih < 0 or ih >= h:
                        col[dst:dst + ow] = 0
                        continue
                    src = xo + (ci * h + ih) * w + e * dw - pl
                    col[dst:dst + lo] = 0
                    for j in range(lo, hi):
                        col[dst + j] = x[src + j * sw]
                    col[dst + hi:dst + ow] = 0


@_inline
def _requant(v, m, s):
    v = v * m
    if s > 0:
        v = (v + (np.int64(1) << (s - 1))) >> s
    if v > 127:
        return np.int8(127)
    if v < -128:
        return np.int8(-128)
    return np.int8(v)


@_inline
def _out(acc, m, s, act, act_max):
    acc = np.int64(acc)
    if act == ACT_RELU or act == ACT_RELU6:
        if acc < 0:
            acc = np.int64(0)
    elif act == ACT_LEAKY and acc < 0:
        return _requant(acc * LEAKY_NUM, m, s + LEAKY_SHIFT)
    q = _requant(acc, m, s)
    if act == ACT_RELU6 and q > act_max:
        q = np.int8(act_max)
    return q


# -- convolution: im2col per group, then an int32 GEMM --------------------------------------


@_pjit
def _gemm_requant(wmat, col, b, m, s, act, act_max, out, o0):
    """out[o0 + o, p] = _out(b[o0+o] + sum_k wmat[o, k] * col[k, p]) for every o, p."""
    og, k_ = wmat.shape
    p_ = col.shape[1]
    for o in prange(og):
        oo = o0 + o
        acc = np.empty(p_, np.int32)
        bo = np.int32(b[oo])
        for p in range(p_):
            acc[p] = bo
        for k in range(k_):
            wv = np.int32(wmat[o, k])
            if wv == 0:
                continue
            for p in range(p_):
                acc[p] += wv * np.int32(col[k, p])
        mo = m[oo]
        so = s[oo]
        for p in range(p_):
            out[oo, p] = _out(acc[p], mo, so, act, act_max)


def conv(x, w, b, m, s, stride, dilation, pads, group, out_shape, act, act_max):
    n_, c_, h_, w_ = x.shape
    o_, cg, kh_, kw_ = w.shape
    oh_, ow_ = out_shape[2], out_shape[3]
    og = o_ // group
    y = np.empty((n_, o_, oh_ * ow_), np.int8)
    wmat = np.ascontiguousarray(w.reshape(o_, cg * kh_ * kw_))
    direct = kh_ == 1 and kw_ == 1 and tuple(stride) == (1, 1) and not any(pads)
    xf = np.ascontiguousarray(x).reshape(-1)
    patches = None if direct else np.empty((cg * kh_ * kw_, oh_ * ow_), np.int8)  # reused per image and group
    for n in range(n_):
        for g in range(group):
            if direct:
                col = np.ascontiguousarray(x[n, g * cg:(g + 1) * cg].reshape(cg, h_ * w_))
            else:  # the core's patch-matrix kernel (zero where the window leaves the input)
                im2col(xf, (n * c_ + g * cg) * h_ * w_, cg, h_, w_, kh_, kw_, stride[0], stride[1], dilation[0],
                       dilation[1], pads[0], pads[1], ow_, 0, oh_, patches.reshape(-1), 0)
                col = patches
            _gemm_requant(wmat[g * og:(g + 1) * og], col, b, m, s, act, act_max, y[n], g * og)
    return y.reshape(n_, o_, oh_, ow_)


@_pjit
def _deconv(x, w, b, m, s, sh, sw, dh, dw, pt, pl, group, oh_, ow_, act, act_max):
    n_, ci_, h_, w_ = x.shape
    _, og, kh_, kw_ = w.shape
    cg = ci_ // group
    o_ = og * group
    y = np.empty((n_, o_, oh_, ow_), np.int8)
    for n in range(n_):
        for o in prange(o_):
            g = o // og
            j = o - g * og
            acc = np.empty((oh_, ow_), np.int32)
            for a in range(oh_):
                for c in range(ow_):
                    acc[a, c] = b[o]
            for ci in range(g * cg, (g + 1) * cg):
                for kh in range(kh_):
                    for kw in range(kw_):
                        wv = np.int32(w[ci, j, kh, kw])
                        if wv == 0:
                            continue
                        for ih in range(h_):
                            oh = ih * sh - pt + kh * dh
                            if oh < 0 or oh >= oh_:
                                continue
                            for iw in range(w_):
                                ow = iw * sw - pl + kw * dw
                                if ow >= 0 and ow < ow_:
                                    acc[oh, ow] += wv * np.int32(x[n, ci, ih, iw])
            for a in range(oh_):
                for c in range(ow_):
                    y[n, o, a, c] = _out(acc[a, c], m[o], s[o], act, act_max)
    return y


@_pjit
def _fc(x, w, b, m, s, act, act_max):
    n_, k_ = x.shape
    f_ = w.shape[0]
    y = np.empty((n_, f_), np.int8)
    for f in prange(f_):
        for n in range(n_):
            acc = np.int32(b[f])
            for k in range(k_):
                acc += np.int32(w[f, k]) * np.int32(x[n, k])
            y[n, f] = _out(acc, m[f], s[f], act, act_max)
    return y


# -- pooling ------------------------------------------------------------------------------


@_jit
def _maxpool(x, kh_, kw_, sh, sw, dh, dw, pt, pl, oh_, ow_, m, s):
    n_, c_, h_, w_ = x.shape
    y = np.empty((n_, c_, oh_, ow_), np.int8)
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                for ow in range(ow_):
                    best = np.int32(-129)
                    for kh in range(kh_):
                        ih = oh * sh - pt + kh * dh
                        if ih < 0 or ih >= h_:
                            continue
                        for kw in range(kw_):
                            iw = ow * sw - pl + kw * dw
                            if iw >= 0 and iw < w_ and np.int32(x[n, c, ih, iw]) > best:
                                best = np.int32(x[n, c, ih, iw])
                    y[n, c, oh, ow] = _requant(np.int64(best), m, s)
    return y


@_jit
def _avgpool(x, kh_, kw_, sh, sw, pt, pl, oh_, ow_, include_pad, m, s):
    n_, c_, h_, w_ = x.shape
    y = np.empty((n_, c_, oh_, ow_), np.int8)
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                for ow in range(ow_):
                    acc = np.int32(0)
                    cnt = 0
                    for kh in range(kh_):
                        ih = oh * sh - pt + kh
                        if ih < 0 or ih >= h_:
                            continue
                        for kw in range(kw_):
                            iw = ow * sw - pl + kw
                            if iw >= 0 and iw < w_:
                                acc += np.int32(x[n, c, ih, iw])
                                cnt += 1
                    if include_pad:
                        cnt = kh_ * kw_
                    y[n, c, oh, ow] = _requant(np.int64(acc), m[cnt], s[cnt])
    return y


# -- elementwise (operands already broadcast to the output shape, flattened) ------------------


@_jit
def _eltwise(xs, m, s, act, act_max):
    size = xs.shape[1]
    y = np.empty(size, np.int8)
    for i in range(size):
        acc = np.int64(0)
        for j in range(xs.shape[0]):
            acc += np.int64(xs[j, i]) * m[j]
        y[i] = _out(acc, 1, s, act, act_max)
    return y


@_jit
def _mul(a, b, m, s, act, act_max):
    y = np.empty(a.size, np.int8)
    for i in range(a.size):
        y[i] = _out(np.int32(a[i]) * np.int32(b[i]), m, s, act, act_max)
    return y


@_jit
def _act(x, m, s, act, act_max):
    y = np.empty(x.size, np.int8)
    for i in range(x.size):
        y[i] = _out(np.int32(x[i]), m, s, act, act_max)
    return y


@_jit
def _hard(x, a, b, m, s, swish):
    one = np.int64(1) << HSIG_BITS
    y = np.empty(x.size, np.int8)
    for i in range(x.size):
        xv = np.int64(x[i])
        t = xv * a + b
        if t < 0:
            t = np.int64(0)
        elif t > one:
            t = one
        y[i] = _requant(xv * t if swish else t, m, s)
    return y


@_jit
def _requant_all(x, m, s):
    y = np.empty(x.size, np.int8)
    for i in range(x.size):
        y[i] = _requant(np.int64(x[i]), m, s)
    return y


@_jit
def _gather_hw(x, map_h, map_w):
    n_, c_ = x.shape[0], x.shape[1]
    y = np.empty((n_, c_, map_h.size, map_w.size), np.int8)
    for n in range(n_):
        for c in range(c_):
            for i in range(map_h.size):
                for j in range(map_w.size):
                    y[n, c, i, j] = x[n, c, map_h[i], map_w[j]]
    return y


# -- the interpreter ------------------------------------------------------------------------


def _flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1)


def run_instruction(ins: dict, env: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
                    tensors: dict[str, dict]) -> np.ndarray:
    """Execute one instruction (its inputs in ``env``); returns the int8 output tensor."""
    op = ins["op"]
    shape = tuple(tensors[ins["y"]]["shape"])
    act, act_max = int(ins.get("act", 0)), int(ins.get("act_max", 127))
    if op == "const":
        return np.ascontiguousarray(arrays[ins["data"]])
    if op == "conv":
        return conv(env[ins["x"]], arrays[ins["w"]], arrays[ins["b"]], arrays[ins["M"]], arrays[ins["S"]],
                    ins["stride"], ins["dilation"], ins["pads"], int(ins["group"]), shape, act, act_max)
    if op == "deconv":
        st, dl, pd = ins["stride"], ins["dilation"], ins["pads"]
        return _deconv(env[ins["x"]], arrays[ins["w"]], arrays[ins["b"]], arrays[ins["M"]], arrays[ins["S"]],
                       st[0], st[1], dl[0], dl[1], pd[0], pd[1], int(ins["group"]), shape[2], shape[3], act, act_max)
    if op == "fc":
        return _fc(np.ascontiguousarray(env[ins["x"]]), arrays[ins["w"]], arrays[ins["b"]], arrays[ins["M"]],
                   arrays[ins["S"]], act, act_max)
    if op == "maxpool":
        k, st, dl, pd = ins["kernel"], ins["stride"], ins["dilation"], ins["pads"]
        return _maxpool(env[ins["x"]], k[0], k[1], st[0], st[1], dl[0], dl[1], pd[0], pd[1], shape[2], shape[3],
                        int(ins["M"]), int(ins["S"]))
    if op == "avgpool":
        k, st, pd = ins["kernel"], ins["stride"], ins["pads"]
        return _avgpool(env[ins["x"]], k[0], k[1], st[0], st[1], pd[0], pd[1], shape[2], shape[3],
                        bool(ins["count_include_pad"]), arrays[ins["M"]], arrays[ins["S"]])
    if op == "eltwise":
        xs = np.stack([_flat(np.broadcast_to(env[t], shape)) for t in ins["x"]])
        return _eltwise(xs, arrays[ins["M"]], int(ins["S"]), act, act_max).reshape(shape)
    if op == "mul":
        a, b = (_flat(np.broadcast_to(env[t], shape)) for t in ins["x"])
        return _mul(a, b, int(ins["M"]), int(ins["S"]), act, act_max).reshape(shape)
    if op == "concat":
        m, s = arrays[ins["M"]], arrays[ins["S"]]
        parts = [_requant_all(_flat(env[t]), int(m[i]), int(s[i])).reshape(env[t].shape)
                 for i, t in enumerate(ins["x"])]
        return np.concatenate(parts, axis=int(ins["axis"]))
    if op == "act":
        return _act(_flat(env[ins["x"]]), int(ins["M"]), int(ins["S"]), act, act_max).reshape(shape)
    if op in ("hsigmoid", "hswish"):
        return _hard(_flat(env[ins["x"]]), int(ins["A"]), int(ins["B"]), int(ins["M"]), int(ins["S"]),
                     op == "hswish").reshape(shape)
    if op == "reshape":
        return _requant_all(_flat(env[ins["x"]]), int(ins["M"]), int(ins["S"])).reshape(shape)
    if op == "resize":
        g = _gather_hw(env[ins["x"]], arrays[ins["map_h"]], arrays[ins["map_w"]])
        return _requant_all(_flat(g), int(ins["M"]), int(ins["S"])).reshape(shape)
    raise ValueError(f"unknown DPU instruction {op!r}")


def quantize_input(x: np.ndarray, scale: float) -> np.ndarray:
    """The border: ONNX QuantizeLinear, ``saturate(round_half_even(x / scale))`` in float32."""
    q = np.rint(np.asarray(x, dtype=np.float32) / np.float32(scale))
    return np.clip(q, -128, 127).astype(np.int8)


def dequantize_output(q: np.ndarray, scale: float) -> np.ndarray:
    """The border: ONNX DequantizeLinear, ``float32(q) * scale``."""
    return q.astype(np.float32) * np.float32(scale)


def execute(program: Program, inputs: Sequence[np.ndarray], step=run_instruction,
            raw: bool = False) -> list[np.ndarray]:
    """Run ``program`` on float inputs (region input order); float32 outputs (int8 with ``raw``)."""
    env: dict[str, np.ndarray] = {}
    for entry, x in zip(program.inputs, inputs):
        want = tuple(entry["shape"])
        if tuple(np.shape(x)) != want:
            raise ValueError(f"input {entry['name']!r} has shape {list(np.shape(x))}; the DPU program was "
                             f"compiled for {list(want)}")
        env[entry["tensor"]] = quantize_input(x, entry["scale"])
    for ins in program.instructions:
        env[ins["y"]] = step(ins, env, program.arrays, program.tensors)
    outs = []
    for entry in program.outputs:
        q = env[entry["tensor"]]
        outs.append(q if raw else dequantize_output(q, entry["scale"]))
    return outs


class DPURegion:
    """The runtime callable of one region: ``region(*float_inputs) -> [float32 outputs]``."""

    def __init__(self, program: Program, engine: str = "numba"):
        from byoc_vitis import reference

        self.program = program
        self.engine = engine
        self._step = run_instruction if engine == "numba" else reference.run_instruction

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return execute(self.program, inputs, self._step)


__all__ = ["DPURegion", "conv", "dequantize_output", "execute", "quantize_input", "run_instruction"]
