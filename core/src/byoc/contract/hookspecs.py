"""Hook specifications: the contract between byoc and vendor plugins (hook API version 2).

A plugin is a module (or object) with functions marked ``@byoc.hookimpl`` whose names match the
specs below, published through the entry-point group ``byoc``::

    [project.entry-points.byoc]
    mychip = "byoc_mychip.plugin"

Specs are listed in the order byoc calls them during ``byoc.compile``.

**Scoped calls.** Every hook below except :func:`byoc_register_targets` concerns one target,
and byoc calls it only in the plugin that registered that target and in plugins that declared
they extend it (``extend(name)`` in :func:`byoc_register_targets`). A plugin therefore never
checks the target name; the ``target`` argument is there for information (a plugin extending
several targets may use it) and, like every argument, may be left out of an implementation.

**Order.** Implementations of one hook run in pluggy's order: last registered first, with
``tryfirst=True`` / ``trylast=True`` honoured; a ``firstresult`` hook stops at the first
non-``None`` result. Hook wrappers (``hookwrapper=True`` / ``wrapper=True``) are refused when
the plugin is registered (``byoc doctor`` says so): every implementation is called on its own, so
that a fault names its plugin.

**Faults.** A hook that raises, returns the wrong type, or claims nodes that would form a cycle
is the plugin's fault: byoc names the plugin, the hook and the node, warns, and falls back to the
next target or the host for that region (``strict=True`` raises :class:`byoc.PluginError`).

**Options.** Hooks that take ``options`` receive the target's full option set, validated
against the target's declared :class:`byoc.contract.Option` list, defaults filled in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

import pluggy

from byoc.contract.types import HOOK_API_VERSION

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir

    from byoc.contract.host import HostExecutor
    from byoc.contract.types import Artifact, Pattern, Region, Rule, Target

hookspec = pluggy.HookspecMarker("byoc")
hookimpl = pluggy.HookimplMarker("byoc")


# -- discovery -----------------------------------------------------------------------------


@hookspec
def byoc_register_targets(register: Callable[["Target"], None], extend: Callable[[str], None]) -> None:
    """Register the targets (devices) this plugin provides, and the targets it extends.

    Called once when the plugin manager is built, in every plugin.

    :param register: call it once per target with a :class:`byoc.contract.Target` (name,
        version, description, device kind, declared options, numeric tolerance, default
        priority, and the hook API version the plugin was built for).
    :param extend: ``extend("other")`` declares that this plugin adds to target ``"other"``
        (registered by another plugin): byoc then calls this plugin's target-scoped hooks for
        ``"other"`` too (extra operators, patterns, rules, passes).
    """


@hookspec
def byoc_register_host_executor(register: Callable[["HostExecutor"], None]) -> None:
    """Offer a CPU executor for the host's nodes (the nodes no target took).

    Called once when the plugin manager is built, in every plugin. The installed executor with
    the highest priority serves every host node it accepts; byoc's reference kernels run the
    rest (see :mod:`byoc.contract.host`).

    :param register: call it with a :class:`byoc.contract.HostExecutor`.
    """


# -- what a target can run -----------------------------------------------------------------


@hookspec
def byoc_register_operators(target: str, register: Callable[..., None]) -> None:
    """Declare which operators ``target`` supports.

    Called once per target, in the plugins that own or extend it.

    :param target: the target being asked about.
    :param register: ``register(op_type, check=None, domain="")``. ``check(node, ctx)`` gets the
        :class:`onnx_ir.Node` and a :class:`byoc.contract.SupportContext` and returns ``True``/
        ``None`` to accept, or ``False`` or a string (the human-readable reason) to reject, e.g.
        ``"Conv: kernel 17x17 exceeds 16x16"``.
    """


@hookspec
def byoc_register_patterns(target: str, register: Callable[["Pattern"], None]) -> None:
    """Declare composite patterns for ``target``.

    :param target: the target being asked about.
    :param register: call it with a :class:`byoc.contract.Pattern`; its name must be
        ``"<target>.<pattern>"``. A match becomes one composite node the target places as a unit;
        byoc accepts it only when every member node has a "yes" verdict for the target and the
        pattern's ``check(match, ctx)`` accepts it.
    """


@hookspec
def byoc_register_rules(target: str, register: Callable[["Rule"], None]) -> None:
    """Declare partition rules for ``target``.

    :param target: the target being asked about.
    :param register: call it with a :class:`byoc.contract.Rule`. A rule ``fn(region, ctx)``
        sees each candidate region and the :class:`byoc.contract.SupportContext` (options,
        scratch state) and returns ``None``/``True`` (keep), ``False`` or a reason string (drop:
        the region goes to the next target in priority order, else the host), or a list of node
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
    :param options: the target's validated options.
    """


@hookspec
def byoc_post_partition(target: str, region: "Region", options: Mapping[str, Any]) -> None:
    """Rewrite one outlined region of ``target`` before code generation (in place).

    :param target: the target that owns the region.
    :param region: the region; ``region.model`` is its standalone body (``onnx_ir.Model``).
    :param options: the target's validated options.
    """


# -- code generation and runtime -----------------------------------------------------------


@hookspec(firstresult=True)
def byoc_codegen(target: str, region: "Region", options: Mapping[str, Any]) -> "Artifact | None":
    """Generate code for one region of ``target``.

    Stops at the first non-``None`` result. Must be deterministic: compiling the same model
    twice must give byte-identical artifacts.

    :param target: the target that owns the region.
    :param region: the outlined region (explicit inputs/outputs, bound constants).
    :param options: the target's validated options.
    :returns: a :class:`byoc.contract.Artifact` (bytes + JSON-serialisable metadata), or
        ``None`` to leave the region to another implementation (an extending plugin).
    """


@hookspec(firstresult=True)
def byoc_runtime(target: str, artifact: "Artifact", options: Mapping[str, Any]) -> "Callable[..., Any] | None":
    """Turn an artifact into something byoc can call.

    Stops at the first non-``None`` result. Called at compile time and again when a saved
    bundle is loaded, so it must not depend on anything but the artifact and the options (when
    loading, machine-local options come from the loading user, never from the bundle).

    :param target: the target that produced the artifact.
    :param artifact: what :func:`byoc_codegen` returned (or its copy read from a bundle).
    :param options: the target's validated options.
    :returns: a callable taking the region's inputs as numpy arrays (in
        ``artifact.metadata["inputs"]`` order) and returning a sequence of arrays (in
        ``artifact.metadata["outputs"]`` order), or ``None``. Its attribute ``note`` (a string,
        optional) is a line for the report on what the runtime did that the user should know,
        e.g. a vendor binary compiled for another machine and recompiled from the region here.
    """


@hookspec(firstresult=True)
def byoc_cost(target: str, region: "Region", options: Mapping[str, Any]) -> "float | None":
    """Estimate the run time of ``region`` on ``target`` in seconds (optional).

    Used when compiling with ``placement="cost"`` to choose between targets: byoc calls it on
    one-node regions (outlined, with their static shapes) and adds transfers
    (``Target.bandwidth``) and region starts (``Target.launch_overhead``) itself. Not called
    while the target's device is absent (``Target.available`` false): byoc's own model prices
    the emulation then. A raise or a value that is not a finite number >= 0 is the plugin's
    fault (byoc's model is used for that node). Stops at the first non-``None`` result.

    :param target: the target that would run the region.
    :param region: the outlined region.
    :param options: the target's validated options.
    :returns: estimated seconds, or ``None`` if unknown.
    """


__all__ = [
    "HOOK_API_VERSION",
    "byoc_codegen",
    "byoc_cost",
    "byoc_post_partition",
    "byoc_pre_partition",
    "byoc_register_host_executor",
    "byoc_register_operators",
    "byoc_register_patterns",
    "byoc_register_rules",
    "byoc_register_targets",
    "byoc_runtime",
    "hookimpl",
    "hookspec",
]
