"""How the conformance kit compares a target's outputs with the host reference.

An element passes when ``|got - want| <= atol + rtol * max(|want|, magnitude)``, with the
target's declared ``Target.rtol``/``Target.atol``. Integer and boolean outputs must be equal;
NaN must meet NaN and an infinity the same infinity; shapes and dtypes must match exactly.

``magnitude`` is what makes one relative tolerance fair to operators that *sum* terms. A target
that computes in lower precision (float16, bfloat16, TF32) rounds each input and weight by up to
``rtol`` of itself; a sum of products ``Σ x·w`` then moves by up to ``rtol · Σ|x|·|w|``, which can
be far more than ``rtol · |Σ x·w|`` when terms cancel. :func:`magnitude_model` builds that bound
as an ONNX graph: the same graph evaluated "in absolute values" (``Conv(|x|, |w|, |b|)``,
``Sub(a, b) -> |a| + |b|``, ``BatchNormalization`` with ``-|mean|``), where activations with a
bounded slope pass the bound through scaled by that slope (``Sigmoid``: 1/4). It is used only
when the plain comparison fails, and only for graphs made of operators with a rule below;
otherwise ``magnitude`` is ``|want|`` and the check is the plain one.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

# -- comparison ---------------------------------------------------------------------------------


@dataclass
class Comparison:
    """The outcome of comparing every output."""

    ok: bool
    #: the largest absolute error over float outputs (0.0 when there are none)
    max_error: float = 0.0
    #: the largest error / tolerance ratio over float outputs (> 1 fails)
    max_ratio: float = 0.0
    #: what went wrong (first failing output), else ""
    message: str = ""


def _fmt(v: Any) -> str:
    try:
        return f"{float(v):.6g}"
    except (TypeError, ValueError):
        return repr(v)


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], *, rtol: float, atol: float,
            magnitude: Sequence[np.ndarray | None] | None = None, names: Sequence[str] | None = None,
            float_range: float | None = None, accept: Sequence[np.ndarray | None] | None = None,
            range_relative: bool = False) -> Comparison:
    """Compare outputs element by element (module docstring).

    ``float_range``: the largest finite magnitude the target computes (65504 for float16);
    where the reference is beyond it, an infinity of the same sign (or any value beyond it) passes.
    ``accept``: per output, a boolean mask of elements that pass whatever their value (see
    :func:`envelope_accepts`). ``range_relative`` (integer targets): the relative part is taken
    over the output's range, ``rtol * max|want|`` of the whole tensor, because a quantised
    tensor's error is a fraction of its scale, not of each element.
    """
    names = list(names) if names is not None else [f"output {i}" for i in range(len(want))]
    if len(got) != len(want):
        return Comparison(False, message=f"{len(got)} outputs, expected {len(want)}")
    max_err = 0.0
    max_ratio = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        name = names[i]
        if g.shape != w.shape:
            return Comparison(False, max_err, max_ratio, f"{name}: shape {list(g.shape)}, expected {list(w.shape)}")
        if g.dtype != w.dtype:
            return Comparison(False, max_err, max_ratio, f"{name}: dtype {g.dtype}, expected {w.dtype}")
        if g.size == 0:
            continue
        ok_mask = accept[i] if accept is not None and i < len(accept) and accept[i] is not None else None
        if w.dtype.kind not in "fc":
            bad = g != w
            if ok_mask is not None:
                bad &= ~ok_mask
            if bad.any():
                idx = tuple(int(j) for j in np.argwhere(bad)[0])
                return Comparison(False, max_err, max_ratio,
                                  f"{name}[{', '.join(map(str, idx))}]: got {g[idx]!r}, expected {w[idx]!r} "
                                  f"({int(bad.sum())} of {w.size} elements differ; {w.dtype} must be exact)")
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        nan_g, nan_w = np.isnan(g64), np.isnan(w64)
        inf_w = np.isinf(w64)
        special_bad = (nan_g != nan_w) | (inf_w & (g64 != w64)) | (~inf_w & ~nan_w & np.isinf(g64))
        if float_range is not None:
            beyond = ~nan_w & (np.abs(w64) > float_range)
            same_side = np.sign(g64) == np.sign(w64)
            ok_beyond = beyond & same_side & (np.abs(g64) > float_range)
            special_bad &= ~ok_beyond
            w64 = np.where(ok_beyond, g64, w64)
            inf_w = np.isinf(w64)
            nan_w = np.isnan(w64)
        scale = np.abs(np.where(nan_w | inf_w, 0.0, w64))
        m = magnitude[i] if magnitude is not None and i < len(magnitude) else None
        if m is not None:
            m64 = np.asarray(m, dtype=np.float64)
            if m64.shape == scale.shape:
                scale = np.maximum(scale, np.where(np.isfinite(m64), np.abs(m64), 0.0))
        if range_relative:
            finite_w = np.abs(w64[np.isfinite(w64)])
            if finite_w.size:
                scale = np.maximum(scale, float(finite_w.max()))
        tol = atol + rtol * scale
        finite = ~(nan_w | inf_w | nan_g | np.isinf(g64))
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(finite, np.abs(g64 - w64), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0))
        max_err = max(max_err, float(err.max()))
        max_ratio = max(max_ratio, float(ratio.max()))
        bad = special_bad | (finite & (err > tol))
        if ok_mask is not None:
            bad &= ~ok_mask
            err = np.where(ok_mask, 0.0, err)
            ratio = np.where(ok_mask, 0.0, ratio)
            max_err = float(err.max())
            max_ratio = float(ratio.max())
        if bad.any():
            flat = np.where(special_bad, np.inf, np.where(bad, ratio, -1.0))
            idx = tuple(int(j) for j in np.unravel_index(int(np.argmax(flat)), flat.shape))
            where = f"{name}[{', '.join(map(str, idx))}]" if w.ndim else name
            return Comparison(False, max_err, max_ratio,
                              f"{where}: got {_fmt(g[idx])}, expected {_fmt(w[idx])} (error {_fmt(err[idx])}, "
                              f"tolerance {_fmt(tol[idx])} = atol {atol:g} + rtol {rtol:g} x {_fmt(scale[idx])}); "
                              f"{int(bad.sum())} of {w.size} elements out of tolerance")
    return Comparison(True, max_err, max_ratio)


# -- ill-conditioned points ----------------------------------------------------------------------


def perturbed_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rel: float,
                    rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``model`` and ``feeds`` with every float value multiplied by ``1 + u``, ``u`` uniform in ``[-rel, rel]``."""

    def jitter(a: np.ndarray) -> np.ndarray:
        if a.dtype.kind != "f" or a.size == 0:
            return a
        with np.errstate(invalid="ignore", over="ignore"):
            return (a * (1.0 + rng.uniform(-rel, rel, size=a.shape))).astype(a.dtype)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, t in enumerate(out.graph.initializer):
        arr = onnx.numpy_helper.to_array(t)
        if arr.dtype.kind == "f":
            out.graph.initializer[k].CopyFrom(onnx.numpy_helper.from_array(jitter(arr), t.name))
    return out, {k: jitter(np.asarray(v)) for k, v in feeds.items()}


