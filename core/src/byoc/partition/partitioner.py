"""Cut a model between targets: verdicts, patterns, regions, rules, outlining.

Targets are served in priority order. For each target, every node gets a support verdict (kept
for the report), the target's patterns turn matches into composite units, cycle-free regions
are formed over the not-yet-placed nodes (:mod:`byoc.partition.regions`), and the target's rules
keep, split or drop them. Dropped nodes stay free for the next target, else the host.
Plugin faults never abort: they are recorded, warned about, and the affected node or region
falls back (``strict=True`` raises :class:`byoc.PluginError` instead).
"""

from __future__ import annotations

import gc
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import onnx
import onnx_ir as ir

from byoc.errors import PluginError
from byoc.contract.faults import PluginFault
from byoc.contract.patterns import match_at
from byoc.contract.types import Pattern, Region, SupportContext, Target
from byoc.partition.costs import build_problem
from byoc.partition.placement import Problem, solve
from byoc.partition.records import NodeRecord
from byoc.partition.regions import form_regions, is_acyclic
from byoc.plugins import Registry

CONTROL_FLOW = {"If", "Loop", "Scan"}


@dataclass
class PartitionResult:
    regions: list[Region]
    records: dict[str, NodeRecord]
    faults: list[PluginFault]
    #: with placement="cost": per region, its estimated compute seconds on every device
    estimates: dict[str, dict[str, Any]] | None = None
    #: with placement="cost": the minimised end-to-end estimate (seconds) of this graph
    estimated_cost: float | None = None


class _Faults:
    def __init__(self, strict: bool):
        self.strict = strict
        self.items: list[PluginFault] = []

    def add(self, plugin: str, hook: str, message: str, kind: str = "error") -> PluginFault:
        fault = PluginFault(plugin, hook, message, kind)
        if self.strict:
            raise PluginError(str(fault))
        self.items.append(fault)
        warnings.warn(f"{fault}; falling back", stacklevel=4)
        return fault


def ensure_node_names(graph: ir.Graph) -> None:
    """Give every node, subgraphs included, a unique, stable name (the report and errors use them)."""
    seen: set[str] = set()
    for i, node in enumerate(ir.traversal.RecursiveGraphIterator(graph)):
        name = node.name or f"{node.op_type}_{i}"
        base, k = name, 1
        while name in seen:
            name = f"{base}_{k}"
            k += 1
        node.name = name
        seen.add(name)


def subgraph_scopes(graph: ir.Graph, scope: str = "") -> list[tuple[ir.Graph, str]]:
    """Every subgraph below ``graph`` with its scope path, e.g. ``"if_0/then_branch"``, outermost first."""
    out = []
    for node in graph:
        for key, attr in node.attributes.items():
            subs = [attr.value] if attr.type == ir.AttributeType.GRAPH else (
                list(attr.value) if attr.type == ir.AttributeType.GRAPHS else [])
            for j, sub in enumerate(subs):
                path = f"{scope}{node.name}/{key}" + (f"[{j}]" if attr.type == ir.AttributeType.GRAPHS else "")
                out.append((sub, path))
                out.extend(subgraph_scopes(sub, path + "/"))
    return out


def _verdict(registry: Registry, target: str, node: ir.Node, ctx: SupportContext, faults: _Faults) -> str | None:
    if node.op_type in CONTROL_FLOW or any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()
    ):
        return f"{node.op_type}: control flow runs on the host"
    entries = registry.operators.get(target, {}).get((node.domain or "", node.op_type))
    if not entries:
        return f"{node.op_type}: operator not supported by {target}"
    reasons = []
    for entry in entries:
        if entry.check is None:
            return None
        try:
            result = entry.check(node, ctx)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            faults.add(entry.plugin, "byoc_register_operators",
                       f"support check for {node.op_type} raised {type(exc).__name__}: {exc} (node {node.name!r})")
            reasons.append(f"{node.op_type}: support check of plugin {entry.plugin!r} raised {type(exc).__name__}")
            continue
        if result is None or result is True:
            return None
        if result is False:
            reasons.append(f"{node.op_type}: rejected by {target}")
        elif isinstance(result, str):
            reasons.append(result)
        else:
            faults.add(entry.plugin, "byoc_register_operators",
                       f"support check for {node.op_type} returned {type(result).__name__}, expected bool, None "
                       f"or str (node {node.name!r})")
            reasons.append(f"{node.op_type}: support check of plugin {entry.plugin!r} returned a wrong type")
    return "; ".join(reasons)


