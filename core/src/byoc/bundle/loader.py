"""Loading a bundle: ``byoc.load(path)`` -> a :class:`~byoc.runtime.compiled.CompiledModel`.

The archive is read and verified first (:mod:`byoc.bundle.reader`); then ``compiled.json`` and
the host graph are checked against each other and against the manifest, every region's
artifact goes back through its plugin's ``byoc_runtime`` hook (:mod:`byoc.codegen`), and plugins
that are missing or of another version are refused, or with ``fallback="host"`` replaced by the
region's kept subgraph on the host.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import onnx_ir as ir

from byoc.arguments import check_load_args
from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.bundle.format import (
    COMPILED,
    HOST_GRAPH,
    MANIFEST,
    MAX_SPECIALISATIONS,
    SOURCE,
    SPEC_DIR,
    WEIGHTS,
    BundleFallbackWarning,
    expected_region_members,
    region_members,
)
from byoc.bundle.reader import Reader, parse_json, parse_onnx, require
from byoc.codegen import CompiledRegion, region_step_factory
from byoc.errors import BundleError, ByocError, OptionError
from byoc.partition.records import NodeRecord
from byoc.contract import REGION_DOMAIN, REGION_OP, Artifact, Region, Target
from byoc.contract.options import bundle_options
from byoc.plugins import PluginFault, get_registry
from byoc.runtime import jitinit
from byoc.runtime.compiled import CompiledModel
from byoc.runtime.isolation import compile_region
from byoc.plugins import recorded_host
from byoc.runtime.plan import build_plan
from byoc.runtime.specialize import ShapeKey, Specializer, has_symbolic_inputs, shape_key
from byoc.runtime.subgraph import host_callable

if TYPE_CHECKING:  # pragma: no cover
    from byoc.plugins import Registry


def _plugin_problem(registry: "Registry | None", target: str, need: Mapping[str, Any]) -> str | None:
    """Why ``registry`` cannot run ``target`` as the bundle needs it, or ``None``."""
    plugin, dist, version = need["plugin"], need["distribution"], need["version"]
    who = f"plugin {plugin!r}" + (f" (distribution {dist!r})" if dist else "")
    wanted = f"{who} version {version!r} for target {target!r}"
    if registry is None or (target not in registry.targets and target not in registry.conflicts
                            and target not in registry.incompatible):
        return f"the bundle needs {wanted}, which is not installed"
    if target in registry.conflicts:
        return f"the bundle needs {wanted}, but several plugins register it: {', '.join(registry.conflicts[target])}"
    if target in registry.incompatible:
        t = registry.incompatible[target]
        return (f"the bundle needs {wanted}, but the installed plugin {t.plugin!r} was built for another "
                f"hook API version ({t.api_version})")
    have = registry.targets[target]
    if have.version != version:
        return (f"the bundle needs {wanted}, but plugin {have.plugin!r} provides version {have.version!r}; "
                f"install version {version!r} or recompile")
    return None


def _records_from_json(rows: Any, origin: str) -> dict[str, NodeRecord]:
    fields = {f.name for f in dataclasses.fields(NodeRecord)}
    if not isinstance(rows, list):
        raise BundleError(f"{origin}: member {COMPILED!r}: 'records' is not a list")
    records = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or set(row) - fields:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed record {str(row)[:200]}")
        verdicts = row.get("verdicts", {})
        ok = all(isinstance(row.get(k), str) for k in ("name", "op_type", "device", "scope") if k in row) and all(
            row.get(k) is None or isinstance(row.get(k), str) for k in ("region", "pattern", "rule", "fallback")
        ) and isinstance(verdicts, dict) and all(v is None or isinstance(v, str) for v in verdicts.values())
        try:
            if not ok:
                raise TypeError("a field has the wrong type")
            rec = NodeRecord(**row)
        except TypeError as exc:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed record {row['name']!r}: {exc}") from None
        records[rec.name] = rec
    return records


def _dataclass_list(cls, rows: Any, what: str, origin: str) -> list:
    fields = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(rows, list):
        raise BundleError(f"{origin}: member {COMPILED!r}: {what!r} is not a list")
    out = []
    for row in rows:
        if not isinstance(row, dict) or set(row) - fields:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed entry in {what!r}: {str(row)[:200]}")
        try:
            out.append(cls(**row))
        except TypeError as exc:
            raise BundleError(f"{origin}: member {COMPILED!r}: malformed entry in {what!r}: {exc}") from None
    return out


_NUMBER = (int, float)
#: the JSON types of a target record's fields (``available`` is never written: it is the machine's)
_TARGET_FIELDS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("name", "version", "description", "device", "shape_policy", "plugin", "distribution",
                     "runtime_path"), (str,)),
    **dict.fromkeys(("rtol", "atol", "launch_overhead"), _NUMBER),
    **dict.fromkeys(("bandwidth", "flops"), (*_NUMBER, type(None))),
    **dict.fromkeys(("priority", "api_version", "max_specializations"), (int,)),
    "needs_calibration": (bool,), "jit": (bool,), "options": (dict, list), "quantization": (dict,),
    "shape_buckets": (list,),
}


def _targets_from_json(rows: Any, what: str, origin: str) -> list[Target]:
    """Target records, each field of its JSON type (a name that is a list would break every lookup)."""
    if isinstance(rows, list):
        for row in rows:
            if not isinstance(row, dict) or "name" not in row:
                continue  # _dataclass_list refuses it
            for key, value in row.items():
                kinds = _TARGET_FIELDS.get(key)
                if kinds is None or not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
                    raise BundleError(f"{origin}: member {COMPILED!r}: {what}: target field {key!r} is "
                                      f"{str(value)[:100]!r}, not what byoc writes")
    targets = _dataclass_list(Target, rows, what, origin)
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise BundleError(f"{origin}: member {COMPILED!r}: {what}: a target appears twice")
    return targets


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _map_of(value: Any, ok) -> bool:
    return isinstance(value, dict) and all(ok(v) for v in value.values())


def _estimates_ok(value: Any) -> bool:
    regions = value.get("regions", {}) if isinstance(value, dict) else None
    return isinstance(value, dict) and _is_number(value.get("total_s", 0)) and _map_of(
        regions, lambda r: isinstance(r, dict) and isinstance(r.get("target", ""), str)
        and _map_of(r.get("estimated_s", {}), lambda s: s is None or _is_number(s)))  # None: cannot take it


#: what the entries of ``compiled.json``'s options that byoc itself reads back (the report, the
#: command line) must look like; entries byoc does not know are left alone
_OPTION_CHECKS = {
    "targets": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "strict": lambda v: isinstance(v, bool),
    "placement": lambda v: isinstance(v, str),
    "host": lambda v: isinstance(v, str),
    "shape_policy": lambda v: _map_of(v, lambda x: isinstance(x, str)),
    "skipped_targets": lambda v: _map_of(v, lambda x: isinstance(x, str)),
    "calibration": lambda v: isinstance(v, dict) and all(
        isinstance(v.get(k), int) and not isinstance(v.get(k), bool) for k in ("samples", "tensors"))
        and isinstance(v.get("schemes", {}), dict),
    "placement_estimates": _estimates_ok,
}


def _check_options(options: dict[str, Any], fail, member: str) -> None:
    for key, ok in _OPTION_CHECKS.items():
        if key in options and not ok(options[key]):
            raise fail(f"member {member!r}: options.{key} is not what byoc writes "
                       f"({str(options[key])[:100]!r})")


class _QuietFaults:
    """Collects plugin faults of the runtime hook without warning (load decides what to say)."""

    strict = False

    def __init__(self) -> None:
        self.items: list[PluginFault] = []

    def add(self, plugin: str, hook: str, message: str, kind: str = "error") -> PluginFault:
        fault = PluginFault(plugin, hook, message, kind)
        self.items.append(fault)
        return fault


def load(
    path: str | os.PathLike,
    *,
    registry: "Registry | None" = None,
    fallback: str | None = None,
    budget: Budget | None = None,
    target_options: "Mapping[str, Mapping[str, Any]] | None" = None,
) -> CompiledModel:
    """Load a bundle written by :meth:`CompiledModel.save`.

    :param path: the bundle file.
    :param registry: the plugin registry (default: the installed plugins, consulted only when the
        bundle has offloaded regions).
    :param fallback: ``"host"`` runs each region whose plugin is missing, of another version, or
        cannot load its artifact on the host from the region's kept subgraph (with a
        :class:`BundleFallbackWarning`); ``None``/``"error"`` (default) raises :class:`BundleError`.
    :param budget: resource limits for reading (declared member sizes) and running.
    :param target_options: the loading user's options per target, validated like
        ``byoc.compile``'s. The bundle's own options are validated against the installed target's
        declared options; machine-local ones (cache folders, threads, device index) are never
        taken from the bundle, the loading user's (or the defaults) apply.
    :raises BundleError: unreadable, truncated or tampered bundle; unsafe or unexpected members;
        a missing or incompatible plugin (naming it and the version the bundle needs).
    :raises OptionError: a bundle or user option the installed target does not accept.
    """
    check_load_args(path, budget=budget, target_options=target_options)
    jitinit.start()  # Numba's start-up overlaps the reading and checking below
    if fallback not in (None, "error", "host"):
        raise OptionError(f"fallback must be None/'error' (refuse) or 'host', got {fallback!r}")
    reader = Reader(Path(os.fspath(path)), budget or DEFAULT_BUDGET)
    reader.read()
    return _Loader(reader, registry, fallback == "host", target_options).load()


class _Loader:
    """Builds the compiled model from the verified members of one bundle, step by step."""

    def __init__(self, reader: Reader, registry: "Registry | None", host_fallback: bool,
                 user_options: "Mapping[str, Mapping[str, Any]] | None" = None, prefix: str = ""):
        #: the loading user's options per target (machine-local options come only from here)
        self.user_options = dict(user_options or {})
        #: the members of this compiled model start with it ("" or a specialisation's SPEC_DIR)
        self.prefix = prefix
        self.reader = reader
        self.origin, self.members, self.manifest = reader.origin, reader.members, reader.manifest
        self.budget = reader.budget
        self.registry = registry
        self.allow_fallback = host_fallback
        #: target -> why this process cannot run it (only with fallback="host")
        self.unavailable: dict[str, str] = {}
        #: region name -> why it runs on the host
        self.host_fallback: dict[str, str] = {}

    def fail(self, msg: str) -> BundleError:
        return BundleError(f"{self.origin}: {msg}")

    def load(self) -> CompiledModel:
        self._read_compiled()
        specs = _Specialisations(self) if self.section is not None else None
        self._check_member_set(self.expected | (specs.expected if specs is not None else set()))
        cm = self.build()
        if specs is not None:
            cm.specializer = specs.build(cm)
        return cm

    def _check_member_set(self, expected: set[str]) -> None:
        for name in self.members:
            if name not in expected:
                raise self.fail(f"unexpected member {name!r}: the compiled model does not use it; refused")
        for name in sorted(expected):
            if name not in self.members:
                raise self.fail(f"member {name!r} is missing")

    def build(self) -> CompiledModel:
        """The compiled model from its checked ``compiled.json`` (:meth:`_read_compiled`)."""
        self._check_manifest_plugins()
        host_graph = self.prefix + HOST_GRAPH
        model = parse_onnx(self.members[host_graph], host_graph, self.origin, self.budget,
                           spent=self.reader.spent, pool=self.reader.pool)
        region_nodes = self._region_nodes(model)
        self._find_unavailable_targets()
        compiled_regions = self._regions(region_nodes)
        for rec in self.records.values():
            if rec.region in self.host_fallback:
                rec.device, rec.fallback = "host", self.host_fallback[rec.region]
        try:
            plan = build_plan(model.graph, budget=self.budget, step_factory=region_step_factory(compiled_regions),
                              fuse=True, host=self.host)
        except ByocError as exc:
            raise self.fail(f"member {host_graph!r}: {type(exc).__name__}: {exc}") from None
        cm = CompiledModel(
            model,
            plan,
            options=self.options,
            regions=compiled_regions,
            records=self.records,
            faults=self.faults,
            targets=self._live_targets(),
            budget=self.budget,
        )
        cm.host_fallback = self.host_fallback
        return cm

    def _read_compiled(self) -> None:
        """compiled.json: its structure, and the exact member set it implies (``self.expected``)."""
        members, origin, prefix = self.members, self.origin, self.prefix
        compiled, host_graph = prefix + COMPILED, prefix + HOST_GRAPH
        if compiled not in members:
            raise self.fail(f"member {compiled!r} is missing")
        if host_graph not in members:
            raise self.fail(f"member {host_graph!r} is missing")
        info = parse_json(members[compiled], compiled, origin)
        where = (compiled, info)
        self.options = require(where, "options", dict, origin)
        _check_options(self.options, self.fail, compiled)
        #: what runs the host's nodes: the executor the compile used, where this process has it
        self.host = recorded_host(self.options.get("host"), self.registry)
        self.regions_json = require(where, "regions", list, origin)
        self.expected = {compiled, host_graph} | expected_region_members(len(self.regions_json), prefix)
        self.section = info.get("specialisation")
        if self.section is not None and prefix:
            raise self.fail(f"member {compiled!r}: a specialisation cannot have specialisations of its own")
        self.targets = _targets_from_json(info.get("targets"), "targets", origin)
        faults = info.get("faults")
        if isinstance(faults, list) and not all(isinstance(row, dict) and all(isinstance(v, str) for v in row.values())
                                                for row in faults):
            raise self.fail(f"member {compiled!r}: a plugin fault whose fields are not all text")
        self.faults = _dataclass_list(PluginFault, faults, "faults", origin)
        self.records = _records_from_json(info.get("records"), origin)
        self.target_options = self.options.get("target_options", {})
        if not isinstance(self.target_options, dict):
            raise self.fail(f"member {self.prefix + COMPILED!r}: options.target_options is not an object")

    def _check_manifest_plugins(self, targets: "list[Target] | None" = None) -> None:
        """The manifest's plugins against compiled.json's targets."""
        plugins = self.manifest["plugins"]
        for t in self.targets if targets is None else targets:
            need = plugins.get(t.name)
            if need is None:
                raise self.fail(f"member {MANIFEST!r} names no plugin for target {t.name!r}")
            if (need["plugin"], need["version"]) != (t.plugin, t.version):
                raise self.fail(f"member {MANIFEST!r} says target {t.name!r} needs plugin {need['plugin']!r} "
                                f"version {need['version']!r}, but {self.prefix + COMPILED!r} records plugin {t.plugin!r} "
                                f"version {t.version!r}; tampered")
        self.target_by_name = {t.name: t for t in self.targets}

    def _region_nodes(self, model: ir.Model) -> dict[str, ir.Node]:
        """The host graph's ``byoc::Region`` nodes by region name; any other ``byoc`` node is refused."""
        region_nodes: dict[str, ir.Node] = {}
        for node in model.graph:
            if node.domain != REGION_DOMAIN:
                continue
            if node.op_type != REGION_OP:
                raise self.fail(f"member {self.prefix + HOST_GRAPH!r}: node {node.name!r} is {REGION_DOMAIN}::{node.op_type}; "
                                f"only {REGION_DOMAIN}::{REGION_OP} nodes may use the {REGION_DOMAIN!r} domain")
            attrs = node.attributes
            region_attr = attrs.get("region")
            target_attr = attrs.get("target")
            if region_attr is None or target_attr is None or region_attr.type != ir.AttributeType.STRING \
                    or target_attr.type != ir.AttributeType.STRING:
                raise self.fail(f"member {self.prefix + HOST_GRAPH!r}: region node {node.name!r} lacks string attributes "
                                "target/region")
            name = region_attr.value
            if name != node.name or name in region_nodes:
                raise self.fail(f"member {self.prefix + HOST_GRAPH!r}: region node {node.name!r} names region {name!r}; "
                                f"duplicate or inconsistent")
            region_nodes[name] = node
        return region_nodes

    def _find_unavailable_targets(self) -> None:
        """Which targets the regions use that this process cannot run (refused without fallback)."""
        plugins = self.manifest["plugins"]
        needed_targets = []
        for entry in self.regions_json:
            if isinstance(entry, dict) and isinstance(entry.get("target"), str):
                if entry["target"] not in needed_targets:
                    needed_targets.append(entry["target"])
        if needed_targets and self.registry is None:
            self.registry = get_registry()
        for target in needed_targets:
            need = plugins.get(target)
            if need is None:
                raise self.fail(f"member {MANIFEST!r} names no plugin for target {target!r}, which region(s) use")
            if target not in self.target_by_name:
                raise self.fail(f"member {self.prefix + COMPILED!r}: regions use target {target!r}, which the model was not "
                                "compiled for")
            problem = _plugin_problem(self.registry, target, need)
            if problem is not None:
                if not self.allow_fallback:
                    raise self.fail(f"{problem} (pass fallback='host' to run its regions on the host instead)")
                self.unavailable[target] = problem

    def _live_targets(self) -> list[Target]:
        """The installed plugin's target where it is the one the bundle needs, else the recorded one."""
        registry = self.registry
        return [
            registry.targets[t.name] if registry is not None and t.name in registry.targets
            and t.name not in self.unavailable and registry.targets[t.name].version == t.version else t
            for t in self.targets
        ]

    def _regions(self, region_nodes: Mapping[str, ir.Node]) -> list[CompiledRegion]:
        compiled_regions = []
        seen_regions: set[str] = set()
        for i, entry in enumerate(self.regions_json):
            region, artifact, plugin = self._region(i, entry, region_nodes, seen_regions)
            compiled_regions.append(self._runtime(region, artifact, plugin))
        for name in region_nodes:
            if name not in seen_regions:
                raise self.fail(f"member {self.prefix + HOST_GRAPH!r}: Region node {name!r} has no region in {self.prefix + COMPILED!r}")
        return compiled_regions

    def _region(self, i: int, entry: Any, region_nodes: Mapping[str, ir.Node],
                seen_regions: set[str]) -> tuple[Region, Artifact, str]:
        """Region ``i`` of compiled.json with its artifact and subgraph, checked against its node."""
        if not isinstance(entry, dict):
            raise self.fail(f"member {self.prefix + COMPILED!r}: region entry #{i} is not an object")
        name, target, plugin = entry.get("name"), entry.get("target"), entry.get("plugin")
        patterns, refs = entry.get("patterns", {}), entry.get("members")
        if not (isinstance(name, str) and isinstance(target, str) and isinstance(plugin, str)
                and isinstance(patterns, dict) and all(isinstance(v, str) for v in patterns.values())):
            raise self.fail(f"member {self.prefix + COMPILED!r}: region entry #{i} is malformed")
        bin_name, json_name, onnx_name = region_members(i, self.prefix)
        if refs != {"artifact": bin_name, "metadata": json_name, "subgraph": onnx_name}:
            raise self.fail(f"member {self.prefix + COMPILED!r}: region {name!r} refers to members {refs!r}, expected "
                            f"{bin_name!r}, {json_name!r}, {onnx_name!r}")
        if name in seen_regions:
            raise self.fail(f"member {self.prefix + COMPILED!r}: region {name!r} appears twice")
        seen_regions.add(name)
        node = region_nodes.get(name)
        if node is None:
            raise self.fail(f"member {self.prefix + HOST_GRAPH!r} has no Region node for region {name!r}")
        if node.attributes["target"].value != target:
            raise self.fail(f"member {self.prefix + HOST_GRAPH!r}: region node {name!r} says target "
                            f"{node.attributes['target'].value!r}, {self.prefix + COMPILED!r} says {target!r}")
        meta_json = parse_json(self.members[json_name], json_name, self.origin)
        metadata = meta_json.get("metadata")
        if not isinstance(meta_json.get("target"), str) or not isinstance(meta_json.get("format"), str) \
                or not isinstance(metadata, dict):
            raise self.fail(f"member {json_name!r}: malformed artifact metadata for region {name!r}")
        artifact = Artifact(meta_json["target"], meta_json["format"], self.members[bin_name], metadata)
        body = parse_onnx(self.members[onnx_name], onnx_name, self.origin, self.budget, self.members[bin_name],
                          self.reader.spent, self.reader.pool)
        in_names = [v.name for v in node.inputs if v is not None]
        out_names = [v.name for v in node.outputs]
        if len(in_names) != len(node.inputs) or [v.name for v in body.graph.inputs] != in_names \
                or [v.name for v in body.graph.outputs] != out_names:
            raise self.fail(f"member {onnx_name!r}: the subgraph's inputs/outputs do not match region node "
                            f"{name!r}")
        if list(artifact.input_names) != in_names or list(artifact.output_names) != out_names:
            raise self.fail(f"member {json_name!r}: the artifact's inputs/outputs do not match region node "
                            f"{name!r}")
        region = Region(name=name, target=target, nodes=list(body.graph), inputs=list(node.inputs),
                        outputs=list(node.outputs), patterns=dict(patterns), model=body)
        return region, artifact, plugin

    def _runtime(self, region: Region, artifact: Artifact, plugin: str) -> CompiledRegion:
        """The region's callable from its plugin's runtime hook, or its kept subgraph on the host."""
        name, target = region.name, region.target
        opts = self.target_options.get(target, {})
        if not isinstance(opts, dict):
            raise self.fail(f"member {self.prefix + COMPILED!r}: options for target {target!r} are not an object")
        why = self.unavailable.get(target)
        if why is None:
            # the installed target's schema judges the bundle's options; machine-local ones come
            # from the loading user
            opts = bundle_options(self.registry.targets[target], opts, self.user_options.get(target),
                                  origin=f"{self.origin}: member {self.prefix + COMPILED!r}")
            hook_faults = _QuietFaults()
            cr = compile_region(self.registry, region, opts, hook_faults, artifact=artifact)
            if cr is not None:
                return cr
            fault = hook_faults.items[-1] if hook_faults.items else None
            why = f"{fault}" if fault is not None else "no plugin provided a runtime"
            why = f"plugin {plugin!r} cannot load the artifact of region {name!r}: {why}"
            if not self.allow_fallback:
                raise self.fail(why)
        try:
            fn = host_callable(region.model, self.budget)
        except ByocError as exc:
            raise self.fail(f"region {name!r} cannot run on the host ({why}): {exc}") from None
        # stacklevel: this method, _regions, _Loader.load, load, the caller of byoc.load
        warnings.warn(f"{self.origin}: region {name!r} runs on the host from its kept subgraph: {why}",
                      BundleFallbackWarning, stacklevel=5)
        self.host_fallback[name] = why
        return CompiledRegion(region, artifact, plugin, fn)


