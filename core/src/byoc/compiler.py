"""``byoc.compile``: frontend -> shared passes -> partitioning -> codegen -> plan.

:func:`compile` resolves targets and options and loads the model; :func:`compile_model` is one
compile for one set of input shapes. A model with symbolic input dimensions and static-shape
targets goes through :func:`byoc.runtime.specialize.specialise`, which wraps the single-shape
compile (once without those targets, then per concrete shapes on first use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from byoc import passes as _passes
from byoc.arguments import check_compile_args
from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.codegen import (
    HOOK_TIMEOUT,
    REGION_DOMAIN,
    CompiledRegion,
    check_host_kernels,
    region_step_factory,
    substitute_regions,
)
from byoc.errors import OptionError
from byoc.frontend import bounded, load_model
from byoc.frontend import pytorch as _pytorch
from byoc.frontend.loader import ModelLike
from byoc.partition.partitioner import Partitioner, _Faults, ensure_node_names, subgraph_scopes
from byoc.partition import measure as _measure
from byoc.partition.placement import HOST, PLACEMENTS
from byoc.partition.records import NodeRecord
from byoc.contract import HostExecutor, Region, Target
from byoc.contract import environment as _env
from byoc.contract.options import resolve_options as _resolve
from byoc.frontend.shapes import fix_input_shapes
from byoc.passes.simplify import drop_legacy_initializer_inputs
from byoc.plugins import Registry, get_registry, host_executor, host_name
from byoc.quantize import pipeline as _quant
from byoc.progress import Stages
from byoc.progress import stages as progress_stages
from byoc.runtime.compiled import CompiledModel
from byoc.runtime.isolation import compile_region
from byoc.runtime.plan import build_plan
from byoc.runtime.subgraph import HostCallable
from byoc.runtime.tiers import Tiers
from byoc.runtime.specialize import (
    assumed_shapes,
    has_symbolic_inputs,
    has_symbolic_ir_inputs,
    specialise,
    with_input_shapes,
)


#: why ``targets=None`` left a target out (``CompiledModel.options["skipped_targets"]``)
UNAVAILABLE = "its device is not present on this machine (an emulation would run): name it in targets= to run it"


def resolve_targets(registry: Registry, targets: Sequence[str] | None,
                    skipped: dict[str, str] | None = None) -> list[Target]:
    """The targets to compile for: the named ones in that order, or with ``None`` every installed
    target whose device is present (:meth:`Target.is_available`), in default priority order; the
    others go to ``skipped`` with the reason."""
    if targets is None:
        out = []
        for t in registry.ordered_targets():
            if t.is_available():
                out.append(t)
            elif skipped is not None:
                skipped[t.name] = UNAVAILABLE
        return out
    if isinstance(targets, str):
        targets = [targets]
    seen, out = set(), []
    for name in targets:
        if name in seen:
            raise OptionError(f"target {name!r} listed twice")
        seen.add(name)
        out.append(registry.target(name))
    return out


def resolve_options(targets: Sequence[Target], target_options: Mapping[str, Mapping[str, Any]] | None):
    """Each target's full options, validated against its declared :class:`byoc.contract.Option` list."""
    target_options = dict(target_options or {})
    unknown = set(target_options) - {t.name for t in targets}
    if unknown:
        raise OptionError(f"target_options for target(s) not compiled for: {sorted(unknown)}")
    return {t.name: _resolve(t, target_options.get(t.name)) for t in targets}