def region_io(nodes: Sequence[ir.Node]) -> tuple[list[ir.Value], list[ir.Value], list[ir.Value]]:
    """(inputs, outputs, bound constants) of a node group, in a deterministic order."""
    inside = set(map(id, nodes))
    inputs, consts, seen = [], [], set()
    for node in nodes:
        for v in node.inputs:
            if v is None or id(v) in seen:
                continue
            producer = v.producer()
            if producer is not None and id(producer) in inside:
                continue
            seen.add(id(v))
            if v.const_value is not None and not v.is_graph_input():
                consts.append(v)
            else:
                inputs.append(v)
    outputs = []
    for node in nodes:
        for v in node.outputs:
            if v.is_graph_output() or any(id(u.node) not in inside for u in v.uses()):
                outputs.append(v)
    return inputs, outputs, consts


def outline(region: Region, model: ir.Model) -> None:
    """Fill ``region.inputs``/``outputs`` and build its standalone body ``region.model``."""
    inputs, outputs, consts = region_io(region.nodes)
    region.inputs, region.outputs = inputs, outputs
    node_protos = []
    for node in region.nodes:
        proto = ir.serde.serialize_node(node)
        if node.name in region.patterns:
            entry = proto.metadata_props.add()
            entry.key, entry.value = "byoc.pattern", region.patterns[node.name]
        node_protos.append(proto)
    # the constants go in as data-less stubs and the body shares their tensors afterwards:
    # outlining never copies weights
    stubs = []
    for v in consts:
        stub = onnx.TensorProto(name=v.name, data_type=v.const_value.dtype.value, dims=v.const_value.shape.numpy())
        stub.data_location = onnx.TensorProto.EXTERNAL
        stub.external_data.add(key="location", value="<byoc: outlined constant>")
        stubs.append(stub)
    graph = onnx.helper.make_graph(
        node_protos,
        region.name,
        [ir.serde.serialize_value(v) for v in inputs],
        [ir.serde.serialize_value(v) for v in outputs],
        stubs,
    )
    opsets = [onnx.helper.make_opsetid(d, ver) for d, ver in sorted(model.graph.opset_imports.items())]
    proto = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="byoc")
    proto.ir_version = max(model.ir_version, 8)
    region.model = ir.from_proto(proto)
    body = region.model.graph.initializers
    for v in consts:
        body[v.name].const_value = v.const_value


