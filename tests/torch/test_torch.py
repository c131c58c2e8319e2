"""byoc as a PyTorch front end: ``torch.compile(model, backend="byoc")`` and ``byoc.compile(module, example_inputs=)``.

Models have seeded random weights (torchvision's ``weights=None``, a Hugging Face BERT from a
small config): nothing is downloaded. Every result is compared with eager PyTorch (max abs
error <= 1e-4), and the ``compiles`` fixture shows each graph really went through byoc.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import byoc  # noqa: E402
import byoc.torch as byoc_torch  # noqa: E402
from torchfe import assert_close, randomize, torchvision  # noqa: E402


def _eager_and_compiled(model, *inputs, **options):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", byoc_torch.FallbackWarning)
        want = model(*inputs)
        got = torch.compile(model, backend="byoc", options=options or None)(*inputs)
    return got, want


# -- the acceptance models ------------------------------------------------------------------------------


def test_resnet18_by_name_no_registration(compiles):
    """The entry point alone makes backend="byoc" known: no registration call, default targets."""
    torch.manual_seed(0)
    model = randomize(torchvision().models.resnet18(weights=None)).eval()
    x = torch.randn(1, 3, 224, 224)
    got, want = _eager_and_compiled(model, x)
    assert_close(got, want)
    assert len(compiles) == 1
    assert {o.name for o in compiles[0][0].graph.output} == {"output0"}


def test_mobilenet_v3_on_cpu_target(compiles):
    torch.manual_seed(0)
    model = randomize(torchvision().models.mobilenet_v3_small(weights=None)).eval()
    x = torch.randn(1, 3, 224, 224)
    got, want = _eager_and_compiled(model, x, targets=["cpu"])
    assert_close(got, want)
    assert "cpu" in compiles[0][1].placement().values(), "nothing ran on cpu"


def test_bert_encoder_from_config(compiles):
    """A Hugging Face BERT built from a small config (random weights), padded attention mask."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    got, want = _eager_and_compiled(model, ids, mask)
    assert_close(got.last_hidden_state, want.last_hidden_state)
    assert_close(got.pooler_output, want.pooler_output)
    assert compiles, "the encoder did not go through byoc"


class LSTMNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(32, 5)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


def test_lstm(compiles):
    """Dynamo leaves RNN modules to eager unless ``allow_rnn``; with it the LSTM is one byoc graph."""
    torch.manual_seed(0)
    model = LSTMNet().eval()
    x = torch.randn(2, 7, 16)
    with torch._dynamo.config.patch(allow_rnn=True):
        got, want = _eager_and_compiled(model, x, targets=["cpu"])
    assert_close(got, want)
    assert len(compiles) == 1
    assert "LSTM" in {n.op_type for n in compiles[0][0].graph.node}
    # and through byoc.compile(module): no Dynamo at all
    compiled = byoc.compile(model, example_inputs=(x,))
    assert_close(torch.from_numpy(compiled.run({"x": x.numpy()})["output0"]), want)


class Branchy(torch.nn.Module):
    """A Python-side branch on a tensor value: Dynamo breaks the graph there."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if h.sum() > 0:
            return self.b(h)
        return torch.relu(self.c(h)) * 2


def test_graph_break_gives_several_pieces(compiles):
    torch.manual_seed(0)
    model = Branchy().eval()
    compiled = torch.compile(model, backend="byoc", options={"targets": ["cpu"]})
    xs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    with torch.no_grad():
        sums = [float(torch.tanh(model.a(x)).sum()) for x in xs]
        picks = [xs[sums.index(max(sums))], xs[sums.index(min(sums))]]  # one per branch
        assert max(sums) > 0 > min(sums)
        for x in picks:
            assert_close(compiled(x), model(x))
    # the part before the branch, and one piece per branch taken
    assert len(compiles) == 3


def test_dynamic_batch(compiles):
    """``mark_dynamic`` on the batch: one symbolic dim in the export, one compile for every batch size > 1."""
    torch.manual_seed(0)
    model = torchvision().models.resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = torch.compile(model, backend="byoc", options={"targets": ["cpu"]})
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        for batch in (3, 5):
            y = torch.randn(batch, 3, 64, 64)
            assert_close(compiled(y), model(y))
    assert len(compiles) == 1
    dims = compiles[0][0].graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [3, 64, 64]


# -- byoc.compile(module) -----------------------------------------------------------------------------


def test_byoc_compile_module_save_load_report(tmp_path):
    torch.manual_seed(0)
    model = torchvision().models.resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = model(x)
    compiled = byoc.compile(model, example_inputs=x, targets=["cpu"])
    assert_close(torch.from_numpy(compiled.run({"x": x.numpy()})["output0"]), want)
    assert "cpu" in compiled.placement().values() and "cpu" in compiled.report()
    compiled.save(tmp_path / "resnet.byoc")
    again = byoc.load(tmp_path / "resnet.byoc").run({"x": x.numpy()})["output0"]
    assert_close(torch.from_numpy(again), want)


def test_byoc_compile_module_dynamic_and_keywords():
    """A dict of example inputs names them; a ``mark_dynamic`` dim stays symbolic."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 2)).eval()
    x = torch.randn(4, 6)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = byoc.compile(model, example_inputs={"input": x})
    for batch in (1, 7):
        y = torch.randn(batch, 6)
        with torch.no_grad():
            assert_close(torch.from_numpy(compiled.run({"input": y.numpy()})["output0"]), model(y))