def compile(  # noqa: A001  (the public name is byoc.compile)
    model: ModelLike,
    targets: Sequence[str] | None = None,
    *,
    passes: Iterable[str] | None = None,
    budget: Budget | None = None,
    target_options: Mapping[str, Mapping[str, Any]] | None = None,
    strict: bool = False,
    registry: Registry | None = None,
    hook_timeout: float | None = HOOK_TIMEOUT,
    calibration: Iterable[Mapping[str, np.ndarray]] | None = None,
    placement: str = "priority",
    input_shapes: Mapping[str, Sequence[int] | int] | None = None,
    measure_budget_s: float | None = None,
    host: str | None = None,
    example_inputs: Any = None,
    wait: bool | None = None,
) -> CompiledModel:
    """Compile an ONNX model (or a ``torch.nn.Module``, exported to ONNX first).

    :param model: a path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``; or a ``torch.nn.Module``
        in eval mode with ``example_inputs`` (see :mod:`byoc.frontend.pytorch`).
    :param targets: vendor targets in priority order; ``None`` uses every installed target whose
        device is present here (``Target.available``; emulations run only when named) in its
        declared default priority, ``[]`` runs everything on the host.
    :param passes: names of the shared passes to run (default: all of
        :data:`byoc.passes.DEFAULT_PASSES`); ``[]`` switches them off.
    :param budget: resource limits (:class:`byoc.Budget`).
    :param target_options: per-target option overrides, ``{"jetson": {"precision": "fp32"}}``.
    :param strict: raise :class:`byoc.PluginError` on any plugin fault instead of falling back.
    :param registry: the plugin registry to use (default: the installed plugins).
    :param hook_timeout: seconds one codegen or runtime hook may take before its region falls
        back (``None``: no limit).
    :param calibration: sample feeds (an iterable of ``{input name: array}``, read once) for
        targets that run quantised code (``Target.needs_calibration``, see :mod:`byoc.quantize`).
        Without it such a target raises :class:`byoc.CalibrationRequiredError` when listed in
        ``targets``, and is skipped when ``targets=None`` (``options["skipped_targets"]`` says why).
    :param placement: how nodes are given to targets: ``"priority"`` (default: each target in
        turn takes every node it supports that is still free) or ``"cost"`` (each node's device
        is chosen over the whole graph to minimise estimated time: the targets' ``byoc_cost``
        hooks or byoc's FLOPs/bytes model, transfers over ``Target.bandwidth`` and
        ``Target.launch_overhead``; see :mod:`byoc.partition.placement`) or ``"measure"`` (each
        region the priority partition forms is compiled and timed on its target, on the host and
        split at pattern boundaries, and the fastest is kept; times cached on disk per machine;
        see :mod:`byoc.partition.measure`).
    :param input_shapes: fixed input shapes, applied before shape inference: input name -> shape
        (``{"x": [1, 3, 224, 224]}``) or symbolic dimension name -> size (``{"batch": 1}``); see
        :mod:`byoc.frontend.shapes`. Static-shape targets then place their regions at compile time.
    :param measure_budget_s: with ``placement="measure"``: wall-clock seconds this compile may spend
        measuring (default :data:`byoc.partition.measure.MEASURE_BUDGET_S`); candidates left when it
        is spent are priced by estimates, and the report says which.
    :param host: what runs the host's nodes (those no target took): ``None`` (default) the
        installed CPU executor with the highest priority (byoc-cpu's tuned kernels where
        installed; ``BYOC_HOST_EXECUTOR`` overrides), ``"reference"`` byoc's reference kernels,
        or an executor's name (see :mod:`byoc.contract.host`).
    :param example_inputs: for a ``torch.nn.Module``: a tensor, a tuple of tensors or a dict
        name -> tensor; the module is exported with them (``mark_dynamic`` dims stay symbolic).
    :param wait: ``False`` (the default; ``BYOC_WAIT=1`` makes it ``True``): where a JIT engine
        compiles its code on the first run (``Target.jit``, ``HostExecutor.jit``: byoc-cpu), runs
        are answered by byoc's reference kernels until that compile, started by the first run in
        the background, is done (:mod:`byoc.runtime.tiers`; ``CompiledModel.wait()`` waits for
        it). ``True``: the first run compiles and every run is at full speed (benchmarks).
    :returns: a :class:`CompiledModel`.
    """
    if _pytorch.is_module(model):
        model = _pytorch.module_to_onnx(model, example_inputs)
    elif example_inputs is not None:
        raise OptionError("example_inputs is for a torch.nn.Module; an ONNX model takes input_shapes")
    wait = _check_placement_args(placement, measure_budget_s, host, wait)
    check_compile_args(targets=targets, passes=passes, budget=budget, target_options=target_options,
                       strict=strict, hook_timeout=hook_timeout, calibration=calibration)
    budget = budget or DEFAULT_BUDGET
    with bounded.time_limit(budget.max_compile_seconds):
        stages = progress_stages("compile")
        stages.next("load and validate the model")
        executor = host_executor(host, registry)
        registry = registry if registry is not None else (get_registry() if targets != [] else None)
        unavailable: dict[str, str] = {}
        selected = resolve_targets(registry, targets, unavailable) if registry is not None else []
        selected, skipped = _quant.split_targets(selected, targets is not None, calibration)
        skipped = {**unavailable, **skipped}
        if skipped and target_options:
            target_options = {k: v for k, v in target_options.items() if k not in skipped}
        options = resolve_options(selected, target_options)

        ir_model = _load(model, budget, require_kernels=not selected)
        fix_input_shapes(ir_model, input_shapes, budget)
        if calibration is not None and any(t.needs_calibration for t in selected):
            calibration = list(calibration)  # read once: each shape specialisation calibrates again
        settings = _Settings(registry, None if passes is None else list(passes), budget, strict, hook_timeout,
                             calibration, placement, measure_budget_s, executor, wait)
        if any(t.shape_policy != "dynamic" for t in selected) and has_symbolic_ir_inputs(ir_model):
            proto = ir.to_proto(ir_model)
            if has_symbolic_inputs(proto):
                stages.finish()
                return _specialised(proto, selected, options, settings)
        cm = compile_model(ir_model, selected, options, settings, stages)
        if skipped:
            cm.options["skipped_targets"] = skipped
        return cm


