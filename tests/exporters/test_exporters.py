"""The real-exporter corpus: graphs written by the exporters users run, not by ``onnx.helper``.

Runs in ``tox -e exporters`` (the only environment with torch). Each model is exported at test
time with seeded random weights and cached under ``.exporter-cache/<versions>/`` (git-ignored;
``BYOC_EXPORTER_CACHE`` moves it): torchvision ResNet-18 and MobileNetV3-small, a 2-layer LSTM
and a small transformer encoder, each through ``torch.onnx.export(dynamo=False)`` (TorchScript)
and the dynamo exporter, plus a model authored with onnxscript. Each one compiles for the host
and for cpu, matches onnxruntime (rtol 1e-3), round-trips through a bundle bit for bit, and
shows a sensible placement in ``byoc explain`` (every Conv, Gemm and MatMul on cpu).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch", reason="the exporter corpus runs in `tox -e exporters` (torch installed)")
onnxscript = pytest.importorskip("onnxscript")

import byoc  # noqa: E402
from byoc import cli  # noqa: E402
from byoc.testing.oracle import run_onnxruntime  # noqa: E402
from onnxscript import FLOAT  # noqa: E402,F401 - used in an onnxscript annotation

ROOT = Path(__file__).resolve().parents[2]


# -- torchvision without its C++ extension ---------------------------------------------------


def _torchvision():
    """torchvision's models are pure Python; its C++ ops (nms, roi_align, ...) are not used here.

    The torchvision wheel on PyPI is built against CUDA torch; with torch's CPU wheel its
    extension does not load and ``import torchvision`` stops at registering a fake kernel for
    ``torchvision::nms``. Declaring the two schemas it registers eagerly lets the import finish
    (the ops stay unimplemented, as they are anyway without the extension).
    """
    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision

    torchvision._byoc_schema_lib = lib  # keep the library (and its schemas) alive
    return torchvision


# -- the models --------------------------------------------------------------------------------


class LSTMNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(32, 5)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


def _randomize(module) -> None:
    """Seeded random BatchNorm statistics and affine terms (the defaults make the outputs degenerate)."""
    gen = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
        elif isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, 0.0, 1.0 / max(1, m.in_features) ** 0.5, generator=gen)


TORCH_MODELS = {
    "resnet18": (lambda: _torchvision().models.resnet18(weights=None), (1, 3, 224, 224)),
    "mobilenet_v3_small": (lambda: _torchvision().models.mobilenet_v3_small(weights=None), (1, 3, 224, 224)),
    "lstm": (LSTMNet, (2, 7, 16)),
    "transformer_encoder": (Encoder, (2, 10, 32)),
}


def _onnxscript_model() -> onnx.ModelProto:
    # FLOAT must be a module global: onnxscript evaluates the (postponed) annotations there
    from onnxscript import script
    from onnxscript import opset18 as op

    rng = np.random.default_rng(0)
    w1 = onnx.numpy_helper.from_array((rng.standard_normal((8, 16)) * 0.3).astype(np.float32), "W1")
    b1 = onnx.numpy_helper.from_array((rng.standard_normal((16,)) * 0.1).astype(np.float32), "B1")
    w2 = onnx.numpy_helper.from_array((rng.standard_normal((16, 4)) * 0.3).astype(np.float32), "W2")

    @script()
    def mlp(x: FLOAT["N", 8]) -> FLOAT["N", 4]:  # noqa: F821 - onnxscript's symbolic dims
        h = op.Relu(op.Add(op.MatMul(x, op.Constant(value=w1)), op.Constant(value=b1)))
        g = op.Div(h, op.Add(op.Abs(h), op.Constant(value_float=1.0)))
        return op.Softmax(op.MatMul(g, op.Constant(value=w2)), axis=-1)

    return mlp.to_model_proto()


CASES = [(name, how) for name in TORCH_MODELS for how in ("torchscript", "dynamo")] + [("mlp", "onnxscript")]


def _cache_dir() -> Path:
    import torch as _t

    versions = f"torch-{_t.__version__}_onnxscript-{onnxscript.__version__}_onnx-{onnx.__version__}"
    base = Path(os.environ.get("BYOC_EXPORTER_CACHE", ROOT / ".exporter-cache"))
    folder = base / versions.replace("+", "_")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _export(name: str, how: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The exported model file (cached) and seeded feeds for it."""
    path = _cache_dir() / f"{name}.{how}.onnx"
    if how == "onnxscript":
        feeds = {"x": np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)}
        if not path.exists():
            onnx.save(_onnxscript_model(), str(path))
        return path, feeds
    ctor, shape = TORCH_MODELS[name]
    torch.manual_seed(0)
    module = ctor().eval()
    with torch.no_grad():
        _randomize(module)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    feeds = {"x": x.numpy()}
    if path.exists():
        return path, feeds
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            if how == "dynamo":
                program = torch.onnx.export(module, (x,), dynamo=True, input_names=["x"], output_names=["y"])
                onnx.save(program.model_proto, str(tmp))
            else:
                torch.onnx.export(module, (x,), str(tmp), dynamo=False, input_names=["x"], output_names=["y"],
                                  opset_version=17)
        except Exception as exc:  # the exporter's own failure, not byoc's
            pytest.skip(f"{how} cannot export {name} with torch {torch.__version__}: {type(exc).__name__}: {exc}")
    os.replace(tmp, path)
    return path, feeds


def _assert_close(got: dict, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for (name, g), w in zip(got.items(), want):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: {name}"
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        assert scale > 1e-6, f"{what}: {name} is degenerate"
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * scale, err_msg=f"{what}: {name}")


#: operators that belong on cpu whenever cpu is a target
ON_CPU = {"Conv", "Gemm", "MatMul"}


@pytest.mark.parametrize("name, how", CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_exported_model(name, how, tmp_path, capsys):
    path, feeds = _export(name, how)
    proto = onnx.load(str(path))
    want = run_onnxruntime(proto, feeds)
    # fixed shapes (what a user passes for a model with symbolic dims, e.g. onnxscript's "N"):
    # cpu generates code per shape, so only then does the bundle hold cpu's regions
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    for targets in ([], ["cpu"]):
        what = f"{name} ({how}, targets={targets})"
        compiled = byoc.compile(str(path), targets=targets, input_shapes=shapes)
        got = compiled.run(feeds)
        _assert_close(got, want, what)
        # bundle round trip: bit-identical
        bundle = tmp_path / f"{name}-{len(targets)}.byoc"
        compiled.save(bundle)
        again = byoc.load(bundle).run(feeds)
        for (k, a), b in zip(got.items(), again.values()):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f"{what}: {k}"

    # the placement report, as a user would ask for it
    report = tmp_path / "report.json"
    shape_args = [a for k, v in shapes.items() for a in ("--shape", f"{k}={','.join(map(str, v))}")]
    assert cli.main(["explain", str(path), "-t", "cpu", *shape_args, "--json", str(report)]) == 0
    capsys.readouterr()
    data = json.loads(report.read_text())
    nodes = data["nodes"]
    assert nodes and data["regions"], f"{name} ({how}): nothing offloaded to cpu"
    misplaced = [(n["name"], n["op_type"], n.get("reason")) for n in nodes
                 if n["op_type"] in ON_CPU and n["device"] != "cpu"]
    assert not misplaced, f"{name} ({how}): left on the host: {misplaced}"
