"""What users bring: model-zoo files as they ship (IR version 3), compiled to a bundle and run from it.

The nine files in the onnx wheel are IR version 3, where every initializer is also a graph
input. Their weights are ``ConstantOfShape`` fills (degenerate outputs), so they get seeded
random weights, keeping the file's ``ir_version`` and that rule (``keep_ir_version=True``).
Each goes through the command line as a user would: ``byoc compile -o``, then ``byoc run`` on
the bundle; the outputs equal the in-process compiled model's bit for bit and onnxruntime's
within 1e-3.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import byoc
from byoc import cli
from byoc.testing.oracle import run_onnxruntime
from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs, zoo_path


@pytest.mark.parametrize("targets", [[], ["cpu"]], ids=["host", "cpu"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_file_compile_bundle_run(name, targets, tmp_path, capsys):
    assert onnx.load(str(zoo_path(name))).ir_version == 3
    model = load_zoo(name, seed=0, keep_ir_version=True)
    assert model.ir_version == 3
    inits = {t.name for t in model.graph.initializer}
    assert inits <= {i.name for i in model.graph.input}  # the IR-3 rule, kept
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = zoo_inputs(model, seed=1)
    args = []
    for i, (k, v) in enumerate(feeds.items()):
        np.save(tmp_path / f"in{i}.npy", v, allow_pickle=False)
        args += ["-i", f"{k}={tmp_path / f'in{i}.npy'}"]

    bundle = tmp_path / f"{name}.byoc"
    where = ["--host-only"] if not targets else [a for t in targets for a in ("-t", t)]
    assert cli.main(["compile", str(path), "-o", str(bundle), *where]) == 0
    assert cli.main(["run", str(bundle), *args, "-o", str(tmp_path / "out")]) == 0
    capsys.readouterr()

    compiled = byoc.compile(str(path), targets=targets)
    if targets:
        assert any(r.device == "cpu" for r in compiled.records.values()), f"{name}: nothing placed on cpu"
    want = compiled.run(feeds)
    expected = run_onnxruntime(model, feeds)
    for (out_name, got_compiled), ort in zip(want.items(), expected):
        from_bundle = np.load(tmp_path / "out" / (cli._safe_filename(out_name) + ".npy"), allow_pickle=False)
        assert from_bundle.dtype == got_compiled.dtype and from_bundle.shape == got_compiled.shape
        assert from_bundle.tobytes() == got_compiled.tobytes(), f"{name}: {out_name} differs after the bundle"
        np.testing.assert_allclose(from_bundle, ort, rtol=1e-3, atol=1e-6, err_msg=f"{name}: {out_name}")


def test_save_refuses_what_load_would_refuse(tmp_path, monkeypatch):
    """A save that cannot be loaded is lost work: save applies the loader's checks first."""
    from byoc.errors import BundleError
    from byoc.runtime import bundle as bundle_mod

    compiled = byoc.compile(load_zoo("squeezenet", keep_ir_version=True), targets=[])
    out = tmp_path / "m.byoc"
    compiled.save(out)
    assert byoc.load(out).run(zoo_inputs(load_zoo("squeezenet")))  # loads

    # had save not written the IR-3 form, the loader's checker would refuse it: save must too
    monkeypatch.setattr(bundle_mod, "_legacy_initializer_inputs", lambda proto: None)
    with pytest.raises(BundleError, match="cannot save the host graph.*initializer but not in graph input"):
        compiled.save(tmp_path / "broken.byoc")
    assert not (tmp_path / "broken.byoc").exists()
