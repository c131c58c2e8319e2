"""The PyTorch front-end tests (``tox -e torch``, the CPU build of torch): Dynamo starts fresh per test."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch front end runs in `tox -e torch` (torch installed)")

import byoc.torch as byoc_torch  # noqa: E402


@pytest.fixture
def compiles(monkeypatch):
    """Every ``byoc.compile`` the backend makes, as (onnx model, CompiledModel); Dynamo starts fresh."""
    torch._dynamo.reset()
    seen = []
    real = byoc_torch.byoc_compile

    def spy(proto, **kw):
        compiled = real(proto, **kw)
        seen.append((proto, compiled))
        return compiled

    monkeypatch.setattr(byoc_torch, "byoc_compile", spy)
    yield seen
    torch._dynamo.reset()