def _specialised(proto: onnx.ModelProto, selected: Sequence[Target], options: Mapping[str, Mapping[str, Any]],
                 settings: _Settings) -> CompiledModel:
    """A symbolic model with static-shape targets: compiled per concrete input shapes (see
    :mod:`byoc.runtime.specialize`)."""
    recipe = {"passes": settings.passes, "strict": settings.strict, "placement": settings.placement,
              "hook_timeout": settings.hook_timeout,
              "calibrated": settings.calibration is not None and any(t.needs_calibration for t in selected),
              "target_options": {t.name: dict(options[t.name]) for t in selected}}
    base = specialise(proto, selected, shape_compiler(options, settings), recipe, background=not settings.wait)
    base.specializer.preview_fn = lambda: _preview(proto, selected, options, settings)
    return base


def _preview(proto: onnx.ModelProto, selected: Sequence[Target], options: Mapping[str, Mapping[str, Any]],
             settings: _Settings) -> dict[str, Any]:
    """Where the targets would place a symbolic model at assumed input shapes (each symbolic
    dimension 1 on an input's first axis, else 256; dimensions of one name alike): the passes,
    vendor passes and partitioning of a compile, no code generation. For the report, on demand."""
    shapes = assumed_shapes(proto)
    try:
        ir_model = _load(with_input_shapes(proto, shapes), settings.budget, require_kernels=False)
        _passes.run_passes(ir_model, settings.passes, budget=settings.budget)
        ensure_node_names(ir_model.graph)
        placing = [t for t in selected if not t.needs_calibration]
        faults = _Faults(strict=False)
        ir_model = _pre_partition(settings.registry, ir_model, placing, options, faults)
        records, regions = _partition(ir_model, placing, options, replace(settings, placement="priority"), faults, {})
    except Exception as exc:  # noqa: BLE001 - a preview: the model's own compile has succeeded
        return {"shapes": shapes, "error": f"{type(exc).__name__}: {exc}"}
    nodes: dict[str, int] = {}
    for rec in records.values():
        nodes[rec.device] = nodes.get(rec.device, 0) + 1
    return {"shapes": shapes, "nodes": nodes, "error": None,
            "regions": [{"name": r.name, "target": r.target, "nodes": len(r.nodes), "first": r.nodes[0].name,
                         "last": r.nodes[-1].name} for r in regions if r.nodes]}


