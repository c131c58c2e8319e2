"""The onnxruntime speed peer of the benchmarks (``byoc.testing.oracle.ort_peer_session``) computes
what the plain oracle computes, with each of its set-ups."""

from __future__ import annotations

import numpy as np
import pytest

from byoc.testing.oracle import ort_peer_session, run_onnxruntime, single_node_model

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("kwargs", [{}, {"threads": 1}, {"threads": 2, "extended_only": True}, {"spin": True}])
def test_peer_session_matches_the_oracle(kwargs):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    model, feeds = single_node_model("Conv", [x, w], {"pads": [1, 1, 1, 1]}, const_inputs=[1])
    sess = ort_peer_session(model, **kwargs)
    np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-6, atol=1e-6)
    assert sess.get_session_options().intra_op_num_threads == kwargs.get("threads", 0)
    assert ort_peer_session(model.SerializeToString()).run(None, feeds)[0].shape == (1, 8, 6, 6)
