"""``run_spmd`` and the work-unit counters (``claim``/``finish``/``wait_done``): every chunk of
every unit runs exactly once, whatever number of threads enters, and a unit is complete before
any thread starts the next."""

from __future__ import annotations

import threading

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc_cpu.host import threads
from byoc_cpu.host._spin import claim, finish, wait_done


@numba.njit(nogil=True, cache=True)
def _units(sync, chunks, hits, seen):
    """Unit ``u`` has ``chunks[u]`` chunks; chunk ``i`` of unit ``u`` counts itself in
    ``hits[u, i]`` and records in ``seen[u, i]`` how many chunk runs of unit ``u - 1`` it sees
    (all of them, if a unit is complete before the next starts)."""
    for u in range(chunks.size):
        while True:
            i = claim(sync, u)
            if i >= chunks[u]:
                break
            hits[u, i] += 1
            if u > 0:
                seen[u, i] = hits[u - 1].sum()
            finish(sync, u)
        wait_done(sync, u, chunks[u])


def _check(chunks: list[int], entrants: int | None = None) -> None:
    c = np.array(chunks, np.int64)
    width = max(chunks)
    hits = np.zeros((len(chunks), width), np.int64)
    seen = np.zeros((len(chunks), width), np.int64)
    sync = np.zeros(2 * len(chunks) + 1, np.int64)
    if entrants is None:
        threads.run_spmd(_units, sync, (c, hits, seen))
    else:
        ts = [threading.Thread(target=_units, args=(sync, c, hits, seen)) for _ in range(entrants)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    for u, n in enumerate(chunks):
        assert list(hits[u, :n]) == [1] * n, (u, hits[u])
        assert int(sync[2 * u + 1]) == n
        if u > 0:
            assert all(seen[u, :n] == chunks[u - 1]), (u, seen[u])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_run_spmd_runs_each_chunk_once(chunks):
    _check(chunks)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=8), st.integers(1, 5))
def test_any_number_of_threads_can_enter(chunks, entrants):
    _check(chunks, entrants)


@numba.njit(nogil=True, cache=True)
def _raising(sync, chunks, bad):
    for u in range(chunks.size):
        while True:
            i = claim(sync, u)
            if i >= chunks[u]:
                break
            if u == bad and i == 1:
                raise ValueError("chunk failed")
            finish(sync, u)
        wait_done(sync, u, chunks[u])


def test_an_error_in_one_thread_does_not_hang_the_others():
    """The chunk that raises is never finished: the abort flag ends the other threads' wait."""
    chunks = np.array([3, 4, 2], np.int64)
    outcome: list[str] = []

    def call():
        try:
            threads.run_spmd(_raising, np.zeros(2 * chunks.size + 1, np.int64), (chunks, 1))
        except ValueError as exc:
            outcome.append(str(exc))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "run_spmd hung after a chunk raised"
    assert outcome == ["chunk failed"]
