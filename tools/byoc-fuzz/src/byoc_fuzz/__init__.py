"""A structure-aware fuzzer for byoc's frontend and compiler.

Starting from small valid models, each case applies one or more *structural* mutations (flipped
element types, wrong data lengths, missing inputs, cycles, absurd shapes, deep nesting, unicode
and NUL in names, external-data tricks, attribute damage, bogus opsets) or a byte-level one,
then compiles the result and, if that succeeds, runs it on small random inputs. Bundle cases
(damaged options, members and compression) and hostile-plugin cases come from
:mod:`byoc_fuzz.hostile`; feeds cases (hostile ``run``/``run_batch`` feeds), options cases (random
arguments of ``compile``, ``run``, ``save`` and ``load``) and caches cases (damaged cache files and
folders in a private temporary folder) from :mod:`byoc_fuzz.inputs`
(``--kinds model,bundle,plugin,feeds,options,caches``, all by default).

Every case must end in success or a :class:`byoc.ByocError`. Anything else is a finding: an
exception of a foreign type, a case slower than the time limit (a hang), or one that allocated
more than the memory cap (traced by ``tracemalloc``, which sees numpy's buffers).

    python -m byoc_fuzz --count 500 --seed 1
    python -m byoc_fuzz --seconds 300          # nox -s fuzz -- --seconds 300

Recorded runs (issue 18, acceptance 2: 10,000 cases across the model, bundle and plugin kinds,
default limits: 20 s and 256 MiB per case, 8 GiB address space; on a 2-core machine shared with
three other jobs, so the times are long):

* ``--count 10000 --seed 1803`` (all kinds, before the specialising bundles): 10,000 cases in
  2,218 s, 3,840 compiled and ran, 6,160 refused with a byoc error; 0 foreign exceptions, 0 over
  the time limit, 0 over the memory cap.
* ``--count 10000 --seed 1805`` (all kinds, with specialising bundles and their weight pool among
  the bundle cases): 10,000 cases in 1,982 s, 3,962 ran, 6,038 refused; 0 foreign, 0 over time,
  0 over memory.
* ``--kinds bundle --count 3000 --seed 1806``: stopped after 950 cases (to leave the machine to
  the run above), 0 findings; ``--kinds bundle --count 1000 --seed 1807`` on the final code
  (read-back options damaged too): 1,000 cases in 249 s, 218 ran, 782 refused; 0 findings.
"""

from __future__ import annotations

import argparse
import math
import random
import threading
import time
import tracemalloc
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: a compiled case may allocate at most this much (bytes) while compiling and running
MEMORY_CAP = 256 << 20
#: one case (compile + run) may take at most this long (seconds)
TIME_LIMIT = 20.0
#: the budget cases run under: generous for the seeds, tight against absurd requests
FUZZ_BUDGET_BYTES = 64 << 20


# -- seed models ------------------------------------------------------------------------------


def _conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Reshape", ["p", "shape"], ["f"], name="flatten"),
        helper.make_node("Softmax", ["f"], ["y"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(nodes, "conv_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 36])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _elementwise() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "a"], ["m"], name="mul"),
        helper.make_node("Sigmoid", ["m"], ["y"], name="sig"),
        helper.make_node("ReduceSum", ["m"], ["z"], keepdims=0, name="sum"),
    ]
    graph = helper.make_graph(
        nodes, "elementwise",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shapes() -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array([2, 3], np.int64), "target"),
             numpy_helper.from_array(np.array(1.5, np.float32), "fill")]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["target"], ["c"], value=numpy_helper.from_array(np.array([1.0], np.float32)),
                         name="const_of_shape"),
        helper.make_node("Expand", ["fill", "target"], ["e"], name="expand"),
        helper.make_node("Add", ["c", "e"], ["ce"], name="add"),
        helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
        helper.make_node("Concat", ["r", "ce"], ["y"], axis=0, name="concat"),
    ]
    graph = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _control_flow() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"], name="cond"),
         helper.make_node("Add", ["v_in", "one"], ["v_out"], name="inc")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")],
    )
    then_g = helper.make_graph([helper.make_node("Neg", ["v"], ["t"], name="neg")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["v"], ["e"], name="abs")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    nodes = [
        helper.make_node("Loop", ["trips", "", "x"], ["v"], body=body, name="loop"),
        helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g, name="if"),
    ]
    graph = helper.make_graph(
        nodes, "control_flow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(3, np.int64), "trips")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SEEDS: dict[str, Callable[[], onnx.ModelProto]] = {
    "conv_net": _conv_net,
    "elementwise": _elementwise,
    "shapes": _shapes,
    "control_flow": _control_flow,
}


