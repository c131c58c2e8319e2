"""Suites on whole random graphs: partition invariants, bundle round trip, deterministic artifacts."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st

import byoc
from byoc.testing.cases import GENERATORS, OpCase, op_cases
from byoc.testing.graphs import LAYERS, contracted, graph_is_dag, kahn_acyclic, layer_dags
from byoc.testing.conformance.results import (
    FAIL,
    PASS,
    REJECTED,
    UNTESTED,
    CheckResult,
)
from byoc.testing.conformance.runner import Outcome, Runner, _bit_identical, _exc, _outputs


class GraphSuites(Runner):
    """partition, bundle, determinism."""

    # -- whole graphs -----------------------------------------------------------------------------

    def layer_ops(self) -> list[str]:
        from byoc.kernels import is_supported

        return [o for o in self.claimed_operators() if o in LAYERS and is_supported(o, "")]

    def graph_strategy(self) -> st.SearchStrategy | None:
        """Random layer DAGs of the operators the target claims, with feeds: ``(model, feeds)``."""
        ops = self.layer_ops()
        if not ops:
            return None
        # a few host-only layers too, so regions have neighbours on the host
        from byoc.kernels import is_supported

        extra = [o for o in ("Relu", "Add", "Mul", "Sigmoid") if o not in ops and is_supported(o, "")][:2]

        @st.composite
        def models(draw):
            model = draw(layer_dags(ops + extra))
            rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
            feeds = {}
            for vi in model.graph.input:
                shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                feeds[vi.name] = rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)
            return model, feeds

        return models()

    @staticmethod
    def _describe_model(item) -> tuple[str, dict | None]:
        model, feeds = item
        lines = []
        for n in model.graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            attrs_text = ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()))
            lines.append(f"{n.name}: {n.op_type}({', '.join(n.input)}){' {' + attrs_text + '}' if attrs_text else ''}")
        lines.append("outputs: " + ", ".join(o.name for o in model.graph.output))
        return "\n".join(lines), {"nodes": lines[:-1], "outputs": [o.name for o in model.graph.output],
                                  "inputs": {k: list(v.shape) for k, v in feeds.items()}}

    def _partition_outcome(self, item) -> Outcome:
        model, feeds = item
        names = [o.name for o in model.graph.output]
        try:
            want = self.host(model, feeds, names)
        except Exception as exc:
            return Outcome("invalid", f"host reference: {_exc(exc)}")
        try:
            cm = self.compile(model, feeds, rules=True)
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile raised {_exc(exc)}")
        node_names = [n.name for n in model.graph.node]
        if not graph_is_dag(cm.model.graph):
            return Outcome(FAIL, "the partitioned graph has a cycle")
        producer = {o: i for i, node in enumerate(model.graph.node) for o in node.output}
        preds = [[producer[v] for v in node.input if v in producer] for node in model.graph.node]
        group_of = [cm.records[n].region or n for n in node_names]
        if not kahn_acyclic(contracted(len(node_names), preds, group_of)):
            return Outcome(FAIL, "contracting the regions of the original graph gives a cycle")
        if sorted(cm.records) != sorted(node_names):
            return Outcome(FAIL, f"placement records {sorted(cm.records)} != nodes {sorted(node_names)}")
        in_regions = [n.name for cr in cm.regions for n in cr.region.nodes]
        on_host = [n.name for n in cm.model.graph if n.domain != "byoc"]
        if sorted(in_regions + on_host) != sorted(node_names):
            dup = [n for n, k in Counter(in_regions + on_host).items() if k > 1]
            return Outcome(FAIL, f"nodes not placed exactly once (repeated: {dup})")
        for cr in cm.regions:
            for node in cr.region.nodes:
                rec = cm.records[node.name]
                if (rec.device, rec.region) != (cr.region.target, cr.region.name):
                    return Outcome(FAIL, f"node {node.name}: record says {rec.device}/{rec.region}, region is "
                                         f"{cr.region.target}/{cr.region.name}")
                if rec.verdicts.get(self.name) is not None and not (rec.pattern or "").startswith(self.name + "."):
                    return Outcome(FAIL, f"node {node.name} ({rec.op_type}) placed on {self.name} although its "
                                         f"support check said: {rec.verdicts[self.name]}")
        try:
            got = _outputs(cm, feeds, names)
        except Exception as exc:
            return Outcome(FAIL, f"running the partitioned model raised {_exc(exc)}")
        try:
            ref = self.reference_for(cm, feeds, names, want)
        except Exception as exc:
            return Outcome(FAIL, f"simulating the quantised regions raised {_exc(exc)}")
        cmp = self._compare("partition", model, feeds, got, ref, names)
        if not cmp.ok:
            return Outcome(FAIL, f"outputs differ from the host reference: {cmp.message}", cmp.max_error, cmp.max_ratio)
        try:
            again = self.compile(model, feeds, rules=True)
        except Exception as exc:
            return Outcome(FAIL, f"the second byoc.compile raised {_exc(exc)}")
        if again.placement() != cm.placement():
            return Outcome(FAIL, "compiling twice placed the nodes differently")
        placed = sum(1 for rec in cm.records.values() if rec.device == self.name)
        if not placed:
            return Outcome(REJECTED, "no node placed on the target", cmp.max_error, cmp.max_ratio)
        return Outcome(PASS, "", cmp.max_error, cmp.max_ratio)

    def check_partition(self) -> CheckResult:
        closed = self._closed("partition", "random layer DAGs")
        if closed:
            return closed
        r = CheckResult("partition", "random layer DAGs")
        r.rtol, r.atol = self.req.tolerance(self.target, "partition")
        strategy = self.graph_strategy()
        if strategy is None:
            r.status, r.message = UNTESTED, (f"the target claims none of the layer operators ({', '.join(sorted(LAYERS))})")
            return r
        return self._explore(r, strategy, self._partition_outcome, self._describe_model, self.graph_examples)

    def _bundle_outcome(self, item) -> Outcome:
        model, feeds = item
        names = [o.name for o in model.graph.output]
        try:
            cm, why = self.compile_placing(model, feeds)
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile raised {_exc(exc)}")
        if cm is None:
            return Outcome(REJECTED, why or "")
        if not cm.regions:
            return Outcome(REJECTED, "no region placed on the target")
        try:
            first = _outputs(cm, feeds, names)
        except Exception as exc:
            return Outcome(FAIL, f"running the compiled model raised {_exc(exc)}")
        with tempfile.TemporaryDirectory(prefix="byoc-conformance-") as tmp:
            path = Path(tmp) / "model.byoc"
            try:
                cm.save(path)
                loaded = byoc.load(path, registry=self.bypass_registry)
            except Exception as exc:
                return Outcome(FAIL, f"save/load raised {_exc(exc)}")
            if [cr.region.name for cr in loaded.regions] != [cr.region.name for cr in cm.regions]:
                return Outcome(FAIL, "the loaded bundle has other regions than the compiled model")
            try:
                second = _outputs(loaded, feeds, names)
            except Exception as exc:
                return Outcome(FAIL, f"running the loaded bundle raised {_exc(exc)}")
            diff = _bit_identical(first, second)
            if diff:
                return Outcome(FAIL, f"save -> load -> run is not bit-identical: {diff}")
            try:
                third = _outputs(cm, feeds, names)
            except Exception as exc:
                return Outcome(FAIL, f"running the compiled model a second time raised {_exc(exc)}")
            diff = _bit_identical(first, third)
            if diff:
                return Outcome(FAIL, f"running the same compiled model twice is not bit-identical: {diff}")
        return Outcome(PASS)

    def _determinism_outcome(self, item) -> Outcome:
        model, feeds = item
        try:
            a, why = self.compile_placing(model, feeds)
            b = self.compile_placing(model, feeds)[0] if a is not None else None
        except Exception as exc:
            return Outcome(FAIL, f"byoc.compile raised {_exc(exc)}")
        if a is None or b is None:
            return Outcome(REJECTED, why or "")
        if not a.regions:
            return Outcome(REJECTED, "no region placed on the target")
        if len(a.regions) != len(b.regions):
            return Outcome(FAIL, f"{len(a.regions)} regions, then {len(b.regions)}")
        for x, y in zip(a.regions, b.regions):
            ax, ay = x.artifact, y.artifact
            if ax.format != ay.format:
                return Outcome(FAIL, f"region {x.region.name}: artifact format {ax.format!r}, then {ay.format!r}")
            if ax.metadata != ay.metadata:
                keys = sorted(k for k in set(ax.metadata) | set(ay.metadata) if ax.metadata.get(k) != ay.metadata.get(k))
                return Outcome(FAIL, f"region {x.region.name}: artifact metadata differs in {keys}")
            if ax.data != ay.data:
                return Outcome(FAIL, f"region {x.region.name}: artifact data differs ({len(ax.data)} vs "
                                     f"{len(ay.data)} bytes; sha256 {ax.sha256[:12]} vs {ay.sha256[:12]})")
        with tempfile.TemporaryDirectory(prefix="byoc-conformance-") as tmp:
            pa, pb = Path(tmp) / "a.byoc", Path(tmp) / "b.byoc"
            try:
                a.save(pa)
                b.save(pb)
            except Exception as exc:
                return Outcome(FAIL, f"saving raised {_exc(exc)}")
            if pa.read_bytes() != pb.read_bytes():
                return Outcome(FAIL, "two compiles of the same model give bundles that differ")
        return Outcome(PASS)

    def _graph_items(self) -> st.SearchStrategy | None:
        """Models for the bundle and determinism suites: layer DAGs, else one-operator instances."""
        s = self.graph_strategy()
        if s is not None:
            return s
        ops = [o for o in self.operators_to_check() if o in GENERATORS]
        if not ops:
            return None

        @st.composite
        def items(draw):
            case: OpCase = draw(op_cases(draw(st.sampled_from(ops))))
            g = case.graph()
            return g.model(), g.feeds

        return items()

    def check_bundle(self) -> CheckResult:
        return self._whole_graph_check("bundle", "save -> load -> run", self._bundle_outcome)

    def check_determinism(self) -> CheckResult:
        return self._whole_graph_check("determinism", "artifacts and bundles", self._determinism_outcome)

    def _whole_graph_check(self, suite: str, label: str, outcome) -> CheckResult:
        """One suite over the kit's whole graphs that place something on the target."""
        closed = self._closed(suite, label)
        if closed:
            return closed
        r = CheckResult(suite, label)
        s = self._graph_items()
        if s is None:
            r.status, r.message = UNTESTED, "no model the kit can build places anything on the target"
            return r
        return self._explore(r, s, outcome, self._describe_model, self.graph_examples)
