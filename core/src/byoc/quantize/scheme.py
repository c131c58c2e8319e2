"""Quantisation schemes (what a target asks for) and per-tensor parameters (what it gets).

A target declares ``Target(needs_calibration=True, quantization={...})``; the dict becomes a
:class:`QuantScheme`. Users may override keys with
``target_options={name: {"quantization": {...}}}``. Every scheme is symmetric (zero point 0):

``activations``
    ``"pow2"``: scales are powers of two, ``scale = 2**-fix_pos`` (fixed-point, DPU style);
    ``"float"``: any float32 scale, ``scale = threshold / qmax``.
``weights``
    ``"per_tensor"`` or ``"per_channel"`` (one scale per output channel of Conv, ConvTranspose,
    Gemm and MatMul weights).
``weight_scale``
    ``"pow2"`` or ``"float"``; default: the same kind as ``activations``.
``method``
    how a calibrated activation's threshold is chosen from its statistics: ``"minmax"`` (the
    largest magnitude seen), ``"percentile"`` (``percentile`` of the magnitudes) or
    ``"entropy"`` (the KL-divergence minimiser over the magnitude histogram, TensorRT style).
``output_method``
    the method for the graph's (region's) outputs, the values that leave the integer domain
    for float consumers (a Softmax, an argmax, the user): ``"minmax"`` by default, so the
    largest calibrated values (the winning logits) are not clipped; ``None``: ``method``.
``bits``
    8 (int8); ``qmax = 2**(bits-1) - 1``, values saturate to ``[-qmax-1, qmax]``.
``fuse_activations``
    leave the output of a Conv/ConvTranspose/Gemm/MatMul/Add/Mul unquantised when its only
    consumer is a Relu/Clip/LeakyRelu (the activation is fused into the producer, as
    accelerators do); default ``True``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from byoc.errors import OptionError

SCALE_KINDS = ("pow2", "float")
GRANULARITIES = ("per_tensor", "per_channel")
METHODS = ("minmax", "percentile", "entropy")


@dataclass(frozen=True)
class QuantScheme:
    """A quantisation scheme request; see the module docstring for the keys."""

    activations: str = "pow2"
    weights: str = "per_tensor"
    weight_scale: str | None = None
    method: str = "percentile"
    percentile: float = 99.99
    output_method: str | None = "minmax"
    bits: int = 8
    fuse_activations: bool = True

    def __post_init__(self) -> None:
        if self.activations not in SCALE_KINDS:
            raise OptionError(f"quantization: activations must be one of {SCALE_KINDS}, got {self.activations!r}")
        if self.weights not in GRANULARITIES:
            raise OptionError(f"quantization: weights must be one of {GRANULARITIES}, got {self.weights!r}")
        if self.weight_scale is not None and self.weight_scale not in SCALE_KINDS:
            raise OptionError(f"quantization: weight_scale must be one of {SCALE_KINDS}, got {self.weight_scale!r}")
        if self.method not in METHODS:
            raise OptionError(f"quantization: method must be one of {METHODS}, got {self.method!r}")
        if self.output_method is not None and self.output_method not in METHODS:
            raise OptionError(f"quantization: output_method must be one of {METHODS} or None, "
                              f"got {self.output_method!r}")
        if not (isinstance(self.percentile, (int, float)) and 50.0 < float(self.percentile) <= 100.0):
            raise OptionError(f"quantization: percentile must be in (50, 100], got {self.percentile!r}")
        if self.bits != 8:
            raise OptionError(f"quantization: only 8-bit quantisation is implemented, got bits={self.bits!r}")
        if not isinstance(self.fuse_activations, bool):
            raise OptionError(f"quantization: fuse_activations must be a bool, got {self.fuse_activations!r}")

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def weight_kind(self) -> str:
        return self.weight_scale or self.activations

    @classmethod
    def from_dict(cls, request: Mapping[str, Any] | None, where: str = "quantization") -> "QuantScheme":
        request = dict(request or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(request) - known)
        if unknown:
            raise OptionError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        try:
            return cls(**request)
        except OptionError as exc:
            raise OptionError(str(exc).replace("quantization:", f"{where}:", 1)) from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TensorQuant:
    """Quantisation parameters of one tensor: ``real = (q - zero_point) * scale``.

    ``scale`` and ``fix_pos`` are lists (one per channel along ``axis``) for per-channel
    weights, scalars otherwise; ``fix_pos`` is set for power-of-two scales
    (``scale == 2.0**-fix_pos``). ``kind`` is ``"activation"``, ``"weight"``, ``"bias"`` or
    ``"constant"``; ``data`` names the integer initializer of a quantised constant in a QDQ
    model; ``source`` says where the parameters came from (``"calibration"``,
    ``"shared:<tensor>"`` for an operator that keeps its input's scale, ``"values"`` for
    constants).
    """

    scale: float | list[float]
    zero_point: int = 0
    dtype: str = "int8"
    axis: int | None = None
    fix_pos: int | list[int] | None = None
    kind: str = "activation"
    threshold: float | None = None
    data: str | None = None
    source: str = "calibration"

    def scales(self) -> np.ndarray:
        """The scale(s) as a float32 array (1-D for per-channel, 0-D otherwise)."""
        return np.asarray(self.scale, dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TensorQuant":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class QuantParams:
    """The quantisation of one graph: the scheme and every quantised tensor's parameters.

    JSON round-trips exactly (:meth:`to_json`/:meth:`from_json`); this is what a QDQ model
    carries in its ``byoc.quantization`` metadata, keyed by the *logical* tensor names (the
    names in the float model). ``aliases`` maps each value name the QDQ rewrite introduced
    (``t/f``, ``t/q``, ``t/dq``) to its logical name.
    """

    scheme: QuantScheme
    tensors: dict[str, TensorQuant] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def logical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def get(self, name: str) -> TensorQuant | None:
        return self.tensors.get(self.logical(name))

    def to_json(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme.to_dict(),
            "tensors": {k: self.tensors[k].to_dict() for k in sorted(self.tensors)},
            "aliases": dict(sorted(self.aliases.items())),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "QuantParams":
        return cls(
            QuantScheme.from_dict(d.get("scheme", {})),
            {k: TensorQuant.from_dict(v) for k, v in d.get("tensors", {}).items()},
            dict(d.get("aliases", {})),
        )


# ---------------------------------------------------------------------------------------------
# scale arithmetic shared by the quantiser and code generators


def pow2_fix_pos(threshold: float, qmax: int = 127) -> int:
    """The largest ``fix_pos`` whose range ``qmax * 2**-fix_pos`` still covers ``threshold``."""
    if not threshold > 0 or not math.isfinite(threshold):
        return 0
    return int(math.floor(math.log2(qmax / threshold)))


def float_scale(threshold: float, qmax: int = 127) -> float:
    """``threshold / qmax`` as a float32 value (1.0 for an all-zero tensor)."""
    if not threshold > 0 or not math.isfinite(threshold):
        return 1.0
    return float(np.float32(threshold / qmax))


def requant_multiplier(ratio: float, bits: int = 24) -> tuple[int, int]:
    """``(M, shift)`` with ``M / 2**shift ~= ratio``, ``2**(bits-1) <= M < 2**bits``, ``shift >= 0``.

    When ``ratio`` is so large that ``shift`` would be negative, ``shift`` is 0 and ``M`` is
    ``round(ratio)`` (exact for the power-of-two ratios of fixed-point schemes).
    """
    if not ratio > 0 or not math.isfinite(ratio):
        raise ValueError(f"requantisation ratio must be positive and finite, got {ratio!r}")
    mant, exp = math.frexp(ratio)  # ratio = mant * 2**exp, 0.5 <= mant < 1
    shift = bits - exp
    m = int(round(mant * (1 << bits)))
    if m == (1 << bits):  # rounding carried into the next power of two
        m >>= 1
        shift -= 1
    if shift < 0:
        return int(round(ratio)), 0
    # drop trailing zero bits: exact power-of-two ratios become (1 << k, 0) or (1, shift)
    while shift > 0 and m % 2 == 0:
        m >>= 1
        shift -= 1
    return m, shift


__all__ = [
    "GRANULARITIES",
    "METHODS",
    "QuantParams",
    "QuantScheme",
    "SCALE_KINDS",
    "TensorQuant",
    "float_scale",
    "pow2_fix_pos",
    "requant_multiplier",
]
