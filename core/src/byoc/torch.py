"""``byoc.torch``: byoc as a ``torch.compile`` backend (extra ``byoc-core[torch]``).

    compiled = torch.compile(model.eval(), backend="byoc", options={"targets": ["cpu"]})

PyTorch finds the backend through the ``torch_dynamo_backends`` entry point (no registration
call). Each graph Dynamo hands over is exported to ONNX (:func:`byoc.frontend.pytorch.export`),
compiled by :func:`byoc.compile` with ``options`` as its keyword arguments (``targets``,
``placement``, ``input_shapes``, ``strict``, ...) and run with torch tensors in and out: the
feeds are ``Tensor.numpy()`` views and the outputs ``torch.from_numpy`` views, no copies.

* parameters and buffers are read once, at compile time, and compiled in as constants (as
  inductor's freezing does): change them and call ``torch._dynamo.reset()``;
* a dimension Dynamo made symbolic (``torch._dynamo.mark_dynamic``, ``dynamic=True`` or its
  automatic dynamic shapes after a recompile) is a symbolic ONNX dim named after Dynamo's
  symbol (``s77``); the sizes Dynamo passes as ``SymInt`` inputs are read off the tensors;
* a graph byoc cannot take (an export or compile failure, CUDA tensors, half precision) runs
  eagerly in PyTorch with one :class:`FallbackWarning` naming the reason, or raises with
  ``options={"strict": True}``;
* inference only: a graph traced in training mode (batch norm or dropout with
  ``training=True``), or inputs that require grad while grad mode is on, raise
  :class:`byoc.InferenceOnlyError`. Outputs never carry autograd history.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from byoc.compiler import compile as byoc_compile
from byoc.errors import InferenceOnlyError, ModelLoadError, OptionError
from byoc.frontend.pytorch import changed, check_inference, export, symbol

#: the option names ``torch.compile(..., options=)`` may hold: byoc.compile's keyword arguments
OPTIONS = frozenset(inspect.signature(byoc_compile).parameters) - {"model", "example_inputs"}

#: input dtypes the feeds can take as numpy views
_DTYPES = ("float32", "float64", "int64", "int32", "bool", "uint8", "int8")


class FallbackWarning(UserWarning):
    """A graph Dynamo handed to byoc runs eagerly in PyTorch; the message says why."""


def backend(gm: Any, example_inputs: Sequence[Any], *, options: dict | None = None, mode: str | None = None) -> Callable:
    """The ``torch.compile`` backend ``"byoc"``: one FX graph -> a callable over torch tensors.

    ``mode`` (torch.compile's ``mode=``) is accepted and not used.
    """
    opts = dict(options or {})
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise OptionError(f"torch.compile(backend='byoc', options=...): unknown option(s) {unknown}; "
                          f"byoc takes {sorted(OPTIONS)}")
    piece = _Piece(gm, example_inputs)
    try:
        piece.check_supported()
        proto = piece.export()
        compiled = byoc_compile(proto, **opts)
    except Exception as exc:
        if opts.get("strict") or isinstance(exc, OptionError):  # a wrong option is the caller's to fix
            raise
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        warnings.warn(f"byoc: a graph of {piece.n_ops} PyTorch operation(s) runs eagerly: {reason}",
                      FallbackWarning, stacklevel=2)
        return gm.forward
    return _runner(compiled, piece)


class _Piece:
    """One Dynamo graph: which inputs the user feeds, which are frozen weights, which are sizes."""

    def __init__(self, gm: Any, example_inputs: Sequence[Any]):
        import torch

        self.gm, self.example = gm, list(example_inputs)
        nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.n_ops = sum(n.op.startswith("call_") for n in gm.graph.nodes)
        self.users: list[int] = []  # placeholder positions fed by the caller
        self.frozen: dict[int, Any] = {}  # position -> parameter or buffer
        self.sizes: dict[int, tuple[int, int]] = {}  # position of a SymInt -> (user input, dim)
        self.names: list[str] = []
        self.dynamic: dict[str, dict[int, str]] = {}
        self.fakes = [n.meta.get("example_value") for n in nodes]
        self._training(torch)
        for i, (node, value) in enumerate(zip(nodes, self.example)):
            grapharg = node.meta.get("grapharg")
            source = getattr(getattr(grapharg, "source", None), "name", "") or ""
            if isinstance(value, torch.Tensor):
                if isinstance(value, torch.nn.Parameter) or "._buffers[" in source:
                    self.frozen[i] = value.detach()
                    continue
                self.users.append(i)
                self.names.append(symbol(node.name.removeprefix("l_")))
                fake = self.fakes[i]
                shape = fake.shape if isinstance(fake, torch.Tensor) else ()
                self.dynamic[self.names[-1]] = {d: symbol(str(s.node.expr)) for d, s in enumerate(shape)
                                                if isinstance(s, torch.SymInt)}
        for i, value in enumerate(self.example):
            if isinstance(value, torch.SymInt) and not nodes[i].users:
                continue  # a symbol Dynamo passes along (a stride, say) that the graph does not use
            if isinstance(value, torch.SymInt):
                self.sizes[i] = self._size_of(torch, value, i, nodes[i].name)
            elif not isinstance(value, torch.Tensor):
                self.sizes[i] = None  # reported by check_supported
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        self.n_outputs = len(self.outputs)
        self.args = [self.example[i] for i in self.users]
        check_inference(self.args, "torch.compile(backend='byoc')")

    def _training(self, torch) -> None:
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            try:
                norm = node.normalized_arguments(self.gm, normalize_to_only_use_kwargs=True)
            except Exception:  # a target without a signature torch.fx can match
                norm = None
            if norm is not None and norm.kwargs.get("training") is True:
                raise InferenceOnlyError(f"the graph calls {getattr(node.target, '__name__', node.target)} with "
                                         "training=True (a module in training mode); byoc compiles inference "
                                         "only: call model.eval() first")

    def _size_of(self, torch, value: Any, i: int, name: str) -> tuple[int, int] | None:
        """The (user input, dim) whose size the SymInt input ``value`` is, or None."""
        expr = value.node.expr
        for k, j in enumerate(self.users):
            fake = self.fakes[j]
            for d, s in enumerate(fake.shape if isinstance(fake, torch.Tensor) else ()):
                if isinstance(s, torch.SymInt) and s.node.expr == expr:
                    return k, d
        return None

    def check_supported(self) -> None:
        """Raise (the graph then runs eagerly) for what the export or the numpy views cannot take."""
        import torch

        for i, where in self.sizes.items():
            if where is None:
                raise ModelLoadError(f"input {i} is a {type(self.example[i]).__name__} that is not the size of "
                                     "an input tensor's dimension")
        for name, t in zip(self.names, self.args):
            if t.device.type != "cpu":
                raise ModelLoadError(f"input {name} is on {t.device}; byoc.torch takes CPU tensors")
            if str(t.dtype).removeprefix("torch.") not in _DTYPES:
                raise ModelLoadError(f"input {name} is {t.dtype}; byoc.torch takes {', '.join(_DTYPES)}")
        bad = [n for n in self.outputs if not isinstance(getattr(n, "meta", {}).get("example_value"), torch.Tensor)]
        if bad:
            raise ModelLoadError(f"the graph returns {len(bad)} value(s) that are not tensors")

    def export(self) -> Any:
        """The graph as ONNX, traced on copies: a graph that changes its inputs or weights in place is refused."""
        module = self.module()
        copies = [a.detach().clone() for a in self.args]
        proto = export(module, copies, self.names, self.n_outputs, self.dynamic)
        names = self.names + [f"weight {i}" for i in self.frozen]
        bad = changed(names, copies + [getattr(module, f"w{i}") for i in self.frozen], self.args + list(self.frozen.values()))
        if bad:
            raise ModelLoadError(f"the graph changes {', '.join(bad)} in place; byoc returns new tensors only")
        return proto

    def module(self) -> Any:
        """An ``nn.Module`` over the user inputs only, copies of the weights as buffers, sizes read off the inputs."""
        import torch

        piece = self

        class Piece(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gm = piece.gm
                for i, t in piece.frozen.items():
                    self.register_buffer(f"w{i}", t.clone(), persistent=False)

            def forward(self, *xs):
                args = list(piece.example)
                for i in piece.frozen:
                    args[i] = getattr(self, f"w{i}")
                for i, x in zip(piece.users, xs):
                    args[i] = x
                for i, (k, d) in piece.sizes.items():
                    args[i] = xs[k].size(d)
                return self.gm(*args)

        return Piece().eval()


def _runner(compiled: Any, piece: _Piece) -> Callable:
    """Dynamo's compiled function: every placeholder in, a tuple of tensors out."""
    import torch

    names, users = piece.names, piece.users
    outputs = [f"output{i}" for i in range(piece.n_outputs)]

    def run(*args):
        got = compiled.run({name: args[i].detach().numpy() for name, i in zip(names, users)})
        return tuple(torch.from_numpy(a if a.flags.writeable else np.array(a)) for a in (got[k] for k in outputs))

    run.byoc = compiled  # the CompiledModel, for report() and save()
    return run
