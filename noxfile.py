"""Developer sessions: `nox -s demo` (the main job), `bench`, `warmup`, `fuzz`, `lint`, `tests`, `gpu`."""

from __future__ import annotations

import nox

nox.options.sessions = ["demo"]
nox.options.reuse_existing_virtualenvs = True

def _install(session: nox.Session, *extras: str) -> None:
    from pathlib import Path

    plugins = [f for f in sorted(Path("plugins").glob("byoc-*")) if (f / "pyproject.toml").exists()]
    session.log(f"installing the core and {len(plugins)} plugin(s) (about a minute on a cold pip cache)")
    session.log(f"[1/{len(plugins) + 1}] core")
    session.install("-e", f"./core[{','.join(('test',) + extras)}]")
    for i, folder in enumerate(plugins, 2):
        session.log(f"[{i}/{len(plugins) + 1}] {folder.name}")
        session.install("-e", str(folder))


@nox.session
def demo(session: nox.Session) -> None:
    """ResNet-50 (onnx wheel) for each installed target alone, then the default: PASS/FAIL vs onnxruntime."""
    _install(session)
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """byoc vs onnxruntime on the nine model-zoo architectures (medians, cold and warm)."""
    _install(session)
    session.run("python", "benchmarks/bench_models.py", *session.posargs)


@nox.session
def warmup(session: nox.Session) -> None:
    """Fill the Numba cache for the common host kernels (`-- --jobs 4`, `-- --target cpu`); then time a first run."""
    _install(session)
    session.run("byoc", "warmup", *session.posargs)
    session.run("python", "benchmarks/startup_bench.py", "--first-run-only")


@nox.session
def fuzz(session: nox.Session) -> None:
    """The structure-aware fuzzer: `nox -s fuzz -- --seconds 600` or `-- --count 5000 --seed 3`."""
    _install(session)
    session.install("-e", "./tools/byoc-fuzz")
    args = session.posargs or ["--count", "2000"]
    session.run("python", "-m", "byoc_fuzz", *args)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over every package."""
    session.install("ruff>=0.4")
    session.run("ruff", "check", "core", "plugins", "tools", "tests", "benchmarks", "examples", "noxfile.py")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test-suite through tox (same as CI)."""
    session.install("tox>=4.11")
    session.run("tox", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """On a GPU machine: byoc-jetson with its pinned TensorRT extra, GPU tests, ResNet-50 vs onnxruntime, cache hit."""
    session.run("python", "benchmarks/gpu_check.py", *session.posargs)