# -- inference only, fallbacks, options -----------------------------------------------------------------


def test_training_mode_and_gradients_are_refused():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    x = torch.randn(3, 4)
    with pytest.raises(byoc.InferenceOnlyError, match="training mode"):
        byoc.compile(model, example_inputs=x)
    with pytest.raises(Exception, match="InferenceOnlyError.*training=True"):
        torch.compile(model, backend="byoc")(x)
    torch._dynamo.reset()
    model.eval()
    needs_grad = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(byoc.InferenceOnlyError, match="requires grad"):
        byoc.compile(model, example_inputs=needs_grad)
    with pytest.raises(Exception, match="InferenceOnlyError.*requires grad"):
        torch.compile(model, backend="byoc")(needs_grad)
    torch._dynamo.reset()
    with torch.no_grad():  # the same input is fine without grad mode
        assert_close(torch.compile(model, backend="byoc")(needs_grad), model(needs_grad))
    torch._dynamo.reset()


class WithDet(torch.nn.Module):
    """A graph break, then ``linalg.det`` (ONNX Det: byoc has no kernel for it)."""

    def forward(self, x):
        y = torch.relu(x) + 1
        if y.mean() > 0:  # a graph break: the first piece has no Det
            return torch.linalg.det(y @ y.transpose(-1, -2))
        return y


def test_unsupported_piece_runs_eagerly_with_one_warning(compiles):
    model = WithDet().eval()
    x = torch.randn(2, 3, 3)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(model, backend="byoc")(x)
    fallbacks = [w for w in caught if issubclass(w.category, byoc_torch.FallbackWarning)]
    assert len(fallbacks) == 1 and "Det" in str(fallbacks[0].message), [str(w.message) for w in caught]
    assert_close(got, model(x))
    assert len(compiles) == 1  # the first piece went through byoc
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="Det"):
        torch.compile(model, backend="byoc", options={"strict": True})(x)


def test_unknown_option_is_an_error():
    with pytest.raises(Exception, match="unknown option.*'target'"):
        torch.compile(torch.nn.Linear(2, 2), backend="byoc", options={"target": ["cpu"]})(torch.randn(1, 2))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="OptionError.*placement"):  # a wrong value raises too, no eager fallback
        torch.compile(torch.nn.Linear(2, 2), backend="byoc", options={"placement": "nosuch"})(torch.randn(1, 2))
    torch._dynamo.reset()
    with pytest.raises(byoc.OptionError, match="example_inputs"):
        byoc.compile(b"", example_inputs=(torch.randn(1),))


def test_import_byoc_does_not_import_torch():
    code = "import sys, byoc, byoc.torch, byoc.frontend.pytorch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_in_place_change_of_an_input_runs_eagerly(compiles):
    """The export traces on copies; a graph that changes its input in place keeps PyTorch's semantics."""
    def bump(x, y):
        x.add_(1)
        return x * y

    x, y = torch.zeros(3), torch.full((3,), 2.0)
    with torch.no_grad(), pytest.warns(byoc_torch.FallbackWarning, match="changes x in place"):
        out = torch.compile(bump, backend="byoc")(x, y)
    assert x.tolist() == [1.0] * 3 and out.tolist() == [2.0] * 3 and not compiles

    class Bump(torch.nn.Module):
        def forward(self, x):
            return x.mul_(2)

    x = torch.ones(2)
    with pytest.raises(byoc.ModelLoadError, match="changes input"):
        byoc.compile(Bump().eval(), example_inputs=x)
    assert x.tolist() == [1.0, 1.0]  # compiling did not change the caller's tensor


def test_non_contiguous_inputs_and_outputs_that_stay_valid(compiles):
    """A transposed input after a contiguous one (Dynamo recompiles with a symbolic stride the graph does not
    use); each call's outputs are arrays of their own, not overwritten by the next call."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()
    compiled = torch.compile(model, backend="byoc", options={"targets": ["cpu"]})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", byoc_torch.FallbackWarning)
        first = compiled(torch.randn(4, 8))
        kept = first.clone()
        for cols in (4, 6):
            x = torch.randn(8, cols).t()
            assert_close(compiled(x), model(x))
    assert torch.equal(first, kept) and len(compiles) >= 2
