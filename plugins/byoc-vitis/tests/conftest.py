"""Fixtures and hypothesis profiles of the vitis tests (helpers live in vitis_helpers.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from vitis_helpers import make_registry

# same profiles as core/tests: "ci" is derandomised, "dev" draws new examples each run
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def registry():
    return make_registry()
