"""Conv -> Add/Sum -> Relu chains of host nodes run as one plan step.

A host Conv whose output only a Relu, or only a two-input Add/Sum (then perhaps a Relu), reads
becomes one step with them (:func:`byoc_cpu.host.conv.fused_conv`: the blocked kernel applies
them as it stores its tiles, else their own kernels run after it). Where the Add's other input
(the residual) dies at this step and is a buffer nothing else can see, the convolution writes
its output over it.
"""

from __future__ import annotations

from typing import Callable

import onnx_ir as ir

from byoc.contract import Fusion


def _standard(node: ir.Node, op_types: tuple[str, ...]) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in op_types


def _only_reader(v: ir.Value) -> ir.Node | None:
    """The one node that reads ``v`` (once), if ``v`` is not a graph output and nothing else reads it."""
    if v.is_graph_output():
        return None
    uses = list(v.uses())
    if len(uses) != 1:
        return None
    node = uses[0][0]
    if sum(1 for x in node.inputs if x is v) != 1:
        return None
    return node


def _float32(v: ir.Value) -> bool:
    return v.dtype is not None and v.dtype == ir.DataType.FLOAT


def chains(nodes: list[ir.Node], is_host: Callable[[ir.Node], bool]) -> list[list[ir.Node]]:
    """[Conv, Relu] | [Conv, Add/Sum] | [Conv, Add/Sum, Relu] for host Convs (float32, one
    output) whose result only that chain reads."""
    out: list[list[ir.Node]] = []
    taken: set[int] = set()  # an Add of two Convs' outputs joins one chain only
    for node in nodes:
        if not _standard(node, ("Conv",)) or len(node.outputs) != 1 or not _float32(node.outputs[0]) \
                or not is_host(node):
            continue
        chain = [node]
        nxt = _only_reader(node.outputs[0])
        if (nxt is not None and _standard(nxt, ("Add", "Sum")) and len(nxt.inputs) == 2
                and all(x is not None for x in nxt.inputs) and id(nxt) not in taken and is_host(nxt)):
            chain.append(nxt)
            nxt = _only_reader(nxt.outputs[0])
        if nxt is not None and _standard(nxt, ("Relu",)) and is_host(nxt):
            chain.append(nxt)
        if len(chain) > 1:
            out.append(chain)
            taken.update(id(n) for n in chain[1:])
    return out


def _residual(chain: list[ir.Node]) -> ir.Value | None:
    """The Add/Sum's other input in a chain (``None`` without an Add/Sum)."""
    if len(chain) < 2 or chain[1].op_type == "Relu":
        return None
    conv_out = chain[0].outputs[0]
    return next(x for x in chain[1].inputs if x is not conv_out)


def _private(res: ir.Value, chain: list[ir.Node], host_convs: set[int]) -> bool:
    """Whether the residual ``res`` is a buffer nothing but the chain can see: the output of a
    host Conv step (a fresh array, not a view; ``host_convs``: those Conv nodes and the last node
    of each one's chain), read only by host Convs (which keep no view of their input) and this
    chain's Add, not the Conv's own input, not a graph output, input or constant."""
    if (res.is_graph_output() or res.is_graph_input() or res.is_initializer() or res.const_value is not None
            or any(x is res for x in chain[0].inputs)):
        return False
    producer = res.producer()
    if producer is None or id(producer) not in host_convs:
        return False
    return all(node is chain[1] or id(node) in host_convs for node, _ in res.uses())


def fusions(nodes: list[ir.Node], is_host: Callable[[ir.Node], bool]) -> list[Fusion]:
    """The executor's fusions (:attr:`byoc.contract.HostExecutor.fusions`)."""
    found = chains(nodes, is_host)
    host_convs = {id(n) for n in nodes if _standard(n, ("Conv",)) and is_host(n)}
    host_convs.update(id(chain[-1]) for chain in found)
    out = []
    for chain in found:
        res = _residual(chain)
        private = res is not None and _private(res, chain, host_convs)
        out.append(Fusion(chain, [res], 3, _builder(chain, res if private else None)))
    return out


def _builder(chain: list[ir.Node], private: ir.Value | None):
    has_add = len(chain) > 1 and chain[1].op_type != "Relu"
    has_relu = chain[-1].op_type == "Relu"

    def build(runs, dies):
        from byoc_cpu.host.conv import fused_conv

        add = runs[1] if has_add else None
        relu = runs[-1] if has_relu else None
        return fused_conv(runs[0], add, relu, over=private is not None and dies(private))

    return build


__all__ = ["chains", "fusions"]
