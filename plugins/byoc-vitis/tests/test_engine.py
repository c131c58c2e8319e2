"""The Numba integer engine equals the numpy int64 reference bit for bit (hypothesis).

Each example builds one DPU instruction with random shapes, attributes, int8 data, int32
biases and requantisation multipliers/shifts (including saturating and tie-heavy ones), runs
it through :mod:`byoc_vitis.engine` and :mod:`byoc_vitis.reference`, and demands identical
int8 tensors. Whole programs (several instructions, borders included) are checked too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byoc_vitis import engine, reference
from byoc_vitis.program import ACT_LEAKY, ACT_NONE, ACT_RELU, ACT_RELU6, Program, dumps, loads

ACTS = st.sampled_from([ACT_NONE, ACT_RELU, ACT_RELU6, ACT_LEAKY])


def _i8(rng, shape):
    return rng.integers(-128, 128, size=shape, dtype=np.int64).astype(np.int8)


def _requant_arrays(rng, n):
    # multipliers up to 2**24, shifts 0..30: pure shifts (M=1), exact ties and saturation all occur
    m = np.where(rng.random(n) < 0.4, 1, rng.integers(1, 1 << 24, size=n)).astype(np.int64)
    s = rng.integers(0, 31, size=n).astype(np.int32)
    return m, s


def _both(ins, env, arrays, tensors):
    got = engine.run_instruction(ins, env, arrays, tensors)
    want = reference.run_instruction(ins, env, arrays, tensors)
    assert got.dtype == np.int8 and want.dtype == np.int8
    assert got.shape == want.shape == tuple(tensors[ins["y"]]["shape"])
    np.testing.assert_array_equal(got, want)
    return got


def _out_size(size, k, s, d, p0, p1):
    return (size + p0 + p1 - ((k - 1) * d + 1)) // s + 1


@st.composite
def conv_case(draw):
    group_kind = draw(st.sampled_from(["one", "depthwise", "grouped"]))
    groups = {"one": 1, "depthwise": draw(st.integers(1, 4)), "grouped": draw(st.integers(2, 3))}[group_kind]
    cg = 1 if group_kind == "depthwise" else draw(st.integers(1, 4))
    og = 1 if group_kind == "depthwise" else draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)), draw(st.integers(0, kh - 1)),
            draw(st.integers(0, kw - 1))]
    h = draw(st.integers((kh - 1) * dh + 1, 9))
    w = draw(st.integers((kw - 1) * dw + 1, 9))
    n = draw(st.integers(1, 2))
    return dict(n=n, c=cg * groups, o=og * groups, group=groups, k=(kh, kw), s=(sh, sw), d=(dh, dw), pads=pads,
                h=h, w=w, act=draw(ACTS), seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=60, deadline=None)
@given(conv_case())
def test_conv_bit_exact(case):
    rng = np.random.default_rng(case["seed"])
    oh = _out_size(case["h"], case["k"][0], case["s"][0], case["d"][0], case["pads"][0], case["pads"][2])
    ow = _out_size(case["w"], case["k"][1], case["s"][1], case["d"][1], case["pads"][1], case["pads"][3])
    x = _i8(rng, (case["n"], case["c"], case["h"], case["w"]))
    wt = _i8(rng, (case["o"], case["c"] // case["group"]) + case["k"])
    b = rng.integers(-(1 << 20), 1 << 20, size=case["o"]).astype(np.int32)
    m, s = _requant_arrays(rng, case["o"])
    arrays = {"w": wt, "b": b, "M": m, "S": s}
    tensors = {"x": {"shape": list(x.shape)}, "y": {"shape": [case["n"], case["o"], oh, ow]}}
    ins = {"op": "conv", "x": "x", "y": "y", "w": "w", "b": "b", "M": "M", "S": "S", "stride": list(case["s"]),
           "dilation": list(case["d"]), "pads": case["pads"], "group": case["group"], "act": case["act"],
           "act_max": int(rng.integers(0, 128))}
    _both(ins, {"x": x}, arrays, tensors)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), ACTS, st.booleans(), st.integers(0, 2**32 - 1))
def test_deconv_bit_exact(ci, og, kh, sh, sw, kw, h, w, act, depthwise, seed):
    rng = np.random.default_rng(seed)
    group = ci if depthwise else 1
    if depthwise:
        og = 1
    pt, pl = int(rng.integers(0, kh)), int(rng.integers(0, kw))
    pb, pr = int(rng.integers(0, kh)), int(rng.integers(0, kw))
    oh = (h - 1) * sh + kh - pt - pb
    ow = (w - 1) * sw + kw - pl - pr
    if oh < 1 or ow < 1:
        return
    o = og * group
    x = _i8(rng, (1, ci, h, w))
    arrays = {"w": _i8(rng, (ci, og, kh, kw)), "b": rng.integers(-5000, 5000, size=o).astype(np.int32)}
    arrays["M"], arrays["S"] = _requant_arrays(rng, o)
    tensors = {"x": {"shape": list(x.shape)}, "y": {"shape": [1, o, oh, ow]}}
    ins = {"op": "deconv", "x": "x", "y": "y", "w": "w", "b": "b", "M": "M", "S": "S", "stride": [sh, sw],
           "dilation": [1, 1], "pads": [pt, pl, pb, pr], "group": group, "act": act, "act_max": 100}
    _both(ins, {"x": x}, arrays, tensors)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 12), ACTS, st.integers(0, 2**32 - 1))
def test_fc_bit_exact(n, k, f, act, seed):
    rng = np.random.default_rng(seed)
    x = _i8(rng, (n, k))
    arrays = {"w": _i8(rng, (f, k)), "b": rng.integers(-(1 << 24), 1 << 24, size=f).astype(np.int32)}
    arrays["M"], arrays["S"] = _requant_arrays(rng, f)
    ins = {"op": "fc", "x": "x", "y": "y", "w": "w", "b": "b", "M": "M", "S": "S", "act": act,
           "act_max": int(rng.integers(0, 128))}
    _both(ins, {"x": x}, arrays, {"x": {"shape": [n, k]}, "y": {"shape": [n, f]}})


@settings(max_examples=50, deadline=None)
@given(st.booleans(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_pool_bit_exact(avg, kh, kw, sh, sw, include_pad, seed):
    rng = np.random.default_rng(seed)
    pads = [int(rng.integers(0, kh)), int(rng.integers(0, kw)), int(rng.integers(0, kh)), int(rng.integers(0, kw))]
    h, w = int(rng.integers(kh, 9)), int(rng.integers(kw, 9))
    oh = _out_size(h, kh, sh, 1, pads[0], pads[2])
    ow = _out_size(w, kw, sw, 1, pads[1], pads[3])
    x = _i8(rng, (2, 3, h, w))
    tensors = {"x": {"shape": list(x.shape)}, "y": {"shape": [2, 3, oh, ow]}}
    ins = {"op": "avgpool" if avg else "maxpool", "x": "x", "y": "y", "kernel": [kh, kw], "stride": [sh, sw],
           "pads": pads}
    arrays = {}
    if avg:
        m, s = _requant_arrays(rng, kh * kw + 1)
        arrays = {"M": m, "S": s}
        ins.update(M="M", S="S", count_include_pad=int(include_pad))
    else:
        m, s = _requant_arrays(rng, 1)
        ins.update(M=int(m[0]), S=int(s[0]) % 4, dilation=[1, 1])
    _both(ins, {"x": x}, arrays, tensors)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.sampled_from(["eltwise", "mul", "act", "hsigmoid", "hswish", "reshape", "concat"]),
       ACTS, st.booleans(), st.integers(0, 2**32 - 1))
def test_pointwise_bit_exact(n_in, op, act, broadcast, seed):
    rng = np.random.default_rng(seed)
    shape = (1, 3, 4, 5)
    env = {f"x{i}": _i8(rng, shape) for i in range(max(n_in, 2))}
    tensors = {name: {"shape": list(shape)} for name in env}
    tensors["y"] = {"shape": list(shape)}
    arrays = {}
    m, s = _requant_arrays(rng, max(n_in, 2))
    if op == "eltwise":
        if broadcast:
            env["x1"] = _i8(rng, (1, 3, 1, 1))
        ins = {"x": [f"x{i}" for i in range(max(n_in, 2))], "M": "M", "S": int(s[0]), "act": act, "act_max": 90}
        arrays["M"] = rng.integers(-(1 << 20), 1 << 20, size=max(n_in, 2)).astype(np.int64)
    elif op == "mul":
        if broadcast:
            env["x1"] = _i8(rng, (1, 3, 1, 1))
        ins = {"x": ["x0", "x1"], "M": int(m[0]), "S": int(s[0]), "act": act, "act_max": 50}
    elif op == "act":
        ins = {"x": "x0", "M": int(m[0]), "S": int(s[0]), "act": act, "act_max": 60}
    elif op in ("hsigmoid", "hswish"):
        ins = {"x": "x0", "A": int(rng.integers(1, 1 << 12)), "B": int(rng.integers(0, 1 << 16)),
               "M": int(m[0]), "S": int(s[0])}
    elif op == "reshape":
        tensors["y"] = {"shape": [1, 60]}
        ins = {"x": "x0", "M": int(m[0]), "S": int(s[0])}
    else:
        names = [f"x{i}" for i in range(max(n_in, 2))]
        tensors["y"] = {"shape": [1, 3 * len(names), 4, 5]}
        arrays = {"M": m, "S": s}
        ins = {"x": names, "axis": 1, "M": "M", "S": "S"}
    ins.update(op=op, y="y")
    _both(ins, env, arrays, tensors)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_resize_bit_exact(h, w, oh, ow, seed):
    rng = np.random.default_rng(seed)
    x = _i8(rng, (1, 2, h, w))
    m, s = _requant_arrays(rng, 1)
    arrays = {"mh": rng.integers(0, h, size=oh).astype(np.int32), "mw": rng.integers(0, w, size=ow).astype(np.int32)}
    ins = {"op": "resize", "x": "x", "y": "y", "map_h": "mh", "map_w": "mw", "M": int(m[0]), "S": int(s[0])}
    _both(ins, {"x": x}, arrays, {"x": {"shape": [1, 2, h, w]}, "y": {"shape": [1, 2, oh, ow]}})


def test_requant_rounds_half_up_and_saturates():
    """The documented arithmetic on hand-picked values (README.md, "Arithmetic")."""
    acc = np.array([5, 6, 7, -5, -6, -7, 1000, -1000, 3, -3], np.int64)
    # shift 1: x / 2 rounded half up: 2.5 -> 3, 3 -> 3, 3.5 -> 4, -2.5 -> -2, -3 -> -3, -3.5 -> -3
    np.testing.assert_array_equal(reference.requant(acc, 1, 1), [3, 3, 4, -2, -3, -3, 127, -128, 2, -1])
    x = acc.astype(np.int8)
    got = engine._act(x, 1, 1, ACT_NONE, 127)
    np.testing.assert_array_equal(got, reference.requant(x, 1, 1))
    # LeakyRelu: a negative accumulator is multiplied by 26 and shifted 8 more bits
    np.testing.assert_array_equal(reference.output(np.array([-256, 256]), 1, 0, ACT_LEAKY, 127), [-26, 127])
    np.testing.assert_array_equal(reference.output(np.array([-100, 100]), 1, 0, ACT_RELU6, 50), [0, 50])


@pytest.mark.parametrize("seed", [0, 1])
def test_program_bit_exact(seed):
    """A whole program (conv -> maxpool -> eltwise with a const -> fc) through serialise/load."""
    rng = np.random.default_rng(seed)
    p = Program()
    p.tensors = {"x": {"shape": [1, 2, 6, 6], "scale": 0.05}, "c": {"shape": [1, 4, 6, 6], "scale": 0.1},
                 "p": {"shape": [1, 4, 3, 3], "scale": 0.1}, "k": {"shape": [1, 4, 3, 3], "scale": 0.2},
                 "e": {"shape": [1, 4, 3, 3], "scale": 0.1}, "f": {"shape": [1, 36], "scale": 0.1},
                 "y": {"shape": [1, 5], "scale": 0.25}}
    p.inputs = [{"name": "in", "tensor": "x", "shape": [1, 2, 6, 6], "scale": 0.05}]
    p.outputs = [{"name": "out", "tensor": "y", "shape": [1, 5], "scale": 0.25}]
    arr = p.add_array
    p.instructions = [
        {"op": "conv", "x": "x", "y": "c", "w": arr("cw", _i8(rng, (4, 2, 3, 3)), "int8"),
         "b": arr("cb", rng.integers(-999, 999, 4), "int32"), "M": arr("cm", [1, 3, 5, 7], "int64"),
         "S": arr("cs", [6, 7, 8, 9], "int32"), "stride": [1, 1], "dilation": [1, 1], "pads": [1, 1, 1, 1],
         "group": 1, "act": ACT_RELU, "act_max": 127},
        {"op": "maxpool", "x": "c", "y": "p", "kernel": [2, 2], "stride": [2, 2], "pads": [0, 0, 0, 0],
         "dilation": [1, 1], "M": 1, "S": 0},
        {"op": "const", "y": "k", "data": arr("kd", _i8(rng, (1, 4, 3, 3)), "int8")},
        {"op": "eltwise", "x": ["p", "k"], "y": "e", "M": arr("em", [1, 2], "int64"), "S": 1, "act": ACT_LEAKY,
         "act_max": 127},
        {"op": "reshape", "x": "e", "y": "f", "M": 1, "S": 0},
        {"op": "fc", "x": "f", "y": "y", "w": arr("fw", _i8(rng, (5, 36)), "int8"),
         "b": arr("fb", rng.integers(-99, 99, 5), "int32"), "M": arr("fm", [3] * 5, "int64"),
         "S": arr("fs", [9] * 5, "int32"), "act": ACT_NONE, "act_max": 127},
    ]
    prog = loads(dumps(p))
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32) * 3
    got = engine.execute(prog, [x], raw=True)
    want = engine.execute(prog, [x], reference.run_instruction, raw=True)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[0].dtype == np.int8 and got[0].shape == (1, 5)


def _patches_by_definition(x, kdims, strides, dils, pads_lo, pads_hi, out_sp, r0, r1):
    """im2col of one image ``x`` (c, d, h, w) from an explicitly zero-padded copy: row
    ``((ci*kd + a)*kh + ki)*kw + kj``, column ``(r - r0)*ow + j`` for rows ``r`` of the (OD*OH)
    row space."""
    c = x.shape[0]
    (kd, kh, kw), (sd, sh, sw), (dd, dh, dw), (_, oh, ow) = kdims, strides, dils, out_sp
    big = np.zeros((c,) + tuple(n + lo + hi + 2 * k * dl for n, lo, hi, k, dl in
                                zip(x.shape[1:], pads_lo, pads_hi, kdims, dils)), x.dtype)
    big[:, pads_lo[0]:pads_lo[0] + x.shape[1], pads_lo[1]:pads_lo[1] + x.shape[2],
        pads_lo[2]:pads_lo[2] + x.shape[3]] = x
    want = np.empty((c * kd * kh * kw, (r1 - r0) * ow), x.dtype)
    for ci in range(c):
        for a in range(kd):
            for ki in range(kh):
                for kj in range(kw):
                    row = ((ci * kd + a) * kh + ki) * kw + kj
                    for r in range(r0, r1):
                        z, i = divmod(r, oh)
                        want[row, (r - r0) * ow:(r - r0 + 1) * ow] = \
                            big[ci, z * sd + a * dd, i * sh + ki * dh, kj * dw:kj * dw + ow * sw:sw]
    return want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 4), h=st.integers(1, 9), w=st.integers(1, 9), kh=st.integers(1, 4), kw=st.integers(1, 4),
       sh=st.integers(1, 3), sw=st.integers(1, 3), dh=st.integers(1, 2), dw=st.integers(1, 2),
       pt=st.integers(0, 3), pl=st.integers(0, 3), pb=st.integers(0, 3), pr=st.integers(0, 3), data=st.data())
def test_flat_im2col_matches_its_definition(c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, data):
    """The engine's 2-D patch builder writes the patch matrix's definition for any geometry and
    any block of output rows, and nothing outside it."""
    from byoc_vitis.engine import im2col

    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        return
    r0 = data.draw(st.integers(0, oh - 1))
    r1 = data.draw(st.integers(r0 + 1, oh))
    x = np.random.default_rng(0).standard_normal(7 + c * h * w).astype(np.float32)
    size = c * kh * kw * (r1 - r0) * ow
    got = np.full(size + 5, np.nan, np.float32)
    im2col(x, 7, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1, got, 3)
    want = _patches_by_definition(x[7:].reshape(c, 1, h, w), (1, kh, kw), (1, sh, sw), (1, dh, dw), (0, pt, pl),
                                  (0, pb, pr), (1, oh, ow), r0, r1)
    assert np.array_equal(got[3:3 + size], want.reshape(-1))
    assert np.isnan(got[:3]).all() and np.isnan(got[3 + size:]).all()
