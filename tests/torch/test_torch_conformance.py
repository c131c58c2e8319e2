"""A sample of byoc's conformance operator checks, through the PyTorch front end.

The instances come from the conformance kit's catalogue (:func:`byoc.testing.cases.op_cases`:
random valid shapes, attributes, broadcasting, asymmetric and automatic pads, groups). Each is
written once more as the PyTorch expression of the same ONNX operator, compiled with
``torch.compile(backend="byoc", options={"strict": True})`` (strict: a graph byoc cannot take is
a failure, not an eager fallback) and checked against both the kit's reference (the ONNX
instance on byoc's host kernels) and eager PyTorch. A small sample: a few operators of each
kind, a few instances each (the full kit runs per target in ``byoc conformance``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

torch = pytest.importorskip("torch")
F = torch.nn.functional

import byoc  # noqa: E402
from byoc.testing.cases import op_cases  # noqa: E402

#: instances per operator (a sample: each one is a Dynamo trace, an export and a compile)
EXAMPLES = 4


def _same_pads(x_shape, kernel, strides, dilations, upper: bool) -> list[int]:
    begins, ends = [], []
    for size, k, s, d in zip(x_shape[2:], kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + d * (k - 1) + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if upper else big)
        ends.append(big if upper else small)
    return begins + ends


def _conv(a, x, w, b=None):
    n = x.dim() - 2
    kernel = a.get("kernel_shape", list(w.shape[2:]))
    strides, dil = a.get("strides", [1] * n), a.get("dilations", [1] * n)
    mode = a.get("auto_pad", "NOTSET")
    pads = (a.get("pads", [0] * 2 * n) if mode == "NOTSET" else [0] * 2 * n if mode == "VALID"
            else _same_pads(x.shape, kernel, strides, dil, mode == "SAME_UPPER"))
    torch_pads = [p for i in reversed(range(n)) for p in (pads[i], pads[n + i])]  # last dim first
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    return conv(F.pad(x, torch_pads), w, b, stride=strides, dilation=dil, groups=a.get("group", 1))


def _gemm(a, x, w, c=None):
    x = x.t() if a.get("transA") else x
    w = w.t() if a.get("transB") else w
    y = a.get("alpha", 1.0) * (x @ w)
    return y if c is None else y + a.get("beta", 1.0) * c


#: ONNX operator -> its PyTorch expression (attributes, then the inputs as tensors)
TORCH_OPS = {
    "Relu": lambda a, x: torch.relu(x),
    "Sigmoid": lambda a, x: torch.sigmoid(x),
    "Tanh": lambda a, x: torch.tanh(x),
    "Exp": lambda a, x: torch.exp(x),
    "Erf": lambda a, x: torch.erf(x),
    "Gelu": lambda a, x: F.gelu(x, approximate=a.get("approximate", "none")),
    "LeakyRelu": lambda a, x: F.leaky_relu(x, a.get("alpha", 0.01)),
    "HardSwish": lambda a, x: F.hardswish(x),
    "Add": lambda a, x, y: x + y,
    "Sub": lambda a, x, y: x - y,
    "Mul": lambda a, x, y: x * y,
    "MatMul": lambda a, x, y: torch.matmul(x, y),
    "Gemm": _gemm,
    "Softmax": lambda a, x: torch.softmax(x, a.get("axis", -1)),
    "LogSoftmax": lambda a, x: torch.log_softmax(x, a.get("axis", -1)),
    "Transpose": lambda a, x: x.permute(*a.get("perm", list(reversed(range(x.dim()))))),
    "Conv": _conv,
}


def _check(case) -> None:
    arrays = [a for a in case.inputs]
    while arrays and arrays[-1] is None:
        arrays.pop()
    assume(all(a is not None and a.dtype == np.float32 and a.size for a in arrays))
    graph = case.graph()
    feeds = {**graph.feeds, **graph.initializers}
    # the kit's reference: the ONNX instance on byoc's host kernels
    want = next(iter(byoc.compile(graph.model(), targets=[]).run(graph.feeds).values()))
    tensors = [torch.from_numpy(np.array(feeds[f"in{i}"])) for i in range(len(arrays))]
    fn = TORCH_OPS[case.op_type]
    eager = fn(case.attrs, *tensors).numpy()
    np.testing.assert_allclose(eager, want, rtol=1e-4, atol=1e-4, err_msg="the test's PyTorch expression")
    torch._dynamo.reset()
    compiled = torch.compile(lambda *xs: fn(case.attrs, *xs), backend="byoc",
                             options={"targets": ["cpu"], "strict": True})
    with torch.no_grad():
        got = compiled(*tensors).numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=graph.describe())
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * scale, err_msg=graph.describe())


@pytest.mark.parametrize("op_type", sorted(TORCH_OPS))
def test_operator_sample(op_type):
    strategy = op_cases(op_type)
    assert strategy is not None, f"the conformance catalogue has no {op_type}"

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=strategy)
    def run(case):
        _check(case)

    run()
    torch._dynamo.reset()
