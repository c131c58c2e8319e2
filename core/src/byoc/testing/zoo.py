"""The model-zoo architectures that ship inside the ``onnx`` wheel, with seeded random weights.

``onnx/backend/test/data/light/*.onnx`` hold real architectures (ResNet-50, DenseNet-121, ...)
whose weights are ``ConstantOfShape`` nodes filling every tensor with 0.02, so their outputs are
degenerate. :func:`randomize` replaces every weight with seeded random values scaled by the
layer's role (He initialisation for convolution weights, positive BatchNorm variance), so the
comparison against onnxruntime means something.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"

#: the nine architectures, short name -> file name
ZOO = {
    "alexnet": "light_bvlc_alexnet.onnx",
    "densenet121": "light_densenet121.onnx",
    "inception_v1": "light_inception_v1.onnx",
    "inception_v2": "light_inception_v2.onnx",
    "resnet50": "light_resnet50.onnx",
    "shufflenet": "light_shufflenet.onnx",
    "squeezenet": "light_squeezenet.onnx",
    "vgg19": "light_vgg19.onnx",
    "zfnet512": "light_zfnet512.onnx",
}


def zoo_path(name: str) -> Path:
    return LIGHT_DIR / ZOO[name]


def _role(graph: onnx.GraphProto, name: str) -> tuple[str, int]:
    """(consumer op_type, input index) of the first consumer, looking through Unsqueeze."""
    for node in graph.node:
        for idx, inp in enumerate(node.input):
            if inp != name:
                continue
            if node.op_type == "Unsqueeze":
                return _role(graph, node.output[0])
            return node.op_type, idx
    return "", -1


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...], role: tuple[str, int], node=None) -> np.ndarray:
    op, idx = role
    if op == "Conv" and idx == 1:
        fan_in = int(np.prod(shape[1:])) or 1
        w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    elif op == "Gemm" and idx == 1:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute) if node is not None else True
        fan_in = shape[1] if trans_b else shape[0]
        w = rng.standard_normal(shape) * np.sqrt(1.0 / max(fan_in, 1))
    elif (op == "BatchNormalization" and idx in (1, 4)) or op == "Mul":
        w = rng.uniform(0.5, 1.0, shape) if idx == 1 or op == "Mul" else rng.uniform(1.0, 2.0, shape)
    else:
        w = rng.uniform(-0.1, 0.1, shape)  # biases, means, shifts
    return w.astype(np.float32)


def randomize(model: onnx.ModelProto, seed: int = 0, *, keep_ir_version: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` whose weights are seeded random initializers (ConstantOfShape removed).

    :param keep_ir_version: keep the file's ``ir_version`` (3 for the zoo files) and its IR's
        rule that every initializer is also a graph input; by default the weights stop being
        inputs and ``ir_version`` is raised to 4.
    """
    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumer = {inp: n for n in graph.node for inp in n.input}
    new_nodes, new_inits = [], []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            out = node.output[0]
            arr = _random_weight(rng, shape, _role(graph, out), consumer.get(out))
            new_inits.append(numpy_helper.from_array(arr, out))
        else:
            new_nodes.append(node)
    for t in graph.initializer:
        if t.name.endswith("__SHAPE"):
            continue
        if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 1:
            role = _role(graph, t.name)
            if role[0] in ("Conv", "Gemm", "BatchNormalization", "Mul", "Add"):
                arr = _random_weight(rng, tuple(t.dims), role, consumer.get(t.name))
                t = numpy_helper.from_array(arr, t.name)
        new_inits.append(t)
    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    shapes = {t.name for t in inits.values() if t.name.endswith("__SHAPE")}
    if keep_ir_version and model.ir_version < 4:
        # the file's own IR: every initializer is also a graph input (the shapes' are gone with ConstantOfShape)
        keep = [i for i in graph.input if i.name not in shapes]
        listed = {i.name for i in keep}
        keep += [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                 for t in new_inits if t.name not in listed]
    else:
        # weights are no longer graph inputs (IR version 3 listed every initializer as an input)
        dropped = {t.name for t in new_inits} | shapes
        keep = [i for i in graph.input if i.name not in dropped]
        if model.ir_version < 4:
            model.ir_version = 4
    del graph.input[:]
    graph.input.extend(keep)
    return model


def load_zoo(name: str, seed: int = 0, *, keep_ir_version: bool = False) -> onnx.ModelProto:
    """The architecture ``name`` (a key of :data:`ZOO`) with seeded random weights (see :func:`randomize`)."""
    return randomize(onnx.load(str(zoo_path(name))), seed, keep_ir_version=keep_ir_version)


def zoo_inputs(model: onnx.ModelProto, seed: int = 1, shapes: Mapping[str, Sequence[int] | int] | None = None,
               assumed: list[str] | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for every graph input that is not an initializer, of its element type
    (floats from a normal distribution, integers in ``[0, 8)``, booleans at random).

    :param shapes: as ``byoc.compile``'s ``input_shapes``: input name -> shape, or symbolic
        dimension name -> size. A symbolic dimension it does not fix is 1.
    :param assumed: filled with ``"input[axis]"`` for each dimension taken as 1.
    """
    rng = np.random.default_rng(seed)
    shapes = dict(shapes or {})
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        shape = []
        for axis, d in enumerate(tt.shape.dim):
            given = shapes.get(i.name)
            if isinstance(given, (list, tuple)) and axis < len(given) and given[axis] >= 0:
                shape.append(int(given[axis]))
            elif d.HasField("dim_value") and d.dim_value >= 0:
                shape.append(d.dim_value)
            elif isinstance(shapes.get(d.dim_param), int):
                shape.append(shapes[d.dim_param])
            else:
                shape.append(1)
                if assumed is not None:
                    assumed.append(f"{i.name}[{axis}]")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype(np.float32)
        if dtype.kind == "b":
            feeds[i.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            feeds[i.name] = rng.integers(0, 8, size=shape).astype(dtype)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
