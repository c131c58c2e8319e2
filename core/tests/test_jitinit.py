"""Numba's start-up on a background thread (byoc.runtime.jitinit): once per process, harmless."""

from __future__ import annotations

import subprocess
import sys


def test_start_is_idempotent_and_kernels_still_run():
    code = r"""
import numpy as np
from byoc.runtime import jitinit
t = jitinit.start()
assert jitinit.start() is t          # once per process
t.join(60)
assert not t.is_alive()
from byoc.kernels import activation
x = np.linspace(-2, 2, 9)
assert np.allclose(activation.erf(x), [__import__("math").erf(v) for v in x])  # a Numba kernel compiles and runs
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_turned_off_by_the_environment():
    code = "from byoc.runtime import jitinit; print(jitinit.start())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "BYOC_JIT_EARLY_INIT": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr[-2000:]
