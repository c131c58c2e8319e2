"""The ``cpu`` target: the byoc reference plugin.

A vendor plugin is this one module, published under the entry-point group ``byoc``
(``pyproject.toml``: ``[project.entry-points.byoc] cpu = "byoc_cpu.plugin"``). byoc calls a
target's hooks only in the plugin that registered it, so no hook checks the target name. The
hooks, in the order byoc calls them:

``byoc_register_targets``    the target: name, version, device, typed options, tolerance, priority
``byoc_register_host_executor``  byoc-cpu's tuned kernels for the host's nodes (:mod:`byoc_cpu.host`)
``byoc_register_operators``  which operators it may take, each with a check giving the reason
``byoc_register_patterns``   named composites, placed as a unit (the fusions it reports)
``byoc_register_rules``      regions worth having (here: drop regions with nothing to compute)
``byoc_codegen``             region -> Artifact (generated source + program + constants)
``byoc_runtime``             Artifact -> callable (verify, import through the cache, run)
``byoc_cost``                estimated seconds of a region (for choosing between targets)

Importing this module is cheap (no Numba compilation): the code generator and the runtime
are imported when byoc first calls their hooks.
"""

from __future__ import annotations

from byoc.contract import Rule, Target, hookimpl

from byoc_cpu import __version__
from byoc_cpu.ops import ALIAS, ANCHOR, OPERATORS
from byoc_cpu.options import OPTIONS
from byoc_cpu.tuning import COST

TARGET = "cpu"

#: sustained rates for the cost estimate: float32 GEMM FLOP/s and bytes/s moved by the loops
_GEMM_FLOPS = COST["gemm_flops"]
_LOOP_BYTES = COST["loop_bytes_per_s"]
_LAUNCH = COST["region_launch_s"]


def _runtime_path() -> str:
    """What ``byoc targets`` shows: whose GEMM the generated code calls on this machine."""
    try:
        from byoc_cpu.host.gemm import FULL_WIDTH

        if FULL_WIDTH:
            return "numba, own AVX-512 GEMM"
        from byoc_cpu.host import threads

        return "numba + openblas" if threads.openblas_symbol("cblas_sgemm") is not None else "numba + numpy"
    except Exception:  # pragma: no cover
        return "numba"


@hookimpl
def byoc_register_targets(register):
    register(Target(
        TARGET,
        version=__version__,
        description="CPU: each region becomes generated Numba kernels: packed GEMMs with fused epilogues",
        device="cpu",
        options=OPTIONS,
        # float32 throughout; GEMM blocking and fused epilogues reorder sums vs the host kernels
        rtol=1e-4,
        atol=1e-4,
        # after accelerators (they take what they can first), before the host
        priority=-10,
        # the code is specialised to static shapes: byoc compiles per concrete input shape
        shape_policy="static",
        # a specialisation holds its code and constants, not its activations (the arenas are
        # shared, byoc_cpu.runtime.ArenaPool); Budget.max_specialization_bytes bounds the constants
        max_specializations=32,
        runtime_path=_runtime_path(),
        # for placement="cost": a region call costs a Python dispatch and argument packing, and a
        # region boundary ends a fused epilogue (a rough estimate, not a measurement)
        launch_overhead=_LAUNCH,
        # generated kernels compile on a region's first call
        jit=True,
    ))


@hookimpl
def byoc_register_host_executor(register):
    from byoc_cpu.host import executor

    register(executor())


@hookimpl
def byoc_register_operators(register):
    from byoc_cpu.support import check

    for op_type in OPERATORS:
        register(op_type, check)


@hookimpl
def byoc_register_patterns(register):
    from byoc_cpu.patterns import patterns

    for pattern in patterns():
        register(pattern)


def has_compute(region, ctx):
    """Drop regions of views only (Reshape, Flatten, ...): there is no code to generate."""
    if all(n.op_type in ALIAS for n in region.nodes):
        return "only reshapes: nothing to compute"
    return True


@hookimpl
def byoc_register_rules(register):
    register(Rule("has_compute", has_compute, "a region must compute something (not only reshape)"))


@hookimpl
def byoc_codegen(region, options):
    from byoc_cpu.codegen import generate

    return generate(region, options)


@hookimpl
def byoc_runtime(artifact, options):
    from byoc_cpu.runtime import load

    return load(artifact, options)


@hookimpl
def byoc_cost(region):
    if region.model is None:
        return None
    from byoc_cpu.lower import Lowering, LoweringError
    from byoc_cpu.ops import macs

    low = Lowering(region.model, {"threads": 1})
    try:
        low.analyze()  # static shapes of every value of the body
    except LoweringError:
        return None
    seconds = 0.0
    for node, info in zip(low.nodes, low.infos):
        if node.op_type in ANCHOR:
            seconds += 2 * macs(node, info) / _GEMM_FLOPS
        elements = 1
        for d in info.out_shapes[0]:
            elements *= d
        seconds += 8 * elements / _LOOP_BYTES
    return seconds
