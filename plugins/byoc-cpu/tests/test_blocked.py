"""The channel-blocked direct convolution (``byoc_cpu.host.blocked``) against a NumPy reference,
over random shapes, paddings, output row widths (the output's own or the planes') and splits of
its output (channel blocks, row ranges)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc_cpu.host import blocked


@st.composite
def cases(draw):
    c = draw(st.sampled_from([3, 8, 16, 24, 32]))  # 3: an RGB stem, zero-padded to one block
    mb = draw(st.sampled_from([blocked.MB, blocked.MB_WIDE]))  # conv8, conv16
    m = mb * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, kh)), draw(st.integers(1, kw))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pt, pb, pl, pr = (draw(st.integers(0, 3)) for _ in range(4))
    if h + pt + pb < kh or w + pl + pr < kw:
        pb, pr = kh, kw
    parts = draw(st.integers(1, 3))
    return (mb, c, m, kh, kw, sh, sw, h, w, pt, pb, pl, pr, parts, draw(st.booleans()), draw(st.booleans()),
            draw(st.integers(0, 3)), draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=60, deadline=None)
@given(cases())
def test_blocked_kernels_match_reference(case):
    _check_against_reference(case)


@pytest.mark.parametrize("h, parts, by_channels", [(5, 1, True), (5, 2, False), (6, 3, False), (1, 1, True)])
def test_rows_of_seven_go_in_pairs(h, parts, by_channels):
    # rows 7 wide: the wide form takes two rows per tile of 14 (an odd one alone), in any split
    _check_against_reference((blocked.MB_WIDE, 16, 64, 3, 3, 1, 1, h, 7, 1, 1, 1, 1, parts, by_channels, True, 3, h))


def _check_against_reference(case):
    mb, c, m, kh, kw, sh, sw, h, w, pt, pb, pl, pr, parts, by_channels, own_rows, ep, seed = case
    kernel = blocked.kernel_for(mb)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, kh, kw)).astype(np.float32)
    hp, wp = h + pt + pb, w + pl + pr
    oh, ow = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    hq, wq = blocked.phase_extent(oh, kh, sh), blocked.phase_extent(ow, kw, sw)
    L = blocked.plane_length(hq, wq, kw, sh, sw)
    xo, yo = 5, 3  # offsets into the flat buffers
    xf = np.concatenate([np.full(xo, np.nan, np.float32), x.ravel()])
    x8 = np.full(xo + -(-c // 8) * L * 8, np.nan, np.float32)
    blocked.reorder8(xf, xo, c, h, w, L, hq, wq, sh, sw, pt, pl, x8, xo)
    ldr = ow if own_rows else wq  # output rows: the output's own (in place) or the planes' width
    ncols = oh * ldr
    y = np.full(yo + m * ncols + 7, np.nan, np.float32)
    wb = blocked.blocked_weights(wt, mb)
    bias = np.concatenate([[np.nan], rng.standard_normal(m)]).astype(np.float32)  # from offset 1
    res = np.concatenate([np.full(2, np.nan), rng.standard_normal(m * ncols)]).astype(np.float32)  # from offset 2
    nb = m // mb
    if by_channels:
        cuts = np.linspace(0, nb, parts + 1).astype(int)
        for a, b in zip(cuts[:-1], cuts[1:]):
            kernel(x8, xo, wb, bias, 1, res, 2, -(-c // 8), L, wq, hq, sh, sw, kh, kw, m, ncols, a, b, 0, oh, ldr, ep, y, yo)
    else:
        cuts = np.linspace(0, oh, parts + 1).astype(int)
        for a, b in zip(cuts[:-1], cuts[1:]):
            kernel(x8, xo, wb, bias, 1, res, 2, -(-c // 8), L, wq, hq, sh, sw, kh, kw, m, ncols, 0, nb, a, b, ldr, ep, y, yo)
    xp = np.zeros((c, hp, wp), np.float64)
    xp[:, pt:pt + h, pl:pl + w] = x
    ref = np.zeros((m, oh, ow)) + bias[1:, None, None]
    for a in range(kh):
        for b in range(kw):
            ref += np.einsum("mc,chw->mhw", wt[:, :, a, b], xp[:, a:a + sh * (oh - 1) + 1:sh, b:b + sw * (ow - 1) + 1:sw])
    if ep & 2:  # the residual, laid out as the output
        ref = ref + res[2:].reshape(m, oh, ldr)[:, :, :ow]
    if ep & 1:
        ref = np.maximum(ref, 0)
    got = y[yo:yo + m * ncols].reshape(m, oh, ldr)
    np.testing.assert_allclose(got[:, :, :ow], ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))
    assert np.isfinite(got).all()  # with the planes' width the padded columns are computed too, from zeros
    assert np.isnan(y[:yo]).all() and np.isnan(y[yo + m * ncols:]).all()  # nothing written outside


def test_blocked_weights_is_a_transpose_of_the_weights_bytes():
    wt = np.arange(32 * 16 * 3 * 3, dtype=np.float32).reshape(32, 16, 3, 3)
    shape, axes = blocked.blocked_weights_axes(*wt.shape)
    np.testing.assert_array_equal(blocked.blocked_weights(wt), wt.reshape(shape).transpose(axes).ravel())
    assert blocked.applies(16, 32, 1, 3, 3, 1, 1, 1, 1)
    assert blocked.applies(16, 32, 1, 3, 3, 2, 2, 1, 1)  # strided: over stride phases
    assert not blocked.applies(12, 32, 1, 3, 3, 1, 1, 1, 1) and not blocked.applies(16, 32, 1, 3, 3, 1, 1, 2, 2)
    assert not blocked.applies(16, 32, 1, 3, 3, 4, 1, 1, 1)  # a stride past the kernel
    assert blocked.applies(16, 32, 1, 1, 1, 2, 2, 1, 1)  # but 1x1 over its first stride phase
    shape, axes = blocked.blocked_weights_axes(*wt.shape, blocked.MB_WIDE)
    assert shape[1] == blocked.MB_WIDE
    np.testing.assert_array_equal(blocked.blocked_weights(wt, blocked.MB_WIDE), wt.reshape(shape).transpose(axes).ravel())


@pytest.mark.parametrize("wide, env, m, stride, side, want", [
    (True, "", 64, 1, 14, 32), (True, "", 64, 1, 7, 32), (True, "", 64, 2, 7, 32), (True, "", 48, 1, 14, 0),
    (True, "", 64, 1, 9, 0), (True, "", 64, 1, 13, 32), (True, "", 64, 1, 30, 32), (True, "1", 64, 1, 9, 32),
    (True, "1", 48, 1, 7, 16), (False, "", 48, 1, 7, 16), (False, "", 64, 1, 14, 16),
])
def test_preferred_form(monkeypatch, wide, env, m, stride, side, want):
    # full-rate AVX-512: the wide form for whole blocks of 32 where most positions its tiles compute
    # are output pixels (rows of 7: one tile of 7; of 13: 13 of 14; of 9: 9 of 14 as rows of their
    # own, 63 of 84 over the planes' width, no; of 30: 30 of 32 over the planes' width), else the
    # GEMMs (unless forced); elsewhere the 8-wide form
    monkeypatch.setattr(blocked, "WIDE", wide)
    monkeypatch.setattr(blocked, "_ENV", env)
    monkeypatch.setattr(blocked, "PAYS", env != "0")
    assert blocked.preferred(16, m, 1, 3, 3, stride, stride, 1, 1, side, side) == want
    assert blocked.preferred(16, m, 1, 3, 3, 1, 1, 2, 2, side, side) == 0  # dilated: never


@pytest.mark.parametrize("c, h, w, pt, pl, pb, pr", [(5, 3, 4, 1, 2, 0, 1), (8, 1, 1, 0, 0, 0, 0), (13, 4, 2, 2, 0, 1, 3)])
def test_reorder8_zero_pads_channels_and_plane(c, h, w, pt, pl, pb, pr):
    rng = np.random.default_rng(c)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    hp, wp = h + pt + pb, w + pl + pr
    L = blocked.plane_length(hp, wp, 3)
    nb = -(-c // 8)
    y = np.full(nb * L * 8 + 4, np.nan, np.float32)
    blocked.reorder8(x.ravel(), 0, c, h, w, L, hp, wp, 1, 1, pt, pl, y, 2)
    want = np.zeros((nb * 8, hp, wp), np.float32)
    want[:c, pt:pt + h, pl:pl + w] = x
    planes = y[2:2 + nb * L * 8].reshape(nb, L, 8)
    np.testing.assert_array_equal(planes[:, :hp * wp, :].reshape(nb, hp, wp, 8).transpose(0, 3, 1, 2).reshape(-1, hp, wp),
                                  want)
    assert (planes[:, hp * wp:, :] == 0).all() and np.isnan(y[:2]).all() and np.isnan(y[2 + nb * L * 8:]).all()


@pytest.mark.parametrize("sh, sw, pt, pl", [(2, 2, 1, 1), (2, 3, 0, 2), (3, 1, 2, 0)])
def test_reorder8_writes_stride_phases(sh, sw, pt, pl):
    c, h, w = 11, 7, 8
    x = np.random.default_rng(sh * 10 + sw).standard_normal((c, h, w)).astype(np.float32)
    hq, wq = 4, 5
    L = blocked.plane_length(hq, wq, 3, sh, sw)
    nb = 2
    y = np.full(nb * L * 8, np.nan, np.float32)
    blocked.reorder8(x.ravel(), 0, c, h, w, L, hq, wq, sh, sw, pt, pl, y, 0)
    padded = np.zeros((nb * 8, sh * hq + h + pt, sw * wq + w + pl), np.float32)
    padded[:c, pt:pt + h, pl:pl + w] = x
    blocks = y.reshape(nb, L, 8)
    for a in range(sh):
        for d in range(sw):
            p = a * sw + d
            got = blocks[:, p * hq * wq:(p + 1) * hq * wq].reshape(nb, hq, wq, 8).transpose(0, 3, 1, 2).reshape(-1, hq, wq)
            np.testing.assert_array_equal(got, padded[:, a:a + sh * hq:sh, d:d + sw * wq:sw])
    assert (blocks[:, sh * sw * hq * wq:] == 0).all()  # the slack


@pytest.mark.parametrize("wide", [False, True])
@settings(max_examples=12, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(16, 32, 3), (8, 16, 5), (24, 48, 2), (16, 64, 3)]), st.integers(5, 30),
       st.lists(st.integers(0, 2), min_size=4, max_size=4), st.integers(0, 2**31 - 1))
def test_host_conv_takes_the_blocked_kernel(wide, n, cmk, hw, pads, seed):
    # both forms on any CPU: the wide one (16-float vectors) is only slower where they are split
    from byoc_cpu.host import conv
    from byoc.testing.oracle import assert_close, run_byoc, run_onnxruntime, single_node_model

    c, m, k = cmk
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, hw, hw + 3)).astype(np.float32)
    w = (rng.standard_normal((m, c, k, k)) / k).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    model, feeds = single_node_model("Conv", [x, w, b], {"pads": pads}, const_inputs=[1, 2])
    calls = []
    real = conv._blocked_conv
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "_blocked_conv", lambda *a: (calls.append(1), real(*a)))
        mp.setattr("byoc_cpu.host.blocked.PAYS", True)  # the rule where the kernel pays, on any CPU
        mp.setattr("byoc_cpu.host.blocked.WIDE", wide)
        mp.setattr("byoc_cpu.host.blocked._ENV", "")
        got = run_byoc(model, feeds)
    wp = hw + 3 + pads[1] + pads[3]
    oh, ow = hw + pads[0] + pads[2] - k + 1, wp - k + 1
    # taken wherever the padded width wastes little; the wide form for whole blocks of 32 channels
    # where most positions its tiles compute are output pixels (else byoc's GEMMs are faster there)
    form_ok = not wide or (m % blocked.MB_WIDE == 0 and blocked.useful_share(oh, ow, ow + k - 1) >= blocked.WIDE_MIN_SHARE)
    assert bool(calls) == (wp <= 1.5 * ow and form_ok)
    assert_close(got, run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("env, want", [("1", True), ("0", False)])
def test_blocked_conv_switch(monkeypatch, env, want):
    monkeypatch.setenv("BYOC_BLOCKED_CONV", env)
    assert blocked._pays() is want


@pytest.mark.parametrize("run, want, rows", [(1, 7, False), (7, 7, True), (8, 14, False), (14, 14, True), (21, 21, True),
                                             (30, 35, False), (56, 56, True), (55, 56, True)])
def test_positions_computed(run, want, rows):
    # tiles of 14 pixels, a rest of at most 7 in a tile of 7; rows of their own where that computes
    # no more than the planes' width (3x3: two more)
    assert blocked.computed(run) == want
    assert blocked.own_rows(run, run + 2) is rows


@pytest.mark.parametrize("wide, c, k, want", [(True, 3, 3, 32), (True, 3, 7, 0), (True, 12, 3, 0), (False, 3, 3, 0)])
def test_preferred_for_stems(monkeypatch, wide, c, k, want):
    # an RGB stem takes the wide form (channels zero-padded to 8) where the GEMMs' depth is small
    # (3x3: 27), not a 7x7 (147); 12 channels do not fill whole blocks: never
    monkeypatch.setattr(blocked, "WIDE", wide)
    monkeypatch.setattr(blocked, "_ENV", "")
    monkeypatch.setattr(blocked, "PAYS", True)
    assert blocked.preferred(c, 64, 1, k, k, 2, 2, 1, 1, 55, 55) == want
    # the host's own limit takes the 7x7 stem (147) and the 11x11 (363) too, not a deeper one
    host = blocked.HOST_STEM_MAX_DEPTH
    assert blocked.preferred(c, 64, 1, k, k, 2, 2, 1, 1, 55, 55, stem_max_depth=host) == (32 if wide and c == 3 else 0)
    assert blocked.preferred(3, 64, 1, 11, 11, 4, 4, 1, 1, 55, 55, stem_max_depth=host) == (32 if wide else 0)
    assert blocked.preferred(7, 64, 1, 11, 11, 4, 4, 1, 1, 55, 55, stem_max_depth=host) == 0  # 847 deep


def test_the_conv_jobs_block_is_filled_where_the_job_reads():
    from byoc_cpu.host import blocked

    block = blocked.conv_job_block({name: k + 100 for k, name in enumerate(blocked._JOB_INTS)})
    arrays = {name: np.zeros(3 + k, np.float32) for k, name in enumerate(("x", "x8", "r", "y"))}
    address = blocked.bind_job(block, arrays["x"], arrays["x8"], arrays["r"], arrays["y"])
    assert address == block.ctypes.data
    assert block[blocked.JOB_ARRAY["sync"]] == address + 8 * blocked.JOB_SYNC
    assert block[blocked.JOB_ARRAY["sync"] + 1] == len(block) - blocked.JOB_SYNC
    for name, arr in arrays.items():
        assert block[blocked.JOB_ARRAY[name]] == arr.ctypes.data and block[blocked.JOB_ARRAY[name] + 1] == arr.size
    assert [block[blocked.JOB_INT[name]] for name in blocked._JOB_INTS] == list(range(100, 100 + len(blocked._JOB_INTS)))
    assert not block[blocked.JOB_SYNC:].any()
