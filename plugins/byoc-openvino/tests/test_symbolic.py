"""A model with symbolic H and W runs on openvino at five sizes with one compile (OpenVINO's
dynamic shapes), and matches onnxruntime at each."""

from __future__ import annotations

import numpy as np
from ov_helpers import conv_net, onnxruntime_run, stats

import byoc

SIZES = [(32, 32), (64, 48), (96, 160), (40, 72), (128, 64)]


def test_five_sizes_one_compile(tmp_path):
    model = conv_net(dynamic=True)
    before = stats()
    cm = byoc.compile(model, targets=["openvino"], strict=True, target_options={"openvino": {"cache_dir": ""}})
    assert [r.region.target for r in cm.regions] == ["openvino"] and len(cm.records) == 8
    assert all(rec.device == "openvino" for rec in cm.records.values())
    assert cm.regions[0].artifact.metadata["dynamic"] is True
    rng = np.random.default_rng(0)
    for h, w in SIZES:
        feeds = {"x": rng.standard_normal((1, 3, h, w)).astype(np.float32)}
        got = cm.run(feeds)["y"]
        want = onnxruntime_run(model, feeds)[0]
        assert got.shape == (1, 1, h, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    after = stats()
    assert after["compiles"] - before["compiles"] == 1, (before, after)
    # the bundle keeps one dynamic blob too: loading imports it once, runs every size
    path = cm.save(tmp_path / "det.byoc")
    loaded = byoc.load(path)
    for h, w in SIZES[:2]:
        feeds = {"x": rng.standard_normal((1, 3, h, w)).astype(np.float32)}
        np.testing.assert_allclose(loaded.run(feeds)["y"], cm.run(feeds)["y"], rtol=0, atol=0)
    assert stats()["compiles"] == after["compiles"]