# -- mutations --------------------------------------------------------------------------------

_DTYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.INT8,
           TensorProto.UINT8, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.STRING, TensorProto.BFLOAT16,
           TensorProto.COMPLEX64, 0, 99]
_WEIRD = ["", "\x00", "a\x00b", "名前", "😀", "../x", "/abs", "x" * 300, "\u202e", " ", "\\", "%s%n"]
_ABSURD = [0, -1, -(2**62), 2**31, 2**40, 10**15, 2**63 - 1]


def _all_graphs(g: onnx.GraphProto) -> list[onnx.GraphProto]:
    out = [g]
    for n in g.node:
        for a in n.attribute:
            if a.HasField("g"):
                out.extend(_all_graphs(a.g))
            for sub in a.graphs:
                out.extend(_all_graphs(sub))
    return out


def _pick_graph(rng: random.Random, m: onnx.ModelProto) -> onnx.GraphProto:
    return rng.choice(_all_graphs(m.graph))


def _tensors(m: onnx.ModelProto) -> list[TensorProto]:
    ts = []
    for g in _all_graphs(m.graph):
        ts.extend(g.initializer)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("t"):
                    ts.append(a.t)
    return ts


def m_flip_dtype(rng, m):
    ts = _tensors(m)
    if ts:
        rng.choice(ts).data_type = rng.choice(_DTYPES)
    g = _pick_graph(rng, m)
    values = list(g.input) + list(g.output) + list(g.value_info)
    if values:
        v = rng.choice(values)
        if v.type.HasField("tensor_type"):
            v.type.tensor_type.elem_type = rng.choice(_DTYPES)


def m_wrong_data_length(rng, m):
    ts = [t for t in _tensors(m) if t.raw_data or t.float_data or t.int64_data]
    if not ts:
        return
    t = rng.choice(ts)
    if t.raw_data:
        data = t.raw_data
        t.raw_data = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.5 else data + bytes(rng.randrange(1, 64))
    elif t.float_data:
        t.float_data.append(1.0) if rng.random() < 0.5 else t.float_data.pop()
    else:
        t.int64_data.append(7) if rng.random() < 0.5 else t.int64_data.pop()


def m_absurd_dims(rng, m):
    ts = _tensors(m)
    if ts:
        t = rng.choice(ts)
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] = rng.choice(_ABSURD)
        else:
            t.dims.append(rng.choice(_ABSURD))
    g = _pick_graph(rng, m)
    values = [v for v in list(g.input) + list(g.output) if v.type.HasField("tensor_type")]
    if values:
        dims = rng.choice(values).type.tensor_type.shape.dim
        if len(dims):
            dims[rng.randrange(len(dims))].dim_value = rng.choice(_ABSURD[1:] + [3])


def m_absurd_shape_values(rng, m):
    """An int64 tensor (a shape, a trip count, an axis) gets absurd values."""
    ts = [t for t in _tensors(m) if t.data_type == TensorProto.INT64]
    if not ts:
        return
    t = rng.choice(ts)
    arr = numpy_helper.to_array(t).copy()
    if arr.size:
        flat = arr.reshape(-1)
        flat[rng.randrange(flat.size)] = rng.choice(_ABSURD)
        t.CopyFrom(numpy_helper.from_array(arr, t.name))


