"""``placement="measure"`` (issue 13): candidate regions timed on their target, the host and split.

The times are made known: a test chip whose runtime sleeps a fixed time per operator type, and
the host's callable (in :mod:`byoc.partition.measure`) wrapped to sleep per operator type too.
The chip is fast at ``Neg`` and slow at ``Relu``, the host the other way round, so on a chain
``Neg, Relu, Neg, Relu`` neither "all on chip" nor "all on host" wins: the split does.
"""

from __future__ import annotations

import json
import time
import warnings
from importlib import resources

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import byoc
import byoc.plugins
from byoc.contract import host_callable, region_model_bytes
from byoc.errors import OptionError
from byoc.partition import measure
from byoc.plugins import build_registry

SLOW = 0.02  # seconds: large next to the host kernels on 2x4 tensors, even on a busy machine
CHIP = {"Neg": 0.0, "Relu": SLOW}
HOST = {"Neg": SLOW, "Relu": 0.0}


class SleepyChip:
    """Runs regions on the host kernels, then sleeps ``costs[op]`` per node."""

    def __init__(self, name="sleepy", version="1.0", costs=CHIP, priority=0):
        self.name, self.version, self.costs, self.priority = name, version, costs, priority

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version=self.version, device="npu", priority=self.priority))

    @byoc.hookimpl
    def byoc_register_operators(self, register):
        for op in self.costs:
            register(op)

    @byoc.hookimpl
    def byoc_codegen(self, region):
        return byoc.Artifact(self.name, "onnx", region_model_bytes(region.model),
                             {"ops": [n.op_type for n in region.nodes]})

    @byoc.hookimpl
    def byoc_runtime(self, artifact):
        fn, pause = host_callable(artifact.data), sum(self.costs[o] for o in artifact.metadata["ops"])

        def run(*args):
            time.sleep(pause)
            return fn(*args)

        return run


def registry(*chips):
    chips = chips or (SleepyChip(),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_registry([(c.name, c) for c in chips], entry_points=False)


def sleepy_host(model, budget=None):
    fn = host_callable(model, budget)
    ops = [n.op_type for n in model.graph] if hasattr(model, "graph") else []
    pause = sum(HOST.get(o, 0.0) for o in ops)

    def run(*args):
        time.sleep(pause)
        return fn(*args)

    return run


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "host_callable", sleepy_host)
    return tmp_path / "cache"


def chain(ops=("Neg", "Relu", "Neg", "Relu")):
    names = ["x"] + [f"t{k}" for k in range(len(ops) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[k]], [names[k + 1]], name=f"n{k}") for k, op in enumerate(ops)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}


