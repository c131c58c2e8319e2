"""Shared fixtures of the jetson plugin's tests.

Tests use an explicit registry holding only this plugin (no entry-point scan), so other
installed plugins never take nodes away. ``@pytest.mark.gpu`` tests need the tensorrt package
and a CUDA GPU and are skipped without them, with the reason and a summary line; with
``BYOC_REQUIRE_GPU=1`` they fail instead (a GPU run that cannot reach the GPU is a failure).

``fake_trt`` installs the test double of ``tensorrt`` and ``cuda.bindings.runtime``
(``tests/fake_trt``), parametrised over TensorRT 10 and 11. ``BYOC_JETSON_FAKE_GPU=10`` (or
``11``) installs it for the whole session, so ``runtime="auto"`` picks TensorRT everywhere:
the suite must pass that way too (no test may assume that "auto" means the emulation);
``BYOC_JETSON_FAKE_GPU=too-old`` simulates cuda-python 13 on a CUDA 12 driver.
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


FAKE_VERSIONS = {"10": "10.8.0.43", "11": "11.1.0.10"}
_MODULES = ("tensorrt", "cuda", "cuda.bindings", "cuda.bindings.runtime")


def install_fake(version: str, gpu=None) -> tuple[dict, object]:
    """Put the fake tensorrt/cudart in ``sys.modules``; returns (what was there before, the fake GPU)."""
    import importlib.machinery
    import types

    import byoc_jetson.tensorrt_rt as trt_rt
    from byoc_jetson.options import reset_probes
    from fake_trt import FakeGPU, make_cudart, make_tensorrt

    gpu = gpu if gpu is not None else FakeGPU()
    cudart = make_cudart(gpu)
    trt = make_tensorrt(version, cudart)
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = cudart
    cuda.bindings = bindings
    saved = {name: sys.modules.get(name) for name in _MODULES}
    for name, mod in zip(_MODULES, (trt, cuda, bindings, cudart)):
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod
    reset_probes()
    trt_rt._backend = None
    return saved, gpu


def remove_fake(saved: dict) -> None:
    import byoc_jetson.tensorrt_rt as trt_rt
    from byoc_jetson.options import reset_probes

    for name, mod in saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    reset_probes()
    trt_rt._backend = None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs the tensorrt package and a CUDA GPU (skipped without them; "
                                       "BYOC_REQUIRE_GPU=1 makes that a failure)")
    fake = os.environ.get("BYOC_JETSON_FAKE_GPU")
    if fake == "too-old":  # TensorRT installed, the driver too old for cuda-python: GPU tests cannot run
        from fake_trt import FakeGPU

        install_fake(FAKE_VERSIONS["10"], FakeGPU(driver="too-old"))
    elif fake:
        install_fake(FAKE_VERSIONS[fake])


def _require_gpu() -> bool:
    return os.environ.get("BYOC_REQUIRE_GPU", "") not in ("", "0")


_skipped_gpu: list[str] = []


def pytest_collection_modifyitems(config, items):
    from byoc_jetson.options import tensorrt_probe

    probe = tensorrt_probe()
    if probe.ok or _require_gpu():
        return
    skip = pytest.mark.skip(reason=f"GPU test not run: {probe.reason} (BYOC_REQUIRE_GPU=1 turns this into a failure)")
    here = Path(__file__).parent
    for item in items:
        if "gpu" in item.keywords and here in Path(item.path).parents:
            item.add_marker(skip)
            _skipped_gpu.append(item.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _skipped_gpu:
        from byoc_jetson.options import tensorrt_probe

        terminalreporter.write_line(f"jetson: {len(_skipped_gpu)} GPU test(s) were NOT run ({tensorrt_probe().reason}); "
                                    "this is not a GPU pass. Set BYOC_REQUIRE_GPU=1 on a GPU machine.", yellow=True)


@pytest.fixture(autouse=True)
def _gpu_required(request):
    if request.node.get_closest_marker("gpu") is not None and _require_gpu():
        from byoc_jetson.options import tensorrt_probe

        probe = tensorrt_probe()
        if not probe.ok:
            pytest.fail(f"BYOC_REQUIRE_GPU=1 but the TensorRT path cannot run: {probe.reason}", pytrace=False)


@pytest.fixture(params=sorted(FAKE_VERSIONS), ids=lambda v: f"trt{v}")
def fake_trt(request):
    """The fake tensorrt (10 or 11) and cudart, installed for one test; yields the fake tensorrt module."""
    saved, gpu = install_fake(FAKE_VERSIONS[request.param])
    try:
        yield sys.modules["tensorrt"]
    finally:
        remove_fake(saved)


@pytest.fixture(scope="session")
def registry():
    from byoc.plugins import build_registry

    import byoc_jetson.plugin

    return build_registry([("jetson", byoc_jetson.plugin)], entry_points=False)


@pytest.fixture(autouse=True)
def _engine_cache(tmp_path, monkeypatch):
    # never touch the user's engine cache from a test
    monkeypatch.setenv("BYOC_JETSON_CACHE", str(tmp_path / "engines"))
