"""The one place that lists ONNX node test cases byoc skips, each with its reason.

Only cases whose operators all have byoc kernels are collected at all; this list names the
supported-operator cases that are still skipped, and why.
"""

#: test case name -> reason
SKIPS: dict[str, str] = {
    "test_resize_downsample_scales_linear_align_corners": "expected data follow onnx.reference's output length "
    "(scale * length); byoc, like onnxruntime and the spec text, uses the integer output length (tested against "
    "onnxruntime in kernels/test_resize.py)",
    "test_resize_downsample_scales_cubic_align_corners": "as test_resize_downsample_scales_linear_align_corners",
    "test_scan_sum": "opset-8 Scan has a batch axis; onnx's version converter rewrites the model to the opset-9 "
    "form without it, so the opset-8 test data no longer fits the converted interface",
}

#: QuantizeLinear/DequantizeLinear cases with float8/int4/int2/float4 tensors
for _case in ["dequantizelinear_e4m3fn", "dequantizelinear_e4m3fn_float16", "dequantizelinear_e4m3fn_zero_point",
              "dequantizelinear_e5m2", "dequantizelinear_uint4", "dequantizelinear_int4", "dequantizelinear_uint2",
              "dequantizelinear_int2", "dequantizelinear_float4e2m1", "quantizelinear_e4m3fn", "quantizelinear_e5m2",
              "quantizelinear_uint4", "quantizelinear_int4", "quantizelinear_uint2", "quantizelinear_int2",
              "quantizelinear_float4e2m1"]:
    SKIPS[f"test_{_case}"] = ("float8/int4/int2/float4 tensors have no plain numpy dtype (the test data are object "
                              "arrays); the host quantisation kernels (byoc.kernels.quant) are integer-only")

#: test case name prefixes -> reason (a whole family of cases)
SKIP_PREFIXES: dict[str, str] = {
    "test_batchnorm_example_training_mode": "training-mode BatchNormalization (batch statistics, running-mean "
    "outputs): byoc is an inference compiler and refuses it with a KernelError naming the node",
    "test_batchnorm_epsilon_training_mode": "as test_batchnorm_example_training_mode",
    "test_training_dropout": "training-mode Dropout draws a random mask; the expected data come from numpy's "
    "RandomState stream, which an inference compiler does not reproduce",
}

#: test case name suffixes -> reason
SKIP_SUFFIXES: dict[str, str] = {
    "_bf16_expanded": "as _fp16_expanded, in bfloat16",
    "_fp16_expanded": "the expected data come from onnx.reference evaluating the expanded function step by step in "
    "float16; byoc computes float16 elementwise ops in float32 and rounds once, and misses by 1-2 float16 ulp, as "
    "onnxruntime does",
    "_bfloat16": "bfloat16 has no numpy dtype; byoc's kernels compute in numpy dtypes",
    "_bf16": "the expected data come from onnx.reference computing in bfloat16 step by step; byoc computes bfloat16 "
    "in float32 and rounds once, and misses by 1 bfloat16 ulp (onnxruntime fails these cases too)",
}


def skip_reason(name: str) -> str | None:
    if name in SKIPS:
        return SKIPS[name]
    for prefix, reason in SKIP_PREFIXES.items():
        if name.startswith(prefix):
            return reason
    for suffix, reason in SKIP_SUFFIXES.items():
        if name.endswith(suffix):
            return reason
    return None


#: cases whose inputs or outputs are sequences, optionals or maps: byoc's values are tensors only
NON_TENSOR_REASON = "non-tensor input or output (sequence/optional/map): byoc runs tensor values only"

