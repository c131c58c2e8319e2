"""Integration tests: every plugin installed (``tox -e integration``), the test plugins included."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# helper modules beside the tests
sys.path.insert(0, str(Path(__file__).parent))

# same profiles as core/tests: "ci" is derandomised, "dev" draws new examples each run
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# the tests check the compiled code's results bit for bit (bundles, threads): compile waits for it,
# also when pytest runs outside tox (which sets the same)
os.environ.setdefault("BYOC_WAIT", "1")
