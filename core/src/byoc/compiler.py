"""``byoc.compile``: frontend -> shared passes -> partitioning -> codegen -> plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.errors import ByocError, OptionError, PluginError
from byoc.frontend import load_model
from byoc.frontend.loader import ModelLike
from byoc.partition.partitioner import (
    NodeRecord,
    Partitioner,
    _Faults,
    ensure_node_names,
    region_io,
    subgraph_scopes,
)
from byoc.partition.types import Artifact, Region, Target
from byoc.frontend.shapes import fix_input_shapes
from byoc.passes.simplify import drop_legacy_initializer_inputs
from byoc.plugins import Registry, get_registry
from byoc.runtime.compiled import CompiledModel
from byoc.runtime.plan import build_plan

REGION_DOMAIN = "byoc"
REGION_OP = "Region"


@dataclass
class CompiledRegion:
    """A region after code generation: what runs, and what a bundle stores."""

    region: Region
    artifact: Artifact
    plugin: str
    fn: Callable[..., Sequence[np.ndarray]]


def resolve_targets(registry: Registry, targets: Sequence[str] | None) -> list[Target]:
    if targets is None:
        return registry.ordered_targets()
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
    target_options = dict(target_options or {})
    unknown = set(target_options) - {t.name for t in targets}
    if unknown:
        raise OptionError(f"target_options for target(s) not compiled for: {sorted(unknown)}")
    resolved = {}
    for t in targets:
        opts = dict(t.options)
        for key, value in target_options.get(t.name, {}).items():
            if key not in opts:
                raise OptionError(f"target {t.name!r} has no option {key!r}; its options: {sorted(opts)}")
            opts[key] = value
        resolved[t.name] = opts
    return resolved


def _validate_artifact(artifact: Any, region: Region) -> Artifact:
    if not isinstance(artifact, Artifact):
        raise TypeError(f"returned {type(artifact).__name__}, expected byoc.partition.Artifact")
    if not isinstance(artifact.data, (bytes, bytearray)):
        raise TypeError(f"Artifact.data is {type(artifact.data).__name__}, expected bytes")
    meta = dict(artifact.metadata)
    meta.setdefault("inputs", [v.name for v in region.inputs])
    meta.setdefault("outputs", [v.name for v in region.outputs])
    json.dumps(meta, sort_keys=True)  # TypeError if not JSON-serialisable
    if list(meta["inputs"]) != [v.name for v in region.inputs] or list(meta["outputs"]) != [
        v.name for v in region.outputs
    ]:
        raise ValueError("Artifact.metadata inputs/outputs do not match the region's")
    return Artifact(artifact.target, str(artifact.format), bytes(artifact.data), meta)


def guarded_runtime(fn: Callable, plugin: str, region_name: str, target: str, n_outputs: int) -> Callable:
    """Wrap a vendor callable so a failure at run time names plugin, hook and region."""

    def run(*args):
        try:
            outs = fn(*args)
        except ByocError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin {plugin!r}, hook byoc_runtime: the callable for region {region_name!r} (target {target!r}) "
                f"raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(outs, (list, tuple)) or len(outs) != n_outputs:
            raise PluginError(
                f"plugin {plugin!r}, hook byoc_runtime: region {region_name!r} returned "
                f"{type(outs).__name__} of length {len(outs) if hasattr(outs, '__len__') else '?'}, "
                f"expected a sequence of {n_outputs} arrays"
            )
        return outs

    return run


#: default limit for one codegen or runtime hook call, seconds
HOOK_TIMEOUT = 600.0


def codegen_region(registry: Registry, region: Region, options: Mapping[str, Any], faults: _Faults,
                   artifact: Artifact | None = None,
                   hook_timeout: float | None = HOOK_TIMEOUT) -> CompiledRegion | None:
    """Run the codegen (unless ``artifact`` is given) and runtime hooks; ``None`` on a plugin fault."""
    target = region.target
    plugin = registry.targets[target].plugin if target in registry.targets else ""
    if artifact is None:
        plugin_cg, result, hook_faults = registry.call_first("byoc_codegen", timeout=hook_timeout, target=target,
                                                              region=region, options=options)
        for f in hook_faults:
            faults.add(f.plugin, f.hook, f"{f.message} (region {region.name!r})")
        if result is None:
            if not hook_faults:
                faults.add(plugin, "byoc_codegen", f"no plugin generated code for region {region.name!r}")
            return None
        try:
            artifact = _validate_artifact(result, region)
        except (TypeError, ValueError) as exc:
            faults.add(plugin_cg, "byoc_codegen", f"{exc} (region {region.name!r})")
            return None
    plugin_rt, fn, hook_faults = registry.call_first("byoc_runtime", timeout=hook_timeout, target=target,
                                                      artifact=artifact, options=options)
    for f in hook_faults:
        faults.add(f.plugin, f.hook, f"{f.message} (region {region.name!r})")
    if fn is None or not callable(fn):
        if fn is not None:
            faults.add(plugin_rt, "byoc_runtime", f"returned {type(fn).__name__}, expected a callable "
                       f"(region {region.name!r})")
        elif not hook_faults:
            faults.add(plugin, "byoc_runtime", f"no plugin provided a runtime for region {region.name!r}")
        return None
    fn = guarded_runtime(fn, plugin_rt, region.name, target, len(region.outputs))
    return CompiledRegion(region, artifact, plugin_rt, fn)


def substitute_regions(compiled: Sequence[CompiledRegion]) -> None:
    """Replace each region's nodes with one ``byoc::Region`` node in their graph, keeping value names."""
    from byoc.passes.base import replace_value

    touched: dict[int, ir.Graph] = {}
    for cr in compiled:
        region = cr.region
        graph = region.nodes[0].graph
        touched[id(graph)] = graph
        # an earlier substitution may have replaced values this region reads: take them afresh
        inputs, _, _ = region_io(region.nodes)
        assert [v.name for v in inputs] == list(cr.artifact.input_names), region.name
        region.inputs = inputs
        node = ir.Node(
            REGION_DOMAIN,
            REGION_OP,
            list(inputs),
            attributes=[ir.AttrString("target", region.target), ir.AttrString("region", region.name)],
            num_outputs=len(region.outputs),
            name=region.name,
        )
        graph.append(node)
        for old, new in zip(region.outputs, node.outputs):
            new.type, new.shape = old.type, old.shape
            replace_value(old, new)
        graph.remove(region.nodes, safe=True)
        region.outputs = list(node.outputs)
    for graph in touched.values():
        graph.sort()


