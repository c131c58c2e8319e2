"""The placement report (``byoc.report``): data, JSON schema, text/DOT/HTML renderers, ONNX export,
and the ``byoc explain/partition/targets/doctor`` commands.

The plugins below are in-process (``registry=``, or patched in as the process registry for the
CLI): ``npu`` takes convolutions with a ``npu.conv_relu`` pattern and drops regions without a
MAC op, ``aux`` takes Sum/Relu and drops one-node regions, ``flaky`` always fails in codegen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import byoc
import byoc.plugins
from byoc.cli import main
from byoc.errors import OptionError
from byoc.contract.patterns import any_value, const, op, tail
from byoc.contract import Pattern, Rule
from byoc.plugins import build_registry
from byoc.report import partitioned_onnx, render, report_data, schema
from byoc.report.flops import estimate_flops, format_flops
from byoc.contract import host_callable, region_model_bytes

jsonschema = pytest.importorskip("jsonschema")

MAC_OPS = {"Conv", "Gemm", "MatMul"}


def _lazy_host_runtime(artifact):
    """Runs the region body on host kernels, built on first call (reports never run it)."""
    state = {}

    def run(*inputs):
        if "fn" not in state:
            state["fn"] = host_callable(artifact.data)
        return state["fn"](*inputs)

    return run


class Npu:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("npu", version="2.1", device="npu", description="test NPU", priority=2))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target != "npu":
            return

        def conv_check(node, ctx):
            # reject: grouped convolutions are not implemented by this test NPU
            group = node.attributes.get("group")
            if group is not None and group.value != 1:
                return "Conv: grouped convolution not supported"
            return True

        def add_check(node, ctx):
            # reject: this test NPU adds tensors of one shape only
            a, b = (ctx.shape(v) for v in node.inputs[:2])
            return True if a == b else "Add: broadcasting not supported"

        register("Conv", conv_check)
        register("Add", add_check)
        for o in ("Relu", "MaxPool", "AveragePool", "Gemm", "Reshape"):
            register(o)

    @byoc.hookimpl
    def byoc_register_patterns(self, target, register):
        if target == "npu":
            register(Pattern("npu.conv_relu", tail(op("Conv", any_value(), const(), const().optional()), "Relu")))

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        if target == "npu":
            register(Rule("needs_mac", lambda r, ctx: None if any(n.op_type in MAC_OPS for n in r.nodes) else "no MAC op"))

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == "npu":
            return byoc.Artifact("npu", "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == "npu":
            return _lazy_host_runtime(artifact)


class Aux:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("aux", version="0.3", device="dsp", runtime_path="emulation"))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == "aux":
            register("Sum")
            register("Relu")

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        if target == "aux":
            register(Rule("min_nodes", lambda r, ctx: None if len(r.nodes) >= 2 else "fewer than 2 nodes"))

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == "aux":
            return byoc.Artifact("aux", "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == "aux":
            return _lazy_host_runtime(artifact)


class Flaky:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("flaky", version="0.0.1", device="gpu"))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target == "flaky":
            for o in ("Sigmoid", "Tanh"):
                register(o)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == "flaky":
            raise RuntimeError("compiler crashed </script><b>")


@pytest.fixture(scope="module")
def registry():
    return build_registry([("npu", Npu()), ("aux", Aux()), ("flaky", Flaky())], entry_points=False)


def _small_model(sigmoid_name: str = "sig") -> onnx.ModelProto:
    """x -> Conv -> Relu -> Sigmoid -> Add(., relu) -> Relu -> y, plus a broadcasting Add side branch."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    k = numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "k")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["s"], name=sigmoid_name),
        helper.make_node("Add", ["s", "r"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu_out"),
        helper.make_node("Add", ["r", "k"], ["g"], name="badd"),
    ]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 4, 8, 8])],
        [w, b, k],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def small(registry):
    with pytest.warns(UserWarning, match="compiler crashed"):
        return byoc.compile(_small_model(), targets=["npu", "flaky"], registry=registry)


@pytest.fixture(scope="module")
def resnet(registry):
    from byoc.testing.zoo import zoo_path

    path = zoo_path("resnet50")
    if not path.exists():  # pragma: no cover
        pytest.skip(f"{path} is not in this onnx wheel")
    return path, byoc.compile(str(path), targets=["npu", "aux"], registry=registry)


