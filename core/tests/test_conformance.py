"""The conformance kit (byoc.testing): strategies, tolerance, suites, pytest plugin, CLI, template, guide.

* the strategies produce valid instances (the host runs every one) with the attributes promised;
* the comparison rules: plain tolerance, the magnitude bound of sums, ill-conditioned points;
* the kit passes a correct plugin (testchip, the generated template) and catches broken ones with
  a minimal example: wrong asymmetric Conv padding, non-deterministic code generation, a runtime
  that silently accepts wrong shapes, a bundle that runs differently after loading, a bad cost;
* every hookspec is documented in docs/plugin-guide.md with its exact signature, and a
  conformance run exercises every hook;
* the pytest plugin is import-light and runs the suite; the guide's code runs as written.
"""

from __future__ import annotations

import functools

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import byoc
from byoc.contract import HostExecutor
from byoc.contract import HOOK_API_VERSION
from byoc.kernels import is_supported
from byoc.contract import Pattern, alt, any_value, const, op, tail
from byoc.plugins import build_registry
from byoc.contract import host_callable, region_model_bytes
from byoc.testing import strategies as bst
from byoc.testing.cases import GENERATORS, OpCase, op_cases
from byoc.testing.conformance import FAIL, PASS, Conformance, run_conformance
from byoc.testing.patterns import pattern_cases
from byoc.testing.requirements import Requirements
from byoc.testing.tolerance import compare, envelope_accepts, magnitude_model, perturbed_model

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugin-guide.md"
HOOKSPECS = ROOT / "core" / "src" / "byoc" / "contract" / "hookspecs.py"
FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


def host_run(model: onnx.ModelProto, feeds):
    cm = byoc.compile(model, targets=[], passes=["shape_inference"])
    out = cm.run(feeds)
    return [out[o.name] for o in model.graph.output]


# -- a correct in-process plugin (host emulation), and broken variants ------------------------------


class Emulated:
    """Target ``emu``: Relu, Add, Mul, Conv, MatMul on byoc's host kernels; every hook implemented."""

    NAME = "emu"
    OPS = ("Relu", "Add", "Mul", "Conv", "MatMul")

    @byoc.hookimpl
    def byoc_register_host_executor(self, register):
        # declines every node: byoc's reference kernels run the host's nodes, as without it
        register(HostExecutor("emu-host", kernel=lambda spec: None))

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.NAME, version="1.0", device="npu", rtol=0.0, atol=0.0,
                             api_version=HOOK_API_VERSION))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        if target != self.NAME:
            return

        def conv(node, ctx):
            w = ctx.shape(node.inputs[1])
            if w is None or len(w) != 4 or ctx.const(node.inputs[1]) is None:
                return "Conv: 2-D with constant weights only"
            return True

        def float32(node, ctx):
            ok = all(v is None or ctx.dtype(v) == onnx.TensorProto.FLOAT for v in node.inputs)
            return True if ok else f"{node.op_type}: float32 only"

        for o in self.OPS:
            register(o, conv if o == "Conv" else float32)

    @byoc.hookimpl
    def byoc_register_patterns(self, target, register):
        if target == self.NAME:
            register(Pattern(f"{self.NAME}.conv_relu", op("Relu", op("Conv", any_value(), const(), const().optional()))))

    @byoc.hookimpl
    def byoc_register_rules(self, target, register):
        if target == self.NAME:
            register(byoc.Rule("needs_mac", lambda r, ctx: any(n.op_type in ("Conv", "MatMul") for n in r.nodes)
                               or "no MAC op"))

    @byoc.hookimpl
    def byoc_pre_partition(self, target, model, options):
        pass

    @byoc.hookimpl
    def byoc_post_partition(self, target, region, options):
        pass

    def emit(self, region) -> bytes:
        return region_model_bytes(region.model)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == self.NAME:
            return byoc.Artifact(self.NAME, "onnx", self.emit(region), {"n": len(region.nodes)})

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target == self.NAME:
            return host_callable(artifact.data)

    @byoc.hookimpl
    def byoc_cost(self, target, region, options):
        if target == self.NAME:
            return 1e-5 * len(region.nodes)


