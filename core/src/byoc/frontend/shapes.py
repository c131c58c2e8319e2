"""Fixing input shapes before shape inference: ``byoc.compile(..., input_shapes=...)`` and ``--shape``.

Like TVM's shape dict and onnxruntime's free-dimension overrides, a user states the shapes the
model will be run with, so static-shape targets (vitis) get their regions at compile time and
the placement report shows the placement the user will get. Keys are either a graph input's
name (value: the whole shape) or a symbolic dimension's name (``dim_param``; value: an int,
applied to every input using it)::

    byoc.compile("model.onnx", input_shapes={"x": [1, 3, 224, 224]})
    byoc.compile("model.onnx", input_shapes={"batch": 1})

A ``-1`` inside a whole shape keeps that dimension as declared. A fixed dimension must agree
with a declared static one. The compiled model then accepts only the fixed shapes.
"""

from __future__ import annotations

import math
import operator
from typing import Mapping, Sequence

import onnx_ir as ir

from byoc.budget import Budget
from byoc.errors import OptionError, ResourceLimitError

ShapeSpec = Mapping[str, "Sequence[int] | int"]


def _int(value, what: str) -> int:
    if isinstance(value, bool):
        raise OptionError(f"input_shapes: {what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise OptionError(f"input_shapes: {what} must be an integer, got {value!r}") from None


def fix_input_shapes(model: ir.Model, input_shapes: ShapeSpec | None, budget: Budget | None = None) -> bool:
    """Give ``model``'s graph inputs the shapes in ``input_shapes``, in place.

    :param input_shapes: input name -> full shape (a sequence of ints, ``-1`` keeps a dimension),
        or symbolic dimension name -> int.
    :returns: whether anything changed.
    :raises OptionError: an unknown name (the error lists the inputs and dimension names), a rank
        that differs from the declared one, a value that contradicts a declared static dimension,
        or a negative size.
    :raises ResourceLimitError: a fixed shape over the budget's ``max_tensor_bytes``.
    """
    if not input_shapes:
        return False
    if not isinstance(input_shapes, Mapping):
        raise OptionError(f"input_shapes must be a mapping of input or dimension names, got {type(input_shapes).__name__}")
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs if v.name not in graph.initializers}
    dim_names = {d.value for v in inputs.values() if v.shape is not None
                 for d in v.shape if isinstance(d, ir.SymbolicDim) and d.value}
    by_dim: dict[str, int] = {}
    whole: dict[str, list[int]] = {}
    for key, value in input_shapes.items():
        if key in inputs:
            if isinstance(value, int) and not isinstance(value, bool):
                value = [value]  # one number for an input: a rank-1 shape (``--shape x=4``)
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise OptionError(f"input_shapes[{key!r}]: the shape of input {key!r} must be a list of ints, "
                                  f"got {value!r}")
            whole[key] = [_int(d, f"input_shapes[{key!r}] dimension {i}") for i, d in enumerate(value)]
        elif key in dim_names:
            by_dim[key] = _int(value, f"input_shapes[{key!r}]")
        else:
            raise OptionError(
                f"input_shapes: {key!r} is neither a graph input nor a symbolic dimension of one; "
                f"inputs: {sorted(inputs)}, dimension names: {sorted(dim_names)}"
            )
    for key, size in by_dim.items():
        if size < 0:
            raise OptionError(f"input_shapes[{key!r}]: a dimension must be >= 0, got {size}")
    changed = False
    for name, value in inputs.items():
        new = _new_shape(value, whole.get(name), by_dim)
        if new is not None and new != value.shape:
            _check_budget(value, new, budget)
            value.shape = new
            changed = True
    return changed


def _new_shape(value: ir.Value, fixed: list[int] | None, by_dim: Mapping[str, int]) -> ir.Shape | None:
    name = value.name
    declared = list(value.shape) if value.shape is not None else None
    if fixed is not None:
        if declared is not None and len(declared) != len(fixed):
            raise OptionError(f"input_shapes[{name!r}]: rank {len(fixed)} ({fixed}), but input {name!r} is declared "
                              f"with rank {len(declared)} ({_show(declared)})")
        dims: list = []
        for i, size in enumerate(fixed):
            old = declared[i] if declared is not None else None
            if size == -1:
                dims.append(old if old is not None else ir.SymbolicDim(None))
                continue
            if size < 0:
                raise OptionError(f"input_shapes[{name!r}]: dimension {i} must be >= 0 (or -1 to keep it), got {size}")
            if isinstance(old, int) and old != size:
                raise OptionError(f"input_shapes[{name!r}]: dimension {i} is {size}, but input {name!r} declares "
                                  f"it as {old} ({_show(declared)})")
            dims.append(size)
        declared = dims
    if declared is None:
        return None
    out = []
    for d in declared:
        if isinstance(d, ir.SymbolicDim) and d.value in by_dim:
            out.append(by_dim[d.value])
        else:
            out.append(d)
    return ir.Shape(out)


def _show(dims) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else (getattr(d, "value", None) or "?") for d in dims) + "]"


def _check_budget(value: ir.Value, shape: ir.Shape, budget: Budget | None) -> None:
    if budget is None:
        return
    known = [d for d in shape if isinstance(d, int)]
    itemsize = value.dtype.itemsize if value.dtype is not None else 1
    nbytes = math.prod(known) * max(1, int(itemsize)) if known else 0
    if nbytes > budget.max_tensor_bytes:
        raise ResourceLimitError(f"input_shapes: input {value.name!r} with shape {_show(shape)} needs "
                                 f"{nbytes} bytes, over the budget max_tensor_bytes={budget.max_tensor_bytes}")


def parse_shape_args(items: Sequence[str] | None) -> dict[str, list[int] | int] | None:
    """``--shape`` values for the command line: ``x=1,3,224,224`` (an input) or ``batch=1`` (a dimension name).

    One number is kept as an int: it fixes a dimension name, or (for an input name) a rank-1
    shape. :raises OptionError: on a malformed item.
    """
    if not items:
        return None
    out: dict[str, list[int] | int] = {}
    for item in items:
        name, sep, text = item.rpartition("=")
        name = name.strip()
        if not sep or not name or not text.strip():
            raise OptionError(f"--shape {item!r}: expected NAME=D1,D2,... (an input) or NAME=N (a dimension name)")
        try:
            dims = [int(part) for part in text.replace("x", ",").split(",") if part.strip() != ""]
        except ValueError:
            raise OptionError(f"--shape {item!r}: dimensions must be integers") from None
        if name in out:
            raise OptionError(f"--shape: {name!r} given twice")
        out[name] = dims[0] if len(dims) == 1 else dims
    return out


def add_shape_argument(parser) -> None:
    """The ``--shape`` option of ``byoc compile/run/explain/partition``."""
    parser.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                        help="fix an input's shape (x=1,3,224,224) or a symbolic dimension (batch=1) "
                             "before compiling; repeat for each")


__all__ = ["add_shape_argument", "fix_input_shapes", "parse_shape_args"]
