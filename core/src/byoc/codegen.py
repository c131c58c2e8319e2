"""Code generation: region -> artifact -> callable, and substitution into the host graph.

After partitioning, each region goes through its target's ``byoc_codegen`` hook (an
:class:`~byoc.contract.Artifact`: bytes and JSON metadata) and ``byoc_runtime`` hook (a
callable), guarded so that a failure names the plugin, hook and region. The regions' nodes are
then replaced by one ``byoc::Region`` node each, which the execution plan runs with that
callable. ``byoc.load`` uses the same path for a bundle's stored artifacts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from byoc.errors import ByocError, PluginError, UnsupportedOperatorError
from byoc.kernels import is_supported
from byoc.partition.partitioner import _Faults, region_io
from byoc.contract import REGION_DOMAIN, REGION_OP, Artifact, Region
from byoc.passes.base import replace_value
from byoc.plugins import Registry

@dataclass
class CompiledRegion:
    """A region after code generation: what runs, and what a bundle stores."""

    region: Region
    artifact: Artifact
    plugin: str
    fn: Callable[..., Sequence[np.ndarray]]
    #: what the runtime did on loading that the report says (the callable's ``note``, see
    #: :func:`byoc.contract.hookspecs.byoc_runtime`)
    note: str | None = None


def plugin_view(region: Region) -> Region:
    """A copy of ``region`` for a ``byoc_codegen`` hook: its own nodes, values and body (weights are
    shared, read-only), so a hook that edits them and then fails leaves the host fallback intact."""
    if region.model is None:
        return dataclasses.replace(region, nodes=list(region.nodes), inputs=list(region.inputs),
                                   outputs=list(region.outputs), patterns=dict(region.patterns))
    body = region.model.clone()
    return dataclasses.replace(region, nodes=list(body.graph), inputs=list(body.graph.inputs),
                               outputs=list(body.graph.outputs), patterns=dict(region.patterns), model=body)


def artifact_view(artifact: Artifact) -> Artifact:
    """A copy of ``artifact`` for a ``byoc_runtime`` hook: editing its metadata changes no bundle."""
    return Artifact(artifact.target, artifact.format, artifact.data, copy.deepcopy(artifact.metadata))


def validate_artifact(artifact: Any, region: Region) -> Artifact:
    """The artifact a ``byoc_codegen`` hook returned, checked and normalised (metadata gets the
    region's input/output names); ``TypeError``/``ValueError`` say what is wrong."""
    if not isinstance(artifact, Artifact):
        raise TypeError(f"returned {type(artifact).__name__}, expected byoc.contract.Artifact")
    if not isinstance(artifact.data, (bytes, bytearray)):
        raise TypeError(f"Artifact.data is {type(artifact.data).__name__}, expected bytes")
    if not isinstance(artifact.target, str) or not isinstance(artifact.format, str):
        # a bundle records both as text and refuses anything else: what saves must load
        raise TypeError(f"Artifact.target/format are {type(artifact.target).__name__}/"
                        f"{type(artifact.format).__name__}, expected str")
    meta = dict(artifact.metadata)
    meta.setdefault("inputs", [v.name for v in region.inputs])
    meta.setdefault("outputs", [v.name for v in region.outputs])
    json.dumps(meta, sort_keys=True)  # TypeError if not JSON-serialisable
    if list(meta["inputs"]) != [v.name for v in region.inputs] or list(meta["outputs"]) != [
        v.name for v in region.outputs
    ]:
        raise ValueError("Artifact.metadata inputs/outputs do not match the region's")
    return Artifact(artifact.target, str(artifact.format), bytes(artifact.data), meta)


def output_specs(values: Sequence[ir.Value]) -> list[tuple[str, np.dtype | None, tuple | None]]:
    """``(name, dtype, dims)`` per declared region output; ``None`` where not declared, a dim ``None``
    where symbolic."""
    specs = []
    for v in values:
        try:
            dtype = np.dtype(v.dtype.numpy()) if v.dtype is not None else None
        except (TypeError, ValueError, AttributeError):
            dtype = None
        dims = None if v.shape is None else tuple(d if isinstance(d, int) else None for d in v.shape)
        specs.append((v.name, dtype, dims))
    return specs


class RegionOutputError(PluginError):
    """A region's callable returned, but not what the region declares (count, type, dtype or
    shape): the plugin's runtime accepted inputs or produced results it should have refused."""


def check_outputs(outs: Any, specs: Sequence[tuple[str, Any, Any]], plugin: str, region_name: str) -> list[np.ndarray]:
    """Every output a region's callable returned must be an array of its declared dtype and shape;
    returns them, a numpy scalar (what numpy gives for a 0-d result) as the 0-d array it stands for."""
    where = f"plugin {plugin!r}, hook byoc_runtime: region {region_name!r}"
    if not isinstance(outs, (list, tuple)) or len(outs) != len(specs):
        raise RegionOutputError(
            f"{where} returned {type(outs).__name__} of length {len(outs) if hasattr(outs, '__len__') else '?'}, "
            f"expected a sequence of {len(specs)} arrays"
        )
    checked = []
    for out, (name, dtype, dims) in zip(outs, specs):
        if isinstance(out, np.generic):
            out = np.asarray(out)
        if not isinstance(out, np.ndarray):
            raise RegionOutputError(f"{where}: output {name!r} is {type(out).__name__}, expected a numpy array")
        if dtype is not None and out.dtype != dtype:
            raise RegionOutputError(f"{where}: output {name!r} is {out.dtype}, declared {dtype}")
        if dims is not None and (out.ndim != len(dims) or any(d is not None and d != n for d, n in zip(dims, out.shape))):
            declared = [d if d is not None else "?" for d in dims]
            raise RegionOutputError(f"{where}: output {name!r} has shape {list(out.shape)}, declared {declared}")
        checked.append(out)
    return checked


def guarded_runtime(fn: Callable, plugin: str, region_name: str, target: str,
                    outputs: Sequence[ir.Value] | int) -> Callable:
    """Wrap a vendor callable so a failure at run time names plugin, hook and region, and every
    output is checked against the region's declared outputs (dtype, rank, static dims).

    A ``BaseException`` a plugin raises (``SystemExit`` from ``sys.exit()`` included) becomes a
    :class:`PluginError`; ``KeyboardInterrupt`` is let through.
    """
    specs = [(f"#{i}", None, None) for i in range(outputs)] if isinstance(outputs, int) else output_specs(outputs)

    def run(*args):
        try:
            outs = fn(*args)
        except (ByocError, KeyboardInterrupt):
            raise
        except BaseException as exc:
            raise PluginError(
                f"plugin {plugin!r}, hook byoc_runtime: the callable for region {region_name!r} (target {target!r}) "
                f"raised {type(exc).__name__}: {exc}"
            ) from exc
        return check_outputs(outs, specs, plugin, region_name)

    return run


def read_only(a: Any) -> Any:
    """A read-only view of an array (other values as they are)."""
    if isinstance(a, np.ndarray) and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


#: default limit for one codegen or runtime hook call, seconds
HOOK_TIMEOUT = 600.0


def codegen_region(registry: Registry, region: Region, options: Mapping[str, Any], faults: _Faults,
                   artifact: Artifact | None = None,
                   hook_timeout: float | None = HOOK_TIMEOUT) -> CompiledRegion | None:
    """Run the codegen (unless ``artifact`` is given) and runtime hooks; ``None`` on a plugin fault."""
    if artifact is None:
        artifact = generate_artifact(registry, region, options, faults, hook_timeout)
        if artifact is None:
            return None
    made = create_runtime(registry, region, artifact, options, faults, hook_timeout)
    if made is None:
        return None
    plugin_rt, fn = made
    return CompiledRegion(region, artifact, plugin_rt, guarded_runtime(fn, plugin_rt, region.name, region.target,
                                                                       region.outputs), runtime_note(fn))


def runtime_note(fn: Any) -> str | None:
    """The runtime callable's ``note`` where it is text (anything else, or a raise, is no note)."""
    try:
        note = getattr(fn, "note", None)
    except Exception:  # noqa: BLE001 - a plugin's property: no note
        return None
    return note[:1000] if isinstance(note, str) and note else None


def generate_artifact(registry: Registry, region: Region, options: Mapping[str, Any], faults: Any,
                      hook_timeout: float | None = HOOK_TIMEOUT) -> Artifact | None:
    """The region's checked artifact from its target's ``byoc_codegen`` hook; ``None`` on a fault."""
    target = region.target
    plugin = registry.targets[target].plugin if target in registry.targets else ""
    plugin_cg, result, hook_faults = registry.call_first("byoc_codegen", timeout=hook_timeout, target=target,
                                                          region=plugin_view(region), options=options)
    for f in hook_faults:
        faults.add(f.plugin, f.hook, f"{f.message} (region {region.name!r})")
    if result is None:
        if not hook_faults:
            faults.add(plugin, "byoc_codegen", f"no plugin generated code for region {region.name!r}")
        return None
    try:
        return validate_artifact(result, region)
    except (TypeError, ValueError) as exc:
        faults.add(plugin_cg, "byoc_codegen", f"{exc} (region {region.name!r})")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # an Artifact (subclass) whose attributes raise
        faults.add(plugin_cg, "byoc_codegen", f"returned an artifact that raised {type(exc).__name__} when read: "
                   f"{exc} (region {region.name!r})")
    return None


def create_runtime(registry: Registry, region: Region, artifact: Artifact, options: Mapping[str, Any], faults: Any,
                   hook_timeout: float | None = HOOK_TIMEOUT) -> tuple[str, Callable] | None:
    """``(plugin, callable)`` from the target's ``byoc_runtime`` hook (unguarded); ``None`` on a fault."""
    target = region.target
    plugin = registry.targets[target].plugin if target in registry.targets else ""
    plugin_rt, fn, hook_faults = registry.call_first("byoc_runtime", timeout=hook_timeout, target=target,
                                                      artifact=artifact_view(artifact), options=options)
    for f in hook_faults:
        faults.add(f.plugin, f.hook, f"{f.message} (region {region.name!r})")
    if fn is None or not callable(fn):
        if fn is not None:
            faults.add(plugin_rt, "byoc_runtime", f"returned {type(fn).__name__}, expected a callable "
                       f"(region {region.name!r})")
        elif not hook_faults:
            faults.add(plugin, "byoc_runtime", f"no plugin provided a runtime for region {region.name!r}")
        return None
    return plugin_rt, fn


def detach_inputs(node: ir.Node) -> None:
    """Make ``node`` no user of its inputs, in time linear in their number (``Graph.remove`` with
    ``safe=True`` rebuilds the input tuple once per input: quadratic in fan-in, minutes for a Sum
    of 16,000 inputs)."""
    inputs = node.inputs
    remove_usage = getattr(ir.Value, "_remove_usage", None)
    if remove_usage is None or not hasattr(node, "_inputs"):  # pragma: no cover - another onnx_ir
        node.resize_inputs(0)
        return
    for index, value in enumerate(inputs):
        if value is not None:
            remove_usage(value, node, index)
    node._inputs = ()


def substitute_regions(compiled: Sequence[CompiledRegion]) -> None:
    """Replace each region's nodes with one ``byoc::Region`` node in their graph, keeping value names."""
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
        for old_node in region.nodes:
            detach_inputs(old_node)
        graph.remove(region.nodes, safe=True)
        region.outputs = list(node.outputs)
    for graph in touched.values():
        graph.sort()


def check_host_kernels(graph: ir.Graph) -> None:
    """Every node left on the host needs a host kernel; list all that lack one."""
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


def region_step_factory(compiled: Sequence[CompiledRegion]) -> Callable:
    """A ``build_plan`` step factory that runs each ``byoc::Region`` node with its region's callable."""
    by_name = {cr.region.name: cr for cr in compiled}

    def step_factory(node: ir.Node, spec):
        if node.domain == REGION_DOMAIN and node.op_type == REGION_OP:
            return by_name[node.name].fn
        return None

    return step_factory


__all__ = [
    "HOOK_TIMEOUT",
    "REGION_DOMAIN",
    "REGION_OP",
    "CompiledRegion",
    "check_host_kernels",
    "codegen_region",
    "create_runtime",
    "generate_artifact",
    "artifact_view",
    "check_outputs",
    "guarded_runtime",
    "output_specs",
    "read_only",
    "plugin_view",
    "region_step_factory",
    "substitute_regions",
    "validate_artifact",
]