def m_missing_input(rng, m):
    g = _pick_graph(rng, m)
    if g.node:
        n = rng.choice(g.node)
        if n.input:
            i = rng.randrange(len(n.input))
            n.input[i] = rng.choice(["", "does_not_exist", n.output[0] if n.output else "x"])
    if rng.random() < 0.3 and len(g.input):
        del g.input[rng.randrange(len(g.input))]


def m_cycle(rng, m):
    g = _pick_graph(rng, m)
    if len(g.node) >= 2:
        i, j = sorted(rng.sample(range(len(g.node)), 2))
        if g.node[i].input and g.node[j].output:
            g.node[i].input[0] = g.node[j].output[0]
    elif g.node and g.node[0].input and g.node[0].output:
        g.node[0].input[0] = g.node[0].output[0]  # a self-loop


def m_weird_names(rng, m):
    g = _pick_graph(rng, m)
    pool = [n for n in g.node] + list(g.initializer) + list(g.input) + list(g.output)
    if pool:
        target = rng.choice(pool)
        target.name = rng.choice(_WEIRD)
    if g.node and rng.random() < 0.5:
        n = rng.choice(g.node)
        if n.output:
            n.output[0] = rng.choice(_WEIRD)


def m_external_data(rng, m):
    ts = [t for t in _tensors(m) if t.name]
    if not ts:
        return
    t = rng.choice(ts)
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.ClearField("int64_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    location = rng.choice(["../../etc/passwd", "/etc/passwd", "a/../../b", "x\x00y", "nonexistent.bin", "",
                           "C:\\windows\\system.ini", "~/.ssh/id_rsa", "."])
    for k, v in [("location", location), ("offset", str(rng.choice([0, -5, 2**62]))),
                 ("length", str(rng.choice([0, 4, 2**40, -1])))]:
        entry = t.external_data.add()
        entry.key, entry.value = k, v


def m_deep_nesting(rng, m):
    """Wrap the graph's first node in ``depth`` nested Ifs."""
    depth = rng.choice([2, 8, 40, 200])
    g = m.graph
    if not g.node or not g.node[0].output:
        return
    inner = g.node[0]
    out_name = inner.output[0]
    vi = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)
    node = inner
    for level in range(depth):
        # the else branch is a constant, so the model grows linearly with the depth
        then_branch = helper.make_graph([node], f"nest{level}", [], [vi])
        constant = helper.make_node("Constant", [], [out_name], value=numpy_helper.from_array(np.zeros(1, np.float32)),
                                    name=f"nest_else_{level}")
        else_branch = helper.make_graph([constant], f"nest{level}_else", [], [vi])
        node = helper.make_node("If", ["__nest_flag"], [out_name], then_branch=then_branch, else_branch=else_branch,
                                name=f"nest_if_{level}")
    g.node[0].CopyFrom(node)
    g.initializer.append(numpy_helper.from_array(np.array(True), "__nest_flag"))


def m_attribute_damage(rng, m):
    g = _pick_graph(rng, m)
    nodes = [n for n in g.node if n.attribute]
    if not nodes:
        if g.node:
            n = rng.choice(g.node)
            n.attribute.append(helper.make_attribute(rng.choice(["axis", "pads", "bogus"]), rng.choice([10**9, -7, 2.5])))
        return
    n = rng.choice(nodes)
    a = rng.choice(n.attribute)
    choice = rng.randrange(4)
    if choice == 0:
        n.attribute.remove(a)
    elif choice == 1:
        a.type = rng.choice([1, 2, 3, 4, 5, 6, 7, 99])
    elif choice == 2 and a.ints:
        a.ints[rng.randrange(len(a.ints))] = rng.choice(_ABSURD)
    else:
        a.i = rng.choice(_ABSURD)


