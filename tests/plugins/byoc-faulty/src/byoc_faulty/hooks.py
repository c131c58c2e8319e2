"""Target ``faultchip``: a working emulated chip with one hook broken on demand.

``BYOC_FAULT`` names the broken hook (see the README). ``faultchip`` has priority 10, above
``testchip`` (-100), so a region it loses falls to testchip (the "next target") or the host.
Unless ``BYOC_FAULT`` names one of :data:`MODES`, the module registers nothing.
"""

from __future__ import annotations

import ctypes
import os
import time

from byoc.contract import Artifact, Pattern, Rule, Target, any_value, hookimpl, host_callable, op, region_model_bytes

from byoc_faulty import __version__, active, modes

TARGET = "faultchip"
OPERATORS = ("Relu", "Neg", "Add", "Mul", "Sigmoid", "Tanh")


#: the values of ``BYOC_FAULT`` that switch faultchip on ("ok": working, the others: one hook broken)
MODES = frozenset({
    "ok", "targets-raise", "targets-wrong-type", "operators-raise", "check-raise", "check-wrong-type",
    "pattern-raise", "rule-raise", "rule-wrong-type", "rule-cycle", "rule-bad-split", "pre-partition-raise",
    "post-partition-raise", "codegen-raise", "codegen-wrong-type", "codegen-bad-metadata", "codegen-none",
    "runtime-raise", "runtime-wrong-type", "callable-raise", "callable-wrong-arity", "cost-raise",
})
#: faults that take a process down, per hook (``BYOC_FAULT=callable-segfault``, ...): they act only in
#: byoc's isolation worker (``BYOC_ISOLATION_WORKER`` set); in the user's process they raise instead
CRASHES = ("segfault", "abort", "hang", "memory")
MODES = MODES | {f"{hook}-{crash}" for hook in ("codegen", "runtime", "callable") for crash in CRASHES}


def _on() -> bool:
    return bool(modes() & MODES)


class FaultyPluginError(RuntimeError):
    """What the broken hooks raise (tests look for this name in warnings and errors)."""


def _crash(hook: str) -> None:
    """Take the process down as ``BYOC_FAULT`` says for ``hook``; once only if ``BYOC_FAULT_ONCE``
    names a file (created on the first crash)."""
    crash = next((c for c in CRASHES if active(f"{hook}-{c}")), None)
    once = os.environ.get("BYOC_FAULT_ONCE")
    if crash is None or (once and os.path.exists(once)):
        return
    if not os.environ.get("BYOC_ISOLATION_WORKER"):
        raise FaultyPluginError(f"would {crash} the user's process (only done in an isolation worker)")
    if once:
        open(once, "w").close()
    if crash == "segfault":
        ctypes.string_at(0)
    elif crash == "abort":
        os.abort()
    elif crash == "hang":
        while True:
            time.sleep(3600)
    else:  # grow until the worker's memory limit refuses (address space only: nothing is touched)
        import numpy as np

        hog = []
        while True:
            hog.append(np.empty(1 << 28, np.uint8))


@hookimpl
def byoc_register_targets(register):
    if not _on():
        return
    if active("targets-raise"):
        raise FaultyPluginError("simulated failure in byoc_register_targets")
    if active("targets-wrong-type"):
        register(TARGET)  # a string, not a Target
        return
    register(Target(TARGET, version=__version__, description="fault-injection chip", device="npu",
                    priority=10, rtol=0.0, atol=0.0))


def _check(node, ctx):
    if active("check-raise"):
        raise FaultyPluginError(f"simulated failure checking {node.name}")
    if active("check-wrong-type"):
        return 42
    return True


@hookimpl
def byoc_register_operators(register):
    if not _on():
        return
    if active("operators-raise"):
        raise FaultyPluginError("simulated failure in byoc_register_operators")
    for op_type in OPERATORS:
        register(op_type, _check)


def _pattern_check(match, ctx):
    if active("pattern-raise"):
        raise FaultyPluginError(f"simulated failure matching at {match.root.name}")
    return True


@hookimpl
def byoc_register_patterns(register):
    # only where a test looks at it
    if _on() and (active("ok") or active("pattern-raise")):
        register(Pattern(f"{TARGET}.neg_relu", op("Relu", op("Neg", any_value())), check=_pattern_check))


def _rule(region, ctx):
    nodes = region.nodes
    if active("rule-raise"):
        raise FaultyPluginError(f"simulated failure in a rule at {nodes[0].name}")
    if active("rule-wrong-type"):
        return 3.5
    if active("rule-cycle") and len(nodes) >= 3:
        # first and last node in one part, the middle in another: on a chain a -> b -> c the
        # parts {a, c} and {b} depend on each other
        return [[nodes[0], nodes[-1]], nodes[1:-1]]
    if active("rule-bad-split"):
        return [[nodes[0], nodes[0]]]  # the same node twice
    return None


@hookimpl
def byoc_register_rules(register):
    if _on():
        register(Rule("shape_up", _rule, "misbehaves on demand"))


@hookimpl
def byoc_pre_partition(model, options):
    if _on() and active("pre-partition-raise"):
        raise FaultyPluginError("simulated failure in byoc_pre_partition")


@hookimpl
def byoc_post_partition(region, options):
    if _on() and active("post-partition-raise"):
        raise FaultyPluginError(f"simulated failure in byoc_post_partition for {region.name}")


@hookimpl
def byoc_codegen(region, options):
    if not _on():
        return None
    _crash("codegen")
    if active("codegen-raise"):
        raise FaultyPluginError(f"simulated failure generating {region.name}")
    if active("codegen-wrong-type"):
        return region_model_bytes(region.model)  # bytes, not an Artifact
    if active("codegen-none"):
        return None
    metadata = {"inputs": [v.name for v in region.inputs], "outputs": [v.name for v in region.outputs]}
    if active("codegen-bad-metadata"):
        metadata["engine"] = object()  # not JSON-serialisable
    return Artifact(TARGET, "onnx", region_model_bytes(region.model), metadata)


def _raising(*inputs):
    raise FaultyPluginError("simulated device error while running")


@hookimpl
def byoc_runtime(artifact, options):
    if not _on():
        return None
    _crash("runtime")
    if active("runtime-raise"):
        raise FaultyPluginError("simulated failure loading the engine")
    if active("runtime-wrong-type"):
        return 42
    if active("callable-raise"):
        return _raising
    program = host_callable(artifact.data)
    if active("callable-wrong-arity"):
        return lambda *inputs: program(*inputs)[:-1]
    if any(active(f"callable-{c}") for c in CRASHES):
        return lambda *inputs: (_crash("callable"), program(*inputs))[1]
    return program


@hookimpl
def byoc_cost(region, options):
    if not _on():
        return None
    if active("cost-raise"):
        raise FaultyPluginError("simulated failure estimating cost")
    return 1e-6 * len(region.nodes)
