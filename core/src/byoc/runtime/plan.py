"""Lower an IR graph once into a flat execution plan.

Execution never walks IR objects: each node becomes a :class:`Step` holding its kernel's run
function and integer slots for its inputs and outputs. Values are released after their last
use. A plan is immutable after construction, so one plan serves many threads at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget
from byoc.contract.host import Fusion, HostExecutor, NodeSpec, RunFn
from byoc.errors import ByocError, InputError, KernelError, ResourceLimitError
from byoc.kernels.registry import make_kernel
from byoc.progress import ticker as progress_ticker
from byoc.runtime import control as _control
from byoc.runtime import control_flow as _control_flow


def attr_value(attr: ir.Attr) -> Any:
    """Convert an IR attribute into the Python value kernels see."""
    t = attr.type
    A = ir.AttributeType
    if t == A.INT:
        return int(attr.value)
    if t == A.FLOAT:
        return float(attr.value)
    if t == A.STRING:
        return attr.value
    if t == A.INTS:
        return [int(v) for v in attr.value]
    if t == A.FLOATS:
        return [float(v) for v in attr.value]
    if t == A.STRINGS:
        return list(attr.value)
    if t == A.TENSOR:
        return attr.value.numpy()
    if t == A.TENSORS:
        return [v.numpy() for v in attr.value]
    return attr.value  # graphs, type protos: passed through


def value_shape(v: ir.Value) -> tuple | None:
    if v.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in v.shape)


def value_dtype(v: ir.Value) -> np.dtype | None:
    if v.dtype is None:
        return None
    try:
        return np.dtype(v.dtype.numpy())
    except Exception:
        return None


def opset_of(graph: ir.Graph, domain: str, default: int = 21) -> int:
    imports = graph.opset_imports
    return imports.get(domain, imports.get("ai.onnx" if domain == "" else domain, default))


def node_spec(node: ir.Node, opset: int, budget: Budget = DEFAULT_BUDGET,
              executor: HostExecutor | None = None) -> NodeSpec:
    consts = {}
    for i, v in enumerate(node.inputs):
        if v is not None and v.const_value is not None:
            consts[i] = v.const_value.numpy()
    return NodeSpec(
        op_type=node.op_type,
        name=node.name or "",
        domain=node.domain or "",
        opset=opset,
        attrs={k: attr_value(a) for k, a in node.attributes.items()},
        n_inputs=len(node.inputs),
        n_outputs=len(node.outputs),
        input_shapes=[value_shape(v) if v is not None else None for v in node.inputs],
        input_dtypes=[value_dtype(v) if v is not None else None for v in node.inputs],
        const_inputs=consts,
        budget=budget,
        executor=executor,
    )


@dataclass(frozen=True)
class Step:
    run: Callable[..., Sequence[np.ndarray]]
    inputs: tuple[int, ...]  # slot per input, -1 for a missing optional input
    outputs: tuple[int, ...]  # slot per output, -1 for an unused output
    release: tuple[int, ...]  # slots dead after this step
    name: str
    op_type: str


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype | None
    shape: tuple | None  # ints for fixed dims, str/None for symbolic/unknown
    optional: bool = False  # an initializer listed as input: a feed overrides its value


class Plan:
    """A flat, immutable execution plan for one graph."""

    def __init__(
        self,
        steps: list[Step],
        n_slots: int,
        inputs: list[tuple[InputSpec, int]],
        outputs: list[tuple[str, int]],
        constants: list[tuple[int, np.ndarray]],
        extra_slots: Sequence[int] = (),
        executor: HostExecutor | None = None,
    ):
        self.steps = tuple(steps)
        #: the CPU executor that serves this plan's host nodes (``None``: the reference kernels)
        self.executor = executor
        self._begin = executor.begin_run if executor is not None else None
        self.extra_slots = tuple(extra_slots)
        self.n_slots = n_slots
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        base: list[Any] = [None] * n_slots
        for slot, arr in constants:
            base[slot] = arr
        self._base = tuple(base)

    def input_specs(self) -> list[InputSpec]:
        return [spec for spec, _ in self.inputs]

    def output_names(self) -> list[str]:
        return [name for name, _ in self.outputs]

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env = list(self._base)
        for spec, slot in self.inputs:
            if spec.name in feeds:
                env[slot] = feeds[spec.name]
        self._run(env)
        return {name: env[slot] for name, slot in self.outputs}

    def run_positional(self, args: Sequence[Any]) -> list[Any]:
        """Run with the graph inputs then the captured values, in order; outputs in order.

        Used for subgraph bodies; no feed validation (the caller built the arguments).
        """
        env = list(self._base)
        n = len(self.inputs)
        for (_, slot), value in zip(self.inputs, args[:n]):
            env[slot] = value
        for slot, value in zip(self.extra_slots, args[n:]):
            env[slot] = value
        self._run(env)
        return [env[slot] for _, slot in self.outputs]

    def _run(self, env: list[Any]) -> None:
        step = None
        ctrl = _control.current()
        tick = progress_ticker(self)  # set only while a front end shows a first run
        if self._begin is not None:
            self._begin()
        try:
            for step in self.steps:
                if ctrl is not None:
                    ctrl.check(f"node {step.name!r} ({step.op_type})")
                if tick is not None:
                    tick.item(f"{step.name} ({step.op_type})")
                args = [env[i] if i >= 0 else None for i in step.inputs]
                results = step.run(*args)
                for slot, val in zip(step.outputs, results):
                    if slot >= 0:
                        env[slot] = val
                for slot in step.release:
                    env[slot] = None
        except ByocError:
            raise
        except MemoryError as exc:  # a kernel that did not check its budget before allocating
            assert step is not None
            raise ResourceLimitError(f"node {step.name!r} ({step.op_type}): out of memory: {exc}") from exc
        except Exception as exc:
            assert step is not None
            raise KernelError(f"node {step.name!r} ({step.op_type}) failed: {type(exc).__name__}: {exc}") from exc


def _subgraphs(node: ir.Node) -> list[ir.Graph]:
    graphs = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.value)
    return graphs


def captured_values(graphs: Sequence[ir.Graph]) -> list[ir.Value]:
    """Outer-scope values the given subgraphs (and their nested subgraphs) read, in first-use order."""
    inner: set[int] = set()
    ordered: list[ir.Value] = []

    def visit(g: ir.Graph) -> None:
        inner.add(id(g))
        for node in g:
            for sub in _subgraphs(node):
                visit(sub)

    for g in graphs:
        visit(g)
    seen: set[int] = set()

    def collect(g: ir.Graph) -> None:
        for node in g:
            for v in node.inputs:
                if v is None or id(v) in seen:
                    continue
                owner = v.graph
                if owner is None or id(owner) not in inner:
                    seen.add(id(v))
                    ordered.append(v)
            for sub in _subgraphs(node):
                collect(sub)
        for v in g.outputs:  # a body may return an outer value directly
            if id(v) not in seen and (v.graph is None or id(v.graph) not in inner):
                seen.add(id(v))
                ordered.append(v)

    for g in graphs:
        collect(g)
    return ordered


def host_step(spec: NodeSpec) -> RunFn:
    """The run function the host gives a node: the executor's kernel (``spec.executor``) or the
    reference kernel, or for If/Loop/Scan a step that runs plans of its subgraphs (built with
    ``spec.step_factory`` and ``spec.captured``)."""
    factory = _control_flow.FACTORIES.get(spec.op_type) if spec.domain in ("", "ai.onnx") else None
    if factory is None:
        run = _executor_kernel(spec) if spec.executor is not None else None
        return run if run is not None else make_kernel(spec)

    def body_plan(graph: ir.Graph) -> Plan:
        return build_plan(graph, budget=spec.budget, step_factory=spec.step_factory, captured=spec.captured,
                          host=spec.executor)

    return factory(spec, body_plan)


def _executor_kernel(spec: NodeSpec) -> RunFn | None:
    """The executor's run function for the node, or ``None`` where it declines it."""
    executor = spec.executor
    assert executor is not None
    try:
        return executor.kernel(spec)
    except ByocError:
        raise
    except MemoryError as exc:
        raise ResourceLimitError(f"{spec.label}: out of memory while building the kernel: {exc}") from exc
    except Exception as exc:
        raise KernelError(f"{spec.label}: host executor {executor.name!r} (plugin {executor.plugin!r}) cannot "
                          f"build the kernel: {type(exc).__name__}: {exc}") from exc