def _check_placement_args(placement: str, measure_budget_s: float | None, host: str | None, wait: Any) -> bool:
    """Check these arguments; returns ``wait`` with its default (``BYOC_WAIT``) applied."""
    if wait is not None and not isinstance(wait, bool):
        raise OptionError(f"wait must be True, False or None, got {wait!r}")
    if placement not in PLACEMENTS:
        raise OptionError(f"placement={placement!r}: expected one of {', '.join(map(repr, PLACEMENTS))}")
    if host is not None and not isinstance(host, str):
        raise OptionError(f"host={host!r}: expected an executor's name, 'reference' or None")
    if measure_budget_s is not None and (isinstance(measure_budget_s, bool) or not isinstance(
            measure_budget_s, (int, float)) or not 0 <= measure_budget_s < math.inf):
        raise OptionError(f"measure_budget_s={measure_budget_s!r}: expected a finite number of seconds >= 0")
    return wait if wait is not None else _env.get("BYOC_WAIT") in ("1", "true", "yes")


def shape_compiler(options: Mapping[str, Mapping[str, Any]], settings: "_Settings"):
    """``compile_shapes(proto, targets)``: one compile of a model with concrete input shapes, as
    :func:`byoc.runtime.specialize.specialise` needs it (also used by a loaded bundle)."""
    def compile_shapes(p: onnx.ModelProto, ts: Sequence[Target], wait: bool | None = None) -> CompiledModel:
        """``wait``: as :func:`compile`'s (``None``: the settings')."""
        return compile_model(_load(p, settings.budget, require_kernels=not ts), ts,
                             {t.name: dict(options[t.name]) for t in ts},
                             settings if wait is None else replace(settings, wait=wait))

    return compile_shapes


def settings_from_recipe(registry: Registry | None, budget: Budget, recipe: Mapping[str, Any],
                         host: HostExecutor | None) -> "_Settings":
    """The compile settings a specialiser's ``recipe`` (plain data, see :func:`specialise`) describes,
    with ``host`` running the host's nodes (the bundle's, see :func:`byoc.plugins.recorded_host`)."""
    return _Settings(registry, recipe["passes"], budget, recipe["strict"], recipe["hook_timeout"], None,
                     recipe["placement"], host=host)


@dataclass(frozen=True)
class _Settings:
    """The arguments of :func:`compile` that every single-shape compile shares."""

    registry: Registry | None
    passes: Iterable[str] | None
    budget: Budget
    strict: bool
    hook_timeout: float | None
    calibration: Iterable[Mapping[str, np.ndarray]] | None
    placement: str = "priority"
    measure_budget_s: float | None = None
    #: what runs the host's nodes (``None``: the reference kernels)
    host: HostExecutor | None = None
    #: ``False``: a first tier answers while JIT code compiles (see :func:`compile`)
    wait: bool = True


def _load(model: ModelLike, budget: Budget, *, require_kernels: bool) -> ir.Model:
    ir_model = load_model(model, budget=budget, require_kernels=require_kernels)
    drop_legacy_initializer_inputs(ir_model)
    return ir_model