_SETTINGS = {"passes", "strict", "placement", "hook_timeout", "target_options"}


class _Specialisations:
    """``compiled.json``'s ``specialisation`` section, checked, and the specialisations it names
    (each loaded like the model itself, from its own members: :data:`byoc.bundle.format.SPEC_DIR`)."""

    def __init__(self, parent: _Loader):
        self.parent = parent
        section, fail = parent.section, parent.fail
        where = f"member {COMPILED!r}: specialisation"
        if not isinstance(section, dict) or set(section) != {"source", "targets", "static_targets", "settings",
                                                             "shapes"}:
            raise fail(f"{where} is malformed (an object with source, targets, static_targets, settings, shapes)")
        if section["source"] != SOURCE:
            raise fail(f"{where}.source is {str(section['source'])[:100]!r}, expected {SOURCE!r}")
        self.targets = _targets_from_json(section["targets"], "specialisation.targets", parent.origin)
        self.names = [t.name for t in self.targets]
        static = section["static_targets"]
        if not self.names or len(set(self.names)) != len(self.names) or not isinstance(static, list) or not static \
                or len(set(map(str, static))) != len(static) or not all(isinstance(n, str) and n in self.names
                                                                         for n in static):
            raise fail(f"{where}: targets / static_targets are malformed or inconsistent")
        self.static = static
        parent._check_manifest_plugins(self.targets)
        self.settings = _check_settings(section["settings"], self.names, lambda m: fail(f"{where}.settings: {m}"))
        shapes = section["shapes"]
        if not isinstance(shapes, list) or len(shapes) > MAX_SPECIALISATIONS:
            raise fail(f"{where}.shapes is not a list of at most {MAX_SPECIALISATIONS} entries")
        self.expected = {SOURCE, WEIGHTS}
        parent.reader.pool = parent.members.get(WEIGHTS)
        self.keys: list[ShapeKey] = []
        self.children: list[_Loader] = []
        for j, entry in enumerate(shapes):
            prefix = SPEC_DIR.format(j)
            key = _shape_entry(entry, prefix, lambda m, j=j: fail(f"{where}.shapes[{j}]: {m}"))
            if key in self.keys:
                raise fail(f"{where}.shapes[{j}]: input shapes {dict(key)} appear twice")
            child = _Loader(parent.reader, parent.registry, parent.allow_fallback, parent.user_options, prefix)
            child._read_compiled()
            if [t.name for t in child.targets] != self.names:
                raise fail(f"member {prefix + COMPILED!r}: targets {[t.name for t in child.targets]} are not the "
                           f"specialisation's {self.names}")
            self.expected |= child.expected
            self.keys.append(key)
            self.children.append(child)

    def build(self, base: CompiledModel) -> Specializer:
        """The loaded specialisations, and a compile for shapes first seen after loading."""
        p = self.parent
        registry = p.registry if p.registry is not None else get_registry()
        cache: dict[ShapeKey, CompiledModel] = {}
        for j, (key, child) in enumerate(zip(self.keys, self.children)):
            child.registry = registry
            scm = child.build()
            _check_shapes(key, scm, lambda m, j=j: p.fail(f"member {SPEC_DIR.format(j) + COMPILED!r}: {m}"))
            cache[key] = scm
            p.host_fallback.update({f"{SPEC_DIR.format(j)}{k}": v for k, v in child.host_fallback.items()})
        proto = ir.to_proto(parse_onnx(p.members[SOURCE], SOURCE, p.origin, p.budget, spent=p.reader.spent,
                                       pool=p.reader.pool))
        source_inputs = {v.name for v in proto.graph.input}
        if not has_symbolic_inputs(proto) or source_inputs != {s.name for s in base.inputs}:
            raise p.fail(f"member {SOURCE!r}: not the model's source (its inputs {sorted(source_inputs)[:20]} are "
                         "not symbolic or not the model's)")
        problems = {n: _plugin_problem(registry, n, p.manifest["plugins"][n]) for n in self.names}
        problems = {n: why for n, why in problems.items() if why is not None}
        if problems and not p.allow_fallback:
            raise p.fail(f"{next(iter(problems.values()))} (pass fallback='host' to run without it)")
        live = [registry.targets[t.name] if t.name not in problems else t for t in self.targets]
        compile_fn = None
        if not problems:
            origin = f"{p.origin}: member {COMPILED!r}: specialisation.settings"
            options = {t.name: bundle_options(t, self.settings["target_options"].get(t.name),
                                              p.user_options.get(t.name), origin=origin) for t in live}
            # imported here: the compile driver imports the runtime, which imports the bundle writer
            from byoc.compiler import settings_from_recipe, shape_compiler

            compile_shapes = shape_compiler(options, settings_from_recipe(registry, p.budget, self.settings, p.host))

            def compile_fn(q):
                return compile_shapes(q, live)
        recipe = {**self.settings, "calibrated": False}
        static = [t for t in live if t.name in self.static]
        return Specializer(base, proto, static, compile_fn, targets=live, recipe=recipe, cache=cache)