def compile_measured(model, reg, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return byoc.compile(model, ["sleepy"], registry=reg, placement="measure", **kw)


def test_measure_splits_where_neither_device_wins_alone():
    reg = registry()
    cm = compile_measured(chain(), reg)
    where = {name: rec.device for name, rec in cm.records.items()}
    assert where == {"n0": "sleepy", "n1": "host", "n2": "sleepy", "n3": "host"}
    ref = byoc.compile(chain(), []).run(FEEDS)
    np.testing.assert_array_equal(cm.run(FEEDS)["y"], ref["y"])
    (decision,) = cm.options["placement_estimates"]["decisions"]
    assert decision["chosen"].startswith("split")
    assert {a["plan"] for a in decision["alternatives"]} >= {"all on sleepy", "all on host"}
    assert all(a["source"] == "measured" for a in decision["alternatives"])
    # priority placement puts the whole chain on the chip
    priority = byoc.compile(chain(), ["sleepy"], registry=reg)
    assert {rec.device for rec in priority.records.values()} == {"sleepy"}


@pytest.mark.parametrize("ops, device", [(("Neg", "Neg"), "sleepy"), (("Relu", "Relu"), "host")])
def test_measure_keeps_the_faster_device_for_a_whole_region(ops, device):
    cm = compile_measured(chain(ops), registry())
    assert {rec.device for rec in cm.records.values()} == {device}
    assert cm.run(FEEDS)["y"].shape == (2, 4)


def test_a_region_goes_to_another_target_that_runs_all_of_it_faster():
    slow = SleepyChip("slow", costs={"Neg": SLOW, "Relu": SLOW})
    fast = SleepyChip("fast", costs={"Neg": 0.0, "Relu": 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = byoc.compile(chain(), ["slow", "fast"], registry=registry(slow, fast), placement="measure")
    assert {rec.device for rec in cm.records.values()} == {"fast"}
    (d,) = cm.options["placement_estimates"]["decisions"]
    assert d["target"] == "slow" and d["chosen"] == "all on fast"
    assert {a["plan"] for a in d["alternatives"]} >= {"all on slow", "all on host", "all on fast"}
    np.testing.assert_array_equal(cm.run(FEEDS)["y"], byoc.compile(chain(), []).run(FEEDS)["y"])


def test_second_compile_measures_nothing_and_places_the_same(cache_dir):
    reg = registry()
    before = dict(measure.STATS)
    first = compile_measured(chain(), reg)
    measured = measure.STATS["measured"] - before["measured"]
    assert measured >= 4  # whole region on both devices and the segments
    assert first.options["placement_estimates"]["measure"]["measured"] == measured
    table = json.loads((cache_dir / "placement-measure.json").read_text())  # plain JSON
    # the whole region is timed twice (again next to the split): its second times are kept
    assert 4 <= len(table) <= measured and all(isinstance(v, float) for v in table.values())
    mid = dict(measure.STATS)
    second = compile_measured(chain(), reg)
    assert measure.STATS["measured"] == mid["measured"]
    summary = second.options["placement_estimates"]["measure"]
    assert summary["measured"] == 0 and summary["cached"] == len(table)
    assert {n: r.device for n, r in first.records.items()} == {n: r.device for n, r in second.records.items()}
    assert [r.region.name for r in first.regions] == [r.region.name for r in second.regions]


@pytest.mark.parametrize("change", ["version", "fingerprint", "weights"])
def test_the_cache_key_changes_with_version_machine_and_weights(change, monkeypatch):
    model = chain(("Neg", "Add"))
    model.graph.node[1].input.append("b")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((2, 4), np.float32), "b"))
    monkeypatch.setitem(CHIP, "Add", 0.0)
    compile_measured(model, registry())
    reg = registry(SleepyChip(version="1.1")) if change == "version" else registry()
    if change == "fingerprint":
        monkeypatch.setattr(measure, "machine_fingerprint", lambda: "another-machine")
    if change == "weights":
        model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.full((2, 4), 2, np.float32), "b"))
    before = measure.STATS["measured"]
    compile_measured(model, reg)
    assert measure.STATS["measured"] > before


@pytest.mark.parametrize("host_s, expect", [(0.097, "sleepy"), (0.090, "host")])
def test_a_plan_within_the_margin_yields_to_the_simpler_one(monkeypatch, host_s, expect):
    times = {"sleepy": 0.1, "host": host_s}

    def fixed(session, jobs, use_cache=True, repeats=measure.REPEATS):
        return [measure.Timing(times[j.device], "measured") for j in jobs]

    monkeypatch.setattr(measure, "time_jobs", fixed)
    cm = compile_measured(chain(("Neg", "Neg")), registry())
    assert {rec.device for rec in cm.records.values()} == {expect}
    (d,) = cm.options["placement_estimates"]["decisions"]
    # the best split puts both halves on the host: shown, but not a plan of its own
    assert "every sub-region on one device, as all on host" in d["alternatives"][2]["plan"]
    assert ("within 5%" in d["why"]) == (expect == "sleepy")


def test_a_spent_budget_falls_back_to_estimates_and_says_so():
    cm = compile_measured(chain(), registry(), measure_budget_s=0)
    est = cm.options["placement_estimates"]
    assert est["measure"]["budget_exhausted"] and est["measure"]["measured"] == 0
    for d in est["decisions"]:
        assert all(a["source"] == "estimated" and "budget spent" in a["note"] for a in d["alternatives"])
    text = cm.report()
    assert "budget spent: the rest are estimates" in text


def test_a_candidate_that_cannot_run_is_estimated_with_the_reason():
    class Broken(SleepyChip):
        @byoc.hookimpl
        def byoc_runtime(self, artifact):
            def run(*args):
                raise RuntimeError("device lost")
            return run

    cm = compile_measured(chain(("Neg", "Neg")), registry(Broken()))
    (d,) = cm.options["placement_estimates"]["decisions"]
    chip = [a for a in d["alternatives"] if a["plan"] == "all on sleepy"][0]
    assert chip["source"] == "estimated" and "device lost" in chip["note"]
    assert cm.options["placement_estimates"]["measure"]["failed"] >= 1


def test_a_corrupt_cache_file_is_ignored(cache_dir):
    cache_dir.mkdir(parents=True)
    (cache_dir / "placement-measure.json").write_text("[not, json")
    compile_measured(chain(), registry())
    assert json.loads((cache_dir / "placement-measure.json").read_text())