class SwappedPads(Emulated):
    """Bug: the code generator swaps a convolution's begin and end pads (invisible when symmetric)."""

    def emit(self, region) -> bytes:
        body = onnx.ModelProto.FromString(region_model_bytes(region.model))
        for node in body.graph.node:
            for a in node.attribute:
                if node.op_type == "Conv" and a.name == "pads":
                    half = len(a.ints) // 2
                    a.ints[:] = list(a.ints[half:]) + list(a.ints[:half])
        return body.SerializeToString(deterministic=True)


class Nondeterministic(Emulated):
    """Bug: a build timestamp in the artifact."""

    count = 0

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        if target == self.NAME:
            Nondeterministic.count += 1
            return byoc.Artifact(self.NAME, "onnx", self.emit(region), {"build": Nondeterministic.count})


class Lenient(Emulated):
    """Bug: the runtime pads/crops whatever it is given and always returns an output."""

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target != self.NAME:
            return None
        fn = host_callable(artifact.data)

        def run(*args):
            try:
                return fn(*args)
            except Exception:
                return [np.zeros((1,), np.float32) for _ in fn.output_names]
        return run


class BadCost(Emulated):
    @byoc.hookimpl
    def byoc_cost(self, target, region, options):
        if target == self.NAME:
            return float("nan")


def registry_of(plugin):
    reg = build_registry([(plugin.NAME, plugin)], entry_points=False)
    assert not reg.faults, reg.faults
    return reg


needs_kernels = pytest.mark.skipif(not all(is_supported(o, "") for o in Emulated.OPS), reason="host kernels missing")


# -- strategies -------------------------------------------------------------------------------------


@FAST
@given(st.data())
def test_conv_attrs_are_valid_and_give_the_formula_shape(data):
    spatial = data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3))
    w = data.draw(bst.conv_attrs(spatial, auto_pad=False))
    x = np.ones((1, 1, *spatial), np.float32)
    k = np.ones((1, 1, *w.kernel), np.float32)
    case = OpCase("Conv", [x, k], w.attrs(), const=frozenset({1})).graph()
    (y,) = host_run(case.model(), case.feeds)
    n = len(spatial)
    for i, size in enumerate(spatial):
        eff = w.dilations[i] * (w.kernel[i] - 1) + 1
        assert y.shape[2 + i] == (size + w.pads[i] + w.pads[i + n] - eff) // w.strides[i] + 1 >= 1


@FAST
@given(st.data())
def test_broadcast_shapes_broadcast(data):
    a = data.draw(bst.shapes(0, 4))
    b = data.draw(bst.broadcast_shape_to(a))
    assert np.broadcast_shapes(a, b) is not None
    u = data.draw(bst.unidirectional_shape_to(a))
    assert np.broadcast_shapes(a, u) == tuple(a)


@FAST
@given(st.sampled_from(["float32", "float16", "int8", "uint8", "int32", "int64", "bool"]), st.data())
def test_tensors_respect_dtype_range_and_tiny(dtype, data):
    shape = data.draw(bst.shapes(0, 3))
    for arr in (data.draw(bst.tensors(dtype, shape, lo=-3, hi=3)),
                data.draw(bst.seeded_tensors(dtype, shape, lo=-3, hi=3))):
        assert arr.dtype == np.dtype(dtype) and arr.shape == tuple(shape)
        if arr.dtype.kind in "fiu" and arr.size:
            lo = 0 if arr.dtype.kind == "u" else -3
            assert arr.min() >= lo and arr.max() <= 3
        if arr.dtype.kind == "f":
            assert not ((arr != 0) & (np.abs(arr) < bst.TINY)).any()


@FAST
@given(st.data())
def test_axes_are_valid(data):
    rank = data.draw(st.integers(1, 5))
    ax = data.draw(bst.axes(rank))
    assert len({a % rank for a in ax}) == len(ax) and all(-rank <= a < rank for a in ax)


@pytest.mark.parametrize("op_type", sorted(o for o in GENERATORS if is_supported(o, "")))
def test_every_generated_instance_runs_on_the_host(op_type):
    """The catalogue only produces instances the host reference accepts (few examples: ~110 operators)."""

    @settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(op_cases(op_type))
    def check(case):
        g = case.graph()
        outs = host_run(g.model(), g.feeds)
        assert len(outs) == case.n_outputs

    check()


