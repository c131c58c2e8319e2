"""The convolution's layout moves (padding planes, stride-phase planes, subsampling) against
their definitions on an explicitly zero-padded array: same values, zeros elsewhere, nothing
outside the channels asked for touched. The host's 5-D adapters only compute offsets: the copies
are the flat kernels byoc-cpu calls (``pad_images``, ``phase_planes``, ``subsample_volumes``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc_cpu.host import conv as C


@st.composite
def geometry(draw):
    nb, c = draw(st.integers(1, 2)), draw(st.integers(1, 5))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pt, pl = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    hq, wq = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    ca = draw(st.integers(0, c - 1))
    cb = draw(st.integers(ca, c))
    x = np.random.default_rng(draw(st.integers(0, 99))).standard_normal((nb, c, 1, h, w)).astype(np.float32)
    return x, sh, sw, pt, pl, hq, wq, ca, cb


@settings(max_examples=150)
@given(geometry())
def test_phase_planes_match_their_definition(g):
    x, sh, sw, pt, pl, hq, wq, ca, cb = g
    nb, c, _, h, w = x.shape
    plane, ld = hq * wq, sh * sw * hq * wq + 3
    for n in range(nb):
        xp = np.full((c, ld), 7.0, np.float32)
        C._phase_planes(x, n, 0, ca, cb, sh, sw, pt, pl, hq, wq, xp)
        want = np.full((c, ld), 7.0, np.float32)
        big = np.zeros((c, pt + hq * sh + sh, pl + wq * sw + sw), np.float32)
        rows, cols = min(h, big.shape[1] - pt), min(w, big.shape[2] - pl)
        big[:, pt:pt + rows, pl:pl + cols] = x[n, :, 0, :rows, :cols]
        for ci in range(ca, cb):
            want[ci] = 0
            for py in range(sh):
                for px in range(sw):
                    base = (py * sw + px) * plane
                    want[ci, base:base + plane] = big[ci, py:py + hq * sh:sh, px:px + wq * sw:sw].reshape(-1)
        np.testing.assert_array_equal(xp, want)


@settings(max_examples=100)
@given(geometry())
def test_pad_planes_and_subsample_match_their_definitions(g):
    x, sh, sw, pt, pl, _, _, ca, cb = g
    nb, c, _, h, w = x.shape
    hp, wp = h + pt + 1, w + pl + 2
    xp = np.full((c, nb * hp * wp + 5), 7.0, np.float32)
    C._pad_planes(x, 0, ca, cb, pt, pl, hp, wp, xp)
    want = np.full_like(xp, 7.0)
    want[ca:cb] = 0
    view = want[:, :nb * hp * wp].reshape(c, nb, hp, wp)
    view[ca:cb, :, pt:pt + h, pl:pl + w] = x[:, ca:cb, 0].transpose(1, 0, 2, 3)
    np.testing.assert_array_equal(xp, want)
    oh, ow = (h - 1) // sh + 1, (w - 1) // sw + 1
    out = np.empty((nb, c, 1, oh, ow), np.float32)
    C._subsample(x, 1, sh, sw, 1, oh, ow, out)
    np.testing.assert_array_equal(out, x[:, :, :, ::sh, ::sw])


@settings(max_examples=30)
@given(m=st.integers(1, 6), cg=st.integers(1, 5), group=st.sampled_from([1, 2]), mt=st.sampled_from([2, 4]),
       seed=st.integers(0, 99))
def test_winograd_weights_are_g_w_gt(m, cg, group, mt, seed):
    w = np.random.default_rng(seed).standard_normal((m * group, cg, 3, 3)).astype(np.float32)
    u = C.winograd_weights(w, mt, group)
    gm = np.asarray(C._WINO[mt][1], dtype=np.float64)
    a = mt + 2
    want = np.empty((group, a * a, m, cg))
    for gi in range(group):
        for mi in range(m):
            for ci in range(cg):
                want[gi, :, mi, ci] = (gm @ w[gi * m + mi, ci].astype(np.float64) @ gm.T).reshape(-1)
    assert u.dtype == np.float32 and u.shape == want.shape
    np.testing.assert_allclose(u, want.astype(np.float32), rtol=2e-7, atol=1e-6)


@settings(max_examples=60)
@given(nb=st.integers(1, 2), c=st.integers(1, 3), d=st.integers(1, 5), h=st.integers(1, 6), w=st.integers(1, 6),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)), seed=st.integers(0, 99))
def test_subsample_of_volumes_matches_its_definition(nb, c, d, h, w, s, seed):
    """A strided 1x1 3-D convolution's input: every stride, the depth's included."""
    x = np.random.default_rng(seed).standard_normal((nb, c, d, h, w)).astype(np.float32)
    od, oh, ow = ((n - 1) // k + 1 for n, k in zip((d, h, w), s))
    out = np.full((nb, c, od, oh, ow), np.nan, np.float32)
    C._subsample(x, *s, od, oh, ow, out)
    np.testing.assert_array_equal(out, x[:, :, ::s[0], ::s[1], ::s[2]])
