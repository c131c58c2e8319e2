"""Fixtures of the vitis tests (helpers live in vitis_helpers.py)."""

from __future__ import annotations

import pytest
from vitis_helpers import make_registry


@pytest.fixture(scope="session")
def registry():
    return make_registry()
