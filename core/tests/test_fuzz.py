"""The structure-aware fuzzer, short and with fixed seeds (``nox -s fuzz`` runs it for longer).

Every case must compile and run, or be refused with a ByocError: never another exception type,
never past the time limit, never past the memory cap.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import byoc_fuzz as fuzz


def test_fixed_seed_fuzz_run_has_no_findings():
    summary = fuzz.fuzz(count=150, seed=20261202, kinds=("model", "bundle", "plugin"))
    assert summary.cases == 150
    assert summary.ok, [(f.kind, f.case_seed, f.mutations, f.detail) for f in summary.findings]
    # the mutations must actually reach both outcomes
    assert summary.counts.get("byoc-error", 0) > 50 and summary.counts.get("ok", 0) > 5


@settings(max_examples=60)
@given(rnd=st.randoms(use_true_random=False))
def test_hypothesis_driven_mutations_only_raise_byoc_errors(rnd: random.Random):
    name, applied, data = fuzz.make_case(rnd)
    outcome = fuzz.run_case(data, rnd, seed_model=name, mutations=applied)
    assert outcome.kind in ("ok", "byoc-error"), (outcome.kind, name, applied, outcome.detail)


def test_every_mutation_applies_to_some_seed_model():
    for mutation in fuzz.STRUCTURAL:
        applied = False
        for make in fuzz.SEEDS.values():
            model = make()
            before = model.SerializeToString()
            try:
                mutation(random.Random(3), model)
            except Exception:
                continue
            applied = applied or model.SerializeToString() != before
        assert applied, mutation.__name__


def test_bundle_and_plugin_cases_end_in_success_or_a_byoc_error():
    from byoc_fuzz import fuzz

    summary = fuzz(count=40, seed=7, kinds=("bundle", "plugin"))
    assert summary.cases == 40 and summary.ok, [(f.kind, f.mutations, f.detail) for f in summary.findings]
    assert summary.counts.get("ok", 0) and summary.counts.get("byoc-error", 0)


def test_hostile_plugin_kinds_are_all_contained():
    import random

    import byoc
    from byoc_fuzz import hostile as fuzz_hostile

    for hook in fuzz_hostile.HOOKS:
        for behaviour in fuzz_hostile.BEHAVIOURS:
            try:
                fuzz_hostile.plugin_case(random.Random(hash((hook, behaviour)) & 0xFFFF), byoc.Budget())
            except byoc.ByocError:
                pass


# fixed seeds and counts of the feeds, options and caches kinds (about 15 s together on 2 cores);
# each draws none of the known findings listed in tools/byoc-fuzz/README.md
FEEDS_SEED, FEEDS_COUNT = 34, 60
OPTIONS_SEED, OPTIONS_COUNT = 41, 80
CACHES_SEED, CACHES_COUNT = 0, 10


def _findings(summary):
    return [(f.kind, f.case_seed, f.mutations, f.detail) for f in summary.findings]


def test_feeds_cases_end_in_success_or_a_byoc_error():
    summary = fuzz.fuzz(count=FEEDS_COUNT, seed=FEEDS_SEED, kinds=("feeds",))
    assert summary.cases == FEEDS_COUNT and summary.ok, _findings(summary)
    assert summary.counts.get("ok", 0) >= 3 and summary.counts.get("byoc-error", 0) >= 20


def test_options_cases_end_in_success_or_a_byoc_error():
    summary = fuzz.fuzz(count=OPTIONS_COUNT, seed=OPTIONS_SEED, kinds=("options",))
    assert summary.cases == OPTIONS_COUNT and summary.ok, _findings(summary)
    assert summary.counts.get("ok", 0) >= 3 and summary.counts.get("byoc-error", 0) >= 20


def test_caches_cases_give_the_clean_cache_results():
    summary = fuzz.fuzz(count=CACHES_COUNT, seed=CACHES_SEED, kinds=("caches",))
    assert summary.cases == CACHES_COUNT and summary.ok, _findings(summary)
    assert summary.counts.get("ok", 0) >= CACHES_COUNT // 2


#: cases that once ended in a finding: a foreign exception from run_batch and from save, a FIFO
#: planted in byoc-cpu's module cache that blocked the compile
FOUND = [(1784037866458323960, "feeds"), (4338323178361340435, "feeds"), (6912573887799929392, "feeds"),
         (1885446857198079865, "options"), (7023743836218156456, "caches"), (1749318759610081913, "caches")]


@pytest.mark.parametrize(("case_seed", "kind"), FOUND)
def test_cases_that_found_defects_end_in_success_or_a_byoc_error(case_seed, kind):
    outcome = fuzz.replay(case_seed, kinds=(kind,))
    assert outcome.kind in ("ok", "byoc-error"), outcome


def test_input_case_kinds_are_registered():
    assert {"feeds", "options", "caches"} <= set(fuzz.KINDS)
    for kind in ("feeds", "options", "caches"):
        name, applied, case = fuzz.make_any_case(random.Random(0), (kind,))
        assert name == kind and callable(case)