class Partitioner:
    def __init__(self, model: ir.Model, registry: Registry, targets: Sequence[Target],
                 options: Mapping[str, Mapping[str, Any]], strict: bool = False, *,
                 graph: ir.Graph | None = None, scope: str = "", counters: dict[str, int] | None = None,
                 placement: str = "priority", refine: Callable[["Partitioner"], None] | None = None):
        self.model = model
        self.graph = model.graph if graph is None else graph
        self.scope = scope
        self.counters = counters if counters is not None else {}
        self.registry = registry
        self.targets = list(targets)
        self.options = options
        self.faults = _Faults(strict)
        self.nodes: list[ir.Node] = list(self.graph)
        self.index = {id(n): i for i, n in enumerate(self.nodes)}
        self.preds: list[list[int]] = []
        for node in self.nodes:
            ps = set()
            for v in node.inputs:
                if v is not None:
                    p = v.producer()
                    if p is not None and id(p) in self.index:
                        ps.add(self.index[id(p)])
            self.preds.append(sorted(ps))
        self.records = {n.name: NodeRecord(n.name, n.op_type, scope=scope) for n in self.nodes}
        # placement: node index -> region id (index into self.placed), -1 while free
        self.region_of = [-1] * len(self.nodes)
        self.placed: list[tuple[str, list[int], dict[int, str]]] = []  # (target, node ids, patterns)
        self.placement = placement
        #: with placement="cost": the device chosen for each node before regions form
        self.assignment: list[str] | None = None
        self.estimated_cost: float | None = None
        self.problem: Problem | None = None
        self._verdicts: dict[str, list[bool]] = {}
        #: node index -> composite id (a pattern match), over every target's placed composites
        self.composite_of: dict[int, int] = {}
        self._n_composites = 0
        #: placement="measure": re-decides the placed regions before they are outlined
        #: (:func:`byoc.partition.measure.refine`)
        self.refine = refine

    # -- units: placed regions, composites, single nodes --------------------------------------

    def _units(self, composites: list[list[int]]) -> tuple[list[int], int]:
        unit_of = [-1] * len(self.nodes)
        n_units = 0
        for _, members, _ in self.placed:
            for i in members:
                unit_of[i] = n_units
            n_units += 1
        for members in composites:
            for i in members:
                unit_of[i] = n_units
            n_units += 1
        for i in range(len(self.nodes)):
            if unit_of[i] < 0:
                unit_of[i] = n_units
                n_units += 1
        return unit_of, n_units

    def _acyclic_with(self, groups: Sequence[Sequence[int]]) -> bool:
        unit_of, n_units = self._units([list(g) for g in groups])
        return is_acyclic(len(self.nodes), self.preds, unit_of, n_units)

    # -- one target ---------------------------------------------------------------------------

    def _composites(self, target: Target, ctx: SupportContext,
                    verdict_ok: Sequence[bool]) -> tuple[list[list[int]], dict[int, str]]:
        patterns: list[tuple[str, Pattern]] = sorted(
            self.registry.patterns.get(target.name, []),
            key=lambda pp: -(pp[1].priority if pp[1].priority is not None else pp[1].expr.size()),
        )
        if not patterns:
            return [], {}
        taken: set[int] = set()

        def free(node: ir.Node) -> bool:
            i = self.index.get(id(node))
            return i is not None and self.region_of[i] < 0 and i not in taken

        composites, pattern_of = [], {}
        for i in range(len(self.nodes) - 1, -1, -1):
            node = self.nodes[i]
            if not free(node):
                continue
            for plugin, pattern in patterns:
                try:
                    m = match_at(pattern.expr, node, free)
                    # every member must be supported on its own: the plugin's check judges the whole
                    if m is not None and not all(verdict_ok[self.index[id(n)]] for n in m.nodes):
                        continue
                    ok = m is not None and (pattern.check is None or pattern.check(m, ctx))
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:
                    self.faults.add(plugin, "byoc_register_patterns",
                                    f"pattern {pattern.name!r} raised {type(exc).__name__}: {exc} (node {node.name!r})")
                    continue
                if m is None or not (ok is None or ok is True):
                    continue
                members = sorted(self.index[id(n)] for n in m.nodes)
                taken.update(members)
                composites.append(members)
                for j in members:
                    pattern_of[j] = pattern.name
                break
        return composites, pattern_of

    def _apply_rules(self, target: Target, ctx: SupportContext, groups: list[list[int]], pattern_of: dict[int, str],
                     composites: list[list[int]]) -> list[list[int]]:
        rules = self.registry.rules.get(target.name, [])
        composite_of = {i: k for k, members in enumerate(composites) for i in members}
        for plugin, rule in rules:
            kept: list[list[int]] = []
            for group in groups:
                region = self._region_view(target.name, group, pattern_of)
                try:
                    verdict = rule.fn(region, ctx)
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:
                    self.faults.add(plugin, "byoc_register_rules",
                                    f"rule {rule.name!r} raised {type(exc).__name__}: {exc} "
                                    f"(region starting at node {region.nodes[0].name!r})")
                    self._mark_dropped(group, f"{target.name}:{rule.name} (raised)")
                    continue
                if verdict is None or verdict is True:
                    kept.append(group)
                elif verdict is False or isinstance(verdict, str):
                    self._mark_dropped(group, f"{target.name}:{rule.name}" + (f" ({verdict})" if verdict else ""))
                elif isinstance(verdict, (list, tuple)):
                    parts = self._split(plugin, target, rule.name, group, verdict, composite_of, kept)
                    if parts is None:
                        self._mark_dropped(group, f"{target.name}:{rule.name} (invalid split)")
                    else:
                        kept.extend(parts)
                else:
                    self.faults.add(plugin, "byoc_register_rules",
                                    f"rule {rule.name!r} returned {type(verdict).__name__}; expected None, bool, "
                                    f"str or a list of node lists")
                    self._mark_dropped(group, f"{target.name}:{rule.name} (wrong return type)")
            groups = kept
        return groups

    def _split(self, plugin, target, rule_name, group, parts, composite_of, others) -> list[list[int]] | None:
        members = set(group)
        out, used = [], set()
        try:
            for part in parts:
                ids = sorted(self.index[id(n)] for n in part)
                if not ids or len(set(ids)) != len(ids) or any(i not in members or i in used for i in ids):
                    raise ValueError("parts must be non-empty, disjoint subsets of the region")
                used.update(ids)
                out.append(ids)
        except (KeyError, TypeError, ValueError) as exc:
            self.faults.add(plugin, "byoc_register_rules", f"rule {rule_name!r} returned an invalid split: {exc}")
            return None
        for ids in out:
            cut = {composite_of[i] for i in ids if i in composite_of}
            for k in cut:
                if not all(j in ids for j in group if composite_of.get(j) == k):
                    self.faults.add(plugin, "byoc_register_rules",
                                    f"rule {rule_name!r} split a composite pattern apart "
                                    f"(node {self.nodes[ids[0]].name!r})")
                    return None
        if not self._acyclic_with(others + out):
            self.faults.add(plugin, "byoc_register_rules",
                            f"rule {rule_name!r} claims nodes that would form a cycle "
                            f"(node {self.nodes[out[0][0]].name!r})")
            return None
        for i in members - used:
            self._mark_dropped([i], f"{target.name}:{rule_name}")
        return out

    def _mark_dropped(self, group: Sequence[int], rule: str) -> None:
        for i in group:
            rec = self.records[self.nodes[i].name]
            rec.rule = rec.rule or rule

    def _region_view(self, target: str, group: Sequence[int], pattern_of: Mapping[int, str]) -> Region:
        nodes = [self.nodes[i] for i in sorted(group)]
        inputs, outputs, _ = region_io(nodes)
        patterns = {self.nodes[i].name: pattern_of[i] for i in group if i in pattern_of}
        return Region(name="", target=target, nodes=nodes, inputs=inputs, outputs=outputs, patterns=patterns)

    def _support(self, target: Target, ctx: SupportContext) -> list[bool]:
        """Each node's verdict for ``target`` (recorded once for the report)."""
        if target.name not in self._verdicts:
            verdict_ok = [False] * len(self.nodes)
            for i, node in enumerate(self.nodes):
                reason = _verdict(self.registry, target.name, node, ctx, self.faults)
                self.records[node.name].verdicts[target.name] = reason
                verdict_ok[i] = reason is None
            self._verdicts[target.name] = verdict_ok
        return self._verdicts[target.name]

    def cost_problem(self, hooks: bool = True) -> Problem:
        """The placement problem of this graph with byoc's estimates (:mod:`byoc.partition.costs`);
        ``hooks=False``: byoc's own model only (no ``byoc_cost`` call, no one-node outlining)."""
        supported = {t.name: self._support(t, SupportContext(t.name, self.options.get(t.name, {})))
                     for t in self.targets}

        def one_node(target: Target, node: ir.Node) -> Region:
            region = Region(name=f"{target.name}_cost", target=target.name, nodes=[node])
            outline(region, self.model)
            return region

        return build_problem(self.nodes, self.preds, self.targets, supported, self.registry if hooks else None,
                             self.options, one_node, lambda plugin, hook, msg: self.faults.add(plugin, hook, msg))

    def _place_by_cost(self) -> None:
        """Choose every node's device over the whole graph (:mod:`byoc.partition.placement`),
        then form each target's regions over its nodes. A node a target's rules drop is barred
        from that target and the graph is solved again, so it goes where it is next cheapest
        (another target or the host), at most once per target."""
        problem = self.problem = self.cost_problem()
        for attempt in range(len(self.targets) + 1):
            assign, total = solve(problem)
            self.assignment = [problem.devices[d] for d in assign]
            self.estimated_cost = total
            self.placed, self.region_of = [], [-1] * len(self.nodes)
            self.composite_of, self._n_composites = {}, 0
            for target in self.targets:
                self._partition_target(target)
            dropped = [(i, d) for i, d in enumerate(assign) if d and self.region_of[i] < 0]
            if not dropped or attempt == len(self.targets):
                return
            for i, d in dropped:
                problem.cost[i][d] = math.inf

    def _partition_target(self, target: Target) -> None:
        opts = self.options.get(target.name, {})
        ctx = SupportContext(target.name, opts)
        verdict_ok = list(self._support(target, ctx))
        if self.assignment is not None:  # placement="cost": only the nodes given to this target
            verdict_ok = [ok and dev == target.name for ok, dev in zip(verdict_ok, self.assignment)]
        composites, pattern_of = self._composites(target, ctx, verdict_ok)
        unit_of, n_units = self._units(composites)
        candidate = [False] * n_units
        n_placed = len(self.placed)
        for k in range(len(composites)):
            candidate[n_placed + k] = True
        for i in range(len(self.nodes)):
            u = unit_of[i]
            if u >= n_placed + len(composites) and self.region_of[i] < 0 and verdict_ok[i]:
                candidate[u] = True
        members_of: dict[int, list[int]] = {}
        for i, u in enumerate(unit_of):
            members_of.setdefault(u, []).append(i)
        unit_groups = form_regions(len(self.nodes), self.preds, unit_of, n_units, candidate)
        groups = [sorted(i for u in g for i in members_of[u]) for g in unit_groups]
        groups = self._apply_rules(target, ctx, groups, pattern_of, composites)
        kept = {i for group in groups for i in group}
        for members in composites:
            if members[0] in kept:
                cid = self._n_composites
                self._n_composites += 1
                self.composite_of.update((i, cid) for i in members)
        for group in groups:
            rid = len(self.placed)
            self.placed.append((target.name, group, {i: pattern_of[i] for i in group if i in pattern_of}))
            for i in group:
                self.region_of[i] = rid

    # -- all targets --------------------------------------------------------------------------

    def run(self) -> PartitionResult:
        # CPython's cyclic GC rescans the whole (large, long-lived) IR graph again and again while
        # outlining allocates; paused, partitioning is linear (10k nodes: ~28 vs ~55 us/node CPU,
        # see benchmarks/partition_bench.py). Nothing here creates garbage worth collecting early.
        if not gc.isenabled():
            return self._run()
        gc.disable()
        try:
            return self._run()
        finally:
            gc.enable()

    def _run(self) -> PartitionResult:
        if self.placement == "cost" and self.targets and self.nodes:
            self._place_by_cost()
        else:
            for target in self.targets:
                self._partition_target(target)
        if self.refine is not None and self.placed:
            self.refine(self)
        # defensive: the whole placement must contract to a DAG
        unit_of, n_units = self._units([])
        if not is_acyclic(len(self.nodes), self.preds, unit_of, n_units):  # pragma: no cover - guarded above
            raise PluginError("internal error: the partition has a cycle")
        regions = []
        counters = self.counters
        for target, members, patterns in sorted(self.placed, key=lambda p: p[1][0]):
            k = counters.get(target, 0)
            counters[target] = k + 1
            name = f"{target}_{k}"
            nodes = [self.nodes[i] for i in members]
            region = Region(name=name, target=target, nodes=nodes,
                            patterns={self.nodes[i].name: p for i, p in patterns.items()})
            outline(region, self.model)
            regions.append(region)
            for node in nodes:
                rec = self.records[node.name]
                rec.device, rec.region = target, name
                rec.pattern = region.patterns.get(node.name)
        return PartitionResult(regions, self.records, self.faults.items, self._estimates(regions),
                               self.estimated_cost)

    def _estimates(self, regions: Sequence[Region]) -> dict[str, dict[str, Any]] | None:
        """For the report: each region's summed node estimates on every device (``None`` where a
        device cannot take all of it); transfers and launches come on top, so a region may stay
        on a device that is not the cheapest here when moving its tensors would cost more."""
        problem = self.problem
        if problem is None:
            return None
        out = {}
        for region in regions:
            members = [self.index[id(n)] for n in region.nodes]
            alts = {}
            for d, dev in enumerate(problem.devices):
                total = sum(problem.cost[i][d] for i in members)
                alts[dev] = total if total < float("inf") else None
            out[region.name] = {"target": region.target, "estimated_s": alts}
        return out

