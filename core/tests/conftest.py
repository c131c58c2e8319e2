import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# test helpers (node_skips.py) live beside the tests
sys.path.insert(0, str(Path(__file__).parent))

# "ci": fixed seed, no deadline (the first call of a kernel JIT-compiles it); "dev": random seeds
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# the suites check the compiled code bit for bit: compile waits for it (tox sets the same);
# tiered first runs are tested with wait=False
os.environ.setdefault("BYOC_WAIT", "1")
