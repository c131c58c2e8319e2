"""pytest plugin of byoc's conformance kit (entry point ``pytest11: byoc = pytest_byoc``).

``pytest --byoc-target=NAME`` runs the conformance suite (:mod:`byoc.testing.suite`) against
the installed target ``NAME``; with no other path on the command line only the suite runs.
``--byoc-examples N`` and ``--byoc-seed S`` override the instances per check and the seed, also
for a plugin's own test file that imports the suite.

This module lives outside the ``byoc`` package on purpose: pytest loads every ``pytest11``
plugin at start-up, and importing ``byoc`` pulls in numpy, onnx and numba. Nothing heavy is
imported until ``--byoc-target`` is given or a test module imports the suite.
"""

from __future__ import annotations

SUITE_MODULE = "byoc.testing.suite"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("byoc", "byoc conformance kit")
    group.addoption("--byoc-target", action="store", default=None, metavar="NAME",
                    help="run byoc's conformance suite against target NAME (an installed byoc plugin)")
    group.addoption("--byoc-examples", action="store", type=int, default=None, metavar="N",
                    help="random instances per operator, pattern and suite (default: Requirements.examples, 10)")
    group.addoption("--byoc-seed", action="store", type=int, default=None, metavar="S",
                    help="Hypothesis seed of the conformance suite (default: Requirements.seed, 0)")


def _suite_path() -> str:
    from importlib.util import find_spec

    spec = find_spec(SUITE_MODULE)
    if spec is None or spec.origin is None:  # pragma: no cover - byoc is installed with this plugin
        raise RuntimeError(f"cannot find {SUITE_MODULE}")
    return spec.origin


def pytest_configure(config) -> None:
    if not config.getoption("byoc_target", default=None):
        return
    path = _suite_path()
    args = list(config.args)
    explicit = getattr(config, "args_source", None) == type(config).ArgsSource.ARGS
    if not explicit:
        # `pytest --byoc-target=NAME` alone: run the suite, not everything under the current folder
        config.args[:] = [path]
    elif path not in args:
        config.args.append(path)
