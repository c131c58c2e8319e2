"""Transformer-era operators: RMSNormalization, GroupNormalization, RotaryEmbedding, Attention.

Plain numpy, with the semantics of onnx.reference. 16-bit floats are computed in float32 and
rounded back once; statistics and the softmax's sums are accumulated in float64 (Attention's
``softmax_precision`` therefore changes nothing).

GroupNormalization has one scale and bias per group at opset 18 and one per channel from 21.
Attention takes 3-D ``(batch, sequence, heads * size)`` or 4-D ``(batch, heads, sequence, size)``
inputs; key/value heads are shared by ``q_num_heads / kv_num_heads`` query heads each (GQA).
Its masks add up: ``attn_mask`` (boolean: False masks; float: added), the causal mask aligned at
the bottom right (a query attends keys up to its own position after the past or, with
``nonpad_kv_seqlen``, after the valid keys), the sliding window and the padding of
``nonpad_kv_seqlen``. A query row that every key is masked from gets zero weights. The optional
``qk_matmul_output`` of mode 0 is the scaled product before the softcap, as the operator definition
and onnxruntime have it (onnx.reference returns it after the softcap).
"""

from __future__ import annotations

import math

import numpy as np

from byoc.kernels.activation import softmax
from byoc.kernels.norm import _as_float, _normalize
from byoc.kernels.registry import NodeSpec, kernel


def _check_stash_type(spec: NodeSpec) -> None:
    stash = int(spec.attr("stash_type", 1))
    if stash != 1:
        raise spec.error(f"stash_type={stash} is not supported (only 1, float32 statistics)")


@kernel("RMSNormalization")
def make_rms_normalization(spec: NodeSpec):
    axis_attr = int(spec.attr("axis", -1))
    eps = float(spec.attr("epsilon", 1e-5))
    _check_stash_type(spec)

    def run(x, scale):
        xc = _as_float(spec, x)
        axis = axis_attr + xc.ndim if axis_attr < 0 else axis_attr
        if not 0 <= axis < xc.ndim:
            raise spec.error(f"axis {axis_attr} is out of range for X of rank {xc.ndim}")
        try:
            s = np.broadcast_to(np.asarray(scale, xc.dtype), xc.shape[axis:])
        except ValueError:
            raise spec.error(f"Scale of shape {list(scale.shape)} does not broadcast to {list(xc.shape[axis:])}") from None
        with np.errstate(divide="ignore", invalid="ignore"):
            ms = np.square(xc, dtype=np.float64).mean(axis=tuple(range(axis, xc.ndim)), keepdims=True)
            y = xc * (1 / np.sqrt(ms + eps)).astype(xc.dtype)
        y *= s
        return (y.astype(x.dtype, copy=False),)

    return run


