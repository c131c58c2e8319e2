"""Every compiled model round-trips: compile, save, load, run; outputs bit-identical.

Shared by the core's tests (host only) and the integration tests (with plugins): the models
are random layer graphs (:func:`byoc.testing.graphs.layer_dags`), every model-zoo file as it
ships (IR version 3, :func:`byoc.testing.zoo.load_zoo` with ``keep_ir_version=True``), and a
deterministic sample of ONNX's own node test cases.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

import byoc


def assert_roundtrip(model: onnx.ModelProto | str, feeds: Mapping[str, np.ndarray], targets: Sequence[str],
                     what: str = "model", **compile_kwargs) -> dict[str, np.ndarray]:
    """Compile ``model`` for ``targets``, save, load and run both; the outputs must be the same bits.

    :returns: the compiled model's outputs.
    """
    compiled = byoc.compile(model, targets=list(targets), **{"wait": True, **compile_kwargs})
    want = compiled.run(dict(feeds))
    with tempfile.TemporaryDirectory(prefix="byoc-roundtrip-") as folder:
        path = Path(folder) / "m.byoc"
        compiled.save(path)
        loaded = byoc.load(path)
        got = loaded.run(dict(feeds))
        # saving the loaded model again gives the same bundle
        again = Path(folder) / "again.byoc"
        loaded.save(again)
        assert again.read_bytes() == path.read_bytes(), f"{what}: a loaded bundle saves differently"
    assert list(got) == list(want), f"{what}: outputs {list(got)} after loading, {list(want)} before"
    for name, a in want.items():
        b = got[name]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: output {name!r} {b.dtype}{b.shape} vs {a.dtype}{a.shape}"
        assert a.tobytes() == b.tobytes(), f"{what}: output {name!r} differs after save -> load"
    return want


def node_case_sample(every: int = 20) -> list:
    """Every ``every``-th ONNX node test case whose operators byoc supports and whose data are tensors."""
    from byoc.kernels import is_supported

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)

    def nodes(graph):
        for node in graph.node:
            yield node
            for attr in node.attribute:
                subs = [attr.g] if attr.HasField("g") else []
                for sub in subs + list(attr.graphs):
                    yield from nodes(sub)

    def tensors_only(case) -> bool:
        return all(isinstance(x, np.ndarray) for inputs, outputs in case.data_sets[:1] for x in list(inputs) + list(outputs))

    usable = [c for c in cases if c.model.graph.node and c.data_sets and tensors_only(c)
              and all(is_supported(n.op_type, n.domain) for n in nodes(c.model.graph))]
    usable.sort(key=lambda c: c.name)
    return usable[::every]


def node_case_feeds(case) -> dict[str, np.ndarray]:
    graph = case.model.graph
    inits = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in inits]
    inputs, _ = case.data_sets[0]
    return dict(zip(names, inputs))


__all__ = ["assert_roundtrip", "node_case_feeds", "node_case_sample"]
