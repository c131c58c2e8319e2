"""byoc-cpu as the host's CPU executor: the tuned kernels that serve the nodes no target took.

byoc asks :func:`executor`'s ``kernel(spec)`` first for every host node (byoc's reference kernels
run the ones it declines, and the zero-size tensors its kernels hand them): convolutions, GEMMs,
pooling, elementwise, activation, reduction and normalisation kernels that split their work over
this package's thread pool (:mod:`byoc_cpu.host.threads`). It runs Conv -> Add/Sum -> Relu chains
as one step (:mod:`byoc_cpu.host.fusion`) and compiles a first run's kernels in helper processes
where there are cores to spare (:mod:`byoc_cpu.host.jithelpers`). Everything heavy is imported on
first use.
"""

from __future__ import annotations

from byoc.contract import HostExecutor, NodeSpec

#: the operator families with kernels here (imported on the first kernel request)
_FAMILIES = ("conv", "gemm", "pool", "elementwise", "activation", "reduce", "norm")
_loaded = False


def _kernel(spec: NodeSpec):
    global _loaded
    if not _loaded:
        import importlib

        for family in _FAMILIES:
            importlib.import_module(f"byoc_cpu.host.{family}")
        _loaded = True
    from byoc_cpu.host.registry import factory

    make = factory(spec.op_type, spec.domain)
    return None if make is None else make(spec)


def _begin_run():
    from byoc_cpu.host.threads import wake

    wake()


def _fusions(nodes, is_host):
    from byoc_cpu.host.fusion import fusions

    return fusions(nodes, is_host)


def _first_run(run):
    from byoc_cpu.host.jithelpers import first_run

    return first_run(run)


def executor() -> HostExecutor:
    """byoc-cpu's host executor (registered by :mod:`byoc_cpu.plugin`)."""
    return HostExecutor(
        "cpu",
        description="byoc-cpu's tuned kernels: blocked and GEMM convolutions, own AVX-512 GEMM, "
                    "ranged elementwise/activation/reduction/normalisation kernels, thread pool",
        priority=10,
        kernel=_kernel,
        begin_run=_begin_run,
        fusions=_fusions,
        first_run=_first_run,
        jit=True,
    )
