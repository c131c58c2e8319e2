"""If, Loop and Scan: the execution plan runs their subgraphs as plans of their own.

These are not kernels: :func:`byoc.runtime.plan.build_plan` builds their steps. Each factory
here receives the node's :class:`~byoc.kernels.registry.NodeSpec` and ``body_plan``, which
lowers one subgraph to a :class:`~byoc.runtime.plan.Plan` (the plan builder passes itself in,
so this module never imports it). A body is lowered once, when the step is built. Values the
body reads from outer scopes arrive after the node's own inputs (see ``NodeSpec.captured``) and
are passed on to the body positionally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from byoc.errors import ResourceLimitError
from byoc.contract.host import NodeSpec, RunFn
from byoc.runtime import control

from byoc.runtime.protocols import BodyPlan

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir

#: lowers one subgraph of the node to a plan
BodyPlanner = Callable[["ir.Graph"], BodyPlan]


def _split_args(spec: NodeSpec, args: tuple) -> tuple[tuple, tuple]:
    n = len(args) - len(spec.captured)
    return args[:n], args[n:]


def make_if(spec: NodeSpec, body_plan: BodyPlanner) -> RunFn:
    then_plan = body_plan(spec.attrs["then_branch"])
    else_plan = body_plan(spec.attrs["else_branch"])

    def run(*args):
        (cond,), captured = _split_args(spec, args)
        if cond is None or np.size(cond) != 1:
            raise spec.error(f"condition must be a single boolean, got shape {np.shape(cond)}")
        plan = then_plan if bool(np.asarray(cond).reshape(())) else else_plan
        return tuple(plan.run_positional(captured))

    return run


def _stack(spec: NodeSpec, items: list[np.ndarray], axis: int = 0, reverse: bool = False) -> np.ndarray:
    if reverse:
        items = items[::-1]
    if not items:
        return spec.alloc.zeros((0,), np.float32)
    return spec.alloc.stack(items, axis=axis)


def _check_accumulated(spec: NodeSpec, totals: list[int], values, what: str, i: int) -> None:
    """Add each scan output's bytes to its running total and refuse one past the budget.

    The stacked output is one tensor, so the values collected so far count against
    ``max_tensor_bytes`` as they accumulate, not only when they are stacked at the end.
    """
    for k, value in enumerate(values):
        totals[k] += np.size(value) * np.asarray(value).dtype.itemsize
        spec.alloc.check_bytes(totals[k], f"{what} {k} after {i + 1} iterations")


def _check_carried(spec: NodeSpec, values, i: int) -> None:
    """Refuse a loop-carried value past the budget (one that grows each iteration, say)."""
    for k, value in enumerate(values):
        if isinstance(value, np.ndarray):
            spec.alloc.check_bytes(value.size * value.dtype.itemsize, f"loop-carried value {k} at iteration {i}")


def make_loop(spec: NodeSpec, body_plan: BodyPlanner) -> RunFn:
    body = spec.attrs["body"]
    plan = body_plan(body)
    n_carried = len(body.inputs) - 2
    max_iter = spec.budget.max_loop_iterations

    def run(*args):
        own, captured = _split_args(spec, args)
        trip, cond = own[0] if len(own) > 0 else None, own[1] if len(own) > 1 else None
        carried = list(own[2:2 + n_carried])
        limit = None if trip is None else int(np.asarray(trip).reshape(()))
        if limit is not None and limit > max_iter:
            raise ResourceLimitError(
                f"{spec.label}: trip count {limit} exceeds the budget max_loop_iterations={max_iter}"
            )
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(()))
        scans: list[list[np.ndarray]] = []
        totals: list[int] = []
        ctrl = control.current()
        i = 0
        while keep_going and (limit is None or i < limit):
            if i >= max_iter:
                raise ResourceLimitError(
                    f"{spec.label}: more than max_loop_iterations={max_iter} iterations; raise the budget "
                    "or check the loop condition"
                )
            args = [np.array(i, dtype=np.int64), np.array(keep_going)] + carried + list(captured)
            if ctrl is None:
                outs = plan.run_positional(args)
            else:  # a timeout or cancel handle is active: check it and name this iteration
                where = f"{spec.label}, iteration {i}"
                ctrl.check(where)
                with control.inside(where):
                    outs = plan.run_positional(args)
            keep_going = bool(np.asarray(outs[0]).reshape(()))
            carried = list(outs[1:1 + n_carried])
            _check_carried(spec, carried, i)
            scan_outs = outs[1 + n_carried:]
            if not scans:
                scans = [[] for _ in scan_outs]
                totals = [0] * len(scan_outs)
            _check_accumulated(spec, totals, scan_outs, "scan output", i)
            for acc, value in zip(scans, scan_outs):
                acc.append(value)
            i += 1
        n_scan = len(spec.attrs["body"].outputs) - 1 - n_carried
        stacked = [_stack(spec, acc) for acc in scans] if scans else [_stack(spec, [])] * n_scan
        return tuple(carried) + tuple(stacked)

    return run


def make_scan(spec: NodeSpec, body_plan: BodyPlanner) -> RunFn:
    body = spec.attrs["body"]
    plan = body_plan(body)
    m = int(spec.attrs["num_scan_inputs"])
    n_state = len(body.inputs) - m
    k = len(body.outputs) - n_state
    in_axes = list(spec.attrs.get("scan_input_axes", [0] * m))
    in_dirs = list(spec.attrs.get("scan_input_directions", [0] * m))
    out_axes = list(spec.attrs.get("scan_output_axes", [0] * k))
    out_dirs = list(spec.attrs.get("scan_output_directions", [0] * k))

    def run(*args):
        own, captured = _split_args(spec, args)
        states = list(own[:n_state])
        scans_in = [np.asarray(x) for x in own[n_state:n_state + m]]
        axes = [a + x.ndim if a < 0 else a for a, x in zip(in_axes, scans_in)]
        lengths = {x.shape[a] for x, a in zip(scans_in, axes)}
        if len(lengths) > 1:
            raise spec.error(f"scan inputs disagree on the sequence length: {sorted(lengths)}")
        steps = lengths.pop() if lengths else 0
        collected: list[list[np.ndarray]] = [[] for _ in range(k)]
        totals = [0] * k
        ctrl = control.current()
        for t in range(steps):
            slices = []
            for x, a, d in zip(scans_in, axes, in_dirs):
                idx = steps - 1 - t if d else t
                slices.append(spec.alloc.take(x, idx, axis=a))
            if ctrl is None:
                outs = plan.run_positional(states + slices + list(captured))
            else:
                where = f"{spec.label}, step {t}"
                ctrl.check(where)
                with control.inside(where):
                    outs = plan.run_positional(states + slices + list(captured))
            states = list(outs[:n_state])
            _check_accumulated(spec, totals, outs[n_state:], "scan output", t)
            for acc, value in zip(collected, outs[n_state:]):
                acc.append(np.asarray(value))
        results = []
        for acc, a, d in zip(collected, out_axes, out_dirs):
            if not acc:
                results.append(_stack(spec, []))
                continue
            rank = acc[0].ndim + 1
            results.append(_stack(spec, acc, axis=a + rank if a < 0 else a, reverse=bool(d)))
        return tuple(states) + tuple(results)

    return run


#: operator type (default ONNX domain) -> step factory; the kernel registry lists the same
#: names in ``PLAN_OPERATORS`` so support checks see them without importing the runtime
FACTORIES: dict[str, Callable[[NodeSpec, BodyPlanner], RunFn]] = {
    "If": make_if,
    "Loop": make_loop,
    "Scan": make_scan,
}
