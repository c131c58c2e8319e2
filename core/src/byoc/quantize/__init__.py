"""Calibration and int8 quantisation, shared by every target that runs integer code.

* :func:`calibrate` runs the float model on the host over sample feeds and keeps bounded
  per-tensor statistics (running min/max, magnitude histograms);
* :class:`QuantScheme` is what a target asks for (power-of-two or float scales, per-tensor or
  per-channel weights, the threshold method);
* :func:`quantize_model` turns a float graph plus statistics into :class:`QuantParams` and a
  QDQ model (QuantizeLinear/DequantizeLinear at the borders and around every quantised tensor,
  int8 weights, int32 biases), which any target, onnxruntime or the host can run;
* :func:`read_qdq` gives a code generator the compute nodes, integer constants and scales back.

``byoc.compile(..., calibration=samples)`` drives all of it for targets declared with
``Target(needs_calibration=True, quantization={...})`` (see :mod:`byoc.quantize.pipeline`).
"""

from byoc.quantize.calibrate import CalibrationTable, TensorStats, calibrate
from byoc.quantize.qdq import META_KEY, QdqView, params_of, quantize_model, read_qdq
from byoc.quantize.scheme import (
    QuantParams,
    QuantScheme,
    TensorQuant,
    float_scale,
    pow2_fix_pos,
    requant_multiplier,
)

__all__ = [
    "CalibrationTable",
    "META_KEY",
    "QdqView",
    "QuantParams",
    "QuantScheme",
    "TensorQuant",
    "TensorStats",
    "calibrate",
    "float_scale",
    "params_of",
    "pow2_fix_pos",
    "quantize_model",
    "read_qdq",
    "requant_multiplier",
]
