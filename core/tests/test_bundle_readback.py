"""Issue 18 (found in round two, looking for more of classes 1 and 3): fields of compiled.json
that byoc reads back after loading (node records, plugin faults, the options the report and the
command line show) are untrusted input too. A record whose ``scope`` was a number made the text
and HTML reports raise TypeError; ``placement_estimates``, ``skipped_targets`` and
``calibration`` of the wrong shape would do the same in the report and ``byoc compile``. They are
checked when loading (entries byoc does not know are left alone)."""

from __future__ import annotations

import json
import os
import random
import tempfile
import warnings
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import byoc
from byoc.cliutil import note_skipped
from byoc.report import FORMATS
import byoc_fuzz.hostile as fh


def _load(members: dict[str, bytes], policy: str = "dynamic", fallback=None):
    members = dict(members)
    fh._rehash(members)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.byoc")
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        return byoc.load(path, registry=fh.registry(fh.HostilePlugin("none", "none", 0, policy)), fallback=fallback)


def _with_options(**entries) -> dict[str, bytes]:
    members = fh._base_members()
    doc = json.loads(members["compiled.json"])
    doc["options"].update(entries)
    members["compiled.json"] = json.dumps(doc).encode()
    return members


BAD_OPTIONS = {
    "estimates not an object": {"placement_estimates": [1]},
    "estimates of a region": {"placement_estimates": {"regions": {"hostile_0": 5}}},
    "estimated seconds": {"placement_estimates": {"regions": {"r": {"target": "t", "estimated_s": {"t": "1"}}}}},
    "skipped not an object": {"skipped_targets": "cpu"},
    "skipped reason": {"skipped_targets": {"cpu": 5}},
    "calibration samples": {"calibration": {"samples": "many", "tensors": 1}},
    "calibration not an object": {"calibration": [1]},
    "shape policy": {"shape_policy": {"hostile": None}},
    "targets": {"targets": "hostile"},
    "strict": {"strict": "no"},
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_options_byoc_reads_back_are_checked_when_loading(case):
    key = next(iter(BAD_OPTIONS[case]))
    with pytest.raises(byoc.BundleError, match=f"options.{key} is not what byoc writes"):
        _load(_with_options(**BAD_OPTIONS[case]))


def test_honest_read_back_options_load():
    """What byoc writes: placement="cost" estimates (``None`` where a device cannot take a
    region), a calibration summary, skipped targets."""
    estimates = {"total_s": 0.5, "regions": {"hostile_0": {"target": "hostile",
                                                           "estimated_s": {"hostile": 0.1, "host": None}}}}
    cm = _load(_with_options(placement_estimates=estimates, calibration={"samples": 4, "tensors": 3, "schemes": {}},
                             skipped_targets={"vitis": "needs calibration"}))
    assert cm.options["placement_estimates"] == estimates
    for fmt in FORMATS:
        cm.report(fmt)


def test_unknown_option_entries_are_left_alone():
    cm = _load(_with_options(something_new={"x": [1]}, skipped_targets={"cpu": "not installed"}))
    assert cm.options["something_new"] == {"x": [1]}
    note_skipped(cm)


@pytest.mark.parametrize("field,value", [("scope", 1.5), ("scope", None), ("device", 3), ("op_type", [])])
def test_a_record_field_of_the_wrong_type_is_refused(field, value):
    members = fh._base_members()
    doc = json.loads(members["compiled.json"])
    doc["records"][0][field] = value
    members["compiled.json"] = json.dumps(doc).encode()
    with pytest.raises(byoc.BundleError, match="malformed record"):
        _load(members)


def test_a_fault_field_of_the_wrong_type_is_refused():
    members = fh._base_members()
    doc = json.loads(members["compiled.json"])
    doc["faults"] = [{"plugin": 5, "hook": "byoc_codegen", "message": "m", "kind": "error"}]
    members["compiled.json"] = json.dumps(doc).encode()
    with pytest.raises(byoc.BundleError, match="plugin fault"):
        _load(members)


@settings(max_examples=60)
@given(seed=st.integers(0, 2**32), policy=st.sampled_from(["dynamic", "static"]))
def test_a_damaged_bundle_that_loads_also_reports(seed, policy):
    """Any field of any compiled.json damaged: refused, or the loaded model runs, reports in
    every format, says what was skipped and saves again."""
    rng = random.Random(seed)
    members = fh._base_members(policy)
    for _ in range(rng.choice([1, 2])):
        (fh._mutate_json if rng.random() < 0.7 else fh._mutate_options)(rng, members)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cm = _load(members, policy, rng.choice([None, "host"]))
        except byoc.ByocError:
            return
        for fmt in FORMATS:
            cm.report(fmt)
        note_skipped(cm)
        repr(cm)
        try:
            cm.run(fh._feeds(2))
            with tempfile.TemporaryDirectory() as tmp:
                cm.save(os.path.join(tmp, "again.byoc"))
        except byoc.ByocError:
            pass


class _OddArtifact(fh.HostilePlugin):
    """Returns an artifact whose target or format is not text."""

    def __init__(self, target, fmt):
        super().__init__("none", "none", 0)
        self.odd = (target, fmt)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        from byoc.contract import region_model_bytes

        return byoc.Artifact(self.odd[0], self.odd[1], region_model_bytes(region.model))


@pytest.mark.parametrize("target,fmt", [(5, "onnx"), (None, "onnx"), ("hostile", b"onnx"), ("hostile", 3)])
def test_an_artifact_a_bundle_could_not_load_is_a_plugin_fault(tmp_path, target, fmt):
    """What a bundle records as text must be text when the plugin returns it: otherwise save
    succeeded and load refused. Now the region falls back to the host with a plugin fault."""
    plugin = _OddArtifact(target, fmt)
    reg = fh.registry(plugin)
    with pytest.warns(UserWarning, match="Artifact.target/format"):
        cm = byoc.compile(fh.model(), targets=["hostile"], registry=reg)
    assert cm.regions == [] and any("Artifact.target/format" in f.message for f in cm.faults)
    cm.save(tmp_path / "m.byoc")
    byoc.load(tmp_path / "m.byoc", registry=reg).run(fh._feeds())