#: lower precisions a target may compute in, with their unit roundoff: the ill-conditioning
#: check also runs the reference rounded to each one whose roundoff the declared rtol admits
LOW_PRECISIONS = ((onnx.TensorProto.FLOAT16, 2.0**-11), (onnx.TensorProto.BFLOAT16, 2.0**-8))


def rounded_model(model: onnx.ModelProto, to: int) -> onnx.ModelProto:
    """``model`` with every float32 value (inputs, initializers, node outputs) rounded through
    the ONNX type ``to`` (``Cast`` there and back), as a target computing in ``to`` would."""
    types = _elem_types(model)
    g = model.graph
    nodes: list[onnx.NodeProto] = []

    def round_trip(src: str, dst: str) -> None:
        mid = f"{dst}__c{to}"
        nodes.append(helper.make_node("Cast", [src], [mid], to=to, name=mid))
        nodes.append(helper.make_node("Cast", [mid], [dst], to=onnx.TensorProto.FLOAT, name=f"{dst}__back"))

    renamed: dict[str, str] = {}
    for name in [v.name for v in g.input] + [t.name for t in g.initializer]:
        if types.get(name) == onnx.TensorProto.FLOAT:
            renamed[name] = f"{name}__r{to}"
            round_trip(name, renamed[name])
    for node in g.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(renamed.get(n, n) for n in node.input)
        rounded = [o for o in node.output if o and types.get(o) == onnx.TensorProto.FLOAT]
        del new.output[:]
        new.output.extend(f"{o}__raw{to}" if o in rounded else o for o in node.output)
        nodes.append(new)
        for o in rounded:
            round_trip(f"{o}__raw{to}", o)
    graph = helper.make_graph(nodes, g.name + "_rounded", list(g.input), list(g.output), list(g.initializer))
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def envelope_accepts(got: Sequence[np.ndarray], runs: Sequence[Sequence[np.ndarray]], *, rtol: float,
                     atol: float) -> list[np.ndarray | None]:
    """Per output, the elements of ``got`` that some run in ``runs`` explains.

    ``runs`` are reference outputs for inputs perturbed by the target's relative tolerance
    (:func:`perturbed_model`) and for the model computed in a lower precision the tolerance
    admits (:func:`rounded_model`), the unperturbed reference among them. Where the reference is
    ill-conditioned (``log(log(x))`` at ``x`` near 1, ``0 ** tiny``, a comparison of two nearly
    equal values) a target that rounds its inputs may land anywhere the perturbed references
    land: an element passes if it is within tolerance of the range they span, is NaN where one
    of them is NaN, or (integer outputs) equals one of them.
    """
    masks: list[np.ndarray | None] = []
    for i, g in enumerate(got):
        g = np.asarray(g)
        outs = [np.asarray(r[i]) for r in runs if i < len(r) and np.asarray(r[i]).shape == g.shape]
        if not outs:
            masks.append(None)
            continue
        if g.dtype.kind not in "fc":
            masks.append(np.logical_or.reduce([o == g for o in outs]))
            continue
        stack = np.stack([o.astype(np.float64) for o in outs])
        g64 = g.astype(np.float64)
        any_nan = np.isnan(stack).any(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo = np.nanmin(np.where(np.isnan(stack), np.inf, stack), axis=0)
            hi = np.nanmax(np.where(np.isnan(stack), -np.inf, stack), axis=0)
            tol = atol + rtol * np.maximum(np.abs(np.where(np.isfinite(lo), lo, 0)), np.abs(np.where(np.isfinite(hi), hi, 0)))
            inside = (g64 >= lo - tol) & (g64 <= hi + tol)
            same_inf = np.logical_or.reduce([np.isinf(o) & (o == g64) for o in stack])
        masks.append((np.isnan(g64) & any_nan) | (~np.isnan(g64) & inside) | same_inf)
    return masks


# -- the magnitude graph ------------------------------------------------------------------------

ABS, NEG, KEEP = "abs", "neg", "keep"

#: op -> rule(node) -> (per-slot transforms, replacement) or None (no bound for this node).
#: replacement: None (same node), ("op", type), ("scale", factor)
Rule = Callable[[onnx.NodeProto], "tuple[Sequence[str], Any] | None"]
MAGNITUDE: dict[str, Rule] = {}


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _same(*ops: str, slots: Sequence[str] = ()) -> None:
    for op in ops:
        MAGNITUDE[op] = lambda node, s=tuple(slots): (s or (ABS,) * max(1, len(node.input)), None)


# sums of products and averages: the same operator on absolute values
_same("Add", "Sum", "Mean", "Mul", "Conv", "ConvTranspose", "MatMul", "AveragePool", "GlobalAveragePool",
      "MaxPool", "GlobalMaxPool", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceL1", "ReduceL2", "ReduceSumSquare",
      "Max", "Identity", "Dropout")
# the operand 0 is data, the others shapes/indices/axes (kept)
_same("CumSum", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather", "GatherElements", "Expand",
      "Tile", "Transpose", "DepthToSpace", "SpaceToDepth", slots=(ABS,))
MAGNITUDE["Concat"] = lambda node: ((ABS,) * len(node.input), None)
MAGNITUDE["Pad"] = lambda node: ((ABS, KEEP, ABS, KEEP), None)
MAGNITUDE["Where"] = lambda node: ((KEEP, ABS, ABS), None)
MAGNITUDE["Sub"] = lambda node: ((ABS, NEG), None)
MAGNITUDE["Gemm"] = lambda node: ((ABS, ABS, ABS), None)
MAGNITUDE["BatchNormalization"] = lambda node: ((ABS, ABS, ABS, NEG, KEEP), None)
MAGNITUDE["Resize"] = lambda node: ((ABS, KEEP, KEEP, KEEP), None) if _attr(node, "mode", b"nearest") in (
    b"nearest", b"linear", "nearest", "linear") else None
# the error of min(a, b) is bounded by the larger of the two bounds
MAGNITUDE["Min"] = lambda node: ((ABS,) * len(node.input), ("op", "Max"))
MAGNITUDE["ReduceMin"] = lambda node: ((ABS, KEEP), ("op", "ReduceMax"))


def _slope(factor: Callable[[onnx.NodeProto], float]) -> Rule:
    return lambda node: ((ABS,), ("scale", float(factor(node))))


# activations: |f(x) - f(y)| <= L |x - y|; the bound passes through scaled by the slope L
for _op in ("Relu", "Tanh", "Clip", "Neg", "Abs", "Softplus", "Softsign", "Celu", "Sin", "Cos", "Atan"):
    MAGNITUDE[_op] = _slope(lambda node: 1.0)
MAGNITUDE["Sigmoid"] = _slope(lambda node: 0.25)
MAGNITUDE["LeakyRelu"] = _slope(lambda node: max(1.0, abs(_attr(node, "alpha", 0.01))))
MAGNITUDE["Elu"] = _slope(lambda node: max(1.0, abs(_attr(node, "alpha", 1.0))))
MAGNITUDE["Selu"] = _slope(lambda node: abs(_attr(node, "gamma", 1.0507)) * max(1.0, abs(_attr(node, "alpha", 1.6733))))
MAGNITUDE["HardSigmoid"] = _slope(lambda node: abs(_attr(node, "alpha", 0.2)))
MAGNITUDE["HardSwish"] = _slope(lambda node: 1.5)
MAGNITUDE["Gelu"] = _slope(lambda node: 1.13)
MAGNITUDE["Erf"] = _slope(lambda node: 2.0 / math.sqrt(math.pi))
MAGNITUDE["Mish"] = _slope(lambda node: 1.1)

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def magnitude_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The magnitude graph of ``model`` (module docstring), same inputs and output names; ``None``
    when a node has no rule."""
    types = _elem_types(model)
    g = model.graph
    nodes: list[onnx.NodeProto] = []
    inits = list(g.initializer)
    counter = 0

    def fresh(base: str) -> str:
        nonlocal counter
        counter += 1
        return f"{base}__mag{counter}"

    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            return None
        rule = MAGNITUDE.get(node.op_type)
        plan = rule(node) if rule is not None else None
        if plan is None:
            return None
        slots, replacement = plan
        new_inputs = []
        for i, name in enumerate(node.input):
            how = slots[i] if i < len(slots) else KEEP
            if not name or how == KEEP or types.get(name) not in _FLOAT_TYPES:
                new_inputs.append(name)
                continue
            a = fresh(name)
            nodes.append(helper.make_node("Abs", [name], [a], name=fresh("abs")))
            if how == NEG:
                n = fresh(name)
                nodes.append(helper.make_node("Neg", [a], [n], name=fresh("neg")))
                a = n
            new_inputs.append(a)
        if replacement is None:
            new = onnx.NodeProto()
            new.CopyFrom(node)
            del new.input[:]
            new.input.extend(new_inputs)
            if node.op_type == "Gemm":
                for attr in new.attribute:
                    if attr.name in ("alpha", "beta"):
                        attr.f = abs(attr.f)
            nodes.append(new)
        elif replacement[0] == "op":
            new = onnx.NodeProto()
            new.CopyFrom(node)
            new.op_type = replacement[1]
            del new.input[:]
            new.input.extend(new_inputs)
            nodes.append(new)
        else:  # ("scale", factor)
            c = fresh("slope")
            dtype = types.get(node.input[0], onnx.TensorProto.FLOAT)
            np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
            inits.append(onnx.numpy_helper.from_array(np.asarray(replacement[1], dtype=np_dtype), c))
            nodes.append(helper.make_node("Mul", [new_inputs[0], c], [node.output[0]], name=node.name or fresh("mul")))
    graph = helper.make_graph(nodes, g.name + "_magnitude", list(g.input), list(g.output), inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


__all__ = ["Comparison", "LOW_PRECISIONS", "MAGNITUDE", "compare", "envelope_accepts", "magnitude_model",
           "perturbed_model", "rounded_model"]