def m_opset(rng, m):
    if rng.random() < 0.5:
        m.opset_import[0].version = rng.choice([0, 1, 6, 9, 10000, -3])
    else:
        g = _pick_graph(rng, m)
        if g.node:
            n = rng.choice(g.node)
            if rng.random() < 0.5:
                n.domain = rng.choice(["com.vendor", "ai.onnx.ml", "byoc", "\x00"])
            else:
                n.op_type = rng.choice(["NoSuchOp", "", "conv", "If", "Loop", "RandomNormal"])


def m_duplicate_outputs(rng, m):
    g = _pick_graph(rng, m)
    if len(g.node) >= 2 and g.node[0].output and g.node[1].output:
        g.node[1].output[0] = g.node[0].output[0]
    elif len(g.output):
        g.output.append(g.output[0])


STRUCTURAL = [m_flip_dtype, m_wrong_data_length, m_absurd_dims, m_absurd_shape_values, m_missing_input, m_cycle,
              m_weird_names, m_external_data, m_deep_nesting, m_attribute_damage, m_opset, m_duplicate_outputs]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 and data:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        data = data[: rng.randrange(len(data) + 1)]
    elif kind == 2 and data:
        i = rng.randrange(len(data))
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:
        a, b = sorted(rng.randrange(len(data) + 1) for _ in range(2))
        data = data[:a] + data[b:] + data[a:b]
    return bytes(data)


# -- one case ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # "ok", "byoc-error", "foreign", "slow", "memory"
    seed_model: str
    mutations: list[str]
    detail: str = ""
    seconds: float = 0.0
    peak_bytes: int = 0
    case_seed: int | None = None


def make_case(rng: random.Random) -> tuple[str, list[str], bytes]:
    name = rng.choice(sorted(SEEDS))
    model = SEEDS[name]()
    applied = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        fn = rng.choice(STRUCTURAL)
        try:
            fn(rng, model)
        except Exception:  # a mutation that does not apply to this (already mutated) model
            continue
        applied.append(fn.__name__[2:])
    data = model.SerializeToString()
    if rng.random() < 0.2:
        data = mutate_bytes(rng, data)
        applied.append("bytes")
    return name, applied, data


def _random_feeds(compiled, rng: random.Random) -> dict[str, np.ndarray]:
    feeds = {}
    gen = np.random.default_rng(rng.randrange(2**32))
    for spec in compiled.inputs:
        if spec.optional:
            continue
        shape = spec.shape if spec.shape is not None else (2,)
        dims = [d if isinstance(d, int) and 0 <= d <= 64 else 2 for d in shape]
        if math.prod(dims) > 1 << 16:
            dims = [2] * len(dims)
        dtype = spec.dtype if spec.dtype is not None else np.dtype(np.float32)
        if dtype == np.bool_:
            feeds[spec.name] = gen.random(dims) < 0.5
        elif dtype.kind in "iu":
            feeds[spec.name] = gen.integers(0, 3, dims).astype(dtype)
        elif dtype.kind == "f":
            feeds[spec.name] = gen.standard_normal(dims).astype(dtype)
        else:
            feeds[spec.name] = np.zeros(dims, dtype)
    return feeds


def _max_rss() -> int:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    except (ImportError, OSError):
        return 0


