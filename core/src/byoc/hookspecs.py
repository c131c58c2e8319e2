"""Hook specifications: the contract between byoc and vendor plugins.

A plugin is a module (or object) with functions marked ``@byoc.hookimpl`` whose names match the
specs below, published through the entry-point group ``byoc``::

    [project.entry-points.byoc]
    mychip = "byoc_mychip.plugin"

Specs are listed in the order byoc calls them during ``byoc.compile``. Every hook that concerns
a target receives the target's name, so a third-party plugin can extend another vendor's target
(extra operators, extra patterns) by registering for that name.

A hook that raises, returns the wrong type, or claims nodes that would form a cycle is the
plugin's fault: byoc names the plugin, the hook and the node, warns, and falls back to the next
target or the host for that region (``strict=True`` raises :class:`byoc.PluginError` instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir

    from byoc.partition.types import Artifact, Pattern, Region, Rule, Target

#: version of this hook API; a plugin declares the version it was built for in its Target
HOOK_API_VERSION = 1

hookspec = pluggy.HookspecMarker("byoc")
hookimpl = pluggy.HookimplMarker("byoc")


# -- discovery -----------------------------------------------------------------------------


@hookspec
def byoc_register_targets(register: Callable[["Target"], None]) -> None:
    """Register the targets (devices) this plugin provides.

    Called once when the plugin manager is built.

    :param register: call it once per target with a :class:`byoc.partition.Target`
        (name, version, description, device kind, default options, numeric tolerance,
        default priority, and the hook API version the plugin was built for).
    """


# -- what a target can run -----------------------------------------------------------------


@hookspec
def byoc_register_operators(target: str, register: Callable[..., None]) -> None:
    """Declare which operators ``target`` supports.

    Called once per target; register only for targets you provide or extend.

    :param target: the target name being asked about.
    :param register: ``register(op_type, check=None, domain="")``. ``check(node, ctx)`` gets the
        :class:`onnx_ir.Node` and a :class:`byoc.partition.SupportContext` and returns ``True``/
        ``None`` to accept, or ``False`` or a string (the human-readable reason) to reject, e.g.
        ``"Conv: kernel 17x17 exceeds 16x16"``.
    """


@hookspec
def byoc_register_patterns(target: str, register: Callable[["Pattern"], None]) -> None:
    """Declare composite patterns for ``target``.

    :param target: the target name being asked about.
    :param register: call it with a :class:`byoc.partition.Pattern`; its name must be
        ``"<target>.<pattern>"``. A match becomes one composite node the target places as a unit.
    """


@hookspec
def byoc_register_rules(target: str, register: Callable[["Rule"], None]) -> None:
    """Declare partition rules for ``target``.

    :param target: the target name being asked about.
    :param register: call it with a :class:`byoc.partition.Rule`. A rule sees each candidate
        region and returns ``None``/``True`` (keep), ``False`` or a reason string (drop: the
        region goes to the next target in priority order, else the host), or a list of node
        lists (split).
    """


# -- vendor passes -------------------------------------------------------------------------


@hookspec
def byoc_pre_partition(target: str, model: "ir.Model", options: Mapping[str, Any]) -> None:
    """Rewrite the model before partitioning for ``target`` (in place).

    Runs after the shared passes, once per selected target in priority order. Keep the model
    semantically equal: byoc compares outputs against the host reference in its tests.

    :param target: the target about to be partitioned for.
    :param model: the whole model (``onnx_ir.Model``), mutable.
    :param options: the target's resolved options.
    """


@hookspec
def byoc_post_partition(target: str, region: "Region", options: Mapping[str, Any]) -> None:
    """Rewrite one outlined region of ``target`` before code generation (in place).

    :param target: the target that owns the region.
    :param region: the region; ``region.model`` is its standalone body (``onnx_ir.Model``).
    :param options: the target's resolved options.
    """


# -- code generation and runtime -----------------------------------------------------------


@hookspec(firstresult=True)
def byoc_codegen(target: str, region: "Region", options: Mapping[str, Any]) -> "Artifact | None":
    """Generate code for one region of ``target``.

    Stops at the first non-``None`` result. Must be deterministic: compiling the same model
    twice must give byte-identical artifacts.

    :param target: the target that owns the region.
    :param region: the outlined region (explicit inputs/outputs, bound constants).
    :param options: the target's resolved options.
    :returns: an :class:`byoc.partition.Artifact` (bytes + JSON-serialisable metadata), or
        ``None`` when this plugin does not generate code for ``target``.
    """


@hookspec(firstresult=True)
def byoc_runtime(target: str, artifact: "Artifact", options: Mapping[str, Any]) -> "Callable[..., Any] | None":
    """Turn an artifact into something byoc can call.

    Stops at the first non-``None`` result. Called at compile time and again when a saved
    bundle is loaded, so it must not depend on anything but the artifact and the options.

    :param target: the target that produced the artifact.
    :param artifact: what :func:`byoc_codegen` returned (or its copy read from a bundle).
    :param options: the target's resolved options.
    :returns: a callable taking the region's inputs as numpy arrays (in
        ``artifact.metadata["inputs"]`` order) and returning a sequence of arrays (in
        ``artifact.metadata["outputs"]`` order); ``None`` if not this plugin's target.
    """


@hookspec(firstresult=True)
def byoc_cost(target: str, region: "Region", options: Mapping[str, Any]) -> "float | None":
    """Estimate the run time of ``region`` on ``target`` in seconds (optional).

    Used when compiling with ``placement="cost"`` to choose between targets. Stops at the first
    non-``None`` result.

    :returns: estimated seconds, or ``None`` if unknown.
    """
