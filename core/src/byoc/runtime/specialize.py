"""Symbolic input dimensions and targets that need static shapes.

A model whose inputs have named or unknown dimensions compiles once. Targets declare a shape
policy (:attr:`byoc.Target.shape_policy`): ``dynamic`` targets take part in that compile;
``static`` and ``buckets`` targets cannot, so byoc compiles a *specialisation* per concrete input
shapes the first time they are seen (``static``: any shapes, up to the target's
``max_specializations``; ``buckets``: only the listed shapes) and caches it. Shapes without a
specialisation run on the shape-agnostic base compile (dynamic targets and the host).

Unless the model was compiled with ``wait=True``, a specialisation compiles on a background
thread, one at a time: the run that first sees its shapes, and every run of them until the
specialisation has compiled and run once, is served by the base, so a new shape costs a run on
the host's kernels, not a compile. With ``wait=True`` the first run of new shapes compiles it.

:func:`specialise` is a wrapper around a single-shape compile that ``byoc.compile`` passes in,
so this module never imports the compile driver.
"""

from __future__ import annotations

import gc
import threading
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import onnx

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir

    from byoc.contract import Target
    from byoc.runtime.compiled import CompiledModel

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]

#: refused input shapes warned about per model; later ones are counted in the report only
MAX_WARNINGS = 8