@pytest.mark.skipif(not hasattr(__import__("os"), "getuid"), reason="POSIX permissions")
def test_a_cache_folder_others_may_write_to_is_not_used(cache_dir):
    cache_dir.mkdir(parents=True)
    cache_dir.chmod(0o777)
    compile_measured(chain(), registry())
    assert not (cache_dir / "placement-measure.json").exists()
    before = measure.STATS["measured"]
    compile_measured(chain(), registry())
    assert measure.STATS["measured"] > before  # nothing read from there either


def test_the_cache_keeps_the_newest_entries(cache_dir, monkeypatch):
    monkeypatch.setattr(measure, "MAX_CACHE_ENTRIES", 3)
    compile_measured(chain(), registry())
    assert len(json.loads((cache_dir / "placement-measure.json").read_text())) == 3


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", True])
def test_a_bad_measure_budget_is_an_option_error(bad):
    with pytest.raises(OptionError, match="measure_budget_s"):
        byoc.compile(chain(), ["sleepy"], registry=registry(), placement="measure", measure_budget_s=bad)


def test_random_inputs_respect_the_budget_and_give_valid_indices():
    import onnx_ir as ir

    v = ir.Value(name="idx", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([3]))
    (arr,) = measure.random_inputs([v], None)
    assert arr.dtype == np.int64 and not arr.any()
    big = ir.Value(name="big", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1 << 20, 1 << 12]))
    with pytest.raises(byoc.ByocError):
        measure.random_inputs([big], byoc.Budget())
    sym = ir.Value(name="s", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["n"]))
    with pytest.raises(ValueError, match="'s'"):
        measure.random_inputs([sym], None)


def test_segments_never_cut_a_composite():
    # composite {1, 2, 3}; equal weights would cut inside it
    segs = measure.segments(list(range(8)), {1: 0, 2: 0, 3: 0}, [1.0] * 8, max_segments=8)
    assert [i for s in segs for i in s] == list(range(8))
    assert any({1, 2, 3} <= set(s) for s in segs)
    assert len(measure.segments([5], {}, [1.0])) == 1


def test_report_shows_alternatives_and_why_in_text_json_html(monkeypatch, tmp_path, capsys):
    from byoc.cli import main

    reg = registry()
    cm = compile_measured(chain(), reg)
    data = cm.report_data()
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(resources.files("byoc.report").joinpath("schema.json").read_text())
    jsonschema.validate(data, schema)
    (d,) = data["placement"]["decisions"]
    assert data["placement"]["mode"] == "measure" and d["why"].startswith(d["chosen"])
    assert set(d["regions"]) == {"host"} | {r["name"] for r in data["regions"]}
    text = cm.report()
    assert "Placement (measure)" in text and "why: split" in text and "all on host" in text
    html = cm.report("html")
    assert 'id="byoc-static-placement"' in html and "all on sleepy" in html
    # the command line, and "cost" gets the same section
    path = tmp_path / "m.onnx"
    onnx.save(chain(), path)
    monkeypatch.setattr(byoc.plugins, "_registry", reg)
    assert main(["explain", str(path), "-t", "sleepy", "--placement", "measure"]) == 0
    assert "Placement (measure)" in capsys.readouterr().out
    assert main(["explain", str(path), "-t", "sleepy", "--placement", "cost", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, schema)
    assert doc["placement"]["mode"] == "cost"
    assert all(dd["why"] and dd["alternatives"] for dd in doc["placement"]["decisions"])


def test_html_report_renders_the_placement_table_in_a_browser(tmp_path):
    import os
    import re
    import shutil
    import subprocess

    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "headless_shell")
                if shutil.which(n)), None)
    if exe is None:
        pytest.skip("no chromium binary on PATH to check the HTML report")
    cm = compile_measured(chain(), registry())
    data = cm.report_data()
    data["placement"]["decisions"][0]["why"] = "</script><script>window.byocReportError('injected')</script>"
    from byoc.report import render

    page = tmp_path / "r.html"
    page.write_text(render(data, "html"), encoding="utf-8")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)},
                         check=True).stdout.decode("utf-8", errors="replace")
    errors = re.search(r'<pre id="byoc-errors"[^>]*>(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == ""
    assert 'id="byoc-ok"' in dom
    assert "Placement (measure)" in dom and "all on sleepy" in dom
    assert "&lt;/script&gt;&lt;script&gt;" in dom  # the why is text, not markup
