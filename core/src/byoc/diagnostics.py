"""``byoc.info(model)`` and ``byoc.doctor()``: what ``byoc info`` and ``byoc doctor`` print, as data.

Both return a dataclass with the facts, a ``format()`` for the text the command prints, and
``to_json()``; neither prints anything.
"""

from __future__ import annotations

import collections
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from byoc.arguments import file_path
from byoc.contract import environment as _env
from byoc.errors import ModelLoadError

if TYPE_CHECKING:  # pragma: no cover
    from byoc.budget import Budget
    from byoc.frontend.loader import ModelLike
    from byoc.plugins import Registry


# -- info -----------------------------------------------------------------------------------------


@dataclass
class TensorInfo:
    """A graph input or output: ``shape`` entries are ints, dimension names, or ``None`` (unknown)."""

    name: str
    dtype: str | None
    shape: list[int | str | None] | None

    def format(self) -> str:
        dims = "[?]" if self.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.name}: {self.dtype or '?'} {dims}"


@dataclass
class ModelInfo:
    """What :func:`info` finds in a model (nothing is compiled)."""

    name: str
    opset: dict[str, int]
    ir_version: int
    producer: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    nodes: int
    initializers: int
    #: operator (``op`` or ``domain::op``) -> node count, subgraphs included, most frequent first
    operators: dict[str, int]
    #: operators the host cannot run (no kernel), and the nodes using them
    unsupported_operators: list[str] = field(default_factory=list)
    unsupported_nodes: list[str] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        """``True`` when the host has a kernel for every node (any model then runs, all on the host)."""
        return not self.unsupported_nodes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"model: {self.name}",
                 f"opset: {self.opset}   ir_version: {self.ir_version}   producer: {self.producer or '-'}",
                 "inputs:"]
        lines += [f"  {t.format()}" for t in self.inputs]
        lines.append("outputs:")
        lines += [f"  {t.format()}" for t in self.outputs]
        lines.append(f"nodes: {self.nodes}   initializers: {self.initializers}")
        lines.append("operators:")
        bad = set(self.unsupported_operators)
        for op, n in self.operators.items():
            lines.append(f"  {op:<28} {n:>6}{'   (unsupported)' if op in bad else ''}")
        if self.unsupported_nodes:
            shown = ", ".join(self.unsupported_nodes[:20])
            more = " ..." if len(self.unsupported_nodes) > 20 else ""
            lines.append(f"unsupported nodes ({len(self.unsupported_nodes)}): {shown}{more}")
        return "\n".join(lines) + "\n"


def _tensor(value: Any) -> TensorInfo:
    shape = None
    if value.shape is not None:
        shape = [d if isinstance(d, int) else (str(d.value) if d.value else None) for d in value.shape]
    return TensorInfo(value.name, value.dtype.name if value.dtype else None, shape)


def info(model: "ModelLike", *, budget: "Budget | None" = None) -> ModelInfo:
    """Inputs, outputs, operator counts and the operators the host cannot run, of an ONNX model.

    :param model: a path, bytes, ``onnx.ModelProto`` or ``onnx_ir.Model`` (read and validated as
        :func:`byoc.compile` does, but not compiled).
    :raises ModelLoadError: the model cannot be read (and the other frontend errors).
    """
    import onnx_ir as ir

    from byoc.frontend import load_model
    from byoc.kernels import is_supported

    ir_model = load_model(model, budget=budget, require_kernels=False)
    graph = ir_model.graph
    counts: collections.Counter[str] = collections.Counter()
    supported: dict[str, bool] = {}
    unsupported_nodes = []
    for node in ir.traversal.RecursiveGraphIterator(graph):
        key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] += 1
        if key not in supported:
            supported[key] = is_supported(node.op_type, node.domain)
        if not supported[key]:
            unsupported_nodes.append(node.name or key)
    if isinstance(model, (str, os.PathLike)):
        name = file_path(model, "the model path", ModelLoadError)
    else:
        name = graph.name or type(model).__name__
    return ModelInfo(
        name=name,
        opset=dict(graph.opset_imports),
        ir_version=int(ir_model.ir_version),
        producer=ir_model.producer_name or "",
        inputs=[_tensor(v) for v in graph.inputs if v.name not in graph.initializers],
        outputs=[_tensor(v) for v in graph.outputs],
        nodes=sum(counts.values()),
        initializers=len(graph.initializers),
        operators=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        unsupported_operators=sorted(op for op, ok in supported.items() if not ok),
        unsupported_nodes=unsupported_nodes,
    )