@kernel("GroupNormalization")
def make_group_normalization(spec: NodeSpec):
    groups = spec.attr("num_groups")
    if not isinstance(groups, int) or groups < 1:
        raise spec.error(f"num_groups must be a positive integer, got {groups!r}")
    eps = float(spec.attr("epsilon", 1e-5))
    _check_stash_type(spec)
    per_group = spec.opset < 21

    def run(x, scale, bias):
        xc = _as_float(spec, x)
        if xc.ndim < 2 or xc.shape[1] % groups:
            raise spec.error(f"the channels of X {list(xc.shape)} do not split into {groups} groups")
        n, c = xc.shape[:2]
        want = groups if per_group else c
        if scale.shape != (want,) or bias.shape != (want,):
            raise spec.error(f"scale and bias must have shape [{want}], got {list(scale.shape)} and {list(bias.shape)}")
        size = math.prod(xc.shape[1:])
        with np.errstate(divide="ignore", invalid="ignore"):
            y = _normalize(xc.reshape(n, groups, size // groups), (2,), eps)[0].reshape(n, want, size // want)
        y *= np.asarray(scale, xc.dtype)[:, None]
        y += np.asarray(bias, xc.dtype)[:, None]
        return (y.reshape(x.shape).astype(x.dtype, copy=False),)

    return run


@kernel("RotaryEmbedding")
def make_rotary_embedding(spec: NodeSpec):
    interleaved = bool(spec.attr("interleaved", 0))
    heads = int(spec.attr("num_heads", 0))
    rot_attr = int(spec.attr("rotary_embedding_dim", 0))

    def run(x, cos, sin, position_ids=None):
        xc = _as_float(spec, x)
        if xc.ndim == 4:
            xh = xc.transpose(0, 2, 1, 3)  # (batch, sequence, heads, head size)
        elif xc.ndim == 3 and heads > 0 and xc.shape[2] % heads == 0:
            xh = xc.reshape(xc.shape[0], xc.shape[1], heads, xc.shape[2] // heads)
        else:
            raise spec.error(f"X must be 4-D, or 3-D with num_heads dividing its last dimension; got shape "
                             f"{list(x.shape)} and num_heads={heads}")
        rd = rot_attr or xh.shape[3]
        if rd % 2 or rd > xh.shape[3]:
            raise spec.error(f"rotary_embedding_dim {rd} must be even and at most the head size {xh.shape[3]}")
        if position_ids is not None:
            if cos.ndim != 2 or sin.shape != cos.shape or position_ids.dtype.kind not in "iu":
                raise spec.error("with position_ids, cos_cache and sin_cache must be 2-D and position_ids integer")
            if position_ids.size and not 0 <= position_ids.min() <= position_ids.max() < cos.shape[0]:
                raise spec.error(f"position_ids out of range for caches of {cos.shape[0]} positions")
            cos, sin = spec.alloc.take(cos, position_ids, 0), spec.alloc.take(sin, position_ids, 0)
        if cos.shape != xh.shape[:2] + (rd // 2,) or sin.shape != cos.shape:
            raise spec.error(f"cos_cache and sin_cache of shapes {list(cos.shape)} and {list(sin.shape)} do not fit "
                             f"{list(xh.shape[:2])} positions of {rd // 2} frequencies")
        c, s = np.asarray(cos, xc.dtype)[:, :, None], np.asarray(sin, xc.dtype)[:, :, None]
        lo, hi = (slice(0, rd, 2), slice(1, rd, 2)) if interleaved else (slice(0, rd // 2), slice(rd // 2, rd))
        x1, x2 = xh[..., lo], xh[..., hi]
        y = xh.copy()
        y[..., lo] = c * x1 - s * x2
        y[..., hi] = s * x1 + c * x2
        y = y.transpose(0, 2, 1, 3) if xc.ndim == 4 else y.reshape(xc.shape)
        return (y.astype(x.dtype, copy=False),)

    return run


def _attention_bias(spec: NodeSpec, mask, allowed, skv: int, dt: np.dtype) -> np.ndarray | None:
    """The additive bias: ``attn_mask`` (padded with -inf to ``skv`` keys) plus -inf where ``allowed`` is False."""
    terms = []
    if mask is not None:
        m = np.where(mask, dt.type(0), dt.type(-np.inf)) if mask.dtype == np.bool_ else np.asarray(mask, dt)
        if m.ndim == 0 or m.shape[-1] > skv:
            raise spec.error(f"attn_mask of shape {list(mask.shape)} does not fit {skv} keys")
        if m.shape[-1] < skv:
            padded = spec.alloc.full(m.shape[:-1] + (skv,), -np.inf, dt)
            padded[..., : m.shape[-1]] = m
            m = padded
        terms.append(m)
    if allowed is not None:
        terms.append(np.where(allowed, dt.type(0), dt.type(-np.inf)))
    return sum(terms[1:], terms[0]) if terms else None


@kernel("Attention")
def make_attention(spec: NodeSpec):
    causal = bool(spec.attr("is_causal", 0))
    heads = {"Q": spec.attr("q_num_heads"), "K": spec.attr("kv_num_heads"), "V": spec.attr("kv_num_heads")}
    scale_attr = spec.attr("scale")
    softcap = float(spec.attr("softcap", 0.0))
    mode = int(spec.attr("qk_matmul_output_mode", 0))
    left, right = int(spec.attr("left_window_size", -1)), int(spec.attr("right_window_size", -1))
    if mode not in range(4) or left < -1 or right < -1:
        raise spec.error(f"qk_matmul_output_mode must be 0 to 3 and window sizes -1 or more, got {mode}, {left} "
                         f"and {right}")

    def heads_first(t: np.ndarray, name: str) -> np.ndarray:
        """3-D ``(batch, sequence, heads * size)`` as 4-D ``(batch, heads, sequence, size)``."""
        h = heads[name]
        if t.ndim == 4:
            return t
        if not h or h < 1 or t.shape[2] % h:
            raise spec.error(f"3-D {name} of shape {list(t.shape)} needs q_num_heads and kv_num_heads dividing its "
                             "last dimension")
        return t.reshape(t.shape[0], t.shape[1], h, t.shape[2] // h).transpose(0, 2, 1, 3)

    def run(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
            raise spec.error(f"Q, K and V must all be 3-D or all 4-D, got shapes {list(q.shape)}, {list(k.shape)} "
                             f"and {list(v.shape)}")
        if (past_key is None) != (past_value is None) or (past_key is not None and nonpad_kv_seqlen is not None):
            raise spec.error("past_key and past_value come together, and not with nonpad_kv_seqlen")
        qc = _as_float(spec, q, "Q")
        dt = qc.dtype
        q4, k4, v4 = heads_first(qc, "Q"), heads_first(np.asarray(k, dt), "K"), heads_first(np.asarray(v, dt), "V")
        if past_key is not None:
            k4 = spec.alloc.concatenate([np.asarray(past_key, dt), k4], axis=2)
            v4 = spec.alloc.concatenate([np.asarray(past_value, dt), v4], axis=2)
        b, hq, sq, dq = q4.shape
        hkv, skv = k4.shape[1], k4.shape[2]
        if k4.shape[::3] != (b, dq) or v4.shape[:3] != k4.shape[:3] or hq % hkv:
            raise spec.error(f"Q, K and V of shapes {list(q4.shape)}, {list(k4.shape)} and {list(v4.shape)} (heads "
                             "first, past included) do not fit")
        spec.check_alloc((b, hq, sq, skv), np.float64)
        g = hq // hkv  # query heads per key/value head
        scale = 1 / math.sqrt(dq) if scale_attr is None else float(scale_attr)
        scores = np.matmul(q4.reshape(b, hkv, g, sq, dq), k4[:, :, None].swapaxes(-1, -2)).reshape(b, hq, sq, skv)
        scores *= dt.type(scale)
        raw = scores
        if softcap > 0:
            scores = np.tanh(scores / dt.type(softcap)) * dt.type(softcap)
        capped = scores
        allowed = None
        if causal or left >= 0 or right >= 0 or nonpad_kv_seqlen is not None:
            j = spec.alloc.arange(skv)
            if nonpad_kv_seqlen is not None:
                valid = np.asarray(nonpad_kv_seqlen, np.int64).reshape(-1, 1, 1, 1)
                offset = valid - sq
            else:
                valid, offset = skv, 0 if past_key is None else past_key.shape[2]
            pos = spec.alloc.arange(sq)[:, None] + offset  # each query's absolute position
            allowed = j < valid
            if causal:
                allowed = allowed & (j <= pos)
            if left >= 0:
                allowed = allowed & (pos - j <= left)
            if right >= 0:
                allowed = allowed & (j - pos <= right)
        bias = _attention_bias(spec, attn_mask, allowed, skv, dt)
        if bias is not None:
            scores = scores + bias
        p = softmax(scores, -1, False).astype(dt, copy=False)
        if bias is not None:  # rows with every key masked: zero weights
            p = np.where(np.isneginf(bias.max(axis=-1, keepdims=True)), dt.type(0), p)
        y = np.matmul(p.reshape(b, hkv, g, sq, skv), v4[:, :, None]).reshape(b, hq, sq, v4.shape[3])
        if q.ndim == 3:
            y = y.transpose(0, 2, 1, 3).reshape(b, sq, hq * v4.shape[3])
        outs = (y, k4, v4, (raw, capped, scores, p)[mode])
        return tuple(o.astype(q.dtype, copy=False) for o in outs[: spec.n_outputs])

    return run
