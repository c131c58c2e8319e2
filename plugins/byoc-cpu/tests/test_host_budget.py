"""byoc-cpu's host kernels allocate through the budget (``spec.alloc``), as byoc's reference
kernels do: each direct numpy allocation is one the list below says is bounded."""

from __future__ import annotations

from pathlib import Path

import byoc_cpu.host
from byoc.testing.allocations import direct_allocations

HOST = Path(byoc_cpu.host.__file__).parent

# (module, function): why a direct numpy allocation there is bounded without a check of its own
ALLOWED = {
    ("conv.py", "winograd_weights"): "Winograd weights: a fixed multiple of the constant weight tensor",
    ("conv.py", "_phase_shift"): "row offsets: one per input channel and tap of the weights",
    ("conv.py", "_shift"): "row offsets: one per input channel and tap of the weights",
    ("gemm.py", "pack_a"): "a padded copy of a weight matrix",
    ("gemm.py", "pack"): "an empty (M or K is 0) packed weight: one tile",
    ("conv.py", ""): "a one-element no-bias constant, made at import (module level)",
    ("gemm.py", "gemm_rows"): "a bias vector of one row of the output",
    ("gemm.py", "gemm_acc"): "a bias vector of one row of the output",
    ("gemm.py", ""): "an empty shared zero vector, made at import (module level)",
    ("gemm.py", "_zeros"): "the shared zero bias, as long as the rows of the largest product so far",
    ("gemm.py", "pack_narrow"): "a padded copy of a weight matrix",
    ("gemm.py", "gemm_narrow"): "a bias vector of one row of the output",
    ("gemm.py", "gemm_narrow_acc"): "a bias vector of one row of the output; a row table of the weight's depth",
    ("threads.py", "scratch"): "work buffers sized by kernels that checked their output",
    ("threads.py", "__init__"): "the pool's shared words: 40 integers, once per pool",
    ("blocked.py", "conv_job_block"): "a compiled job's argument block: 43 integers, once per layer and shape",
    ("conv.py", "run"): "a blocked convolution's output in its steady state, the same shape the budget allowed before",
    ("elementwise.py", "binary"): "the broadcast output, checked by plan_for before the call",
    ("elementwise.py", "unary"): "the size of its (already budgeted) input",
    ("blocked.py", "blocked_weights"): "a stem's weights with their channels padded to 8, once per weight tensor",
}


def test_host_kernels_allocate_only_through_the_budgeted_allocator():
    offenders, used = [], set()
    for path in sorted(HOST.glob("*.py")):
        for scope, line, call in direct_allocations(path):
            if (path.name, scope) in ALLOWED:
                used.add((path.name, scope))
                continue
            offenders.append(f"{path.name}:{line} in {scope or '<module>'}: np.{call}")
    assert not offenders, "host kernels allocate without the budget (use spec.alloc):\n" + "\n".join(offenders)
    assert used == set(ALLOWED), f"stale allow-list entries: {sorted(set(ALLOWED) - used)}"