def build_plan(
    graph: ir.Graph,
    *,
    budget: Budget = DEFAULT_BUDGET,
    step_factory: Callable[[ir.Node, NodeSpec], Callable] | None = None,
    captured: Sequence[ir.Value] = (),
    fuse: bool = False,
    host: HostExecutor | None = None,
) -> Plan:
    """Lower ``graph`` (topologically sorted) to a :class:`Plan`.

    ``step_factory(node, spec)`` can supply the run function for a node (used for offloaded
    regions); ``None`` from it, or no factory, means :func:`host_step`. ``captured`` lists outer-scope values a
    subgraph reads; :meth:`Plan.run_positional` feeds them after the graph inputs. A node with
    subgraphs (If, Loop, Scan) receives the values its bodies capture after its own inputs, and
    finds them in ``spec.captured``.

    ``host``: the CPU executor that serves the host's nodes (``None``: the reference kernels).
    ``fuse``: the executor may run chains of host nodes as one step
    (:attr:`HostExecutor.fusions <byoc.contract.HostExecutor>`). The fused nodes' outputs other
    than the last are then never seen, so only callers that observe nothing between nodes ask
    for it (not calibration, not a kernel wrapper).
    """
    slots: dict[int, int] = {}  # id(value) -> slot

    def slot_of(v: ir.Value) -> int:
        key = id(v)
        if key not in slots:
            slots[key] = len(slots)
        return slots[key]

    constants = []
    input_slots = []
    for v in graph.inputs:
        optional = v.name in graph.initializers  # an initializer listed as input
        shape = None if v.shape is None else tuple(d if isinstance(d, int) else (d.value if hasattr(d, "value") else None) for d in v.shape)
        input_slots.append((InputSpec(v.name, value_dtype(v), shape, optional), slot_of(v)))
    extra_slots = [slot_of(v) for v in captured]
    for v in graph.initializers.values():
        if v.const_value is not None:
            constants.append((slot_of(v), v.const_value.numpy()))

    nodes = list(graph)
    chains = _fusions(nodes, step_factory, graph, host) if fuse and host is not None and host.fusions else {}
    if chains:
        nodes = _fused_order(nodes, {k: f.nodes for k, f in chains.items()})
    node_inputs: list[list[ir.Value | None]] = []
    node_captures: list[list[ir.Value]] = []
    for node in nodes:
        subs = _subgraphs(node)
        caps = captured_values(subs) if subs else []
        node_captures.append(caps)
        fusion = chains.get(id(node))
        extra = [] if fusion is None else [None] * (fusion.arity - len(node.inputs)) + list(fusion.extra_inputs)
        node_inputs.append(list(node.inputs) + extra + caps)
    last_use: dict[int, int] = {}
    for idx, values in enumerate(node_inputs):
        for v in values:
            if v is not None:
                last_use[slot_of(v)] = idx
    keep = {slot_of(v) for v in graph.outputs}
    releases: dict[int, list[int]] = {}
    for slot, idx in last_use.items():
        if slot not in keep:
            releases.setdefault(idx, []).append(slot)

    steps = []
    for idx, node in enumerate(nodes):
        opset = opset_of(graph, node.domain or "")
        spec = node_spec(node, opset, budget, host)
        spec.captured = node_captures[idx]
        spec.step_factory = step_factory
        run = step_factory(node, spec) if step_factory is not None else None
        if run is None:
            run = host_step(spec)
        fusion = chains.get(id(node))
        if fusion is not None:
            dead = set(releases.get(idx, ()))
            runs = [run] + [host_step(node_spec(n, opset_of(graph, n.domain or ""), budget, host))
                            for n in fusion.nodes[1:]]
            run = fusion.build(runs, lambda v, dead=dead: slot_of(v) in dead)
        chain = None if fusion is None else fusion.nodes
        steps.append(
            Step(
                run=run,
                inputs=tuple(slot_of(v) if v is not None else -1 for v in node_inputs[idx]),
                outputs=tuple(slot_of(v) if v.uses() or v.is_graph_output() else -1
                              for v in (node if chain is None else chain[-1]).outputs),
                release=tuple(releases.get(idx, ())),
                name=node.name or f"#{idx}",
                op_type=node.op_type,
            )
        )
    outputs = [(v.name, slot_of(v)) for v in graph.outputs]
    return Plan(steps, len(slots), input_slots, outputs, constants, extra_slots, host)


