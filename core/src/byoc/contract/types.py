"""The objects plugins and the core exchange: targets, support contexts, patterns, rules,
regions and artifacts.

Everything here is part of the vendor contract (hook API version 2): import it from
:mod:`byoc.contract`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from byoc.contract.options import Option, normalize_options, option_defaults

if TYPE_CHECKING:  # pragma: no cover
    from byoc.contract.patterns import Match, PatternExpr

#: the ONNX domain and operator type of a node that stands for an offloaded region
REGION_DOMAIN = "byoc"
REGION_OP = "Region"

#: the hook API version this contract defines (see :mod:`byoc.contract.hookspecs`)
HOOK_API_VERSION = 2


@dataclass
class Target:
    """A device a plugin provides.

    :param name: unique target name (``"jetson"``); patterns are named ``"<name>.<pattern>"``.
    :param version: the plugin's version, recorded in bundles.
    :param description: one line for ``byoc targets``.
    :param device: device kind, e.g. ``"gpu"``, ``"dpu"``, ``"cpu"``.
    :param options: the options the target accepts, a list of :class:`byoc.contract.Option`
        (name, type, default, allowed values, doc, machine-local or not). byoc validates
        ``byoc.compile(..., target_options={name: {...}})`` and options read from a bundle
        against them and hands every hook the full, validated set (defaults filled in). A plain
        ``{name: default}`` dict is accepted as a list of untyped options.
    :param rtol: relative tolerance of this target's numerics vs the host reference.
    :param atol: absolute tolerance.
    :param priority: default priority when ``targets=None`` (higher first).
    :param api_version: the hook API version the plugin was built for (default: this
        contract's, :data:`HOOK_API_VERSION`).
    :param shape_policy: ``"dynamic"`` (artifacts accept any input shapes), ``"static"`` (byoc
        specialises the model per concrete input shapes, caching up to ``max_specializations``,
        then runs new shapes on the remaining targets/host) or ``"buckets"`` (specialise only for
        the input shapes listed in ``shape_buckets``).
    :param shape_buckets: for ``"buckets"``: a list of ``{input name: shape}`` dicts.
    :param needs_calibration: the target runs quantised (integer) code: ``byoc.compile`` needs
        ``calibration=`` samples for it (an explicit target without them raises
        :class:`byoc.CalibrationRequiredError`; with ``targets=None`` it is skipped, and
        ``CompiledModel.options["skipped_targets"]`` says why), and its regions reach the code
        generator quantised (see :mod:`byoc.quantize`).
    :param available: whether the device is really present on this machine: a bool, or a
        callable ``() -> bool`` that byoc calls lazily (only when it must decide, e.g.
        ``byoc.compile(model)`` with ``targets=None`` or ``byoc targets``), so a plugin can probe
        its driver without initialising it at registration. ``targets=None`` selects only
        available targets; an unavailable one (an emulation) runs when named in ``targets=``
        and in the conformance kit. A callable that raises counts as ``False``.
    :param bandwidth: bytes per second between host memory and the device, used by
        ``placement="cost"`` to price a tensor crossing between the host and this target;
        ``None`` (default): the device works in host memory, crossings are free.
    :param launch_overhead: fixed seconds per region run (launch, synchronisation), used by
        ``placement="cost"``.
    :param flops: sustained FLOP/s of the device for byoc's own cost model (used when the
        plugin gives no ``byoc_cost``); ``None``: the host's measured throughput.
    :param jit: the target's runtime compiles its code on the first call (seconds on a fresh
        install): byoc answers runs from its reference kernels until that first call, made in the
        background, is done (``byoc.compile(..., wait=False)``, the default; see
        :mod:`byoc.runtime.tiers`).
    :param quantization: the scheme the target asks for (:class:`byoc.quantize.QuantScheme`
        keys, e.g. ``{"activations": "pow2", "weights": "per_channel"}``); a user may override
        keys with ``target_options={name: {"quantization": {...}}}``.
    """

    name: str
    version: str = "0"
    description: str = ""
    device: str = "accelerator"
    options: Sequence[Option] | Mapping[str, Any] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5
    priority: int = 0
    api_version: int = HOOK_API_VERSION
    shape_policy: str = "dynamic"
    shape_buckets: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    max_specializations: int = 8
    needs_calibration: bool = False
    quantization: dict[str, Any] = field(default_factory=dict)
    available: "bool | Callable[[], bool]" = True
    bandwidth: float | None = None
    launch_overhead: float = 0.0
    flops: float | None = None
    jit: bool = False
    #: filled in by the plugin manager
    plugin: str = ""
    distribution: str = ""
    #: what ``byoc targets`` shows as the active runtime path (e.g. "emulation", "tensorrt")
    runtime_path: str = ""

    def __post_init__(self) -> None:
        self.options = normalize_options(self.name, self.options)

    def is_available(self) -> bool:
        """Evaluate :attr:`available` (calling it when it is a callable; an exception means ``False``)."""
        avail = self.available
        if callable(avail):
            try:
                return bool(avail())
            except Exception:
                return False
        return bool(avail)

    @property
    def defaults(self) -> dict[str, Any]:
        """``{option name: default}`` for every declared option."""
        return option_defaults(self.options)

    def option(self, name: str) -> Option | None:
        """The declared option ``name``, or ``None``."""
        for o in self.options:
            if o.name == name:
                return o
        return None


@dataclass(frozen=True)
class SupportContext:
    """What a support check, a pattern check and a partition rule see besides their subject.

    :param target: the target being partitioned for.
    :param options: the target's validated options (defaults filled in).
    :param state: a scratch dict, fresh for each partitioning of one graph for this target: a
        rule may keep counts in it (e.g. "at most N regions").
    """

    target: str
    options: Mapping[str, Any]
    state: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @staticmethod
    def shape(value: ir.Value | None) -> tuple | None:
        """Static shape of ``value`` (ints; ``None`` for unknown dims) or ``None``."""
        if value is None or value.shape is None:
            return None
        return tuple(d if isinstance(d, int) else None for d in value.shape)

    @staticmethod
    def const(value: ir.Value | None) -> np.ndarray | None:
        """The compile-time constant behind ``value``, or ``None``."""
        if value is None or value.const_value is None or value.is_graph_input():
            return None
        return value.const_value.numpy()

    @staticmethod
    def dtype(value: ir.Value | None) -> ir.DataType | None:
        return None if value is None else value.dtype


@dataclass
class Pattern:
    """A named composite pattern: ``name`` is ``"<target>.<pattern>"``.

    :param expr: the dataflow pattern (see :mod:`byoc.contract.patterns`).
    :param check: optional ``check(match, ctx) -> True | None | False | str`` with the
        :class:`Match` and the :class:`SupportContext`. The core itself refuses a match when one
        of its member nodes has no support verdict for the target, so a check only needs to
        judge the composite as a whole.
    :param priority: larger tries first; default: the pattern's node count (longest match wins).
    """

    name: str
    expr: "PatternExpr"
    check: "Callable[[Match, SupportContext], Any] | None" = None
    priority: int | None = None
    description: str = ""


@dataclass
class Rule:
    """A partition rule: ``fn(region, ctx) -> None | True | False | str | list[list[ir.Node]]``.

    ``ctx`` is the :class:`SupportContext` of the partitioning in progress (target, options,
    scratch state). ``None``/``True`` keeps the region, ``False`` or a reason drops it, a list
    of node lists splits it (each part becomes its own region; parts that would form a cycle
    are refused).
    """

    name: str
    fn: Callable[["Region", SupportContext], Any]
    description: str = ""


@dataclass
class Region:
    """A group of nodes placed on one target, outlined as a standalone model."""

    name: str
    target: str
    nodes: list[ir.Node]
    #: values flowing in from outside (graph inputs or other regions/host), in a fixed order
    inputs: list[ir.Value] = field(default_factory=list)
    #: values used outside the region or graph outputs, in a fixed order
    outputs: list[ir.Value] = field(default_factory=list)
    #: composite pattern name per node name (nodes fused into a pattern)
    patterns: dict[str, str] = field(default_factory=dict)
    #: the standalone body: inputs/outputs as above, constants used inside bound as initializers
    model: ir.Model | None = None

    @property
    def op_types(self) -> list[str]:
        return [n.op_type for n in self.nodes]

    def __len__(self) -> int:
        return len(self.nodes)


@dataclass
class Artifact:
    """What a vendor's code generator produces for one region.

    ``data`` is opaque bytes (an engine, a program, generated source); ``metadata`` must be
    JSON-serialisable and hold at least ``inputs`` and ``outputs`` (value names, in call order).
    Artifacts are stored in bundles as-is: never pickled, never executed by byoc on load.
    """

    target: str
    format: str
    data: bytes
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        h = hashlib.sha256(self.data)
        h.update(json.dumps(self.metadata, sort_keys=True).encode())
        return h.hexdigest()

    @property
    def input_names(self) -> Sequence[str]:
        return self.metadata.get("inputs", [])

    @property
    def output_names(self) -> Sequence[str]:
        return self.metadata.get("outputs", [])
