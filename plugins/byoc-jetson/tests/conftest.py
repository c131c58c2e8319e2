"""Shared fixtures of the jetson plugin's tests.

Tests use an explicit registry holding only this plugin (no entry-point scan), so other
installed plugins never take nodes away. ``@pytest.mark.gpu`` tests need the tensorrt package
and a CUDA GPU and are skipped without them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

# same profiles as core/tests: "ci" is derandomised, "dev" draws new examples each run
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs the tensorrt package and a CUDA GPU (skipped without them)")


def pytest_collection_modifyitems(config, items):
    from byoc_jetson.options import tensorrt_available

    if tensorrt_available():
        return
    skip = pytest.mark.skip(reason="needs the tensorrt package and a CUDA GPU")
    here = Path(__file__).parent
    for item in items:
        if "gpu" in item.keywords and here in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def registry():
    from byoc.plugins import build_registry

    import byoc_jetson.plugin

    return build_registry([("jetson", byoc_jetson.plugin)], entry_points=False)


@pytest.fixture(autouse=True)
def _engine_cache(tmp_path, monkeypatch):
    # never touch the user's engine cache from a test
    monkeypatch.setenv("BYOC_JETSON_CACHE", str(tmp_path / "engines"))
