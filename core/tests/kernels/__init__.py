"""Helpers for the kernel tests."""

import contextlib
from concurrent.futures import ThreadPoolExecutor

from byoc.kernels import parallel


@contextlib.contextmanager
def splitting(parts: int = 3):
    """Range work split into ``parts`` chunks run on threads (as a host executor lends them)."""

    def runner(fn, n_units, args, unit_cost=1):
        bounds = [n_units * i // parts for i in range(parts + 1)]
        with ThreadPoolExecutor(parts) as pool:
            list(pool.map(lambda i: fn(*args, bounds[i], bounds[i + 1]), range(parts)))

    previous = parallel._runner
    parallel.use(runner)
    try:
        yield
    finally:
        parallel.use(previous)


@contextlib.contextmanager
def serial():
    """Range work in one call (no host executor's threads)."""
    previous = parallel._runner
    parallel.use(None)
    try:
        yield
    finally:
        parallel.use(previous)
