"""How ``byoc.compile`` uses the quantiser: which targets need calibration, and region rewriting.

``byoc.compile(model, targets=[...], calibration=samples)``:

1. targets with ``Target.needs_calibration`` and no ``calibration=``: an explicitly listed
   target raises :class:`~byoc.errors.CalibrationRequiredError`; with ``targets=None`` it is
   skipped and ``CompiledModel.options["skipped_targets"][name]`` says why;
2. after the shared and vendor pre-partition passes, the float model runs on the host over the
   samples once (:func:`byoc.quantize.calibrate`), whatever the number of such targets;
3. each region of such a target is rewritten, before the vendor's post-partition passes and
   code generator see it, into its QDQ form (:func:`byoc.quantize.quantize_model`) with the
   target's scheme: ``Target.quantization`` updated by the user's
   ``target_options[name]["quantization"]``. A region that cannot be quantised falls back to
   the host with the reason recorded as a fault.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from byoc.errors import ByocError, CalibrationRequiredError, OptionError
from byoc.contract import Region, Target
from byoc.quantize.calibrate import CalibrationTable, calibrate
from byoc.quantize.qdq import quantize_model
from byoc.quantize.scheme import QuantScheme


def skip_reason(target: Target) -> str:
    return (f"target {target.name!r} runs quantised int8 code and needs calibration data; compile with "
            f"byoc.compile(model, calibration=samples) to use it")


def split_targets(selected: Sequence[Target], explicit: bool,
                  calibration: Any) -> tuple[list[Target], dict[str, str]]:
    """``(targets to compile for, {skipped target: reason})``; raises for explicit targets without data."""
    if calibration is not None:
        return list(selected), {}
    missing = [t for t in selected if t.needs_calibration]
    if not missing:
        return list(selected), {}
    if explicit:
        names = ", ".join(repr(t.name) for t in missing)
        raise CalibrationRequiredError(
            f"target(s) {names} run quantised int8 code and need calibration data: pass "
            f"byoc.compile(model, targets=[...], calibration=samples), where samples is an iterable of "
            f"feed dicts {{input name: array}} representative of the real inputs")
    return [t for t in selected if not t.needs_calibration], {t.name: skip_reason(t) for t in missing}


def scheme_for(target: Target, options: Mapping[str, Any]) -> QuantScheme:
    """The target's requested scheme, updated by ``options["quantization"]``."""
    override = options.get("quantization") or {}
    if not isinstance(override, Mapping):
        raise OptionError(f"target {target.name!r}: option 'quantization' must be a dict, got "
                          f"{type(override).__name__}")
    return QuantScheme.from_dict({**dict(target.quantization or {}), **dict(override)},
                                 where=f"target {target.name!r} quantization")


class RegionQuantizer:
    """Rewrites regions of calibrated targets into their QDQ form."""

    def __init__(self, table: CalibrationTable, schemes: Mapping[str, QuantScheme]):
        self.table = table
        self.schemes = dict(schemes)

    def wants(self, region: Region) -> bool:
        return region.target in self.schemes

    def __call__(self, region: Region) -> None:
        """Replace ``region.model`` by its QDQ form; raises :class:`~byoc.errors.QuantizationError`."""
        region.model, _ = quantize_model(region.model, self.table, self.schemes[region.target])

    def apply(self, region: Region, faults) -> bool:
        """Quantise ``region``; on failure record a fault naming the tensor and return ``False``."""
        try:
            self(region)
        except ByocError as exc:
            faults.add("byoc.quantize", "quantize", f"{exc} (region {region.name!r}, target {region.target!r})")
            return False
        return True

    def summary(self) -> dict[str, Any]:
        """What ``CompiledModel.options["calibration"]`` records (JSON)."""
        return {"samples": self.table.samples, "tensors": len(self.table.stats),
                "schemes": {name: s.to_dict() for name, s in sorted(self.schemes.items())}}


def prepare(model, selected: Sequence[Target], options: Mapping[str, Mapping[str, Any]],
            calibration: Iterable[Mapping[str, Any]] | None, budget=None) -> RegionQuantizer | None:
    """Calibrate once for every selected target that needs it; ``None`` when none does."""
    needing = [t for t in selected if t.needs_calibration]
    if not needing:
        return None
    schemes = {t.name: scheme_for(t, options.get(t.name, {})) for t in needing}  # option errors first
    table = calibrate(model, calibration, budget=budget)
    return RegionQuantizer(table, schemes)


__all__ = ["RegionQuantizer", "prepare", "scheme_for", "skip_reason", "split_targets"]