def compile_model(ir_model: ir.Model, selected: Sequence[Target], options: Mapping[str, Mapping[str, Any]],
                  settings: _Settings, stages: Stages | None = None) -> CompiledModel:
    """One compile of a loaded model for its input shapes: passes, vendor passes, calibration,
    partitioning, codegen and the host plan (each a step of ``stages``, see :mod:`byoc.progress`)."""
    budget = settings.budget
    stages = stages or progress_stages("compile")
    stages.next("shared passes")
    with bounded.time_limit(budget.max_compile_seconds):  # a specialisation's compile: a limit of its own
        _passes.run_passes(ir_model, settings.passes, budget=budget)
    ensure_node_names(ir_model.graph)

    faults = _Faults(settings.strict)
    stages.next("vendor passes and calibration")
    ir_model = _pre_partition(settings.registry, ir_model, selected, options, faults)
    # targets that run quantised code: calibrate the float model once, here (after every rewrite)
    quantizer = _quant.prepare(ir_model, selected, options, settings.calibration, budget)

    compiled_regions: list[CompiledRegion] = []
    stages.next("partition")
    estimates: dict[str, Any] = {}
    if selected:
        records, regions = _partition(ir_model, selected, options, settings, faults, estimates)
        stages.next("codegen", total=len(regions))
        compiled_regions = _codegen(regions, records, options, quantizer, settings, faults, stages)
        substitute_regions(compiled_regions)
        check_host_kernels(ir_model.graph)
    else:
        records = _host_records(ir_model.graph)

    if compiled_regions and REGION_DOMAIN not in ir_model.graph.opset_imports:
        ir_model.graph.opset_imports[REGION_DOMAIN] = 1
    stages.next("execution plan")
    plan = build_plan(ir_model.graph, budget=budget, step_factory=region_step_factory(compiled_regions), fuse=True,
                      host=settings.host)
    stages.finish()
    cm = CompiledModel(
        ir_model,
        plan,
        options={"targets": [t.name for t in selected], "target_options": dict(options), "strict": settings.strict,
                 "placement": settings.placement, "host": host_name(settings.host)},
        regions=compiled_regions,
        records=records,
        faults=list(faults.items),
        targets=selected,
        budget=budget,
    )
    if quantizer is not None:
        cm.options["calibration"] = quantizer.summary()
    if estimates:
        cm.options["placement_estimates"] = estimates
    if not settings.wait:
        cm.tiers = _first_tier(cm, selected, settings)
    return cm


def _first_tier(cm: CompiledModel, selected: Sequence[Target], settings: _Settings) -> Tiers | None:
    """The first tier of :mod:`byoc.runtime.tiers` where a JIT engine serves the model (and no
    region is quantised, whose results the float reference would not reproduce)."""
    jit_targets = {t.name for t in selected if getattr(t, "jit", False)}
    quantised = {t.name for t in selected if t.needs_calibration}
    regions = cm.regions
    if any(cr.region.target in quantised or cr.region.model is None for cr in regions):
        return None
    if not (getattr(settings.host, "jit", False) or any(cr.region.target in jit_targets for cr in regions)):
        return None
    on_host = {cr.region.name: HostCallable(cr.region.model, settings.budget, reference=True) for cr in regions}
    first = build_plan(cm.model.graph, budget=settings.budget,
                       step_factory=lambda node, spec: on_host.get(node.name) if node.domain == REGION_DOMAIN else None)
    return Tiers(first, cm._first_run)


def _pre_partition(registry: Registry | None, ir_model: ir.Model, selected: Sequence[Target],
                   options: Mapping[str, Mapping[str, Any]], faults: _Faults) -> ir.Model:
    """Run each target's ``byoc_pre_partition`` passes on a copy of the model, kept only when none
    of them raised: a pass that rewrites and then raises leaves no half-done rewrite behind."""
    for t in selected:
        if registry is None or not registry.hookimpls("byoc_pre_partition", t.name):
            continue
        work = ir_model.clone()
        failed = False
        for plugin, _, exc in registry.call_each("byoc_pre_partition", target=t.name, model=work,
                                                  options=options[t.name]):
            if exc is not None:
                failed = True
                faults.add(plugin, "byoc_pre_partition", f"raised {type(exc).__name__}: {exc} (target {t.name!r}; "
                           f"the target's pre-partition rewrites were rolled back)")
        if not failed:
            ir_model = work
    return ir_model


