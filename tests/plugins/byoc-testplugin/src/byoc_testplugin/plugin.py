"""The ``testchip`` target: a host-emulated NPU that implements every byoc hook.

Everything it does is observable, so integration tests can check that byoc called each hook
with the right arguments: the pre-partition pass stamps the model, the post-partition pass
stamps each region body (and so its artifact), the runtime counts calls per region.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from byoc.contract import (Artifact, Option, Pattern, Rule, Target, any_value, const, hookimpl, host_callable, op,
                           region_model_bytes)

from byoc_testplugin import __version__

TARGET = "testchip"
#: operator types testchip runs (each also has a host kernel, so the emulation can run it)
OPERATORS = ("Relu", "Neg", "Add", "Mul", "Sigmoid", "Tanh", "Clip", "Conv", "Gemm", "MatMul")
#: operators that use the chip's multiply-accumulate array
MAC_OPS = frozenset({"Conv", "Gemm", "MatMul"})
#: the ``max_nodes`` rule splits larger regions (a module constant)
MAX_REGION_NODES = 24
#: calls of each region's runtime, by region name (the tests read and clear it)
CALLS: Counter[str] = Counter()


# -- targets ------------------------------------------------------------------------------


@hookimpl
def byoc_register_targets(register):
    register(Target(
        TARGET,
        version=__version__,
        description="host-emulated test NPU (byoc integration tests)",
        device="npu",
        options=[Option("max_kernel", 7, type=int, minimum=1, doc="largest Conv kernel side"),
                 Option("tag", "testchip", type=str, doc="written into the model's metadata by byoc_pre_partition")],
        rtol=0.0,
        atol=0.0,
        priority=-100,
        runtime_path="emulation",
    ))


# -- operators ----------------------------------------------------------------------------


def _check_conv(node, ctx):
    kernel = ctx.shape(node.inputs[1]) if len(node.inputs) > 1 else None
    if kernel is None or len(kernel) != 4 or None in kernel:
        return "Conv: only 2-D convolutions with a static kernel shape"
    if ctx.const(node.inputs[1]) is None:
        return "Conv: the weight must be a constant"
    limit = int(ctx.options.get("max_kernel", 7))
    kh, kw = kernel[2], kernel[3]
    if kh > limit or kw > limit:
        # the MAC array holds at most limit x limit taps per output channel
        return f"Conv: kernel {kh}x{kw} exceeds {limit}x{limit}"
    return True


def _check_binary(node, ctx):
    shapes = [ctx.shape(v) for v in node.inputs]
    if None in shapes or any(None in s for s in shapes):
        return f"{node.op_type}: input shapes must be static"
    if shapes[0] != shapes[1] and _numel(shapes[0]) != 1 and _numel(shapes[1]) != 1:
        # the vector unit takes equal shapes or a single-element operand, nothing else broadcasts
        return f"{node.op_type}: broadcasting {shapes[0]} with {shapes[1]} is not supported"
    return True


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_clip(node, ctx):
    for v in node.inputs[1:]:
        if v is not None and ctx.const(v) is None:
            return "Clip: min/max must be constants"
    return True


def _check_gemm(node, ctx):
    attr = node.attributes.get("transA")
    if attr is not None and attr.value:
        return "Gemm: transA=1 is not supported"
    return True


@hookimpl
def byoc_register_operators(register):
    checks = {"Conv": _check_conv, "Add": _check_binary, "Mul": _check_binary, "Clip": _check_clip,
              "Gemm": _check_gemm}
    for op_type in OPERATORS:
        register(op_type, checks.get(op_type))


# -- patterns -----------------------------------------------------------------------------


def _conv_bias_relu_check(match, ctx):
    conv = match["conv"]
    group = conv.attributes.get("group")
    if group is not None and group.value != 1:
        return "grouped convolutions are not fused"
    return _check_conv(conv, ctx)


@hookimpl
def byoc_register_patterns(register):
    register(Pattern(
        f"{TARGET}.conv_bias_relu",
        op("Relu", op("Conv", any_value(), const(), const(), label="conv"), label="relu"),
        check=_conv_bias_relu_check,
        description="Conv with constant weight and bias followed by Relu",
    ))
    register(Pattern(
        f"{TARGET}.mul_add",
        op("Add", op("Mul", any_value(), const(), label="mul"), const(), label="add"),
        description="x * scale + shift on the MAC array",
    ))


# -- rules --------------------------------------------------------------------------------


def needs_mac(region, ctx):
    """Drop regions that would not use the MAC array: offloading them costs more than it saves."""
    if any(n.op_type in MAC_OPS for n in region.nodes):
        return True
    if any(p == f"{TARGET}.mul_add" for p in region.patterns.values()):
        return True
    return "needs a MAC op (Conv, Gemm, MatMul or testchip.mul_add)"


def split_max_nodes(region, ctx):
    """Split regions of more than MAX_REGION_NODES nodes into pieces, in topological order.

    Consecutive pieces of a convex region stay cycle-free. A piece never ends inside a
    composite: a node fused into a pattern stays with the node of the same pattern it feeds.
    """
    if len(region.nodes) <= MAX_REGION_NODES:
        return None
    inside = {id(n) for n in region.nodes}
    pieces, current, waiting = [], [], set()
    for node in region.nodes:
        current.append(node)
        waiting.discard(id(node))
        pattern = region.patterns.get(node.name)
        if pattern is not None:
            for value in node.outputs:
                uses = value.uses()
                if len(uses) == 1 and not value.is_graph_output():
                    consumer = uses[0].node
                    if id(consumer) in inside and region.patterns.get(consumer.name) == pattern:
                        waiting.add(id(consumer))
        if len(current) >= MAX_REGION_NODES and not waiting:
            pieces.append(current)
            current = []
    if current:
        pieces.append(current)
    return pieces if len(pieces) > 1 else None


@hookimpl
def byoc_register_rules(register):
    register(Rule("max_nodes", split_max_nodes, f"at most {MAX_REGION_NODES} nodes per region"))
    register(Rule("needs_mac", needs_mac, "a region must contain a MAC operation"))


# -- passes -------------------------------------------------------------------------------


@hookimpl
def byoc_pre_partition(model, options):
    # harmless and observable: stamp the model with what the pass saw
    model.metadata_props[f"{TARGET}.pre_partition"] = f"{options['tag']}:{len(model.graph)}"


@hookimpl
def byoc_post_partition(region, options):
    region.model.metadata_props[f"{TARGET}.region"] = region.name


# -- code generation and runtime ----------------------------------------------------------


@hookimpl
def byoc_codegen(region, options):
    return Artifact(
        TARGET,
        "onnx",
        region_model_bytes(region.model),
        {
            "region": region.name,
            "op_types": sorted({n.op_type for n in region.nodes}),
            "patterns": sorted(set(region.patterns.values())),
            "nodes": len(region.nodes),
            "inputs": [v.name for v in region.inputs],
            "outputs": [v.name for v in region.outputs],
        },
    )


class _Engine:
    """The emulated device program: the region body on byoc's host kernels."""

    def __init__(self, artifact: Artifact):
        self.region = str(artifact.metadata.get("region", "?"))
        self.program = host_callable(artifact.data)

    def __call__(self, *inputs):
        CALLS[self.region] += 1
        return self.program(*inputs)


@hookimpl
def byoc_runtime(artifact, options):
    return _Engine(artifact)


@hookimpl
def byoc_cost(region, options: Mapping[str, Any]):
    return 5e-6 + 1e-6 * len(region.nodes)
