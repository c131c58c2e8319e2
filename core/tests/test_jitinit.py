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
from byoc.kernels import conv
x = np.arange(2 * 5 * 5, dtype=np.float32)
col = np.zeros(2 * 9 * 25, np.float32)
conv.im2col(x, 0, 2, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 0, 5, col, 0)
assert col.reshape(18, 25)[4].tolist() == x[:25].tolist()   # centre tap of channel 0
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_turned_off_by_the_environment():
    code = "from byoc.runtime import jitinit; print(jitinit.start())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "BYOC_JIT_EARLY_INIT": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr[-2000:]