def _partition(ir_model: ir.Model, selected: Sequence[Target], options: Mapping[str, Mapping[str, Any]],
               settings: _Settings, faults: _Faults,
               est: dict[str, Any]) -> tuple[dict[str, NodeRecord], list[Region]]:
    """The main graph first, then every subgraph (If branches, Loop/Scan bodies) on its own: a
    region never spans a subgraph boundary. With placement="cost", ``est`` receives the
    estimates (``{"total_s": ..., "regions": {name: {"target", "estimated_s": {device: s}}}}``)."""
    counters: dict[str, int] = {}
    records: dict[str, NodeRecord] = {}
    regions: list[Region] = []
    session = refine = None
    if settings.placement == "measure":
        session = _measure.Session(budget=settings.budget, registry=settings.registry,
                                   hook_timeout=settings.hook_timeout)
        if settings.measure_budget_s is not None:
            session.budget_s = float(settings.measure_budget_s)

        def refine(p: Partitioner) -> None:
            _measure.refine(p, session)
    for graph, scope in [(ir_model.graph, "")] + subgraph_scopes(ir_model.graph):
        result = Partitioner(ir_model, settings.registry, selected, options, settings.strict, graph=graph,
                             scope=scope, counters=counters, placement=settings.placement, refine=refine).run()
        faults.items.extend(result.faults)
        records.update(result.records)
        regions.extend(result.regions)
        if result.estimates is not None:
            est.setdefault("regions", {}).update(result.estimates)
            est["total_s"] = est.get("total_s", 0.0) + (result.estimated_cost or 0.0)
    if session is not None:
        session.save()
        est.update(_measure_report(session, records))
    return records, regions


def _measure_report(session: Any, records: Mapping[str, NodeRecord]) -> dict[str, Any]:
    """The measurement summary and one decision per candidate region, its nodes named by the
    regions they ended up in (``"host"`` for nodes given back to the host)."""
    decisions = []
    for d in session.decisions:
        where = list(dict.fromkeys(records[n].region or HOST for n in d["nodes"] if n in records))
        decisions.append({**{k: v for k, v in d.items() if k != "nodes"}, "nodes": len(d["nodes"]),
                          "first_node": d["nodes"][0], "last_node": d["nodes"][-1], "regions": where})
    return {"measure": session.summary(), "decisions": decisions}


def _codegen(regions: Sequence[Region], records: dict[str, NodeRecord], options: Mapping[str, Mapping[str, Any]],
             quantizer: Any, settings: _Settings, faults: _Faults, stages: Stages) -> list[CompiledRegion]:
    """Quantise (for calibrated targets), run the vendor post-partition passes and codegen of
    every region; a region whose plugin fails falls back to the host, and its records say why."""
    registry = settings.registry
    compiled: list[CompiledRegion] = []
    for region in regions:
        stages.item(f"{region.name} ({region.target})")
        opts = options[region.target]
        post_failed = False
        if quantizer is not None and quantizer.wants(region) and not quantizer.apply(region, faults):
            post_failed = True  # the fault names the tensor; the region runs on the host
        for plugin, _, exc in registry.call_each("byoc_post_partition", target=region.target, region=region,
                                                  options=opts):
            if exc is not None:
                post_failed = True
                faults.add(plugin, "byoc_post_partition", f"raised {type(exc).__name__}: {exc} "
                           f"(region {region.name!r})")
        # a pass that failed half-way may have left the body broken: that region runs on the host
        cr = None if post_failed else compile_region(registry, region, opts, faults,
                                                     hook_timeout=settings.hook_timeout)
        if cr is None:
            reason = faults.items[-1].message if faults.items else "plugin fault"
            for node in region.nodes:
                rec = records[node.name]
                rec.device, rec.region, rec.pattern, rec.fallback = "host", None, None, reason
            continue
        compiled.append(cr)
    return compiled


def _host_records(graph: ir.Graph) -> dict[str, NodeRecord]:
    records = {n.name: NodeRecord(n.name, n.op_type) for n in graph}
    for sub, scope in subgraph_scopes(graph):
        records.update({n.name: NodeRecord(n.name, n.op_type, scope=scope) for n in sub})
    return records
