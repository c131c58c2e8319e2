"""The nine model-zoo architectures (seeded random weights) on the openvino target alone, through a
bundle (compile -> save -> load: the loaded model runs the imported blobs) vs onnxruntime, within
1e-4.

CI runs three (the env's time budget is a few minutes on 2 cores); BYOC_OPENVINO_ZOO=all runs all
nine (``tox -e openvino -- -k zoo`` with it set), BYOC_OPENVINO_ZOO=a,b a chosen few.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from ov_helpers import onnxruntime_run

import byoc
from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs

CI_MODELS = ("squeezenet", "shufflenet", "resnet50")


def _selected(name: str) -> bool:
    chosen = os.environ.get("BYOC_OPENVINO_ZOO", "")
    if chosen == "all":
        return True
    if chosen:
        return name in chosen.split(",")
    return name in CI_MODELS


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_through_a_bundle_matches_onnxruntime(name, tmp_path):
    if not _selected(name):
        pytest.skip(f"{name}: set BYOC_OPENVINO_ZOO=all (or a list) to run it; CI runs {', '.join(CI_MODELS)}")
    model = load_zoo(name, seed=0)
    feeds = zoo_inputs(model, seed=1)
    expected = onnxruntime_run(model, feeds)
    cm = byoc.compile(model, targets=["openvino"], strict=True)
    assert all(rec.device == "openvino" for rec in cm.records.values()), \
        [(n, r.verdicts) for n, r in cm.records.items() if r.device != "openvino"][:5]
    path = cm.save(tmp_path / f"{name}.byoc")
    del cm
    loaded = byoc.load(path)
    got = loaded.run(feeds)
    for (out_name, actual), want in zip(got.items(), expected):
        assert actual.shape == want.shape and actual.dtype == want.dtype, out_name
        np.testing.assert_allclose(actual, want, rtol=1e-4, atol=1e-5, err_msg=f"{name}: {out_name}")
