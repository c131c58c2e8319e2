"""PyTorch -> ONNX for :func:`byoc.compile` and :mod:`byoc.torch` (torch is imported only here, lazily).

One export path serves both: :func:`export` traces a module with example tensors through
``torch.onnx.export(dynamo=False)``, the TorchScript exporter. With torch 2.13 it exports every
graph Dynamo hands a backend (torchvision CNNs, LSTMs, Hugging Face BERT with its attention
mask) in about a second and keeps the weights as initializers; the dynamo exporter is slower
(seconds per graph), so it is the fallback, tried only when the TorchScript exporter fails.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import sys
import warnings
from typing import Any, Mapping, Sequence

import onnx

from byoc.errors import InferenceOnlyError, ModelLoadError

#: the opset asked of the exporter (the loader converts it to byoc's canonical opset)
OPSET = 18


def is_module(model: Any) -> bool:
    """``model`` is a ``torch.nn.Module`` (never imports torch: if it is not imported, it is not one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def symbol(name: str) -> str:
    """A symbolic dimension's name as an ONNX identifier (``2*s0`` -> ``2_s0``)."""
    return re.sub(r"\W+", "_", name).strip("_") or "dim"


def check_inference(tensors: Sequence[Any], what: str) -> None:
    """Raise :class:`InferenceOnlyError` when a call with these inputs would need gradients."""
    import torch

    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise InferenceOnlyError(f"{what}: an input requires grad; byoc compiles inference only (no gradients "
                                 "flow through a byoc graph): pass inputs without requires_grad, or call under "
                                 "torch.no_grad() / torch.inference_mode()")


def changed(names: Sequence[str], before: Sequence[Any], after: Sequence[Any]) -> list[str]:
    """The names whose tensor differs between ``before`` and ``after`` (NaN equals NaN)."""
    import torch

    return [n for n, a, b in zip(names, before, after) if not torch.equal(a, b) and not torch.allclose(
        a, b, rtol=0, atol=0, equal_nan=True)]


def export(module: Any, args: Sequence[Any], names: Sequence[str], n_outputs: int,
           dynamic: Mapping[str, Mapping[int, str]] | None = None) -> onnx.ModelProto:
    """``module(*args)`` as an ONNX model: inputs ``names``, outputs ``output0..``, ``dynamic``
    input name -> {dim: symbolic name}. A failure of both exporters is a :class:`ModelLoadError`."""
    import torch

    kw = dict(input_names=list(names), output_names=[f"output{i}" for i in range(n_outputs)],
              dynamic_axes={k: dict(v) for k, v in (dynamic or {}).items() if v} or None, opset_version=OPSET)
    first = None
    for dynamo in (False, True):
        buf = io.BytesIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(module, tuple(args), None if dynamo else buf, dynamo=dynamo, **kw)
            return program.model_proto if dynamo else onnx.load_from_string(buf.getvalue())
        except Exception as exc:  # the exporter's own failure: report the first one
            first = first or exc
    raise ModelLoadError(f"torch.onnx.export cannot export {type(module).__name__}: "
                         f"{type(first).__name__}: {str(first).strip().splitlines()[0] if str(first) else ''}")


def module_to_onnx(module: Any, example_inputs: Any) -> onnx.ModelProto:
    """``byoc.compile(module, example_inputs=...)``: an ``nn.Module`` in eval mode as ONNX.

    ``example_inputs``: a tensor, a tuple of tensors (the positional arguments of ``forward``,
    inputs named after its parameters) or a dict name -> tensor (keyword arguments). A dimension
    marked with ``torch._dynamo.mark_dynamic`` becomes the symbolic dim ``<input>_dim<k>``.
    """
    import torch

    if module.training:
        raise InferenceOnlyError(f"{type(module).__name__} is in training mode; byoc compiles inference only: "
                                 "call module.eval() first")
    if example_inputs is None:
        raise ModelLoadError("byoc.compile(module, ...) of a torch.nn.Module needs example_inputs=(tensor, ...)")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, Mapping):
        names, args = list(example_inputs), list(example_inputs.values())
        params = [p for p in inspect.signature(module.forward).parameters]
        if names != params[:len(names)]:
            raise ModelLoadError(f"example_inputs names {names} are not the first parameters of forward {params}")
    else:
        args = list(example_inputs)
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [params[i] if i < len(params) else f"input{i}" for i in range(len(args))]
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise ModelLoadError("example_inputs must be tensors (a tensor, a tuple of them or a dict name -> tensor)")
    check_inference(args, type(module).__name__)
    copies = [a.detach().clone() for a in args]  # the export runs forward: the caller's tensors stay as they are
    with torch.no_grad():
        outputs = torch.utils._pytree.tree_leaves(module(*copies))
    dynamic = {n: {d: f"{symbol(n)}_dim{d}" for d in sorted(getattr(a, "_dynamo_dynamic_indices", ()))}
               for n, a in zip(names, args)}
    proto = export(module, copies, names, len([t for t in outputs if isinstance(t, torch.Tensor)]), dynamic)
    if changed(names, copies, args):
        raise ModelLoadError(f"{type(module).__name__}.forward changes input(s) {changed(names, copies, args)} in "
                             "place; a byoc model returns new tensors only")
    return proto
