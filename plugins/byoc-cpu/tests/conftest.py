import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# helpers beside the tests
sys.path.insert(0, str(Path(__file__).parent))

# same profiles as core/tests: "ci" is derandomised, "dev" draws new examples each run; every
# example compiles a generated module with Numba, so the example counts stay small
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# the suites check the compiled code bit for bit: compile waits for it (tox sets the same);
# tiered first runs are tested with wait=False
os.environ.setdefault("BYOC_WAIT", "1")
