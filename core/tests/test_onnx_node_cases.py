"""ONNX's own node test cases, run through ``byoc.backend`` for every operator byoc supports.

A case is collected when every node of its model has a byoc kernel. Skips live in one place,
``node_skips.py``, each with its reason.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from byoc.kernels import is_supported

from node_skips import NON_TENSOR_REASON, skip_reason


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and attr.HasField("g"):
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def _cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    out = []
    for case in cases:
        graph = case.model.graph
        if not graph.node:
            continue
        if all(is_supported(n.op_type, n.domain) for n in _all_nodes(graph)):
            out.append(case)
    return out


CASES = _cases()


def _as_array(x):
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, np.generic):  # some cases store scalars as numpy scalars
        return np.asarray(x)
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    reason = skip_reason(case.name)
    if reason:
        pytest.skip(reason)
    import byoc.backend as backend

    rep = backend.prepare(case.model)
    graph = case.model.graph
    init_names = {t.name for t in graph.initializer}
    input_names = [i.name for i in graph.input if i.name not in init_names]
    for inputs, expected in case.data_sets:
        if any(_as_array(x) is None for x in list(inputs) + list(expected)):
            pytest.skip(NON_TENSOR_REASON)
        inputs = [_as_array(x) for x in inputs]
        expected = [_as_array(x) for x in expected]
        outputs = rep.run(dict(zip(input_names, inputs)))
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            got = np.asarray(got)
            assert got.dtype == want.dtype, f"output {i}: dtype {got.dtype}, expected {want.dtype}"
            assert got.shape == want.shape, f"output {i}: shape {got.shape}, expected {want.shape}"
            if want.dtype.kind in "fc":
                np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"output {i}")