def _fusions(nodes: list[ir.Node], step_factory, graph: ir.Graph, host: HostExecutor) -> dict[int, Fusion]:
    """id(first node) -> the executor's fusion, for chains of this graph's host nodes."""
    mine = {id(n) for n in nodes}

    def is_host(node: ir.Node) -> bool:
        if id(node) not in mine or _subgraphs(node):
            return False
        return step_factory is None or step_factory(node, node_spec(node, opset_of(graph, node.domain or ""))) is None

    def fault(message: str) -> KernelError:
        return KernelError(f"host executor {host.name!r} (plugin {host.plugin!r}): {message}")

    try:
        offered = list(host.fusions(nodes, is_host) or ())
    except ByocError:
        raise
    except Exception as exc:
        raise fault(f"fusions() raised {type(exc).__name__}: {exc}") from exc
    out: dict[int, Fusion] = {}
    taken: set[int] = set()
    for fusion in offered:
        if (not isinstance(fusion, Fusion) or len(fusion.nodes) < 2 or not all(is_host(n) for n in fusion.nodes)
                or any(id(n) in taken for n in fusion.nodes)):
            raise fault(f"an invalid fusion (not a chain of distinct host nodes of this graph): {fusion!r:.200}")
        taken.update(id(n) for n in fusion.nodes)
        out[id(fusion.nodes[0])] = fusion
    return out


