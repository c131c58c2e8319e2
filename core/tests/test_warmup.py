"""``byoc warmup`` fills the Numba cache: a second warmup (a new process) compiles nothing."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

import byoc
from byoc.errors import OptionError
from byoc.jitcache import FAMILIES


def _warmup(cache, *args):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "byoc.cli", "warmup", *args], env=env, capture_output=True,
                          text=True, timeout=900)


def test_warmup_fills_the_cache_with_progress(tmp_path):
    cache = tmp_path / "numba"
    first = _warmup(cache, "--family", "activation", "--family", "pool")
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert any(line.startswith("byoc warmup: activation") and "compiled" in line for line in lines), lines
    assert any(line.startswith("byoc warmup: pool") for line in lines), lines
    assert any(f.name.endswith(".nbi") for f in cache.rglob("*")), "no Numba index written"
    second = _warmup(cache, "--family", "activation", "--family", "pool")
    assert second.returncode == 0, second.stderr
    assert second.stderr.count("all from the cache") == 2, second.stderr


def test_warmup_api_reports_every_family():
    out = io.StringIO()
    results = byoc.warmup(["tensor"], progress=out)
    assert [r.family for r in results] == ["tensor"]
    assert results[0].error is None
    assert "byoc warmup: tensor" in out.getvalue()


def test_every_family_model_is_valid():
    from byoc.frontend import load_model

    for build in FAMILIES.values():
        load_model(build())  # the checker, byoc's checks, every operator has a kernel


@pytest.mark.parametrize("kwargs", [{"families": ["nope"]}, {"jobs": 0}])
def test_warmup_refuses_bad_options(kwargs):
    with pytest.raises(OptionError):
        byoc.warmup(progress=None, **kwargs)