def test_pattern_cases_match_their_pattern():
    from byoc.frontend import load_model
    from byoc.contract.patterns import match_at

    exprs = [
        tail(alt(op("Add", op("Conv", any_value(), const(), const().optional()), const()),
                 op("Conv", any_value(), const(), const().optional())), "Relu", "Sigmoid"),
        op(("Relu", "Tanh"), op(("Add", "Mul"), op("MatMul", any_value(), const()), any_value())),
        op("Softmax", any_value()),
    ]
    def checker(expr):
        strategy = pattern_cases(expr)
        assert strategy is not None

        @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(strategy)
        def check(case):
            model = load_model(case.model(), require_kernels=False)
            assert match_at(expr, list(model.graph)[-1]) is not None
            host_run(case.model(), case.feeds)

        return check

    for expr in exprs:
        checker(expr)()
    assert pattern_cases(op("NoSuchOp", any_value())) is None


# -- tolerance ------------------------------------------------------------------------------------


def test_compare_rules():
    f = np.float32
    assert compare([np.array([1.0, 2.0], f)], [np.array([1.0, 2.0], f)], rtol=0, atol=0).ok
    bad = compare([np.array([1.0, 2.5], f)], [np.array([1.0, 2.0], f)], rtol=0.1, atol=0.01)
    assert not bad.ok and "[1]" in bad.message and "tolerance" in bad.message
    assert compare([np.array([np.nan], f)], [np.array([np.nan], f)], rtol=0, atol=0).ok
    assert not compare([np.array([0.0], f)], [np.array([np.nan], f)], rtol=1, atol=1).ok
    assert not compare([np.array([1], np.int64)], [np.array([1], np.int32)], rtol=1, atol=1).ok  # dtype
    assert not compare([np.zeros((2, 1), f)], [np.zeros((1, 2), f)], rtol=1, atol=1).ok  # shape
    assert not compare([np.array([2], np.int32)], [np.array([1], np.int32)], rtol=1, atol=1).ok  # exact ints
    # a quantised target: relative to the tensor's range
    assert compare([np.array([0.0, 8.0], f)], [np.array([0.2, 8.0], f)], rtol=0.05, atol=0.0, range_relative=True).ok
    assert not compare([np.array([0.0, 8.0], f)], [np.array([0.2, 8.0], f)], rtol=0.05, atol=0.0).ok
    # beyond float16's range an infinity of the same sign passes when float_range says so
    assert compare([np.array([np.inf], f)], [np.array([1e6], f)], rtol=0, atol=0, float_range=65504).ok


def test_magnitude_bound_of_a_cancelling_sum():
    """Sub(a, b) with a ~ b: a float16 target's error is relative to |a| + |b|, not to |a - b|."""
    case = OpCase("Sub", [np.array([1000.0], np.float32), np.array([999.5], np.float32)]).graph()
    model = case.model()
    want = host_run(model, case.feeds)
    got = [want[0] + np.float32(0.4)]  # what rounding 1000 and 999.5 by 2e-4 of themselves may do
    assert not compare(got, want, rtol=1e-3, atol=1e-3).ok
    mag = magnitude_model(model)
    bound = host_run(mag, case.feeds)
    np.testing.assert_allclose(bound[0], [1999.5])
    assert compare(got, want, rtol=1e-3, atol=1e-3, magnitude=bound).ok
    # a graph with an operator without a rule has no bound
    assert magnitude_model(OpCase("Exp", [np.ones(2, np.float32)]).graph().model()) is None


