"""byoc's thread pool (``byoc_cpu.host.threads``): every chunk runs once, errors reach the
caller, and the hand-off (helpers poll a shared word outside the GIL before they sleep) neither
loses nor repeats a job, whether the caller or a helper finishes last, whether the helper is
polling or asleep."""

from __future__ import annotations

import threading
import time

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byoc_cpu.host import threads
from byoc_cpu.host._spin import claim, finish, int64_at, wait_done


@numba.njit(nogil=True, cache=True)
def _busy(n):
    s = 0.0
    for i in range(n):
        s += np.sqrt(i + 1.0)
    return s


def _pool(workers: int = 1) -> threads._Pool:
    return threads._Pool(workers)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 3000), st.floats(0, 0.002)), min_size=1, max_size=12))
def test_every_chunk_runs_once(jobs):
    pool = _pool(1)
    for n, work, pause in jobs:
        hits = np.zeros(n, np.int64)
        who = [None] * n

        def fn(i, hits=hits, who=who, work=work):
            _busy(work * (i + 1))  # uneven chunks: sometimes the helper finishes last
            hits[i] += 1
            who[i] = threading.current_thread().name

        pool.run(fn, n)
        assert hits.tolist() == [1] * n
        time.sleep(pause)  # a pause past the polling: the helper sleeps and is woken


def test_a_helper_finishing_last_is_waited_for():
    pool = _pool(1)
    for _ in range(200):
        order = []

        def fn(i, order=order):
            # chunk 1 is long: whoever takes it finishes after the other
            _busy(20000 if i == 1 else 10)
            order.append(i)

        pool.run(fn, 2)
        assert sorted(order) == [0, 1]


def test_errors_reach_the_caller_and_the_pool_stays_usable():
    pool = _pool(1)

    def bad(i):
        if i == 1:
            raise ValueError("chunk 1")

    with pytest.raises(ValueError, match="chunk 1"):
        pool.run(bad, 4)
    seen = []
    pool.run(seen.append, 3)
    assert sorted(seen) == [0, 1, 2]


def test_callers_on_two_threads_share_the_pool():
    pool = _pool(1)
    totals = [0, 0]

    def caller(k):
        for _ in range(100):
            box = np.zeros(4, np.int64)

            def fn(i, box=box):
                _busy(200)
                box[i] = 1

            pool.run(fn, 4)
            totals[k] += int(box.sum())

    ts = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert totals == [400, 400]


def test_spin_wait_sees_a_store_and_gives_up():
    word = np.zeros(16, np.int64)
    assert threads._spin_wait(word, 0, 0) is False  # nothing changes: gives up after its polls
    word[0] = 5
    assert threads._spin_wait(word, 0, 0) is True
    assert threads._spin_wait(word, 0, 5, 8, 7) is False and word[8] == 7  # stores first


# -------------------------------------------------------------------------------------------------
# compiled jobs: a C function that the threads share through claims, run by helpers without the GIL


def _counting_job(p):
    """Argument block: claim counters' address, hits' address, chunks, work per chunk."""
    a = numba.carray(p, 4)
    sync, hits = numba.carray(int64_at(a[0]), 3), numba.carray(int64_at(a[1]), a[2])
    while True:
        i = claim(sync, 0)
        if i >= a[2]:
            break
        s = 0.0
        for k in range(a[3] * (i % 3 + 1)):  # uneven chunks
            s += np.sqrt(k + 1.0)
        hits[i] += 1 if s >= 0 else 2
        finish(sync, 0)
    wait_done(sync, 0, a[2])


_JOB = []


def _job_address() -> int:
    if not _JOB:
        _JOB.append(numba.cfunc(numba.types.void(numba.types.CPointer(numba.types.int64)))(_counting_job).address)
    return _JOB[0]


def _run_counting(pool, n: int, work: int) -> np.ndarray:
    sync, hits = np.zeros(3, np.int64), np.zeros(n, np.int64)
    block = np.array([sync.ctypes.data, hits.ctypes.data, n, work], np.int64)
    pool.run_compiled(_job_address(), block.ctypes.data)
    return hits


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 3000), st.floats(0, 0.002), st.booleans()),
                min_size=1, max_size=12))
def test_a_compiled_job_runs_each_chunk_once(jobs):
    # compiled and Python jobs interleaved, with pauses past the helper's polling (it sleeps)
    pool = _pool(1)
    for n, work, pause, python_too in jobs:
        assert _run_counting(pool, n, work).tolist() == [1] * n
        if python_too:
            hits = np.zeros(n, np.int64)
            pool.run(lambda i, hits=hits: hits.__setitem__(i, hits[i] + 1), n)
            assert hits.tolist() == [1] * n
        time.sleep(pause)


def test_a_compiled_job_in_a_busy_pool_runs_on_its_caller():
    pool = _pool(1)
    results = [None] * 4

    def fn(i):  # a job posted from inside another job's chunk: the pool is taken
        results[i] = _run_counting(pool, 5, 100)

    pool.run(fn, 4)
    assert all(r.tolist() == [1] * 5 for r in results)


def test_a_helper_woken_early_polls_then_sleeps_again():
    pool = _pool(2)
    time.sleep(0.01)
    for _ in range(20):
        pool.wake()  # nothing posted: the helpers poll a while, then sleep
        time.sleep(0.001)
        assert _run_counting(pool, 8, 500).tolist() == [1] * 8


def test_a_compiled_job_without_a_pool():
    sync, hits = np.zeros(3, np.int64), np.zeros(6, np.int64)
    block = np.array([sync.ctypes.data, hits.ctypes.data, 6, 10], np.int64)
    threads.run_job(_job_address(), block)
    assert hits.tolist() == [1] * 6