def _validate(data):
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(data, schema())


# -- data ---------------------------------------------------------------------------------------


def test_small_report_records(small):
    data = small.report_data()
    _validate(data)
    nodes = {n["name"]: n for n in data["nodes"]}
    assert list(nodes) == list(small.records)
    conv, relu, sig, add = nodes["conv"], nodes["relu"], nodes["sig"], nodes["add"]
    assert conv["device"] == relu["device"] == "npu"
    assert conv["region"] == relu["region"] == "npu_0"
    assert conv["pattern"] == relu["pattern"] == "npu.conv_relu"
    assert conv["verdicts"] == {"npu": None, "flaky": "Conv: operator not supported by flaky"}
    # rejected by a support check, with the plugin's reason
    assert nodes["badd"]["device"] == "host" and nodes["badd"]["rule"] is None
    assert nodes["badd"]["verdicts"] == {"npu": "Add: broadcasting not supported",
                                         "flaky": "Add: operator not supported by flaky"}
    # Add + Relu form a region without a MAC op: dropped by the rule, left to the host
    assert add["device"] == "host" and add["region"] is None
    assert add["rule"] == "npu:needs_mac (no MAC op)"
    assert nodes["relu_out"]["rule"] == "npu:needs_mac (no MAC op)"
    # flaky took Sigmoid, its codegen raised: a fault and a host fallback, never silent
    assert sig["device"] == "host" and sig["fallback"] and "RuntimeError" in sig["fallback"]
    assert sig["verdicts"]["flaky"] is None
    assert data["faults"] and data["faults"][0]["plugin"] == "flaky"
    assert data["faults"][0]["hook"] == "byoc_codegen"
    assert data["fallbacks"] == [{"reason": sig["fallback"], "nodes": ["sig"]}]
    # FLOPs: Conv 2*N*Cout*H*W*Cin*kh*kw; others output elements
    assert conv["flops"] == 2 * 1 * 4 * 8 * 8 * 3 * 3 * 3
    assert relu["flops"] == sig["flops"] == add["flops"] == nodes["badd"]["flops"] == 4 * 8 * 8
    totals = data["totals"]
    assert totals["nodes"] == 6 and totals["regions"] == 1
    assert totals["fallback_nodes"] == 1 and totals["dropped_nodes"] == 2
    assert set(totals["by_device"]) == {"npu", "flaky", "host"}
    assert totals["by_device"]["npu"]["nodes"] == 2 and totals["by_device"]["host"]["nodes"] == 4
    assert totals["by_device"]["flaky"] == {"nodes": 0, "regions": 0, "flops": 0, "flops_share": 0.0}
    assert totals["flops"] == sum(n["flops"] for n in data["nodes"])
    assert totals["by_device"]["npu"]["flops"] == conv["flops"] + relu["flops"]
    assert sum(d["flops_share"] for d in totals["by_device"].values()) == pytest.approx(1.0)
    region = data["regions"][0]
    assert region["name"] == "npu_0" and region["target"] == "npu" and region["nodes"] == ["conv", "relu"]
    assert region["patterns"] == {"npu.conv_relu": 2} and region["inputs"] == ["x"]
    assert sorted(region["outputs"]) == ["r"] and region["artifact"]["format"] == "onnx"
    assert [t["name"] for t in data["targets"]] == ["npu", "flaky"]
    assert data["model"]["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 3, 8, 8]}]


def test_json_matches_data_and_schema_version(small):
    doc = json.loads(small.report("json"))
    assert doc == json.loads(json.dumps(small.report_data()))
    assert doc["schema_version"] == byoc.report.SCHEMA_VERSION == schema()["properties"]["schema_version"]["const"]


def test_schema_rejects_bad_documents(small):
    data = small.report_data()
    for mutate in (
        lambda d: d.pop("nodes"),
        lambda d: d["nodes"][0].pop("verdicts"),
        lambda d: d["nodes"][0].update(device=None),
        lambda d: d["nodes"][0]["verdicts"].update(npu=3),
        lambda d: d["totals"]["by_device"].pop("host"),
        lambda d: d.update(schema_version=99),
        lambda d: d["regions"][0]["artifact"].update(sha256="xyz"),
    ):
        bad = json.loads(json.dumps(data))
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema())


