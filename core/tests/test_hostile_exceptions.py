"""Class 3 of the hardening issue: no foreign exception escapes compile, run or load.

Kernel-building errors are wrapped like kernel-running ones (a :class:`KernelError` naming the
node); Conv and BatchNormalization check their constant parameters before packing them; feeds
and the API's arguments are type-checked at the boundary.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import byoc
from byoc.errors import BundleError, ByocError, InputError, KernelError, OptionError, ResourceLimitError
from byoc.kernels import registry
from byoc.kernels.registry import NodeSpec, make_kernel


def _model(nodes, inputs, outputs, inits=(), opset=17):
    return h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", opset)])


def _relu():
    return _model([h.make_node("Relu", ["x"], ["y"], name="relu")], [h.make_tensor_value_info("x", T.FLOAT, [2])],
                  [h.make_tensor_value_info("y", T.FLOAT, [2])])


@pytest.fixture(scope="module")
def relu_model():
    return byoc.compile(_relu(), targets=[])


# -------------------------------------------------------------------------------------------------
# kernel-building errors


@pytest.mark.parametrize("exc", [ValueError("bad"), IndexError("range"), TypeError("type"), ZeroDivisionError(),
                                 AttributeError("attr"), KeyError("k")])
def test_a_factory_raising_a_foreign_exception_becomes_a_kernel_error(monkeypatch, exc):
    def factory(spec):
        raise exc

    monkeypatch.setitem(registry._REGISTRY, ("test.harden", "Boom"), factory)
    with pytest.raises(KernelError, match=r"node 'boom1' \(Boom\): cannot build the kernel: " + type(exc).__name__):
        make_kernel(NodeSpec("Boom", name="boom1", domain="test.harden"))


def test_a_factory_running_out_of_memory_becomes_a_resource_limit_error(monkeypatch):
    def factory(spec):
        raise MemoryError

    monkeypatch.setitem(registry._REGISTRY, ("test.harden", "Big"), factory)
    with pytest.raises(ResourceLimitError, match="node 'big'"):
        make_kernel(NodeSpec("Big", name="big", domain="test.harden"))


def _conv(x_shape, w_shape, group, *, const_w=True):
    w = np.ones(w_shape, np.float32)
    inputs = [h.make_tensor_value_info("x", T.FLOAT, list(x_shape))]
    if not const_w:
        inputs.append(h.make_tensor_value_info("w", T.FLOAT, list(w_shape)))
    node = h.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group)
    return _model([node], inputs, [h.make_tensor_value_info("y", T.FLOAT, None)],
                  [nh.from_array(w, "w")] if const_w else [])


@pytest.mark.parametrize("x_shape,w_shape,group", [
    ((1, 4, 5, 5), (3, 2, 1, 1), 2),   # group does not divide the 3 output channels
    ((1, 6, 5, 5), (5, 2, 3, 3), 3),
    ((1, 4, 5, 5), (4, 1, 1, 1), 3),   # group does not divide anything
    ((1, 4, 5, 5), (4, 2, 1, 1), 4),   # X has 4 channels, W expects 8
])
def test_conv_whose_group_does_not_divide_the_channels(x_shape, w_shape, group):
    with pytest.raises(KernelError, match=r"node 'conv' \(Conv\)"):
        compiled = byoc.compile(_conv(x_shape, w_shape, group), targets=[])
        compiled.run({"x": np.ones(x_shape, np.float32)})


def test_conv_with_weights_fed_at_run_time_and_a_bad_group():
    compiled = byoc.compile(_conv((1, 4, 5, 5), (3, 2, 1, 1), 2, const_w=False), targets=[])
    with pytest.raises(KernelError, match=r"node 'conv' \(Conv\)"):
        compiled.run({"x": np.ones((1, 4, 5, 5), np.float32), "w": np.ones((3, 2, 1, 1), np.float32)})


def _bn(params: dict, *, fed=()):
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 2, 2])]
    inputs += [h.make_tensor_value_info(k, T.FLOAT, list(np.shape(params[k]))) for k in fed]
    inits = [nh.from_array(np.asarray(v, np.float32), k) for k, v in params.items() if k not in fed]
    node = h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")
    return _model([node], inputs, [h.make_tensor_value_info("y", T.FLOAT, None)], inits, opset=15)


_ok = np.ones(3, np.float32)


@pytest.mark.parametrize("params", [
    {"s": np.float32(1), "b": _ok, "m": _ok, "v": _ok},              # 0-D scale
    {"s": _ok, "b": _ok, "m": _ok, "v": np.float32(1)},              # 0-D var
    {"s": _ok, "b": np.ones(2, np.float32), "m": _ok, "v": _ok},     # mismatched B
    {"s": _ok, "b": _ok, "m": np.ones(4, np.float32), "v": _ok},     # mismatched mean
    {"s": np.ones((3, 2), np.float32), "b": _ok, "m": _ok, "v": _ok},
])
def test_batchnorm_with_scalar_or_mismatched_constant_params(params):
    with pytest.raises(KernelError, match=r"node 'bn' \(BatchNormalization\)"):
        compiled = byoc.compile(_bn(params), targets=[])
        compiled.run({"x": np.ones((1, 3, 2, 2), np.float32)})


def test_batchnorm_with_a_scalar_param_fed_at_run_time():
    params = {"s": np.float32(1), "b": _ok, "m": _ok, "v": _ok}
    compiled = byoc.compile(_bn(params, fed=("s",)), targets=[])
    with pytest.raises(KernelError, match=r"node 'bn' \(BatchNormalization\)"):
        compiled.run({"x": np.ones((1, 3, 2, 2), np.float32), "s": np.array(1, np.float32)})


def test_rnn_whose_hidden_size_disagrees_with_its_weights():
    node = h.make_node("RNN", ["X", "W", "R"], ["Y"], hidden_size=1 << 30, name="rnn")
    model = _model([node], [h.make_tensor_value_info("X", T.FLOAT, [2, 1, 3])], [h.make_tensor_value_info("Y", T.FLOAT, None)],
                   [nh.from_array(np.ones((1, 4, 3), np.float32), "W"), nh.from_array(np.ones((1, 4, 4), np.float32), "R")])
    with pytest.raises(KernelError, match=r"node 'rnn' \(RNN\).*hidden_size=1073741824"):
        byoc.compile(model, targets=[]).run({"X": np.ones((2, 1, 3), np.float32)})


# -------------------------------------------------------------------------------------------------
# feeds


@pytest.mark.parametrize("feeds", [
    {0: np.ones(2, np.float32)},
    {"x": np.ones(2, np.float32), 1: np.ones(2, np.float32)},
    {None: np.ones(2, np.float32), "x": np.ones(2, np.float32)},
    {("x",): np.ones(2, np.float32)},
    {b"x": np.ones(2, np.float32)},
    {1.5: 0, "x": np.ones(2, np.float32)},
])
def test_feeds_with_non_string_keys(relu_model, feeds):
    with pytest.raises(InputError, match="feed names must be strings"):
        relu_model.run(feeds)


@given(st.dictionaries(st.one_of(st.integers(), st.none(), st.floats(allow_nan=False), st.binary(max_size=3),
                                 st.tuples(st.integers())),
                       st.just(np.ones(2, np.float32)), min_size=1, max_size=4))
def test_any_non_string_key_is_an_input_error(keys_and_values):
    compiled = _compiled_relu()
    feeds = dict(keys_and_values)
    feeds["x"] = np.ones(2, np.float32)
    with pytest.raises(InputError):
        compiled.run(feeds)


_cache: dict = {}


def _compiled_relu():
    if "relu" not in _cache:
        _cache["relu"] = byoc.compile(_relu(), targets=[])
    return _cache["relu"]


@pytest.mark.parametrize("feeds", [None, [("x", np.ones(2))], "x", 5, np.ones(2)])
def test_feeds_that_are_not_a_dict(relu_model, feeds):
    with pytest.raises(InputError, match="feeds must be a dict"):
        relu_model.run(feeds)


# -------------------------------------------------------------------------------------------------
# API arguments


@pytest.mark.parametrize("kwargs,match", [
    ({"timeout": "5"}, "timeout must be a positive number"),
    ({"timeout": [1]}, "timeout"),
    ({"timeout": float("nan")}, "timeout"),
    ({"timeout": True}, "timeout"),
    ({"timeout": -1}, "timeout"),
    ({"cancel": object()}, "cancel must be a byoc.CancelHandle"),
    ({"cancel": "stop"}, "cancel"),
])
def test_run_with_wrongly_typed_arguments(relu_model, kwargs, match):
    with pytest.raises(OptionError, match=match):
        relu_model.run({"x": np.ones(2, np.float32)}, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"budget": {}}, "budget must be a byoc.Budget"),
    ({"budget": 1 << 30}, "budget"),
    ({"targets": 5}, "targets must be a list of names"),
    ({"targets": 5.0}, "targets must be a list of names"),
    ({"targets": [b"cpu"]}, "target names"),
    ({"targets": [5]}, "target names"),
    ({"targets": [None]}, "target names"),
    ({"target_options": {"cpu": 5}}, r"target_options\['cpu'\] must be a dict"),
    ({"target_options": 5}, "target_options must be a dict"),
    ({"target_options": {5: {}}}, "target_options: keys must be target names"),
    ({"target_options": {"cpu": {1: 2}}}, "option names must be strings"),
    ({"passes": 5}, "passes must be a list"),
    ({"passes": "fold_constants"}, "passes must be a list"),
    ({"strict": "yes"}, "strict must be True or False"),
    ({"hook_timeout": "1"}, "hook_timeout"),
    ({"hook_timeout": 0}, "hook_timeout"),
    ({"calibration": 5}, "calibration"),
    ({"calibration": {"x": np.ones(2)}}, "calibration"),
])
def test_compile_with_wrongly_typed_arguments(kwargs, match):
    with pytest.raises(OptionError, match=match):
        byoc.compile(_relu(), **kwargs)


@pytest.mark.parametrize("path", [None, 5, 1.5, [b"x"], b"bundle.byoc", ""])
def test_load_with_something_that_is_not_a_path(path):
    with pytest.raises(BundleError):
        byoc.load(path)


def test_load_with_a_bad_budget(tmp_path):
    with pytest.raises(OptionError, match="budget"):
        byoc.load(tmp_path / "x.byoc", budget={})


@pytest.mark.parametrize(("target_options", "match"), [
    (2**70, "target_options must be a dict"), ("cpu", "target_options must be a dict"),
    ([("cpu", {})], "target_options must be a dict"), ({5: {}}, "keys must be target names"),
    ({"cpu": 5}, r"target_options\['cpu'\] must be a dict"), ({"cpu": {1: 2}}, "option names must be strings"),
])
def test_load_with_wrongly_typed_target_options(relu_model, tmp_path, target_options, match):
    """Checked as compile checks them, before the bundle is read (an int raised TypeError)."""
    path = relu_model.save(tmp_path / "relu.byoc")
    with pytest.raises(OptionError, match=match):
        byoc.load(path, target_options=target_options)


class _Raising:
    def __init__(self, exc):
        self.exc = exc

    def __array__(self, dtype=None, copy=None):
        raise self.exc("hostile __array__")


@pytest.mark.parametrize("exc", [ValueError, MemoryError, RuntimeError, KeyError])
def test_a_feed_whose_conversion_raises_is_an_input_error_in_run_and_run_batch(relu_model, exc):
    """Whatever a feed's ``__array__`` raises, ``run`` and ``run_batch`` (which stacks feeds
    first) answer with an InputError naming the input."""
    good = {"x": np.ones(2, np.float32)}
    with pytest.raises(InputError, match="input 'x'.*hostile"):
        relu_model.run({"x": _Raising(exc)})
    with pytest.raises(InputError, match="input 'x'.*hostile"):
        list(relu_model.run_batch([good, {"x": _Raising(exc)}], batch_size=2))


def test_correct_arguments_still_work(relu_model):
    out = relu_model.run({"x": np.array([-1, 2], np.float32)}, timeout=5, cancel=byoc.CancelHandle())
    assert out["y"].tolist() == [0, 2]
    assert byoc.compile(_relu(), targets=[], strict=False, hook_timeout=None, target_options={},
                        budget=byoc.Budget(), passes=None).run({"x": np.ones(2, np.float32)})["y"].tolist() == [1, 1]


def test_every_refusal_is_a_byoc_error():
    for cls in (KernelError, InputError, OptionError, BundleError, ResourceLimitError):
        assert issubclass(cls, ByocError)


# -------------------------------------------------------------------------------------------------
# paths: every entry point that takes a file name


class _RaisingPath:
    """An ``os.PathLike`` whose ``__fspath__`` raises."""

    def __fspath__(self):
        raise RuntimeError("no path today")


HOSTILE_PATHS = [3, 2.5, None, _RaisingPath(), "", "a\x00b", ["m.onnx"]]


@pytest.mark.parametrize("path", HOSTILE_PATHS, ids=repr)
@pytest.mark.parametrize("entry", ["save", "load", "compile", "info"])
def test_a_hostile_path_is_a_byoc_error(relu_model, entry, path):
    call = {"save": relu_model.save, "load": byoc.load, "compile": lambda p: byoc.compile(p, targets=[]),
            "info": byoc.info}[entry]
    with pytest.raises(ByocError):
        call(path)
