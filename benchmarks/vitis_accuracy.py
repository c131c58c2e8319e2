"""Accuracy of the Vitis-AI DPU plugin's int8 models against float32 onnxruntime.

For each model-zoo architecture (``byoc.testing.zoo``: the onnx wheel's ResNet-50, SqueezeNet
and ShuffleNet with seeded random weights) the model is compiled for ``vitis`` with
``calibration=`` 32 random samples and evaluated on 100 other random samples, against
onnxruntime in float32. Reported per model:

* placement: operators on the DPU, operators left on the host with their reasons, regions;
* ``top1``: agreement of the argmax of the logits (the Softmax input; Softmax keeps the order);
* ``top5``: the float top-1 class is among the int8 model's five largest logits;
* ``classes``: how many different float top-1 classes the evaluation samples produce;
* ``rel_err``: mean over samples of ``||q - f|| / ||f||`` of the logits, and ``rel_err_p`` of
  the Softmax probabilities (the model's output);
* ``c_top1``/``c_corr``: top-1 agreement and correlation of the *input-dependent* part of the
  logits (each model's logits minus its own mean over the evaluation samples);
* ``margin``/``err``: median float top-1 margin (top-1 minus top-2 logit) and mean absolute
  logit error, with ``step``, the int8 output step of the logits.

Why the extra columns: with random weights the logits hardly depend on the input (the same
class wins for most inputs, by a small margin), so top-1 agreement alone says little: a model
that ignored its input could score 100%, and a constant quantisation offset can flip every
sample at once. ``classes`` exposes that, and the centred figures measure whether the int8
model follows the input the way the float model does.

Run: ``python benchmarks/vitis_accuracy.py [--models resnet50 squeezenet shufflenet]
[--calibration 32] [--eval 100] [--quantization '{"weights": "per_channel"}'] [--options
'{"grouped_conv": true}'] [--json out.json]``
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings

import numpy as np
import onnx

import byoc
from byoc.testing.zoo import load_zoo, zoo_inputs


def _with_logits(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str, str]:
    """The model with the last Softmax's input added as a graph output: (model, logits, probabilities)."""
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][-1]
    logits = softmax.input[0]
    model = onnx.shape_inference.infer_shapes(model)
    info = next((v for v in model.graph.value_info if v.name == logits), None)
    model.graph.output.append(info if info is not None else onnx.helper.make_empty_tensor_value_info(logits))
    return model, logits, model.graph.output[0].name


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def evaluate(name: str, n_cal: int, n_eval: int, quantization: dict | None, registry=None,
             options: dict | None = None) -> dict:
    import onnxruntime as ort

    model, logits, probs = _with_logits(load_zoo(name))
    calibration = (zoo_inputs(model, seed=100 + i) for i in range(n_cal))  # read once, never stored
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opts = dict(options or {})
        if quantization:
            opts["quantization"] = quantization
        cm = byoc.compile(model, wait=True, targets=["vitis"], calibration=calibration, registry=registry,
                          target_options={"vitis": opts} if opts else None)
    t_compile = time.perf_counter() - t0
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    fl, ql, fp, qp = [], [], [], []
    t_run = 0.0
    for i in range(n_eval):
        feeds = zoo_inputs(model, seed=1000 + i)
        f_logits, f_probs = sess.run([logits, probs], feeds)
        t0 = time.perf_counter()
        out = cm.run(feeds)
        t_run += time.perf_counter() - t0
        fl.append(f_logits.reshape(-1))
        fp.append(f_probs.reshape(-1))
        ql.append(out[logits].reshape(-1))
        qp.append(out[probs].reshape(-1))
    F, Q, FP, QP = map(np.stack, (fl, ql, fp, qp))
    top5 = np.argsort(-Q, axis=1)[:, :5]
    Fc, Qc = F - F.mean(axis=0), Q - Q.mean(axis=0)
    srt = np.sort(F, axis=1)
    records = list(cm.records.values())
    host = collections.Counter()
    for r in records:
        if r.device != "vitis":
            why = r.fallback or r.rule or r.verdicts.get("vitis") or "?"
            host[why if why.startswith(r.op_type) else f"{r.op_type}: {why}"] += 1
    step = None
    for cr in cm.regions:
        step = cr.artifact.metadata["output_scales"].get(logits, step)
    return {
        "model": name,
        "scheme": cm.options["calibration"]["schemes"]["vitis"],
        "calibration_samples": n_cal,
        "eval_samples": n_eval,
        "nodes": len(records),
        "on_dpu": sum(r.device == "vitis" for r in records),
        "regions": len(cm.regions),
        "host": dict(host.most_common()),
        "faults": [str(f) for f in cm.faults],
        "top1": float(np.mean(F.argmax(1) == Q.argmax(1))),
        "top5": float(np.mean([F.argmax(1)[i] in top5[i] for i in range(n_eval)])),
        "classes": int(len(set(F.argmax(1).tolist()))),
        "rel_err": float(np.mean(np.linalg.norm(Q - F, axis=1) / np.linalg.norm(F, axis=1))),
        "rel_err_p": float(np.mean(np.linalg.norm(QP - FP, axis=1) / np.linalg.norm(FP, axis=1))),
        "c_top1": float(np.mean(Fc.argmax(1) == Qc.argmax(1))),
        "c_corr": float((Fc * Qc).sum() / np.sqrt((Fc ** 2).sum() * (Qc ** 2).sum())),
        "margin": float(np.median(srt[:, -1] - srt[:, -2])),
        "err": float(np.mean(np.abs(Q - F))),
        "spread": float(Fc.std()),
        "step": step,
        "compile_s": round(t_compile, 2),
        "run_ms": round(1000 * t_run / n_eval, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "squeezenet", "shufflenet"])
    ap.add_argument("--calibration", type=int, default=32)
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--quantization", type=json.loads, default=None,
                    help='overrides of the target\'s scheme, e.g. \'{"weights": "per_channel"}\'')
    ap.add_argument("--options", type=json.loads, default=None,
                    help='other vitis target options, e.g. \'{"grouped_conv": true}\'')
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if "vitis" not in [t.name for t in byoc.list_targets()]:
        print("the vitis target is not installed (pip install -e plugins/byoc-vitis)", file=sys.stderr)
        return 2
    results = []
    cols = ["top1", "top5", "classes", "rel_err", "rel_err_p", "c_top1", "c_corr", "margin", "err", "step"]
    print(f"{'model':<11} {'dpu':>7} " + " ".join(f"{c:>9}" for c in cols) + f" {'run ms':>7}")
    for name in args.models:
        r = evaluate(name, args.calibration, args.eval, args.quantization, options=args.options)
        results.append(r)
        vals = " ".join(f"{r[c]:>9.4g}" if isinstance(r[c], float) else f"{r[c]!s:>9}" for c in cols)
        print(f"{name:<11} {r['on_dpu']:>3}/{r['nodes']:<3} {vals} {r['run_ms']:>7}", flush=True)
        for why, n in r["host"].items():
            print(f"{'':<11} host x{n}: {why}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