def has_symbolic_inputs(proto: onnx.ModelProto) -> bool:
    inits = {t.name for t in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in inits or not value.type.HasField("tensor_type"):
            continue
        tt = value.type.tensor_type
        if not tt.HasField("shape"):
            return True
        if any(not d.HasField("dim_value") for d in tt.shape.dim):
            return True
    return False


def has_symbolic_ir_inputs(model: "ir.Model") -> bool:
    """:func:`has_symbolic_inputs` on the IR, without serialising the model and its weights."""
    import onnx_ir as ir

    graph = model.graph
    for value in graph.inputs:
        if value.name in graph.initializers or not isinstance(value.type, ir.TensorType):
            continue
        if value.shape is None or any(not isinstance(d, int) for d in value.shape):
            return True
    return False


def with_input_shapes(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` whose graph inputs have the given concrete shapes."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for value in out.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[value.name]:
                dims.add().dim_value = int(d)
    for vi in list(out.graph.value_info):  # stale symbolic shapes would contradict the new ones
        out.graph.value_info.remove(vi)
    return out


def assumed_shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for the symbolic inputs of ``proto``, to preview a placement: a symbolic
    dimension is 1 on an input's first axis (a batch), else 256; dimensions of one name alike."""
    inits = {t.name for t in proto.graph.initializer}
    sizes: dict[str, int] = {}
    shapes = {}
    for value in proto.graph.input:
        if value.name in inits or not value.type.tensor_type.HasField("shape"):
            continue
        dims = []
        for axis, d in enumerate(value.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            else:
                dims.append(sizes.setdefault(d.dim_param, 1 if axis == 0 else 256) if d.dim_param else
                            (1 if axis == 0 else 256))
        shapes[value.name] = tuple(dims)
    return shapes


def shape_key(shapes: Mapping[str, Sequence[int]]) -> ShapeKey:
    """The cache key of one set of concrete input shapes (input name -> dims)."""
    return tuple(sorted((str(name), tuple(int(d) for d in dims)) for name, dims in shapes.items()))


def specialise(
    proto: onnx.ModelProto,
    targets: Sequence["Target"],
    compile_shapes: Callable[..., "CompiledModel"],
    recipe: dict[str, Any] | None = None,
    background: bool = False,
) -> "CompiledModel":
    """Compile ``proto`` (symbolic input dimensions) once with the ``dynamic`` targets only and
    attach a :class:`Specializer` that compiles for all ``targets`` per concrete input shapes.

    :param compile_shapes: ``compile_shapes(model, targets)``, one compile of ``model`` for
        ``targets`` (in priority order).
    :param recipe: the compile's settings as plain data (``passes``, ``strict``, ``placement``,
        ``hook_timeout``, ``calibrated``), kept so that a bundle can specialise further shapes
        after loading as this model would (:mod:`byoc.bundle`); ``None``: it cannot be saved.
    :param background: compile specialisations on a background thread (``compile_shapes`` then
        takes ``wait=True``: the thread runs the specialisation once before it serves).
    :returns: the base compiled model; its ``run`` picks a specialisation by the feeds' shapes.
    """
    targets = list(targets)
    static = [t for t in targets if t.shape_policy != "dynamic"]
    base = compile_shapes(proto, [t for t in targets if t.shape_policy == "dynamic"])
    compile_fn = (lambda p: compile_shapes(p, targets, wait=True)) if background else \
        (lambda p: compile_shapes(p, targets))
    base.specializer = Specializer(base, proto, static, compile_fn, targets=targets, recipe=recipe,
                                   background=background)
    base.options["shape_policy"] = {t.name: t.shape_policy for t in targets}
    return base


class Specializer:
    """Chooses, per call, the compiled model for the feeds' concrete shapes."""

    def __init__(
        self,
        base: "CompiledModel",
        proto: onnx.ModelProto,
        static_targets: Sequence["Target"],
        compile_fn: Callable[[onnx.ModelProto], "CompiledModel"] | None,
        *,
        targets: Sequence["Target"] | None = None,
        recipe: dict[str, Any] | None = None,
        cache: dict[ShapeKey, "CompiledModel"] | None = None,
        background: bool = False,
    ):
        self.base = base
        self.proto = proto
        self.static_targets = list(static_targets)
        #: every target of a specialisation, in priority order
        self.targets = list(targets) if targets is not None else list(self.static_targets)
        #: ``None``: no further shapes are specialised (a loaded bundle whose plugins are missing)
        self.compile_fn = compile_fn
        self.recipe = recipe
        self.cache: dict[ShapeKey, "CompiledModel"] = dict(cache or {})
        #: refused shapes, most recently seen last, at most ``Budget.max_shape_keys`` of them
        self.refused: OrderedDict[ShapeKey, None] = OrderedDict()
        #: every refusal so far (a shape forgotten and seen again counts again)
        self.n_refused = 0
        #: compile new shapes on a background thread (see the module's description)
        self.background = background
        #: the shapes being specialised in the background, with a copy of their first feeds
        self._queued: tuple[ShapeKey, dict[str, np.ndarray]] | None = None
        self._thread: threading.Thread | None = None
        self._in_flight: ShapeKey | None = None
        #: shapes whose background compile failed: ``{shapes: "Type: message"}``
        self.failed: dict[ShapeKey, str] = {}
        #: ``preview_fn()``: the placement at assumed shapes, for the report (``None``: none)
        self.preview_fn: Callable[[], dict[str, Any]] | None = None
        self._preview: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def held_bytes(self) -> int:
        """Bytes of artifact data the specialisations hold (see ``Budget.max_specialization_bytes``)."""
        return sum(len(cr.artifact.data) for cm in list(self.cache.values()) for cr in cm.regions)

    def _allowed(self, key: ShapeKey) -> bool:
        if self.compile_fn is None or self.held_bytes() > self.base.budget.max_specialization_bytes:
            return False
        shapes = dict(key)
        for t in self.static_targets:
            if t.shape_policy == "buckets":
                if any(all(tuple(shapes.get(k, ())) == tuple(v) for k, v in b.items()) for b in t.shape_buckets):
                    return True
            elif len(self.cache) < t.max_specializations:
                return True
        return False

    def select(self, feeds: dict[str, Any]) -> "CompiledModel":
        key = shape_key({name: np.shape(v) for name, v in feeds.items()})
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        with self._lock:
            if key in self.cache:
                return self.cache[key]
            if key in self.refused:
                self.refused.move_to_end(key)
                return self.base
            if self.background and (self._in_flight is not None or key in self.failed):
                return self.base  # one at a time: a later run of these shapes starts theirs
            if not self._allowed(key):
                self._refuse(key)
                return self.base
            if self.background:
                self._in_flight = key
                self._queued = (key, {name: np.array(value, copy=True) for name, value in feeds.items()})
                return self.base
            compiled = self.compile_fn(with_input_shapes(self.proto, dict(key)))
            self.cache[key] = compiled
            return compiled

    def start_queued(self) -> None:
        """Start the background compile that :meth:`select` queued (after the run it served:
        that run's answer comes first)."""
        with self._lock:
            if self._queued is None:
                return
            key, feeds = self._queued
            self._queued = None
            self._thread = threading.Thread(target=self._specialise, args=(key, feeds), daemon=True,
                                            name="byoc-specialise")
        self._thread.start()

    def drop_queued(self) -> None:
        """Forget the compile that :meth:`select` queued (the run it was queued for failed)."""
        with self._lock:
            if self._queued is not None:
                if self._in_flight == self._queued[0]:
                    self._in_flight = None
                self._queued = None

    def _specialise(self, key: ShapeKey, feeds: dict[str, np.ndarray]) -> None:
        try:
            compiled = self.compile_fn(with_input_shapes(self.proto, dict(key)))
            compiled.run(feeds)  # its first run: JIT engines compile or load their code here
            # a full collection here, in the background, of what the compile left: else Python's
            # next one (100-200 ms once a large model's specialisations are alive) falls in a run
            gc.collect()
        except BaseException as exc:  # noqa: BLE001 - reported once; the base keeps serving these shapes
            with self._lock:
                self.failed[key] = f"{type(exc).__name__}: {exc}"
                self._in_flight = None
            warnings.warn(f"byoc: the specialisation for input shapes {dict(key)} failed to compile in the "
                          f"background ({self.failed[key]}); they keep running on the base compile",
                          RuntimeWarning, stacklevel=1)
            return
        with self._lock:
            self.cache[key] = compiled
            self._in_flight = None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background compile in flight, if any; whether none is left."""
        self.start_queued()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._in_flight is None

    def _refuse(self, key: ShapeKey) -> None:
        """Remember ``key`` (forgetting the least recently seen beyond the budget's bound) and warn,
        for the first :data:`MAX_WARNINGS` refusals only."""
        self.refused[key] = None
        while len(self.refused) > self.base.budget.max_shape_keys:
            self.refused.popitem(last=False)
        self.n_refused += 1
        if self.n_refused > MAX_WARNINGS:
            return
        names = ", ".join(t.name for t in self.static_targets)
        why = "shape policy/limit or Budget.max_specialization_bytes" if self.compile_fn is not None else \
            "a loaded bundle whose plugins for them are missing specialises no further shapes"
        more = ("; further refused shapes are not warned about (the report counts them)"
                if self.n_refused == MAX_WARNINGS else "")
        warnings.warn(f"no specialisation for input shapes {dict(key)} (targets {names}: {why}); "
                      f"running them without those targets{more}", stacklevel=4)

    def preview(self) -> dict[str, Any] | None:
        """Where the targets would place the model at assumed input shapes (computed once, on
        demand; ``None`` without a ``preview_fn``)."""
        if self._preview is None and self.preview_fn is not None:
            self._preview = self.preview_fn()
        return self._preview

    def describe(self) -> dict[str, Any]:
        return {
            "static_targets": [t.name for t in self.static_targets],
            "specialisations": [dict(k) for k in self.cache],
            "held_bytes": self.held_bytes(),
            "refused": [dict(k) for k in self.refused],
            "refused_count": self.n_refused,
            "compiling": None if self._in_flight is None else dict(self._in_flight),
            "failed": [{"shapes": dict(k), "error": e} for k, e in self.failed.items()],
        }
