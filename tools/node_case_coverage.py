"""Which of onnx's node test cases byoc cannot run for want of a kernel, per missing operator.

For every case of ``onnx.backend.test.case.node.collect_testcases`` with an operator byoc has no
kernel for (:func:`byoc.kernels.is_supported`), onnxruntime runs the case against its expected
outputs; the table counts, per set of missing operators, the cases onnxruntime passes and fails.
The cases byoc can run are core/tests/test_onnx_node_cases.py's.

    python tools/node_case_coverage.py [--names]
"""

from __future__ import annotations

import argparse
import collections
import warnings

import numpy as np


def _nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def _onnxruntime_passes(case) -> bool:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        for inputs, expected in case.data_sets:
            for got, want in zip(sess.run(None, dict(zip(names, inputs))), expected):
                got, want = np.asarray(got), np.asarray(want)
                assert got.shape == want.shape
                if want.dtype.kind in "fc":
                    np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
                else:
                    np.testing.assert_array_equal(got, want)
    except Exception:  # a refusal, a crash or a wrong result alike
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", action="store_true", help="list the cases onnxruntime passes")
    args = parser.parse_args()
    from byoc.kernels import is_supported

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    table: dict[str, tuple[list[str], list[str]]] = collections.defaultdict(lambda: ([], []))
    for case in cases:
        missing = sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                          for n in _nodes(case.model.graph) if not is_supported(n.op_type, n.domain)})
        if missing:
            table[",".join(missing)][0 if _onnxruntime_passes(case) else 1].append(case.name)
    print(f"{'missing operators':50s} {'ort passes':>10s} {'ort fails':>10s}")
    for ops, (passed, failed) in sorted(table.items(), key=lambda kv: (-len(kv[1][0]), kv[0])):
        print(f"{ops:50s} {len(passed):10d} {len(failed):10d}")
        if args.names and passed:
            print("    " + " ".join(passed))


if __name__ == "__main__":
    main()