def _check_host_kernels(graph: ir.Graph) -> None:
    """Every node left on the host needs a host kernel; list all that lack one."""
    from byoc.errors import UnsupportedOperatorError
    from byoc.kernels import is_supported

    bad = [
        (n.name, n.domain or "ai.onnx", n.op_type)
        for n in ir.traversal.RecursiveGraphIterator(graph)
        if n.domain != REGION_DOMAIN and not is_supported(n.op_type, n.domain)
    ]
    if bad:
        listing = "; ".join(f"{name} ({d}::{op})" for name, d, op in bad[:50])
        raise UnsupportedOperatorError(
            f"{len(bad)} node(s) stay on the host but have no host kernel (no selected target took them): {listing}",
            nodes=bad,
        )


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
    input_shapes: Mapping[str, Sequence[int] | int] | None = None,
) -> CompiledModel:
    """Compile an ONNX model.

    :param model: a path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model``.
    :param targets: vendor targets in priority order; ``None`` uses every installed target in
        its declared default priority, ``[]`` runs everything on the host.
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
    :param input_shapes: fixed input shapes, applied before shape inference: input name -> shape
        (``{"x": [1, 3, 224, 224]}``) or symbolic dimension name -> size (``{"batch": 1}``); see
        :mod:`byoc.frontend.shapes`. Static-shape targets then place their regions at compile time.
    :returns: a :class:`CompiledModel`.
    """
    from byoc import passes as _passes
    from byoc.quantize import pipeline as _quant
    from byoc.runtime.specialize import Specializer, has_symbolic_inputs

    budget = budget or DEFAULT_BUDGET
    registry = registry if registry is not None else (get_registry() if targets != [] else None)
    selected = resolve_targets(registry, targets) if registry is not None else []
    selected, skipped = _quant.split_targets(selected, targets is not None, calibration)
    if skipped and target_options:
        target_options = {k: v for k, v in target_options.items() if k not in skipped}
    options = resolve_options(selected, target_options)

    ir_model = load_model(model, budget=budget, require_kernels=not selected)
    drop_legacy_initializer_inputs(ir_model)
    fix_input_shapes(ir_model, input_shapes, budget)
    static = [t for t in selected if t.shape_policy != "dynamic"]
    if static:
        proto = ir.to_proto(ir_model)
        if has_symbolic_inputs(proto):
            # compile once without the static-shape targets; specialise per shape on first use
            dynamic = [t.name for t in selected if t.shape_policy == "dynamic"]
            if calibration is not None and any(t.needs_calibration for t in selected):
                calibration = list(calibration)  # each shape specialisation calibrates again
            kwargs = dict(passes=passes, budget=budget, strict=strict, registry=registry, hook_timeout=hook_timeout,
                          calibration=calibration)
            base = compile(proto, dynamic, target_options={k: v for k, v in (target_options or {}).items()
                                                          if k in dynamic}, **kwargs)
            names = [t.name for t in selected]
            base.specializer = Specializer(
                base, proto, static, lambda p: compile(p, names, target_options=target_options, **kwargs))
            base.options["shape_policy"] = {t.name: t.shape_policy for t in selected}
            return base
    _passes.run_passes(ir_model, passes, budget=budget)
    ensure_node_names(ir_model.graph)

    faults = _Faults(strict)
    for t in selected:
        for plugin, _, exc in registry.call_each("byoc_pre_partition", target=t.name, model=ir_model,
                                                  options=options[t.name]):
            if exc is not None:
                faults.add(plugin, "byoc_pre_partition", f"raised {type(exc).__name__}: {exc} (target {t.name!r})")

    # targets that run quantised code: calibrate the float model once, here (after every rewrite)
    quantizer = _quant.prepare(ir_model, selected, options, calibration, budget)

    records: dict[str, NodeRecord]
    compiled_regions: list[CompiledRegion] = []
    if selected:
        # the main graph first, then every subgraph (If branches, Loop/Scan bodies) on its own:
        # a region never spans a subgraph boundary
        counters: dict[str, int] = {}
        records, regions = {}, []
        for graph, scope in [(ir_model.graph, "")] + subgraph_scopes(ir_model.graph):
            result = Partitioner(ir_model, registry, selected, options, strict, graph=graph, scope=scope,
                                 counters=counters).run()
            faults.items.extend(result.faults)
            records.update(result.records)
            regions.extend(result.regions)
        for region in regions:
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
            cr = None if post_failed else codegen_region(registry, region, opts, faults, hook_timeout=hook_timeout)
            if cr is None:
                reason = faults.items[-1].message if faults.items else "plugin fault"
                for node in region.nodes:
                    rec = records[node.name]
                    rec.device, rec.region, rec.pattern, rec.fallback = "host", None, None, reason
                continue
            compiled_regions.append(cr)
        substitute_regions(compiled_regions)
        _check_host_kernels(ir_model.graph)
    else:
        records = {n.name: NodeRecord(n.name, n.op_type) for n in ir_model.graph}
        for graph, scope in subgraph_scopes(ir_model.graph):
            records.update({n.name: NodeRecord(n.name, n.op_type, scope=scope) for n in graph})

    if compiled_regions and REGION_DOMAIN not in ir_model.graph.opset_imports:
        ir_model.graph.opset_imports[REGION_DOMAIN] = 1
    by_name = {cr.region.name: cr for cr in compiled_regions}

    def step_factory(node: ir.Node, spec):
        if node.domain == REGION_DOMAIN and node.op_type == REGION_OP:
            return by_name[node.name].fn
        return None

    plan = build_plan(ir_model.graph, budget=budget, step_factory=step_factory)
    cm = CompiledModel(
        ir_model,
        plan,
        options={"targets": [t.name for t in selected], "target_options": options, "strict": strict},
        regions=compiled_regions,
        records=records,
        faults=list(faults.items),
        targets=selected,
        budget=budget,
    )
    if skipped:
        cm.options["skipped_targets"] = skipped
    if quantizer is not None:
        cm.options["calibration"] = quantizer.summary()
    return cm
