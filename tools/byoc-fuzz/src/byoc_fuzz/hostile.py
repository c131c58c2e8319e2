"""Fuzz cases for bundles and plugins, used by :mod:`byoc_fuzz`.

*Bundle* cases save a small compiled model (one offloaded region of an in-process echo target;
or, for a static-shape target, a symbolic batch with two per-shape specialisations) and damage
the bundle: ``compiled.json``'s target options (unknown keys, wrong types, machine-local keys
such as ``cache_dir``), any field of a ``compiled.json`` (the specialisation section included),
its members (deleted, truncated, bit-flipped, renamed,
added, path-traversal names) and their compression (a member inflated to far past the budget),
with the manifest hashes recomputed most of the time (as a careful attacker would), then load
and run it. *Plugin* cases compile with a hostile in-process plugin: a random hook raises
(``sys.exit()`` and other ``BaseException``s included), returns the wrong type, edits what it was
given, or its runtime returns wrong outputs or writes into its inputs. Either must end in success
or a :class:`byoc.ByocError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import tempfile
import zipfile
from typing import Any

import numpy as np
from onnx import TensorProto, helper

import byoc
from byoc.contract import host_callable, region_model_bytes

OPS = ("Relu", "Neg", "Tanh", "Add")
HOOKS = ("operators", "pre_partition", "codegen", "runtime", "call")
BEHAVIOURS = ("exit", "base", "error", "wrong_type", "edit", "bad_output", "write_input", "none")


class _Base(BaseException):
    """A plugin's own ``BaseException`` subclass."""


def _raise(rng: random.Random) -> None:
    kind = rng.choice(["exit", "base", "error", "generator"])
    if kind == "exit":
        sys.exit(rng.choice([0, 1, "bye"]))
    if kind == "base":
        raise _Base("hostile")
    if kind == "generator":
        raise GeneratorExit
    raise rng.choice([RuntimeError, ValueError, KeyError, MemoryError, RecursionError])("hostile")


class HostilePlugin:
    """A target ``hostile`` whose ``hook`` misbehaves as ``behaviour`` says."""

    name = "hostile"

    def __init__(self, hook: str, behaviour: str, seed: int, shape_policy: str = "dynamic"):
        self.hook, self.behaviour, self.rng = hook, behaviour, random.Random(seed)
        self.shape_policy = shape_policy

    def _misbehave(self, hook: str, given: Any = None) -> Any:
        if hook != self.hook or self.behaviour == "none":
            return None
        b = self.behaviour
        if b in ("exit", "base", "error"):
            _raise(self.rng)
        if b == "edit" and given is not None:
            for node in list(getattr(given, "nodes", None) or getattr(getattr(given, "graph", None), "_nodes", [])):
                node.op_type = self.rng.choice(OPS)
            _raise(self.rng)
        if b == "wrong_type":
            return self.rng.choice([5, "x", object(), [1, 2], {"a": 1}])
        return None

    @byoc.hookimpl
    def byoc_register_targets(self, register):
        register(byoc.Target(self.name, version="1.0", device="npu", shape_policy=self.shape_policy))

    @byoc.hookimpl
    def byoc_register_operators(self, target, register):
        self._misbehave("operators")
        for op in OPS:
            register(op)

    @byoc.hookimpl
    def byoc_pre_partition(self, model, options):
        self._misbehave("pre_partition", model)

    @byoc.hookimpl
    def byoc_codegen(self, target, region, options):
        bad = self._misbehave("codegen", region)
        if bad is not None:
            return bad
        return byoc.Artifact(self.name, "onnx", region_model_bytes(region.model))

    @byoc.hookimpl
    def byoc_runtime(self, target, artifact, options):
        bad = self._misbehave("runtime")
        if bad is not None:
            return bad
        fn = host_callable(artifact.data)
        if self.hook != "call":
            return fn
        rng, behaviour = self.rng, self.behaviour

        def call(*args):
            if behaviour in ("exit", "base", "error"):
                _raise(rng)
            if behaviour == "write_input":
                args[0][...] = 0
            outs = fn(*args)
            if behaviour == "bad_output":
                return rng.choice([[np.zeros(3)], ["s"], [], None, [o.astype(np.float64) for o in outs],
                                   [o.reshape(-1) for o in outs]])
            return outs

        return call