# -- doctor ---------------------------------------------------------------------------------------


@dataclass
class PluginInfo:
    """A loaded plugin: its distribution (``""`` when registered in-process) and its targets."""

    name: str
    distribution: str
    version: str
    targets: list[str]


@dataclass
class Problem:
    """One thing wrong with the installed plugins.

    ``kind``: ``"broken"`` (a plugin failed to import or register), ``"duplicate"`` (a target
    registered by several plugins), ``"incompatible"`` (a target built for another hook API
    version) or ``"incompatible-plugin"`` (a plugin written against a removed hook API: it imports
    a module of hook API 1).
    """

    kind: str
    message: str
    plugin: str = ""
    target: str = ""


@dataclass
class DoctorReport:
    """What :func:`doctor` finds; ``ok`` is ``True`` when there is no problem."""

    hook_api_version: int
    #: the value of BYOC_PLUGINS (``None`` when unset: every installed plugin loads)
    plugins_env: str | None
    plugins: list[PluginInfo]
    usable_targets: list[str]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def format(self) -> str:
        env = self.plugins_env
        lines = [f"hook API version: {self.hook_api_version}"
                 + (f"   BYOC_PLUGINS={env!r} restricts the plugins loaded" if env is not None else ""),
                 f"plugins loaded ({len(self.plugins)}):"]
        for p in self.plugins:
            dist = f"{p.distribution} {p.version}".strip() or "(in-process)"
            lines.append(f"  {p.name:<20} {dist:<28} targets: {', '.join(p.targets) or '-'}")
        lines.append(f"usable targets: {', '.join(self.usable_targets) or 'none'}")
        headings = {"broken": "broken plugins", "duplicate": "duplicate targets", "incompatible": "incompatible targets",
                    "incompatible-plugin": "incompatible plugins"}
        for kind, heading in headings.items():
            found = [p for p in self.problems if p.kind == kind]
            if found:
                lines.append(f"\n{heading} ({len(found)}):")
                lines += [f"  {p.message}" for p in found]
        lines.append(f"\n{len(self.problems)} problem(s) found" if self.problems else "\nno problems found")
        return "\n".join(lines) + "\n"


def doctor(registry: "Registry | None" = None) -> DoctorReport:
    """Check the installed plugins: broken (import or registration failed), duplicate targets,
    targets built for another hook API version.

    :param registry: the registry to check (default: the installed plugins, as ``byoc.compile``
        sees them, ``BYOC_PLUGINS`` included).
    """
    from byoc.contract import hookspecs
    from byoc.plugins import get_registry

    registry = registry if registry is not None else get_registry()
    plugins = [PluginInfo(name, dist, version, [t.name for t in registry.targets.values() if t.plugin == name])
               for name, (dist, version) in sorted(registry.distributions.items())]
    problems = [Problem("broken", f"[{f.kind}] {f}", plugin=f.plugin)
                for f in registry.faults if f.kind not in ("duplicate", "api-version")]
    for name, owners in sorted(registry.conflicts.items()):
        dists = [" ".join(registry.distributions.get(o, ("", ""))).strip() or "in-process" for o in owners]
        problems.append(Problem(
            "duplicate",
            f"target {name!r} is registered by plugins " + ", ".join(f"{o!r} ({d})" for o, d in zip(owners, dists))
            + "; uninstall one or restrict with BYOC_PLUGINS",
            plugin=owners[0] if owners else "", target=name))
    for name, t in sorted(registry.incompatible.items()):
        dist = f" ({t.distribution})" if t.distribution else ""
        problems.append(Problem(
            "incompatible",
            f"target {name!r} of plugin {t.plugin!r}{dist} was built for hook API version {t.api_version}; "
            f"byoc provides {hookspecs.HOOK_API_VERSION}: upgrade the plugin",
            plugin=t.plugin, target=name))
    problems += [Problem("incompatible-plugin", str(f), plugin=f.plugin)
                 for f in registry.faults if f.kind == "api-version" and f.hook == "import"]
    return DoctorReport(
        hook_api_version=hookspecs.HOOK_API_VERSION,
        plugins_env=_env.get("BYOC_PLUGINS", None),
        plugins=plugins,
        usable_targets=[t.name for t in registry.ordered_targets()],
        problems=problems,
    )


__all__ = ["DoctorReport", "ModelInfo", "PluginInfo", "Problem", "TensorInfo", "doctor", "info"]