def _check_settings(settings: Any, names: list[str], fail) -> dict[str, Any]:
    """The compile settings of a specialisation section (plain data; see ``specialise``'s recipe)."""
    from byoc.passes import PASSES
    from byoc.partition.placement import PLACEMENTS

    if not isinstance(settings, dict) or set(settings) != _SETTINGS:
        raise fail(f"expected an object with {sorted(_SETTINGS)}")
    passes, timeout, options = settings["passes"], settings["hook_timeout"], settings["target_options"]
    if passes is not None and not (isinstance(passes, list) and all(isinstance(x, str) and x in PASSES
                                                                     for x in passes)):
        raise fail(f"passes must be null or a list of pass names ({list(PASSES)})")
    if not isinstance(settings["strict"], bool):
        raise fail("strict is not a boolean")
    if settings["placement"] not in PLACEMENTS:
        raise fail(f"placement must be one of {list(PLACEMENTS)}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or not math.isfinite(timeout) or timeout <= 0):
        raise fail("hook_timeout must be null or a positive number of seconds")
    if not isinstance(options, dict) or set(options) - set(names) or \
            not all(isinstance(v, dict) for v in options.values()):
        raise fail(f"target_options must map some of the targets {names} to objects")
    return settings


def _shape_entry(entry: Any, prefix: str, fail) -> ShapeKey:
    """One ``shapes`` entry: ``{"inputs": {name: [dims]}, "members": prefix}`` -> its cache key."""
    if not isinstance(entry, dict) or set(entry) != {"inputs", "members"} or entry["members"] != prefix:
        raise fail(f"expected {{'inputs': {{name: [dims]}}, 'members': {prefix!r}}}")
    inputs = entry["inputs"]
    if not isinstance(inputs, dict) or not inputs or len(inputs) > 100_000:
        raise fail("inputs is not a non-empty object")
    for name, dims in inputs.items():
        if not isinstance(dims, list) or len(dims) > 64 or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in dims):
            raise fail(f"input {name[:100]!r}: dims must be a list of at most 64 counts")
    return shape_key(inputs)


def _check_shapes(key: ShapeKey, cm: CompiledModel, fail) -> None:
    """A loaded specialisation is compiled for exactly the input shapes it is filed under."""
    specs = {s.name: s for s in cm.inputs}
    given = dict(key)
    missing = [s.name for s in cm.inputs if not s.optional and s.name not in given]
    if missing or set(given) - set(specs):
        raise fail(f"filed under inputs {sorted(given)[:20]}, but its inputs are {sorted(specs)[:20]}")
    for name, dims in key:
        shape = specs[name].shape
        if shape is None or tuple(shape) != dims:
            raise fail(f"filed under input {name!r} of shape {list(dims)}, but compiled for "
                       f"{list(shape) if shape is not None else 'unknown rank'}")


__all__ = ["BundleFallbackWarning", "load"]
