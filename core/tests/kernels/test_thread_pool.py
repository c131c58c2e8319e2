"""byoc's thread pool (``byoc.kernels.threads``): every chunk runs once, errors reach the
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

from byoc.kernels import threads


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
