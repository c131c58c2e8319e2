"""Scratch arenas shared by every region of the process (byoc_cpu.runtime.ArenaPool)."""

from __future__ import annotations

import threading

import numpy as np
from cpu_helpers import REGISTRY
from test_bundle import small_net

import byoc
from byoc_cpu.runtime import ARENAS, ArenaPool


def test_a_call_borrows_the_smallest_idle_arena_that_fits():
    pool = ArenaPool(max_idle=2)
    a, b = pool.borrow(100), pool.borrow(300)
    assert a.size == 100 and b.size == 300
    pool.give_back(a)
    pool.give_back(b)
    assert pool.borrow(50) is a and pool.borrow(200) is b
    assert pool.borrow(400).size == 400  # nothing idle fits: a new one
    for arena in (a, b, pool.borrow(1000)):
        pool.give_back(arena)
    assert pool.idle_bytes() == (300 + 1000) * 4  # the largest max_idle kept


def test_many_specialisations_hold_no_activations_of_their_own():
    """Twenty input shapes of a symbolic model: the idle arenas stay within the pool's bound (the
    largest shape's few arenas), however many specialisations there are, and every run is right."""
    model, _ = small_net(seed=31)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    cm = byoc.compile(model, registry=REGISTRY, wait=True)
    want_cm = byoc.compile(model, targets=[], host="reference")
    rng = np.random.default_rng(31)
    largest = 0
    for n in range(1, 21):
        x = {"x": rng.standard_normal((n, 3, 12, 12)).astype(np.float32)}
        got, want = cm.run(x), want_cm.run(x)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    for spec in cm.specializer.cache.values():
        largest = max([largest] + [int(cr.artifact.metadata["program"]["arena"]) for cr in spec.regions])
    assert len(cm.specializer.cache) == 20
    assert ARENAS.idle_bytes() <= ARENAS.max_idle * largest * 4


def test_threads_running_regions_at_once_get_their_own_arenas():
    model, feeds = small_net(seed=32, batch=2)
    cm = byoc.compile(model, registry=REGISTRY, wait=True)
    want = cm.run(feeds)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                x = {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)}
                out, again = cm.run(x), cm.run(x)
                for name in out:
                    np.testing.assert_array_equal(out[name], again[name])
            for name, value in cm.run(feeds).items():
                np.testing.assert_array_equal(value, want[name])
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
