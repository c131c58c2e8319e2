"""Helpers of the PyTorch front-end tests (``tox -e torch``, the CPU build of torch)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch front end runs in `tox -e torch` (torch installed)")


def torchvision():
    """torchvision without its C++ extension (the same workaround as tests/exporters).

    The torchvision wheel is built against CUDA torch; with torch's CPU wheel its extension
    does not load and ``import torchvision`` stops at registering a fake kernel for
    ``torchvision::nms``. Declaring the two schemas it registers eagerly lets the import finish.
    """
    try:
        import torchvision as tv
        return tv
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision as tv

    tv._byoc_schema_lib = lib  # keep the library (and its schemas) alive
    return tv


def assert_close(got, want, tol: float = 1e-4) -> None:
    """Outputs (a tensor or a tuple/list/dict of them) within ``tol`` of eager PyTorch, same dtype and shape."""
    got_l = torch.utils._pytree.tree_leaves(got)
    want_l = torch.utils._pytree.tree_leaves(want)
    assert len(got_l) == len(want_l)
    for g, w in zip(got_l, want_l):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert float(w.abs().max()) > 1e-6, "degenerate reference"
        err = float((g - w).abs().max())
        assert err <= tol, f"max abs error {err:.3g} > {tol}"


def randomize(module):
    """Seeded random BatchNorm statistics and Linear weights (torchvision's init makes MobileNet's outputs ~1e-9)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
            elif isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, 0.0, 1.0 / max(1, m.in_features) ** 0.5, generator=gen)
    return module
