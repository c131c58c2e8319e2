"""What every pass receives besides the model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from byoc.budget import DEFAULT_BUDGET, Budget


@dataclass
class PassContext:
    budget: Budget = DEFAULT_BUDGET


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant value of ``value`` if it is fixed at compile time, else ``None``.

    An initializer that is also a graph input can be overridden by a feed, so it is not
    constant.
    """
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    return value.const_value.numpy()


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """Register a new initializer named ``name`` (made unique) holding ``array``."""
    base, i = name, 0
    while name in graph.initializers:
        i += 1
        name = f"{base}_{i}"
    # (np.ascontiguousarray turns a 0-d array into shape (1,); keep scalars scalar)
    array = np.ascontiguousarray(array).reshape(np.shape(array))
    if array.dtype.kind in "biuf" and array.dtype.isnative:
        tensor = ir.Tensor(array, name=name)  # wraps the array, no copy
    else:
        tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Point every use of ``old`` (graph outputs included) at ``new``.

    A node output ``new`` takes over ``old``'s name, so graph output names never change; an
    initializer keeps its own (unique) name, so name it after ``old`` when creating it.
    """
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if new.type is None:
        new.type = old.type
    if new.shape is None:
        new.shape = old.shape
    if not new.is_initializer():
        name = old.name
        old.name = f"{name}__replaced"
        new.name = name