def test_host_only_report():
    cm = byoc.compile(_small_model_host_only(), targets=[])
    data = cm.report_data()
    _validate(data)
    assert data["targets"] == [] and data["regions"] == [] and data["faults"] == []
    assert all(n["device"] == "host" and n["verdicts"] == {} for n in data["nodes"])
    assert data["totals"]["by_device"]["host"]["flops_share"] == 1.0
    text = cm.report()
    assert "none (host only)" in text and text.rstrip().splitlines()[-1].startswith("  total")


def _small_model_host_only() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "h", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unknown_format(small):
    with pytest.raises(OptionError, match="unknown report format"):
        small.report("pdf")


# -- FLOP estimates -----------------------------------------------------------------------------


def test_flops_formulas():
    shapes = {"x": (2, 8, 10, 10), "w": (16, 4, 3, 3), "y": (2, 16, 5, 5)}
    assert estimate_flops("Conv", {"group": 2}, ["x", "w"], ["y"], shapes) == 2 * 2 * 16 * 5 * 5 * 4 * 3 * 3
    # weight shape unknown: Cin/groups and kernel_shape from the input and attributes
    shapes2 = {"x": (2, 8, 10, 10), "y": (2, 16, 5, 5)}
    assert estimate_flops("Conv", {"group": 2, "kernel_shape": (3, 3)}, ["x", "w"], ["y"], shapes2) == \
        2 * 2 * 16 * 5 * 5 * 4 * 3 * 3
    g = {"a": (7, 5), "b": (3, 5), "y": (7, 3)}
    assert estimate_flops("Gemm", {"transB": 1}, ["a", "b", ""], ["y"], g) == 2 * 7 * 3 * 5
    g = {"a": (5, 7), "y": (7, 3)}
    assert estimate_flops("Gemm", {"transA": 1}, ["a", "b"], ["y"], g) == 2 * 7 * 3 * 5
    m = {"a": (4, 2, 7, 5), "b": (5, 3), "y": (4, 2, 7, 3)}
    assert estimate_flops("MatMul", {}, ["a", "b"], ["y"], m) == 2 * 4 * 2 * 7 * 3 * 5
    t = {"x": (1, 8, 4, 4), "w": (8, 2, 3, 3), "y": (1, 4, 9, 9)}
    assert estimate_flops("ConvTranspose", {"group": 2}, ["x", "w"], ["y"], t) == 2 * 8 * 16 * 2 * 9
    assert estimate_flops("Relu", {}, ["x"], ["y"], {"y": (3, 4)}) == 12
    assert estimate_flops("Split", {}, ["x"], ["p", "q"], {"p": (3, 4), "q": (3, 2)}) == 18
    assert estimate_flops("Relu", {}, ["x"], ["y"], {"y": (None, 4)}) == 4  # symbolic dims count as 1
    assert estimate_flops("Relu", {}, ["x"], ["y"], {}) is None
    assert estimate_flops("Gemm", {}, ["a", "b"], ["y"], {"y": (2, 2)}) is None
    assert [format_flops(v) for v in (None, 0, 999, 1500, 2.5e6, 8.19e9)] == ["?", "0", "999", "1.5K", "2.5M", "8.19G"]


# -- text ---------------------------------------------------------------------------------------