def limit_address_space(nbytes: int = 8 << 30) -> None:
    """Cap this process's address space so a runaway allocation fails instead of exhausting RAM."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft > nbytes:
            resource.setrlimit(resource.RLIMIT_AS, (nbytes, hard))
    except (ImportError, ValueError, OSError):
        pass


#: byoc's threads that run models or compile in the background (tiers, specialisations, hooks)
_BACKGROUND = ("byoc-full-tier", "byoc-specialise", "byoc-hook-")


def _start_tracing() -> None:
    tracemalloc.start()


def _stop_tracing(wait: float = 60.0) -> None:
    """Stop tracemalloc once byoc's background threads are done: on Python < 3.12.9,
    ``tracemalloc.stop()`` while another thread allocates without the GIL (numpy does, in
    byoc-cpu's pool threads) crashes the process (CPython gh-128679). A run of many cases traces
    throughout and stops once (:func:`fuzz`)."""
    deadline = time.monotonic() + wait
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and thread.name.startswith(_BACKGROUND):
            thread.join(max(0.0, deadline - time.monotonic()))
    tracemalloc.stop()


def run_case(data: bytes, rng: random.Random, *, seed_model: str = "", mutations=(),
             time_limit: float = TIME_LIMIT, memory_cap: int = MEMORY_CAP) -> Outcome:
    """Compile and run one case; classify what happened."""
    import byoc

    budget = byoc.Budget(max_tensor_bytes=FUZZ_BUDGET_BYTES, max_total_bytes=4 * FUZZ_BUDGET_BYTES,
                         max_nesting=32, max_loop_iterations=10_000)
    out = Outcome("ok", seed_model, list(mutations))
    tracing = tracemalloc.is_tracing()
    if not tracing:
        _start_tracing()
    tracemalloc.reset_peak()
    traced_before = tracemalloc.get_traced_memory()[0]  # what earlier cases left (caches, compiled code)
    rss_before = _max_rss()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if callable(data):  # a bundle, plugin, feeds, options or caches case
                # a case may list its mutations in rng.fuzz_applied as it goes: named even if it raises
                rng.fuzz_applied = out.mutations = []
                out.mutations = data(rng, budget)
            else:
                compiled = byoc.compile(data, targets=[], budget=budget)
                feeds = _random_feeds(compiled, rng)
                compiled.run(feeds, timeout=time_limit)
    except KeyboardInterrupt:
        raise
    except byoc.ByocError as exc:
        out.kind, out.detail = "byoc-error", f"{type(exc).__name__}: {str(exc)[:200]}"
    except RecursionError as exc:  # a foreign type: reported as a finding
        out.kind, out.detail = "foreign", f"RecursionError: {str(exc)[:200]}"
    except BaseException as exc:  # SystemExit from a hostile plugin too: a finding
        out.kind, out.detail = "foreign", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        out.seconds = time.perf_counter() - t0
        # numpy buffers are traced; memory allocated in C (protobuf, onnx) shows in the peak RSS
        out.peak_bytes = max(tracemalloc.get_traced_memory()[1] - traced_before, _max_rss() - rss_before)
        if not tracing:
            _stop_tracing()
    if out.kind != "foreign":
        if out.seconds > time_limit:
            out.kind, out.detail = "slow", f"took {out.seconds:.1f} s ({out.detail or 'ok'})"
        elif out.peak_bytes > memory_cap:
            out.kind, out.detail = "memory", f"peak {out.peak_bytes >> 20} MiB ({out.detail or 'ok'})"
    return out


@dataclass
class Summary:
    cases: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    findings: list[Outcome] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        self.cases += 1
        self.counts[o.kind] = self.counts.get(o.kind, 0) + 1
        if o.kind in ("foreign", "slow", "memory"):
            self.findings.append(o)
        elif o.kind == "byoc-error":
            key = o.detail.split(":", 1)[0]
            self.errors[key] = self.errors.get(key, 0) + 1

    @property
    def ok(self) -> bool:
        return not self.findings


def make_any_case(rng: random.Random, kinds: Sequence[str] = ("model",)) -> tuple[str, list[str], Any]:
    """A model case (:func:`make_case`), or a bundle or plugin case (:mod:`byoc_fuzz.hostile`) or a
    feeds, options or caches case (:mod:`byoc_fuzz.inputs`), whose ``data`` is then a callable
    ``(rng, budget) -> mutation names``."""
    kind = rng.choice(list(kinds))
    if kind == "model":
        return make_case(rng)
    from byoc_fuzz import hostile as fuzz_hostile
    from byoc_fuzz import inputs as fuzz_inputs

    return kind, [], {"bundle": fuzz_hostile.bundle_case, "plugin": fuzz_hostile.plugin_case,
                      "feeds": fuzz_inputs.feeds_case, "options": fuzz_inputs.options_case,
                      "caches": fuzz_inputs.caches_case}[kind]


KINDS = ("model", "bundle", "plugin", "feeds", "options", "caches")


def fuzz(count: int | None = None, seconds: float | None = None, seed: int = 0,
         progress: Callable[[Summary], None] | None = None, kinds: Sequence[str] = KINDS) -> Summary:
    if count is None and seconds is None:
        count = 200
    rng = random.Random(seed)
    summary = Summary()
    t_end = None if seconds is None else time.monotonic() + seconds
    tracing = tracemalloc.is_tracing()
    if not tracing:
        _start_tracing()  # once for the run: see _stop_tracing
    try:
        while (count is None or summary.cases < count) and (t_end is None or time.monotonic() < t_end):
            case_seed = rng.randrange(2**63)
            case_rng = random.Random(case_seed)
            name, applied, data = make_any_case(case_rng, kinds)
            outcome = run_case(data, case_rng, seed_model=name, mutations=applied)
            outcome.case_seed = case_seed
            summary.add(outcome)
            if progress is not None and summary.cases % 50 == 0:
                progress(summary)
    finally:
        if not tracing:
            _stop_tracing()
    return summary


def replay(case_seed: int, kinds: Sequence[str] = KINDS) -> Outcome:
    """Re-run one case by the seed printed with a finding (with the same ``--kinds``)."""
    rng = random.Random(case_seed)
    name, applied, data = make_any_case(rng, kinds)
    return run_case(data, rng, seed_model=name, mutations=applied)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m byoc_fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, help="number of cases (default 200 when --seconds is not given)")
    parser.add_argument("--seconds", type=float, help="run for this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", type=int, metavar="CASE_SEED", help="re-run one case")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="case kinds, comma-separated: model (mutated ONNX), bundle (damaged bundles: "
                             "options, members, compression), plugin (hostile plugins), feeds (hostile "
                             "run/run_batch feeds), options (random compile/run/save/load arguments), "
                             "caches (damaged cache files and folders); default all")
    parser.add_argument("--address-space-gib", type=float, default=8.0,
                        help="cap the process's address space (0: no cap)")
    args = parser.parse_args(argv)
    if args.address_space_gib > 0:
        limit_address_space(int(args.address_space_gib * (1 << 30)))
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    if args.replay is not None:
        o = replay(args.replay, kinds)
        print(f"{o.kind}: seed model {o.seed_model}, mutations {o.mutations}: {o.detail}")
        return 0 if o.kind in ("ok", "byoc-error") else 1

    shown = 0

    def progress(s: Summary) -> None:
        nonlocal shown
        print(f"  {s.cases} cases: {s.counts}", flush=True)
        for f in s.findings[shown:]:  # at once, so that a long run that is stopped keeps them
            print(f"  found {f.kind}: case seed {f.case_seed}: {f.detail}", flush=True)
        shown = len(s.findings)

    t0 = time.perf_counter()
    s = fuzz(args.count, args.seconds, args.seed, progress, kinds)
    print(f"{s.cases} cases in {time.perf_counter() - t0:.0f} s (seed {args.seed}): "
          f"{s.counts.get('ok', 0)} compiled and ran, {s.counts.get('byoc-error', 0)} refused with a byoc error")
    print("byoc errors by type: " + ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())))
    crashes = sum(1 for f in s.findings if f.kind == "foreign")
    hangs = sum(1 for f in s.findings if f.kind == "slow")
    memory = sum(1 for f in s.findings if f.kind == "memory")
    print(f"findings: {crashes} foreign exceptions, {hangs} over the time limit, {memory} over the memory cap")
    for f in s.findings[:50]:
        print(f"  {f.kind}: case seed {f.case_seed} (replay with --replay), seed model {f.seed_model}, "
              f"mutations {f.mutations}: {f.detail}")
    return 0 if s.ok else 1