def test_envelope_accepts_ill_conditioned_points():
    """log(log(x)) near x = 1: NaN, -inf or a finite value depending on how x was rounded."""
    x = np.array([0.99999], np.float32)
    from onnx import helper

    g = helper.make_graph([helper.make_node("Log", ["x"], ["l"]), helper.make_node("Log", ["l"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    want = host_run(model, {"x": x})
    assert np.isnan(want[0][0])
    rng = np.random.default_rng(0)
    runs = [want] + [host_run(*perturbed_model(model, {"x": x}, 1e-2, rng)) for _ in range(8)]
    mask = envelope_accepts([np.array([-5.0], np.float32)], runs, rtol=1e-2, atol=1e-3)
    assert mask[0][0]
    mask = envelope_accepts([np.array([100.0], np.float32)], runs, rtol=1e-2, atol=1e-3)
    assert not mask[0][0]


# -- the suites -----------------------------------------------------------------------------------


@needs_kernels
def test_correct_plugin_passes_every_suite():
    report = run_conformance("emu", registry=registry_of(Emulated()), examples=6)
    assert report.ok, report.format()
    suites = {r.suite for r in report.results}
    assert suites == {"registration", "operators", "patterns", "partition", "bundle", "determinism", "faults", "cost"}
    ops = {r.name: r for r in report.results if r.suite == "operators"}
    assert set(ops) == set(Emulated.OPS)
    assert all(r.status == PASS and r.passed > 0 for r in ops.values())
    assert ops["Relu"].max_error == 0.0
    # Relu alone is dropped by needs_mac, then checked without the rule
    data = report.to_json()
    assert data["ok"] and data["target"]["name"] == "emu" and "Conv" in data["target"]["operators"]
    assert "byoc conformance: target 'emu'" in report.format()


@needs_kernels
def test_asymmetric_padding_bug_is_caught_with_a_minimal_example():
    report = run_conformance("emu", registry=registry_of(SwappedPads()), examples=20, suites=["operators"],
                             operators=["Conv", "Relu"])
    conv, relu = report.results
    assert relu.status == PASS
    assert conv.status == FAIL and not report.ok
    node = conv.example_json["nodes"][0]
    pads = node["attributes"]["pads"]
    assert pads[: len(pads) // 2] != pads[len(pads) // 2:], conv.example
    # shrunk: a tiny input, and the message points at an element
    x = conv.example_json["inputs"]["in0"]
    assert int(np.prod(x["shape"])) <= 8, conv.example
    assert "got" in conv.message and "expected" in conv.message
    assert "smallest failing example" in conv.summary() and "FAILURES" in report.format()


@needs_kernels
def test_nondeterministic_codegen_is_caught():
    r = Conformance("emu", registry=registry_of(Nondeterministic()), examples=3).check_determinism()
    assert r.status == FAIL and "metadata differs in ['build']" in r.message


@needs_kernels
def test_runtime_accepting_wrong_shapes_is_caught():
    r = Conformance("emu", registry=registry_of(Lenient()), examples=3).check_faults()
    assert r.status == FAIL and "returned outputs instead of raising" in r.message
    ok = Conformance("emu", registry=registry_of(Emulated()), examples=3).check_faults()
    assert ok.status == PASS and ok.passed >= 3


@needs_kernels
def test_bad_cost_is_caught():
    r = Conformance("emu", registry=registry_of(BadCost()), examples=3).check_cost()
    assert r.status == FAIL and "nan" in r.message


@needs_kernels
def test_bundle_that_runs_differently_after_load_is_caught():
    class Drifting(Emulated):
        loads = 0

        @byoc.hookimpl
        def byoc_runtime(self, target, artifact, options):
            if target != self.NAME:
                return None
            Drifting.loads += 1
            fn = host_callable(artifact.data)
            if Drifting.loads % 2:
                return fn
            return lambda *a: [np.nextafter(o, np.inf).astype(o.dtype) for o in fn(*a)]

    r = Conformance("emu", registry=registry_of(Drifting()), examples=4).check_bundle()
    assert r.status == FAIL and "bit-identical" in r.message


@needs_kernels
def test_requirements_close_capabilities_and_skip_operators():
    class Req(Requirements):
        fault_behaviour = False
        reasons = {"fault_behaviour": "the simulator aborts"}
        skip_operators = {"Mul": "in v2"}
        operators = ["Mul", "Relu"]

    report = run_conformance("emu", registry=registry_of(Emulated()), requirements=Req(), examples=3,
                             suites=["operators", "faults"])
    by = {(r.suite, r.name): r for r in report.results}
    assert by[("faults", "wrong shapes and arity")].status == "skipped"
    assert by[("faults", "wrong shapes and arity")].message == "the simulator aborts"
    assert by[("operators", "Mul")].status == "skipped" and by[("operators", "Relu")].status == PASS
    assert [r.name for r in report.results if r.suite == "operators"] == ["Mul", "Relu"]
    with pytest.raises(TypeError):
        Requirements(no_such_thing=1)


@needs_kernels
def test_rejections_are_counted_with_reasons():
    r = Conformance("emu", registry=registry_of(Emulated()), examples=12).check_operator("Add")
    assert r.status == PASS and r.rejected > 0
    assert any("float32 only" in reason for reason in r.reasons)


# -- hooks: documented and exercised ----------------------------------------------------------------


def _hookspec_signatures() -> dict[str, str]:
    tree = ast.parse(HOOKSPECS.read_text(encoding="utf-8"))
    sigs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("byoc_"):
            args = ", ".join(f"{a.arg}: {ast.unparse(a.annotation)}" for a in node.args.args)
            sigs[node.name] = f"{node.name}({args}) -> {ast.unparse(node.returns)}"
    return sigs


def _normalise(text: str) -> str:
    return re.sub(r"[\s'\"]", "", text)


def test_every_hookspec_is_in_the_guide_with_its_exact_signature():
    import byoc.contract.hookspecs as hs

    sigs = _hookspec_signatures()
    specs = {n for n in dir(hs) if n.startswith("byoc_") and hasattr(getattr(hs, n), "byoc_spec")}
    assert specs == set(sigs) and len(sigs) >= 9
    guide = _normalise(GUIDE.read_text(encoding="utf-8"))
    missing = [sig for sig in sigs.values() if _normalise(sig) not in guide]
    assert not missing, f"hookspecs not documented with their exact signature in {GUIDE.name}: {missing}"
    headings = re.findall(r"^### (byoc_\w+)$", GUIDE.read_text(encoding="utf-8"), re.M)
    assert set(headings) == specs


@needs_kernels
def test_a_conformance_run_exercises_every_hook():
    import byoc.contract.hookspecs as hs

    specs = {n for n in dir(hs) if n.startswith("byoc_") and hasattr(getattr(hs, n), "byoc_spec")}
    called: set[str] = set()
    inner = Emulated()

    class Recording:
        NAME = "emu"

    rec = Recording()
    for name in specs:
        fn = getattr(inner, name)

        @functools.wraps(fn)  # pluggy reads the argument names through __wrapped__
        def wrapper(*args, _fn=fn, _name=name, **kwargs):
            called.add(_name)
            return _fn(*args, **kwargs)

        setattr(rec, name, byoc.hookimpl(wrapper))
    report = run_conformance("emu", registry=registry_of(rec), examples=3)
    assert report.ok, report.format()
    assert called == specs, f"hooks no conformance suite calls: {sorted(specs - called)}"


# -- the generated template ---------------------------------------------------------------------------


def test_template_plugin_passes_conformance(tmp_path):
    from byoc.testing.commands import render_template

    files = render_template("tmplchip", tmp_path / "byoc-tmplchip")
    names = {f.relative_to(tmp_path / "byoc-tmplchip").as_posix() for f in files}
    assert names == {"pyproject.toml", "README.md", "src/byoc_tmplchip/__init__.py", "src/byoc_tmplchip/plugin.py",
                     "tests/test_conformance.py"}
    pyproject = (tmp_path / "byoc-tmplchip" / "pyproject.toml").read_text()
    assert 'tmplchip = "byoc_tmplchip.plugin"' in pyproject and 'name = "byoc-tmplchip"' in pyproject
    src = str(tmp_path / "byoc-tmplchip" / "src")
    sys.path.insert(0, src)
    try:
        plugin = importlib.import_module("byoc_tmplchip.plugin")
        reg = build_registry([("tmplchip", plugin)], entry_points=False)
        assert not reg.faults
        report = run_conformance("tmplchip", registry=reg, examples=5)
        assert report.ok, report.format()
        assert all(r.status == PASS for r in report.results if r.suite == "operators"), report.format()
    finally:
        sys.path.remove(src)
        for m in [m for m in sys.modules if m.startswith("byoc_tmplchip")]:
            del sys.modules[m]
    with pytest.raises(byoc.ByocError):
        render_template("tmplchip", tmp_path / "byoc-tmplchip")  # not empty
    with pytest.raises(byoc.OptionError):
        render_template("Bad-Name", tmp_path / "other")


def test_template_tests_pass_under_pytest(tmp_path):
    """The generated tests/test_conformance.py runs the suite through pytest, out of the box."""
    from byoc.testing.commands import render_template

    root = tmp_path / "byoc-tchip"
    render_template("tchip", root)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--byoc-examples=3",
                           str(root / "tests")], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ passed", proc.stdout)
    assert "test_operator_numerics" in proc.stdout or "passed" in proc.stdout


# -- pytest plugin ------------------------------------------------------------------------------------


def test_pytest_plugin_is_import_light():
    code = ("import sys, pytest_byoc; heavy = [m for m in ('numpy', 'onnx', 'onnx_ir', 'numba', 'byoc', 'hypothesis') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_pytest_plugin_entry_point_is_declared():
    text = (ROOT / "core" / "pyproject.toml").read_text()
    assert re.search(r"\[project\.entry-points\.pytest11\]\s*\nbyoc = \"pytest_byoc\"", text)


pytest_plugins = ["pytester"]


@needs_kernels
def test_suite_imported_by_a_plugin_test_file(pytester):
    pytester.makepyfile(test_vendor=textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from test_conformance import Emulated
        from byoc.testing.suite import *  # noqa: F401,F403


        class Requirements(Requirements):  # noqa: F405
            target = "emu"
            plugins = (("emu", Emulated()),)
            examples = 3
            cost_estimates = False
            reasons = {"cost_estimates": "no cost model yet"}
    """ % str(Path(__file__).parent)))
    result = pytester.runpytest_subprocess("-v", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=11, skipped=1)
    result.stdout.fnmatch_lines(["*test_registration PASSED*", "*test_operator_numerics?Add? PASSED*"])
    result.stdout.fnmatch_lines(["*skipped: no cost model yet*"])


def test_byoc_target_option_runs_the_suite(pytester):
    from byoc.plugins import get_registry

    if "testchip" not in get_registry().targets:
        pytest.skip("byoc-testplugin is not installed (the integration environment has it)")
    result = pytester.runpytest_subprocess("--byoc-target=testchip", "--byoc-examples=2", "-q", "-p",
                                           "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 18, outcomes


# -- command line ---------------------------------------------------------------------------------------


def test_cli_conformance_unknown_target_and_new_plugin(tmp_path, capsys):
    from byoc.cli import main

    assert main(["conformance", "no-such-target", "-q"]) == 2
    assert "unknown target 'no-such-target'" in capsys.readouterr().err
    assert main(["new-plugin", "clichip", "--dir", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "src" / "byoc_clichip" / "plugin.py").is_file()
    assert main(["new-plugin", "9bad"]) == 2


def test_cli_conformance_on_an_installed_target(tmp_path, capsys):
    from byoc.cli import main
    from byoc.plugins import get_registry

    if "testchip" not in get_registry().targets:
        pytest.skip("byoc-testplugin is not installed (the integration environment has it)")
    out = tmp_path / "r.json"
    assert main(["conformance", "testchip", "-n", "2", "-q", "-s", "operators,faults", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "conformance: PASS" in text and "operators" in text
    import json

    data = json.loads(out.read_text())
    assert data["ok"] and data["schema"] == "byoc-conformance/1"


# -- the guide ---------------------------------------------------------------------------------------------


@needs_kernels
def test_guide_examples_run(tmp_path, monkeypatch):
    """Every ```python block of docs/plugin-guide.md, in order, in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 10
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "plugin_guide"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name} python block {i + 1}", "exec"), namespace)  # noqa: S102


# -- integer targets ------------------------------------------------------------------------------------


class Int8Emulated(Emulated):
    """An int8 target: the regions reach it quantised (QDQ); it runs them on the host kernels."""

    NAME = "int8emu"

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.NAME, version="1.0", device="dpu", rtol=0.05, atol=0.05, needs_calibration=True,
                             quantization={"activations": "pow2", "weights": "per_tensor"},
                             api_version=HOOK_API_VERSION))


class Int8Off(Int8Emulated):
    """Bug: every output one quantisation step too high."""

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        if target != self.NAME:
            return None
        fn = host_callable(artifact.data)
        return lambda *a: [o + np.float32(0.5) for o in fn(*a)]


@needs_kernels
def test_integer_target_gets_calibration_and_the_quantised_reference():
    if "calibration" not in __import__("inspect").signature(byoc.compile).parameters:
        pytest.skip("this byoc.compile takes no calibration")
    report = run_conformance("int8emu", registry=registry_of(Int8Emulated()), examples=4,
                             suites=["operators", "partition"], operators=["Conv", "Relu"])
    assert report.ok, report.format()
    conv = report.results[0]
    assert conv.passed > 0 and conv.max_error == 0.0  # the reference is the quantised simulation
    bad = run_conformance("int8emu", registry=registry_of(Int8Off()), examples=4, suites=["operators"],
                          operators=["Relu"])
    assert not bad.ok and "got" in bad.results[0].message
