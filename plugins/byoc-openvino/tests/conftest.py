"""Shared set-up: every test here skips, with the reason, where ``openvino`` does not import.

The blob cache goes to a temporary folder for the session (never the user's ~/.cache), and
OpenVINO gets the two threads the CI machine has unless BYOC_NUM_THREADS says otherwise.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

try:
    import openvino  # noqa: F401

    OPENVINO_MISSING = None
except Exception as exc:  # not installed, or installed but broken (a missing shared library)
    OPENVINO_MISSING = f"openvino does not import here ({type(exc).__name__}: {exc}); pip install byoc-openvino"

os.environ.setdefault("BYOC_OPENVINO_CACHE", tempfile.mkdtemp(prefix="byoc-openvino-test-cache-"))
os.environ.setdefault("BYOC_NUM_THREADS", "2")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
except ImportError:  # pragma: no cover
    pass


def pytest_configure(config):
    config.addinivalue_line("markers", "no_openvino: runs without openvino too (not skipped)")


def pytest_collection_modifyitems(config, items):
    if OPENVINO_MISSING is None:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=OPENVINO_MISSING)
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here) and "no_openvino" not in item.keywords:
            item.add_marker(skip)