def _fused_order(nodes: list[ir.Node], chains: dict[int, list[ir.Node]]) -> list[ir.Node]:
    """The plan's nodes with each fused chain as its first node, which runs where the chain's
    last node stood (a value the chain reads besides its first node's inputs may come later)."""
    absorbed = {id(n) for chain in chains.values() for n in chain[1:]}
    by_last = {id(chain[-1]): chain for chain in chains.values()}
    order: list[ir.Node] = []
    for node in nodes:
        if id(node) in by_last:
            order.append(by_last[id(node)][0])
        elif id(node) not in absorbed and id(node) not in chains:
            order.append(node)
    return order


def feed_array(name: Any, value: Any) -> np.ndarray:
    """``value`` as a numpy array, or :class:`InputError` naming the input (a conversion that
    raises anything, ``MemoryError`` from an ``__array__`` included)."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - whatever the object raises is the user's input error
        raise InputError(f"input {name!r}: cannot convert {type(value).__name__} to a numpy array "
                         f"({type(exc).__name__}: {str(exc)[:100]})") from None


def check_feeds(specs: Sequence[InputSpec], feeds: dict[str, Any],
                budget: Budget | None = None) -> dict[str, np.ndarray]:
    """Validate user feeds against the graph inputs; returns the arrays to run with.

    With ``budget``, a feed's logical size (a zero-stride view counts in full: kernels that
    copy it materialise every element) must be within ``max_tensor_bytes``.
    """
    if not isinstance(feeds, dict):
        raise InputError(f"feeds must be a dict name -> numpy array, got {type(feeds).__name__}")
    bad_keys = [k for k in feeds if not isinstance(k, str)]
    if bad_keys:
        raise InputError(f"feed names must be strings, got {', '.join(repr(k) for k in bad_keys[:5])}")
    expected = {s.name for s in specs}
    unknown = sorted(set(feeds) - expected)
    if unknown:
        raise InputError(f"unknown input name(s) {unknown}; the model expects {sorted(expected)}")
    out = {}
    dims: dict[str, int] = {}
    for spec in specs:
        if spec.name not in feeds:
            if spec.optional:
                continue
            raise InputError(f"missing input {spec.name!r} ({_describe(spec)})")
        arr = feed_array(spec.name, feeds[spec.name])
        if spec.dtype is not None and arr.dtype != spec.dtype:
            raise InputError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {arr.dtype}")
        if spec.shape is not None:
            if arr.ndim != len(spec.shape):
                raise InputError(
                    f"input {spec.name!r}: expected shape {_fmt_shape(spec.shape)} ({len(spec.shape)}-D), "
                    f"got {list(arr.shape)}"
                )
            for want, got in zip(spec.shape, arr.shape):
                if isinstance(want, int) and want != got:
                    raise InputError(f"input {spec.name!r}: expected shape {_fmt_shape(spec.shape)}, got {list(arr.shape)}")
                if isinstance(want, str):
                    if dims.setdefault(want, got) != got:
                        raise InputError(
                            f"input {spec.name!r}: dimension {want!r} is {got} here but {dims[want]} in another input"
                        )
        if budget is not None:
            budget.check_bytes(arr.size * arr.dtype.itemsize, f"input {spec.name!r}",
                               f"a feed of shape {list(arr.shape)} ({arr.dtype})")
        if arr.dtype == object:
            _check_strings(spec.name, arr)
        if arr.flags.writeable:  # kernels and plugin runtimes never change the caller's array
            arr = read_only(arr)
        out[spec.name] = arr
    return out


def read_only(arr: np.ndarray) -> np.ndarray:
    """A read-only view of ``arr`` over a read-only buffer, so that even ``flags.writeable = True``
    fails (numpy allows that on a plain view of a writable array); a plain read-only view where
    the buffer protocol cannot carry the dtype (object, extension dtypes)."""
    try:
        out = np.asarray(memoryview(arr).toreadonly())
        if out.dtype == arr.dtype and out.shape == arr.shape:
            return out
    except (TypeError, ValueError, BufferError):
        pass
    out = arr.view()
    out.flags.writeable = False
    return out


def _check_strings(name: str, arr: np.ndarray) -> None:
    """A STRING (object) feed holds only ``str`` elements."""
    for index, item in np.ndenumerate(arr):
        if not isinstance(item, str):
            raise InputError(f"input {name!r}: element {list(index)} is {type(item).__name__} ({item!r:.40}), "
                             f"a STRING input holds only str")


def _fmt_shape(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _describe(spec: InputSpec) -> str:
    shape = _fmt_shape(spec.shape) if spec.shape is not None else "any shape"
    return f"{spec.dtype or 'any dtype'} {shape}"