def model(batch: int | str = 2) -> bytes:
    """Neg -> Relu -> Add on ``x`` of shape ``[batch, 4]`` (``"N"``: a symbolic batch)."""
    nodes = [helper.make_node("Neg", ["x"], ["a"], name="n0"), helper.make_node("Relu", ["a"], ["b"], name="n1"),
             helper.make_node("Add", ["b", "x"], ["y"], name="n2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def registry(plugin: HostilePlugin):
    from byoc.plugins import build_registry

    return build_registry([("hostile", plugin)], entry_points=False)


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.linspace(-2, 2, 4 * batch, dtype=np.float32).reshape(batch, 4)}


def plugin_case(rng: random.Random, budget) -> list[str]:
    """Compile and run with a hostile plugin; returns the mutation names."""
    hook, behaviour = rng.choice(HOOKS), rng.choice(BEHAVIOURS)
    reg = registry(HostilePlugin(hook, behaviour, rng.randrange(2**32)))
    cm = byoc.compile(model(), targets=["hostile"], registry=reg, budget=budget, strict=rng.random() < 0.2)
    feed = _feeds()
    before = feed["x"].copy()
    cm.run(feed)
    if not np.array_equal(feed["x"], before):
        raise AssertionError("a plugin runtime changed the caller's feed")
    return [f"plugin:{hook}:{behaviour}"]


_BASE: dict[str, dict[str, bytes]] = {}
_MIB = bytes(1 << 20)
#: the batch sizes a specialising bundle was run with before saving, and one it was not
SPEC_BATCHES = (2, 3)
NEW_BATCH = 5


def _base_members(policy: str = "dynamic") -> dict[str, bytes]:
    """The members of a saved bundle: ``dynamic``, one region; ``static``, a symbolic batch whose
    target specialises per shape (two specialisations: :data:`SPEC_BATCHES`)."""
    if policy not in _BASE:
        reg = registry(HostilePlugin("none", "none", 0, policy))
        cm = byoc.compile(model(2 if policy == "dynamic" else "N"), targets=["hostile"], registry=reg)
        for batch in SPEC_BATCHES if policy == "static" else ():
            cm.run(_feeds(batch))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.byoc")
            cm.save(path)
            with zipfile.ZipFile(path) as zf:
                _BASE[policy] = {i.filename: zf.read(i) for i in zf.infolist()}
    return dict(_BASE[policy])


_WEIRD = [None, True, 0, -1, 2**70, 1.5, float("nan"), "", "x" * 300, "../../etc", [], {}, {"a": [1]}, "/tmp"]


def _entry(topts: dict, name: str) -> dict:
    if not isinstance(topts.get(name), dict):
        topts[name] = {}
    return topts[name]


def _mutate_options(rng: random.Random, members: dict[str, bytes]) -> str:
    try:
        compiled = json.loads(members["compiled.json"])
        options = compiled.get("options", compiled)
    except (KeyError, ValueError, AttributeError):  # an earlier mutation deleted or damaged it
        return "options:skipped"
    if not isinstance(options, dict):
        return "options:skipped"
    if not isinstance(options.get("target_options"), dict):  # an earlier mutation replaced it
        options["target_options"] = {}
    topts = options["target_options"]
    choice = rng.choice(["value", "cache_dir", "unknown_target", "not_a_dict", "drop", "read_back"])
    if choice == "value":
        _entry(topts, "hostile")[rng.choice(["level", "threads", "x"])] = rng.choice(_WEIRD)
    elif choice == "cache_dir":
        _entry(topts, rng.choice(["hostile", "cpu", "jetson"]))["cache_dir"] = rng.choice(_WEIRD)
    elif choice == "unknown_target":
        topts[rng.choice(["nope", "", "cpu"])] = rng.choice(_WEIRD)
    elif choice == "not_a_dict":
        options["target_options"] = rng.choice(_WEIRD)
    elif choice == "read_back":  # entries the report and the command line read back
        key = rng.choice(["skipped_targets", "calibration", "placement_estimates", "shape_policy", "targets"])
        options[key] = rng.choice(_WEIRD + [{"regions": {"hostile_0": rng.choice(_WEIRD)}},
                                           {"samples": rng.choice(_WEIRD), "tensors": 1}, {"hostile": 5}])
    else:
        options.pop("target_options", None)
    members["compiled.json"] = json.dumps(compiled, allow_nan=True).encode()
    return f"options:{choice}"


def _mutate_member(rng: random.Random, members: dict[str, bytes]) -> str:
    name = rng.choice(sorted(members))
    choice = rng.choice(["delete", "truncate", "flip", "rename", "add", "traversal", "empty"])
    data = members[name]
    if choice == "delete":
        del members[name]
    elif choice == "truncate":
        members[name] = data[: rng.randrange(len(data) + 1)]
    elif choice == "flip" and data:
        i = rng.randrange(len(data))
        members[name] = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    elif choice == "rename":
        members[name + rng.choice(["x", "/", "\\", ".."])] = members.pop(name)
    elif choice == "add":
        members[f"extra{rng.randrange(9)}.bin"] = os.urandom(rng.randrange(64))
    elif choice == "traversal":
        members[rng.choice(["../evil", "/abs", "a/../../b", "C:\\x"])] = b"x"
    else:
        members[name] = b""
    return f"member:{choice}:{name}"


def _json_paths(obj: Any, prefix: tuple = ()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            yield from _json_paths(v, prefix + (i,))


def _mutate_json(rng: random.Random, members: dict[str, bytes]) -> str:
    """One field of a compiled.json (the model's, its specialisation section, a specialisation's)
    set to a weird value, or a list entry duplicated or dropped."""
    names = sorted(n for n in members if n.endswith("compiled.json"))
    if not names:
        return "json:skipped"
    name = rng.choice(names)
    try:
        doc = json.loads(members[name])
        paths = [p for p in _json_paths(doc) if p]
        where = rng.choice(paths)
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
    except (ValueError, IndexError, KeyError, TypeError):  # an earlier mutation damaged it
        return "json:skipped"
    choice = rng.choice(["value", "value", "duplicate", "drop"])
    if choice == "value":
        parent[where[-1]] = rng.choice(_WEIRD)
    elif choice == "duplicate" and isinstance(parent, list):
        parent.append(parent[where[-1]])
    elif isinstance(parent, list):
        del parent[where[-1]]
    else:
        parent.pop(where[-1], None)
    members[name] = json.dumps(doc, allow_nan=True).encode()
    return f"json:{choice}:{name}:{'/'.join(map(str, where))[:80]}"


def _rehash(members: dict[str, bytes]) -> None:
    try:
        manifest = json.loads(members["manifest.json"])
        manifest["members"] = {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                               for n, d in members.items() if n != "manifest.json"}
        members["manifest.json"] = json.dumps(manifest).encode()
    except (KeyError, ValueError, TypeError, AttributeError):
        pass


def bundle_case(rng: random.Random, budget) -> list[str]:
    """Save, damage, load and run a bundle; returns the mutation names."""
    policy = rng.choice(["dynamic", "static"])
    members = _base_members(policy)
    applied = [f"base:{policy}"]
    bomb = None
    for _ in range(rng.choice([1, 1, 2])):
        kind = rng.choice(["options", "options", "member", "compression", "json"])
        if kind == "options":
            applied.append(_mutate_options(rng, members))
        elif kind == "json":
            applied.append(_mutate_json(rng, members))
        elif kind == "member":
            applied.append(_mutate_member(rng, members))
        else:
            bomb = (rng.choice(sorted(members)), rng.choice([1 << 20, 96 << 20, 300 << 20]))
            applied.append(f"compression:{bomb[0]}:{bomb[1] >> 20}MiB")
    if rng.random() < 0.8:
        _rehash(members)
        applied.append("rehashed")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.byoc")
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in members.items():
                info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w", force_zip64=True) as out:
                    out.write(data)
                    for _ in range(bomb[1] >> 20 if bomb and bomb[0] == name else 0):
                        out.write(_MIB)  # streamed: the fuzzer itself never holds the inflated member
        del members
        reg = registry(HostilePlugin("none", "none", 0, policy))
        cm = byoc.load(path, registry=reg, budget=budget, fallback=rng.choice([None, "host"]))
        for batch in (*SPEC_BATCHES, NEW_BATCH) if policy == "static" else (2,):
            cm.run(_feeds(batch))
    return applied


__all__ = ["HostilePlugin", "bundle_case", "plugin_case"]
