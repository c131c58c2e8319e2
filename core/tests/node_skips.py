"""The one place that lists ONNX node test cases byoc skips, each with its reason.

Only cases whose operators all have byoc kernels are collected at all; this list names the
supported-operator cases that are still skipped, and why.
"""

#: test case name -> reason
SKIPS: dict[str, str] = {
    "test_scan_sum": "opset-8 Scan has a batch axis; onnx's version converter rewrites the model to the opset-9 "
    "form without it, so the opset-8 test data no longer fits the converted interface",
}

#: test case name prefixes -> reason (a whole family of cases)
SKIP_PREFIXES: dict[str, str] = {}

#: test case name suffixes -> reason
SKIP_SUFFIXES: dict[str, str] = {
    "_bfloat16": "bfloat16 has no numpy dtype; byoc's kernels compute in numpy dtypes",
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