def _node_table(text: str) -> tuple[str, list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\s*#\s+node\s", line))
    end = lines.index("", start)
    return lines[start], lines[start + 2:end]


def test_text_table_is_aligned_and_complete(small):
    text = small.report()
    header, rows = _node_table(text)
    data = small.report_data()
    assert len(rows) == len(data["nodes"])
    cols = {name: header.index(name) for name in ("node", "device", "region", "npu", "flaky", "rule", "fallback")}
    for row, n in zip(rows, data["nodes"]):
        assert row[cols["node"]:].split()[0] == n["name"]
        assert row[cols["device"]:].split()[0] == n["device"]
        assert row[cols["region"]:].split()[0] == (n["region"] or "-")
        assert row[cols["npu"]:].split()[0] == ("ok" if n["verdicts"]["npu"] is None else "no")
    # reasons are listed once as notes, rules and fallbacks in full, totals at the very end
    assert "Add: broadcasting not supported" in text
    assert "Sigmoid: operator not supported by npu" in text
    assert "npu:needs_mac (no MAC op)" in text and "[R1] npu:needs_mac (no MAC op)  (2)" in text
    assert [r[cols["rule"]:].split()[:2] for r in rows if "needs_mac" in r] == [["npu:needs_mac", "[R1]"]] * 2
    assert "Host fallbacks (placed on a target, running on the host instead)" in text and "nodes (1): sig" in text
    assert "Plugin faults (1):" in text and "compiler crashed" in text
    tail_lines = text.rstrip().splitlines()
    totals_at = max(i for i, line in enumerate(tail_lines) if line == "Totals:")
    assert all(not line.startswith(("Regions", "Plugin", "Host", "Verdict")) for line in tail_lines[totals_at:])
    assert any(line.split()[:3] == ["npu", "npu", "2"] for line in tail_lines[totals_at:])


# -- DOT ----------------------------------------------------------------------------------------


def _check_dot(dot: str, data: dict) -> None:
    assert dot.startswith("digraph byoc {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    for n in data["nodes"]:
        quoted = '"' + n["name"].replace("\\", "\\\\").replace('"', '\\"') + '"'
        assert len(re.findall(re.escape(quoted) + r" \[label=", dot)) == 1, n["name"]
    assert dot.count("subgraph ") == len(data["regions"])
    exe = shutil.which("dot")
    if exe:
        done = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        assert b"<svg" in done.stdout


def test_dot(small):
    dot = small.report("dot")
    data = small.report_data()
    _check_dot(dot, data)
    assert re.search(r'subgraph "cluster_0_npu_0" \{', dot)
    block = dot[dot.index("cluster_0_npu_0"):dot.index("}", dot.index("cluster_0_npu_0"))]
    assert '"conv" [' in block and '"relu" [' in block and '"add" [' not in block
    assert re.search(r'"sig" \[.*color="#d00000"', dot)  # the fallback is outlined
    assert '"conv" -> "relu"' in dot and '"relu" -> "sig"' in dot


# -- HTML in a headless browser -----------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _open_in_browser(html: str) -> str:
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium binary on PATH (apt-get install -y chromium) to check the HTML report")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(html, encoding="utf-8")
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={Path(tmp) / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
               page.as_uri()]
        done = subprocess.run(cmd, capture_output=True, timeout=120, env={**os.environ, "HOME": tmp})
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode("utf-8", errors="replace")


def _assert_rendered(dom: str, n_nodes: int) -> None:
    errors = re.search(r'<pre id="byoc-errors"[^>]*>(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == "", errors.group(1) if errors else dom[:2000]
    ok = re.search(r'<div id="byoc-ok"[^>]*data-nodes="(\d+)" data-rows="(\d+)"', dom)
    assert ok is not None, "the page's script did not finish rendering"
    assert int(ok.group(1)) == int(ok.group(2)) == n_nodes


def _assert_self_contained(html: str) -> None:
    assert html.count("<html") == 1
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:|//)', html, re.I)
    assert "@import" not in html and "url(" not in html


def test_html_small_with_hostile_strings(small):
    data = small.report_data()
    # names and reasons are data, never markup: they must not break out of the page's script
    data["nodes"][0]["name"] = "</script><script>window.byocReportError('injected')</script>&amp;\"'"
    data["nodes"][2]["verdicts"]["npu"] = "<img src=x onerror=alert(1)> \u2028 \u2029"
    html = render(data, "html")
    _assert_self_contained(html)
    dom = _open_in_browser(html)
    _assert_rendered(dom, len(data["nodes"]))
    assert "injected" not in re.search(r'<pre id="byoc-errors"[^>]*>(.*?)</pre>', dom, re.S).group(1)
    assert "&lt;/script&gt;&lt;script&gt;" in dom  # shown as text in the table
    assert "compiler crashed" in dom and "npu:needs_mac" in dom


# -- ResNet-50 acceptance -----------------------------------------------------------------------


def test_resnet50_explain_cli(resnet, registry, monkeypatch, capsys, tmp_path):
    path, cm = resnet
    monkeypatch.setattr(byoc.plugins, "_registry", registry)
    out_json, out_dot, out_html = tmp_path / "r.json", tmp_path / "r.dot", tmp_path / "r.html"
    rc = main(["explain", str(path), "-t", "npu", "-t", "aux", "--json", str(out_json), "--dot", str(out_dot),
               "--html", str(out_html)])
    assert rc == 0
    text = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    _validate(data)
    assert data == json.loads(json.dumps(cm.report_data()))
    header, rows = _node_table(text)
    assert len(rows) == len(data["nodes"]) == len(cm.records) > 100
    assert text.rstrip().splitlines()[-1].lstrip().startswith("total") or "note:" in text.rstrip().splitlines()[-1]
    totals = data["totals"]
    # ResNet-50 is ~4.1 GMACs, i.e. ~8.2 GFLOPs
    assert 7.6e9 < totals["flops"] < 8.6e9
    assert totals["by_device"]["npu"]["flops_share"] > 0.99
    assert totals["by_device"]["npu"]["nodes"] + totals["by_device"]["host"]["nodes"] == totals["nodes"]
    assert totals["regions"] == len(cm.regions) > 1
    sums = [n for n in data["nodes"] if n["op_type"] == "Sum"]
    assert sums and all(n["device"] == "host" and n["rule"] == "aux:min_nodes (fewer than 2 nodes)"
                        and n["verdicts"] == {"npu": "Sum: operator not supported by npu", "aux": None} for n in sums)
    assert any(n["pattern"] == "npu.conv_relu" for n in data["nodes"])
    _check_dot(out_dot.read_text(), data)
    html = out_html.read_text()
    _assert_self_contained(html)
    _assert_rendered(_open_in_browser(html), len(data["nodes"]))


def test_explain_json_to_stdout(resnet, registry, monkeypatch, capsys):
    path, cm = resnet
    monkeypatch.setattr(byoc.plugins, "_registry", registry)
    assert main(["explain", str(path), "-t", "npu", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)  # JSON only, no table
    _validate(doc)
    assert [t["name"] for t in doc["targets"]] == ["npu"]
    assert main(["explain", str(path), "--json", "-", "--dot", "-"]) == 2


def test_partition_export(resnet, registry, monkeypatch, capsys, tmp_path):
    path, cm = resnet
    monkeypatch.setattr(byoc.plugins, "_registry", registry)
    out = tmp_path / "part.onnx"
    assert main(["partition", str(path), "-t", "npu", "-t", "aux", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    regions = [n for n in model.graph.node if n.domain == "byoc" and n.op_type == "Region"]
    assert len(regions) == len(cm.regions)
    assert {"byoc": 1}.items() <= {o.domain: o.version for o in model.opset_import}.items()
    by_name = {cr.region.name: cr.region for cr in cm.regions}
    for node in regions:
        attrs = {a.name: a for a in node.attribute}
        assert attrs["body"].type == onnx.AttributeProto.GRAPH
        body = attrs["body"].g
        assert [v.name for v in body.input] == list(node.input)
        assert [v.name for v in body.output] == list(node.output)
        assert [n.name for n in body.node] == [n.name for n in by_name[node.name].nodes]
        assert attrs["target"].s.decode() == by_name[node.name].target
    # the weights moved into the bodies; the in-memory model was not changed
    assert not any(t.name.endswith("_w_0") for t in model.graph.initializer)
    assert not any(a.name == "body" for n in cm.model.graph for a in n.attributes.values())


def _inline_regions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace every byoc::Region node by its body's nodes (value names are shared)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes, inits = [], list(model.graph.initializer)
    for node in model.graph.node:
        if node.domain == "byoc":
            body = next(a.g for a in node.attribute if a.name == "body")
            nodes.extend(body.node)
            inits.extend(body.initializer)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.initializer[:]
    model.graph.initializer.extend({t.name: t for t in inits}.values())
    kept = [o for o in model.opset_import if o.domain != "byoc"]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model


def test_exported_bodies_compute_the_model(small):
    ort = pytest.importorskip("onnxruntime")
    proto = partitioned_onnx(small)
    onnx.checker.check_model(proto, full_check=True)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)

    def run(m):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": x})

    for got, want in zip(run(_inline_regions(proto)), run(_small_model())):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- targets and doctor -------------------------------------------------------------------------


def test_targets_command(registry, monkeypatch, capsys):
    monkeypatch.setattr(byoc.plugins, "_registry", registry)
    assert main(["targets"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[0].split()
    assert header[:4] == ["target", "version", "distribution", "device"]
    rows = {line.split()[0]: line.split() for line in out[2:] if line.strip()}
    assert rows["npu"][1:9] == ["2.1", "-", "npu", "7", "1", "1", "-", "True"]
    assert rows["aux"][1:8] == ["0.3", "-", "dsp", "2", "0", "1", "emulation"]
    assert list(rows)[0] == "npu"  # priority order
    assert main(["targets", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {d["name"]: d["operators"] for d in doc} == {"npu": 7, "aux": 2, "flaky": 2}
    assert all(d["available"] is True for d in doc)  # Target.available defaults to True


class _Dup:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("npu", version="9"))


class _OldApi:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("old", api_version=0))


class _Raises:
    @byoc.hookimpl
    def byoc_register_targets(self, register):
        raise ValueError("cannot find the driver")


def test_doctor(registry, monkeypatch, capsys):
    monkeypatch.setattr(byoc.plugins, "_registry", registry)
    assert main(["doctor"]) == 0
    assert "no problems found" in capsys.readouterr().out
    with pytest.warns(UserWarning):
        bad = build_registry([("npu", Npu()), ("dup", _Dup()), ("old", _OldApi()), ("raises", _Raises())],
                             entry_points=False)
    monkeypatch.setattr(byoc.plugins, "_registry", bad)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "duplicate targets (1)" in out and "'npu'" in out and "'dup'" in out
    assert "incompatible targets (1)" in out and "hook API version 0" in out
    assert "broken plugins (1)" in out and "cannot find the driver" in out
    assert "3 problem(s) found" in out


# -- properties over random graphs --------------------------------------------------------------

ELEMENTWISE = ("Relu", "Sigmoid", "Tanh", "Abs", "Add", "Mul")


class _Random:
    def __init__(self, supported):
        self.supported = supported

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target("rnd", version="1", device="npu"))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        for o in self.supported:
            register(o)

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        register(Rule("no_tanh_alone", lambda r, ctx: False if [n.op_type for n in r.nodes] == ["Tanh"] else None))

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if any(n.op_type == "Abs" for n in region.nodes):
            return "not an artifact"  # a plugin fault -> host fallback
        return byoc.Artifact("rnd", "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        return _lazy_host_runtime(artifact)


@st.composite
def random_graphs(draw):
    n = draw(st.integers(1, 10))
    values, nodes, used = ["x"], [], set()
    for i in range(n):
        op_type = draw(st.sampled_from(ELEMENTWISE))
        arity = 2 if op_type in ("Add", "Mul") else 1
        ins = [draw(st.sampled_from(values)) for _ in range(arity)]
        used.update(ins)
        nodes.append(helper.make_node(op_type, ins, [f"v{i}"], name=f"node{i}_{op_type}"))
        values.append(f"v{i}")
    outs = [v for v in values[1:] if v not in used] or [values[-1]]
    graph = helper.make_graph(nodes, "rnd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info(v, TensorProto.FLOAT, [2, 5]) for v in outs])
    supported = draw(st.sets(st.sampled_from(ELEMENTWISE)))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), sorted(supported)


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(random_graphs())
def test_report_properties(case):
    model, supported = case
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = byoc.compile(model, registry=build_registry([("rnd", _Random(supported))], entry_points=False))
    data = report_data(cm)
    jsonschema.validate(data, schema())
    names = [n["name"] for n in data["nodes"]]
    assert names == list(cm.records) and len(set(names)) == len(names)
    region_nodes = [m for r in data["regions"] for m in r["nodes"]]
    assert len(region_nodes) == len(set(region_nodes))
    for n in data["nodes"]:
        assert n["device"] in ("host", "rnd")
        assert (n["device"] == "rnd") == (n["region"] is not None) == (n["name"] in region_nodes)
        assert n["flops"] == 10  # every value is [2, 5]
        assert (n["verdicts"]["rnd"] is None) == (n["op_type"] in supported)
        if n["device"] == "host" and n["verdicts"]["rnd"] is None:
            assert n["rule"] or n["fallback"], f"{n['name']} left on the host without a reason"
        if n["fallback"]:
            assert data["faults"]
    totals = data["totals"]
    assert sum(d["nodes"] for d in totals["by_device"].values()) == totals["nodes"] == len(names)
    assert sum(d["flops_share"] for d in totals["by_device"].values()) == pytest.approx(1.0)
    text = cm.report("text")
    _, rows = _node_table(text)
    assert [row.split()[1] for row in rows] == names
    _check_dot(render(data, "dot"), data)
    proto = partitioned_onnx(cm)
    onnx.checker.check_model(proto)
    assert sum(1 for node in proto.graph.node if node.domain == "byoc") == len(data["regions"])


# -- a model of 400+ nodes ----------------------------------------------------------------------


def test_large_model_report_in_browser(registry):
    n = 420
    nodes, prev = [], "x"
    for i in range(n):
        op_type = ("Relu", "Sigmoid", "Add")[i % 3]
        ins = [prev, "x"] if op_type == "Add" else [prev]
        nodes.append(helper.make_node(op_type, ins, [f"t{i}"], name=f"layer{i:03d}_{op_type.lower()}"))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(UserWarning):  # flaky's codegen fails for every Sigmoid region
        cm = byoc.compile(model, targets=["npu", "flaky"], registry=registry, passes=[])
    data = cm.report_data()
    _validate(data)
    assert len(data["nodes"]) == n
    assert data["totals"]["fallback_nodes"] == n // 3
    text = cm.report()
    _, rows = _node_table(text)
    assert len(rows) == n
    widths = {len(r) for r in rows}
    assert max(widths) - min(widths) < 80  # aligned columns; only trailing text varies
    _assert_rendered(_open_in_browser(cm.report("html")), n)


# -- regions inside control flow, bundles -------------------------------------------------------


def test_region_inside_if_branch(registry):
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    then_g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["t1"], name="then_conv"),
         helper.make_node("Relu", ["t1"], ["t2"], name="then_relu")],
        "then", [], [helper.make_tensor_value_info("t2", TensorProto.FLOAT, [1, 2, 3, 3])])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e1"], name="else_sig")], "else", [],
                               [helper.make_tensor_value_info("e1", TensorProto.FLOAT, [1, 2, 3, 3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if0", then_branch=then_g, else_branch=else_g)], "m",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])], [w])
    cm = byoc.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), targets=["npu"],
                      registry=registry)
    data = cm.report_data()
    _validate(data)
    nodes = {n["name"]: n for n in data["nodes"]}
    assert nodes["if0"]["scope"] == "" and nodes["if0"]["verdicts"]["npu"] == "If: control flow runs on the host"
    assert nodes["then_conv"]["scope"] == "if0/then_branch" and nodes["then_conv"]["region"] == "npu_0"
    assert nodes["then_conv"]["flops"] == 2 * 2 * 3 * 3 * 2
    assert nodes["else_sig"]["device"] == "host" and nodes["else_sig"]["scope"] == "if0/else_branch"
    header, rows = _node_table(cm.report())
    assert "scope" in header.split() and any("if0/then_branch" in r for r in rows)
    proto = partitioned_onnx(cm)
    onnx.checker.check_model(proto, full_check=True)
    then_branch = next(a.g for a in proto.graph.node[0].attribute if a.name == "then_branch")
    (region,) = then_branch.node
    assert region.domain == "byoc" and [a.name for a in region.attribute] == ["target", "region", "body"]
    assert [n.name for n in region.attribute[2].g.node] == ["then_conv", "then_relu"]
    assert [t.name for t in proto.graph.initializer] == []  # w lives in the region body now


def test_report_of_a_bundle_with_a_missing_plugin(registry, monkeypatch, tmp_path):
    bundle = pytest.importorskip("byoc.bundle.loader")
    monkeypatch.setattr(byoc.plugins, "_registry", registry)
    cm = byoc.compile(_small_model(), targets=["npu"], registry=registry)
    path = cm.save(tmp_path / "m.byoc")
    monkeypatch.setattr(byoc.plugins, "_registry", build_registry([], entry_points=False))
    with pytest.warns(UserWarning):
        loaded = bundle.load(path, fallback="host")
    data = loaded.report_data()
    _validate(data)
    nodes = {n["name"]: n for n in data["nodes"]}
    assert nodes["conv"]["device"] == "host" and "not installed" in nodes["conv"]["fallback"]
    assert nodes["conv"]["flops"] == 2 * 4 * 8 * 8 * 27  # shapes recovered from the kept body
    assert data["regions"][0]["host_fallback"] and data["totals"]["regions"] == 0
    assert "runs on host: fallback" in loaded.report()
