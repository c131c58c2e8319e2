"""Fuzz cases for feeds, compile options and cache files, used by :mod:`byoc_fuzz`.

Each case is a callable ``(rng, budget) -> mutation names``, like those of
:mod:`byoc_fuzz.hostile`, and must end in success or a :class:`byoc.ByocError`; a wrong result
is raised as an ``AssertionError`` (a foreign exception: a finding).

* *Feeds* cases (:func:`feeds_case`) compile a seed model of :mod:`byoc_fuzz` (or a symbolic
  batch model) for the host (``targets=[]``) or, where byoc-cpu is installed, sometimes the
  ``cpu`` target, always with ``wait=True``, then call ``run`` or ``run_batch`` with hostile
  feeds: wrong, missing and extra names, a feeds object that is not a dict, values that are not
  arrays (lists, strings, ``None``, objects whose ``__array__`` raises), wrong dtypes, ranks and
  shapes, zero-size arrays, huge declared shapes (zero-stride ``as_strided`` views), non-contiguous,
  Fortran-ordered and read-only arrays, NaN and inf, ndarray subclasses and numpy scalars. A run
  that succeeds must give, bit for bit (NaN equal to NaN), what the same model gives for plain
  contiguous copies of the feeds, and must leave the caller's arrays unchanged.
* *Options* cases (:func:`options_case`) call ``byoc.compile`` with random keyword arguments
  (targets, budget, passes, input_shapes, placement, measure_budget_s, strict, hook_timeout,
  target_options, host, wait, calibration: known values, unknown ones and wrong types), then
  ``run(timeout=..., cancel=...)``, ``save`` to odd paths in a temporary folder and ``byoc.load``
  with random options; a loaded bundle must give the compiled model's outputs bit for bit.
* *Caches* cases (:func:`caches_case`) point byoc's cache folders (``BYOC_CACHE_DIR``:
  ``host-throughput.json`` and ``placement-measure.json``; ``BYOC_CPU_CACHE``: byoc-cpu's
  generated modules) at a private temporary folder, set only for the case and restored after it.
  A clean compile and run (``placement="cost"`` or ``"measure"`` with a small
  ``measure_budget_s``, or the cpu target) fills the folder; a copy of it is then damaged (random
  bytes, truncated, oversized or deeply nested JSON, wrong types, planted figures under the right
  keys, symbolic links out of the folder and dangling ones, FIFOs, folders where files should be,
  unreadable files, a folder others may write) and the same compile and run must give the clean
  run's outputs: bit for bit where the placement is the same, within the target's tolerance where
  planted figures moved nodes. byoc's in-process memos of those files (the host's throughput,
  byoc-cpu's imported modules) are emptied for each compile and restored after the case, so the
  files are read again. A FIFO's reader that blocks is released (the FIFO opened for writing and
  closed) only after :data:`byoc_fuzz.TIME_LIMIT`, so such a hang shows as a case over the time
  limit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import byoc

#: whether byoc-cpu (the ``cpu`` target, the host executor) is installed
HAVE_CPU = importlib.util.find_spec("byoc_cpu") is not None


def _applied(rng: random.Random, *names: str) -> list[str]:
    """The case's list of mutation names: the one :func:`byoc_fuzz.run_case` put on ``rng`` (so a
    case that raises still names what it applied), else a new one."""
    applied = getattr(rng, "fuzz_applied", None)
    if not isinstance(applied, list):
        applied = []
    applied.extend(names)
    return applied


def _seed_bytes(name: str) -> bytes:
    import byoc_fuzz
    from byoc_fuzz import hostile

    if name == "batch":
        return hostile.model("N")
    return byoc_fuzz.SEEDS[name]().SerializeToString()


SEED_NAMES = ("conv_net", "elementwise", "shapes", "control_flow", "batch")


def _valid_feeds(cm, rng: random.Random) -> dict[str, np.ndarray]:
    import byoc_fuzz

    return byoc_fuzz._random_feeds(cm, rng)


def _same(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            return False
    return True


def _close(a: dict, b: dict, rtol: float, atol: float) -> bool:
    if list(a) != list(b):
        return False
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape:
            return False
        if x.dtype.kind in "fc":
            if not np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


# -- feeds ------------------------------------------------------------------------------------


class _RaisingArray:
    """An object whose ``__array__`` raises."""

    def __init__(self, exc: type[Exception]):
        self.exc = exc

    def __array__(self, dtype=None, copy=None):
        raise self.exc("hostile __array__")


class _Sub(np.ndarray):
    """A plain ndarray subclass."""


class _Meddling(np.ndarray):
    """An ndarray subclass whose ufunc hook answers garbage."""

    def __array_ufunc__(self, *args, **kwargs):
        return NotImplemented


_BAD_DTYPES = [np.float16, np.float64, np.int32, np.int64, np.uint8, np.bool_, object, np.str_, np.complex64,
               np.longdouble, np.dtype("M8[s]"), np.dtype("V4"), np.dtype(">f4")]


def _huge_view(dtype, shape: tuple[int, ...]) -> np.ndarray:
    base = np.zeros(1, dtype)
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=(0,) * len(shape), writeable=False)


def _mutate_value(rng: random.Random, a: np.ndarray) -> tuple[Any, str]:
    """One value mutation; the name ends in ``:same`` when the values are unchanged (only layout,
    flags or type differ), so a run must give the plain copy's result."""
    choice = rng.choice(["list", "str", "none", "raising", "dtype", "rank_up", "rank_down", "shape", "zero",
                         "huge", "noncontig", "fortran", "readonly", "nan", "subclass", "meddling", "scalar",
                         "broadcast", "bytes", "object_array", "masked"])
    if choice == "list":
        return a.tolist(), "list"
    if choice == "str":
        return rng.choice(["x", "", "1.0", "名前"]), "str"
    if choice == "none":
        return None, "none"
    if choice == "raising":
        return _RaisingArray(rng.choice([ValueError, TypeError, RuntimeError, MemoryError, KeyError])), "raising"
    if choice == "dtype":
        dt = rng.choice(_BAD_DTYPES)
        try:
            return a.astype(dt), f"dtype:{np.dtype(dt).str}"
        except (TypeError, ValueError):
            return np.zeros(a.shape, dt), f"dtype:{np.dtype(dt).str}"
    if choice == "rank_up":
        return a[None], "rank_up"
    if choice == "rank_down":
        if a.size == 1 or a.ndim > 1:
            return (a.reshape(-1) if a.ndim != 1 else a.reshape(())), "rank_down"
        # no arithmetic: the value may be of any dtype (void, datetime) by an earlier mutation
        return (a[:1].reshape(()) if a.size else np.zeros((), a.dtype)), "rank_down"
    if choice == "shape":
        shape = list(a.shape) or [1]
        i = rng.randrange(len(shape))
        shape[i] = rng.choice([shape[i] + 1, max(0, shape[i] - 1), 7])
        return np.ones(shape, a.dtype), "shape"
    if choice == "zero":
        shape = list(a.shape) or [0]
        shape[rng.randrange(len(shape))] = 0
        return np.zeros(shape, a.dtype), "zero"
    if choice == "huge":
        shape = list(a.shape) or [1]
        shape[rng.randrange(len(shape))] = rng.choice([2**31, 2**40, 10**15, 2**62 // max(1, a.itemsize)])
        for huge in (tuple(shape), (2**40,) + tuple(shape[1:]), (2**31,)):
            try:
                return _huge_view(a.dtype, huge), "huge"
            except ValueError:  # past numpy's own limit on the byte count
                continue
        return _huge_view(np.dtype(np.float32), (2**31,)), "huge"
    if choice == "noncontig":
        big = np.repeat(a[..., None], 2, axis=-1) if a.ndim else np.array([a, a])
        return (big[..., 0] if a.ndim else big[0]), "noncontig:same"
    if choice == "fortran":
        return np.asfortranarray(a), "fortran:same"
    if choice == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b, "readonly:same"
    if choice == "nan":
        if a.dtype.kind != "f" or not a.size:
            return a, "nan:same"
        b = a.copy()
        flat = b.reshape(-1)
        for _ in range(rng.randint(1, 3)):
            flat[rng.randrange(flat.size)] = rng.choice([np.nan, np.inf, -np.inf, 3e38, -0.0, 1e-45])
        return b, "nan:same"
    if choice == "subclass":
        return a.copy().view(_Sub), "subclass:same"
    if choice == "meddling":
        return a.copy().view(_Meddling), "meddling"
    if choice == "scalar":
        if a.ndim == 0:
            return a.dtype.type(a[()]), "scalar:same"
        return a.dtype.type(a.reshape(-1)[0]) if a.size else np.float32(1), "scalar"
    if choice == "broadcast":
        if a.size:
            v = a.reshape(-1)[:1]
            return np.broadcast_to(v.reshape((1,) * a.ndim), a.shape), "broadcast:same"
        return a, "broadcast:same"
    if choice == "bytes":
        return a.tobytes(), "bytes"
    if choice == "object_array":
        return a.astype(object), "object_array"
    return np.ma.masked_array(a, mask=np.zeros(a.shape, bool)), "masked"


def _mutate_feeds(rng: random.Random, feeds: dict, names: list[str], applied: list[str], prefix: str = "") -> Any:
    """Damage ``feeds`` (a copy); the mutations' names go to ``applied`` as they are made."""
    out: Any = dict(feeds)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if not isinstance(out, dict):
            break
        choice = rng.choice(["value", "value", "value", "value", "missing", "extra", "rename", "not_dict",
                             "key_type"])
        if choice == "value" and out:
            k = rng.choice(sorted(k for k in out if isinstance(k, str)) or [None])
            if k is None:
                continue
            v = out[k]
            if isinstance(v, np.ndarray) and v.nbytes <= 1 << 20:  # not a huge view made before
                applied.append(f"{prefix}value:{k}")
                try:
                    out[k], name = _mutate_value(rng, v)
                except (TypeError, ValueError, OverflowError):  # the harness's own numpy call on a
                    out[k], name = None, "none"                 # value an earlier mutation made odd
                applied[-1] += f":{name}"
        elif choice == "missing" and out:
            k = rng.choice(sorted(k for k in out if isinstance(k, str)) or [None])
            if k is None:
                continue
            del out[k]
            applied.append(f"{prefix}missing:{k}")
        elif choice == "extra":
            k = rng.choice(["extra", "", "\x00", "名前", "X", (names[0] + " ") if names else "y"])
            out[k] = np.zeros(2, np.float32)
            applied.append(f"{prefix}extra")
        elif choice == "rename" and out:
            k = rng.choice(sorted(k for k in out if isinstance(k, str)) or [None])
            if k is None:
                continue
            out[k.upper() if k.upper() != k else k + "_"] = out.pop(k)
            applied.append(f"{prefix}rename:{k}")
        elif choice == "key_type":
            out[rng.choice([5, None, b"x", ("a",), 1.5])] = np.zeros(2, np.float32)
            applied.append(f"{prefix}key_type")
        elif choice == "not_dict":
            out = rng.choice([list(out.values()), list(out.items()), tuple(out.values()), None, "feeds", 5,
                              np.zeros(3, np.float32), _MappingLike(out), set()])
            applied.append(f"{prefix}not_dict:{type(out).__name__}")
    return out


class _MappingLike:
    """A mapping in all but type (keys(), __getitem__), not a dict."""

    def __init__(self, d: dict):
        self._d = d

    def keys(self):
        return self._d.keys()

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


def _plain(feeds: Any) -> dict[str, np.ndarray] | None:
    """Contiguous, writable, base-class copies of ``feeds``; None when they are not all arrays."""
    if isinstance(feeds, _MappingLike):  # run_batch takes any mapping
        feeds = dict(feeds)
    if not isinstance(feeds, dict):
        return None
    out = {}
    for k, v in feeds.items():
        if not isinstance(v, (np.ndarray, np.generic)):
            return None
        out[k] = np.array(np.asarray(v), order="C", copy=True, subok=False)
    return out


def _snapshot(feeds: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    if not isinstance(feeds, dict):
        return []
    return [(v, np.array(v, copy=True, subok=False)) for v in feeds.values()
            if isinstance(v, np.ndarray) and v.flags.writeable and v.size < (1 << 20)]


def _check_unchanged(snap: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for arr, before in snap:
        if not np.array_equal(np.asarray(arr).view(np.ndarray), before, equal_nan=before.dtype.kind in "fc"):
            raise AssertionError("a run changed the caller's feed array")


def feeds_case(rng: random.Random, budget) -> list[str]:
    """Compile a seed model and run it on hostile feeds; returns the mutation names."""
    name = rng.choice(SEED_NAMES)
    targets = ["cpu"] if HAVE_CPU and rng.random() < 0.3 else []
    applied = _applied(rng, f"seed:{name}", f"targets:{','.join(targets) or 'host'}")
    cm = byoc.compile(_seed_bytes(name), targets=targets, budget=budget, wait=True)
    base = _valid_feeds(cm, rng)
    names = [s.name for s in cm.inputs]
    how = rng.choice(["run", "run", "run", "batch"])
    if how == "run":
        feeds = _mutate_feeds(rng, base, names, applied)
        snap = _snapshot(feeds)
        out = cm.run(feeds)
        _check_unchanged(snap)
        plain = _plain(feeds)
        if plain is None:
            raise AssertionError(f"a run accepted feeds that are not all arrays: {type(feeds).__name__}")
        ref = cm.run(plain)
        if not _same(out, ref):
            raise AssertionError("a run's outputs differ from those for contiguous copies of the same feeds")
        return applied
    # run_batch: a few feed dicts, some mutated, or a hostile iterable
    items: list[Any] = []
    for i in range(rng.randint(1, 4)):
        f = _valid_feeds(cm, random.Random(rng.randrange(2**32)))
        if name == "batch" and rng.random() < 0.5:
            n = rng.choice([1, 3])
            f = {"x": np.linspace(-1, 1, 4 * n, dtype=np.float32).reshape(n, 4)}
        if rng.random() < 0.5:
            f = _mutate_feeds(rng, f, names, applied, f"#{i}:")
        items.append(f)
    batch_size = rng.choice([1, 2, 3, 8, 0, -1, 2.0, True, "2"])
    applied.append(f"batch_size:{batch_size!r}")
    feeds_arg: Any = items
    if rng.random() < 0.1:
        feeds_arg = rng.choice([None, 5, _Exploding(items), iter(items), (f for f in items)])
        applied.append(f"iterable:{type(feeds_arg).__name__}")
    snaps = [_snapshot(f) for f in items]
    try:
        outs = list(cm.run_batch(feeds_arg, batch_size=batch_size))
    except Planted:
        return applied
    for s in snaps:
        _check_unchanged(s)
    if len(outs) != len(items):
        raise AssertionError(f"run_batch gave {len(outs)} results for {len(items)} feed dicts")
    for f, out in zip(items, outs):
        plain = _plain(f)
        if plain is None:
            raise AssertionError("run_batch accepted feeds that are not all arrays")
        if not _same(out, cm.run(plain)):
            raise AssertionError("run_batch's outputs differ from single runs on contiguous copies")
    return applied


class Planted(Exception):
    """Raised by the caller's own code (an iterable of feeds or calibration samples): byoc may let
    it through unchanged or turn it into a byoc error; a case that sees it ends as a success."""


class _Exploding:
    """An iterable that raises :class:`Planted` part-way."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        yield from self.items[:1]
        raise Planted("the caller's iterator raised")


# -- options ----------------------------------------------------------------------------------

_JUNK = [None, True, 0, -1, 2**70, 1.5, float("nan"), float("inf"), "", "x" * 300, [], {}, {"a": [1]}, object(),
         b"bytes", ("t",), {1, 2}]


def _pick(rng: random.Random, good: list, bad: list = _JUNK, p_good: float = 0.75) -> Any:
    return rng.choice(good) if rng.random() < p_good else rng.choice(bad)


def _budget_value(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return rng.choice([{}, 5, "budget", byoc.Budget, {"max_tensor_bytes": 1}])
    fields = {}
    for f in ("max_tensor_bytes", "max_total_bytes", "max_nodes", "max_nesting", "max_loop_iterations",
              "max_shape_keys", "max_compile_seconds"):
        if rng.random() < 0.3:
            fields[f] = rng.choice([0, 1, 7, 64, 1 << 20, 64 << 20, 2**63, np.int64(5), 30.0, 2**20, 10**4]
                                   if rng.random() < 0.9 else
                                   [-1, 1.5, None, True, float("nan"), float("inf"), "1", np.float32(2)])
    return byoc.Budget(**fields)  # an invalid field: OptionError here, inside the case


def _calibration(rng: random.Random, x: np.ndarray) -> Any:
    return rng.choice([None, [], [{"x": x}], [{"x": x}] * 3, 5, "x", {"x": x}, [5], [{"x": "s"}],
                       [{"nope": x}], _Exploding([{"x": x}]), ({"x": x} for _ in range(2)),
                       [{"x": x.astype(np.float64)}]])


def _shapes_value(rng: random.Random, symbolic: bool) -> Any:
    good = [{"x": [2, 4]}, {"N": 3} if symbolic else {"x": [2, 4]}, {"N": 1}, {"x": [1, 4]}]
    bad = [{"x": [-1, 4]}, {"N": 2**40}, {"x": [2**40, 4]}, {"x": [2.5, 4]}, {"nope": 1}, {"x": "a"}, 5,
           {"x": [2]}, {5: 1}, {"x": [2, 4, 1]}, {"N": -3}, {"N": 0}, {"x": [0, 4]}, {"N": "M"}, {"x": ["N", 4]},
           {"x": None}, {"N": 1.0}, {"N": True}, {"x": np.array([2, 4])}, {"": 2}, {"x": [2, 4], "N": 2}]
    return _pick(rng, good, bad, 0.6)


def _target_options(rng: random.Random, tmp: Path) -> Any:
    good = [{"cpu": {"native": "off"}}, {"cpu": {"fuse": False}}, {"cpu": {"threads": 1}},
            {"cpu": {"conv_strategy": "direct"}}, {"cpu": {"cache_dir": str(tmp / "cpu-cache")}}, {}]
    bad = [{"cpu": {"bogus": 1}}, {"cpu": 5}, {"nope": {}}, {"cpu": {"native": "maybe"}}, {"cpu": {"threads": 0}},
           {"cpu": {"threads": 2**40}}, {"cpu": {"fuse": "yes"}}, {"cpu": {"cache_dir": 5}},
           {"cpu": {"cache_dir": str(tmp / "a-file")}}, {"cpu": {"cache_dir": str(tmp / "dangling")}},
           {"cpu": {"cache_dir": ""}}, {"cpu": {"cache_dir": str(tmp / "open")}}, {"cpu": {5: 1}},
           {5: {}}, {"cpu": {"native": ["on"]}}, {"cpu": {"x": {"y": [{"z": object()}]}}}, [("cpu", {})],
           {"jetson": {"precision": "fp64"}}, {"jetson": {"workspace": -1}}, {"vitis": {"engine": 5}},
           {"cpu": {"cache_dir": None}}]
    return _pick(rng, good, bad + _JUNK[:6], 0.6)


def _odd_path(rng: random.Random, tmp: Path) -> Any:
    (tmp / "a-file").write_bytes(b"not a bundle")
    (tmp / "sub").mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        os.symlink(tmp / "nowhere" / "x", tmp / "dangling")
    with contextlib.suppress(OSError):
        os.symlink(tmp / "sub", tmp / "link-to-dir")
    good = [tmp / "m.byoc", str(tmp / "m.byoc"), tmp / "名前 😀.byoc", tmp / "a-file", tmp / ".hidden"]
    bad = [tmp, tmp / "sub", tmp / "missing" / "m.byoc", tmp / "dangling", tmp / "link-to-dir",
           str(tmp / "x\x00y"), "", b"m.byoc", 5, None, tmp / ("x" * 300), _BadPath(), tmp / "a-file" / "m.byoc"]
    return _pick(rng, good, bad, 0.5)


class _BadPath:
    """An os.PathLike whose ``__fspath__`` raises."""

    def __fspath__(self):
        raise RuntimeError("hostile __fspath__")


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables for the block; restore them after it."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _private_tmp(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700


def _rmtree(path: Path) -> None:
    def onerror(func, p, exc):  # an unreadable folder planted by a case
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    for root, dirs, _files in os.walk(path, followlinks=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                if not os.path.islink(os.path.join(root, d)):
                    os.chmod(os.path.join(root, d), 0o700)
    shutil.rmtree(path, onerror=onerror)


def options_case(rng: random.Random, budget) -> list[str]:
    """``byoc.compile`` / ``run`` / ``save`` / ``byoc.load`` with random arguments."""
    tmp = _private_tmp("byoc-fuzz-options-")
    try:
        with _environ(BYOC_CACHE_DIR=str(tmp / "cache"), BYOC_CPU_CACHE=str(tmp / "cpu-cache")):
            return _options_case(rng, budget, tmp)
    finally:
        _rmtree(tmp)


def _options_case(rng: random.Random, budget, tmp: Path) -> list[str]:
    from byoc_fuzz import hostile

    symbolic = rng.random() < 0.3
    model = hostile.model("N" if symbolic else 2) if rng.random() < 0.7 else _seed_bytes("elementwise")
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    names = ["cpu"] if HAVE_CPU else []
    kwargs: dict[str, Any] = {"budget": budget, "wait": True}
    applied = _applied(rng)
    pool = {
        "targets": lambda: _pick(rng, [[], names, names[:1] and "cpu" or [], None],
                                 [["nope"], ["cpu", "cpu"], 5, [5], "", [""], ["jetson"], ["vitis"], [None],
                                  ("cpu",), {"cpu"}, iter(["cpu"]), b"cpu", ["CPU"], ["cpu", "nope"]], 0.6),
        "budget": lambda: _budget_value(rng),
        "passes": lambda: _pick(rng, [None, [], ["fold_constants"], list(reversed(_default_passes()))],
                                [["nope"], "fold", [5], 5, [None], ["fold_constants"] * 2, iter(["x"])], 0.5),
        "input_shapes": lambda: _shapes_value(rng, symbolic),
        "placement": lambda: _pick(rng, ["priority", "cost", "measure"], ["nope", 5, None, "", "COST", ["cost"]]),
        "measure_budget_s": lambda: _pick(rng, [0, 0.05, 0.2, None], [-1, float("nan"), float("inf"), "1", True,
                                                                      1e300, -0.0, 2**70]),
        "strict": lambda: _pick(rng, [True, False], [1, "yes", None, np.bool_(True)]),
        "hook_timeout": lambda: _pick(rng, [None, 0.5, 30, 1e-6], [0, -1, float("nan"), "5", True, float("inf")]),
        "target_options": lambda: _target_options(rng, tmp),
        "host": lambda: _pick(rng, [None, "reference"] + (["cpu"] if HAVE_CPU else []),
                              ["nope", 5, "", b"reference", ["reference"]], 0.6),
        "wait": lambda: _pick(rng, [True], [1, "yes", 0, [], np.bool_(True)], 0.7),
        "calibration": lambda: _calibration(rng, x),
    }
    for key in rng.sample(sorted(pool), rng.randint(1, 4)):
        kwargs[key] = pool[key]()
        applied.append(f"{key}={_short(kwargs[key])}")
    if kwargs.get("placement") == "measure" and kwargs.get("measure_budget_s") is None:
        kwargs["measure_budget_s"] = 0.2  # keep the case short
    if (kwargs.get("targets") is None or "jetson" in str(kwargs.get("targets"))) and rng.random() < 0.7:
        kwargs["targets"] = []  # None compiles for every available target: sometimes only
    try:
        cm = byoc.compile(model, **kwargs)
    except Planted:
        return applied
    feeds = {"x": x} if "x" in cm.input_names else _valid_feeds(cm, rng)
    run_kw: dict[str, Any] = {}
    if rng.random() < 0.5:
        run_kw["timeout"] = _pick(rng, [None, 5.0, 1e-9], [0, -1, float("nan"), "5", True, [], float("inf")])
    if rng.random() < 0.4:
        handle = byoc.CancelHandle()
        if rng.random() < 0.5:
            handle.cancel()
        run_kw["cancel"] = _pick(rng, [handle, None], [5, threading.Event(), "cancel", object()], 0.6)
    applied.append(f"run={_short(run_kw)}")
    out = cm.run(feeds, **run_kw)
    again = cm.run(feeds)
    if not _same(out, again):
        raise AssertionError("two runs of the same feeds differ")
    if rng.random() < 0.5:
        path = _odd_path(rng, tmp)
        applied.append(f"save={_short(path)}")
        written = cm.save(path)
        load_kw: dict[str, Any] = {}
        if rng.random() < 0.5:
            load_kw["fallback"] = _pick(rng, [None, "host", "error"], ["nope", 5, True, ""])
        if rng.random() < 0.3:
            load_kw["budget"] = _pick(rng, [budget, None], [{}, 5, "b"])
        if rng.random() < 0.3:
            load_kw["target_options"] = _target_options(rng, tmp)
        applied.append(f"load={_short(load_kw)}")
        loaded = byoc.load(written if rng.random() < 0.8 else _odd_path(rng, tmp), **load_kw)
        back = loaded.run(feeds)
        if not load_kw.get("target_options") and not _same(out, back):
            raise AssertionError("a loaded bundle's outputs differ from the compiled model's")
    return applied


def _default_passes() -> list[str]:
    from byoc.passes import DEFAULT_PASSES

    return list(DEFAULT_PASSES)


def _short(v: Any) -> str:
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001
        text = type(v).__name__
    return text[:60]


# -- caches -----------------------------------------------------------------------------------


def _plant_json(rng: random.Random, path: Path, clean: Any) -> str:
    """Overwrite ``path`` with damaged or hostile JSON; returns what was done."""
    from byoc.partition.placement import machine_fingerprint

    choice = rng.choice(["random", "truncate", "oversized", "nested", "wrong_type", "planted", "planted",
                         "nan", "empty", "huge_table"])
    text = json.dumps(clean) if clean is not None else "{}"
    if choice == "random":
        data = os.urandom(rng.randrange(1, 4096))
    elif choice == "truncate":
        data = text.encode()[: rng.randrange(len(text) + 1)]
    elif choice == "oversized":
        with open(path, "wb") as f:  # sparse: past every reader's size limit, costs no disk
            f.truncate(rng.choice([(1 << 20) + 1, 10_000_001, 1 << 30]))
        return "oversized"
    elif choice == "nested":
        depth = rng.choice([1000, 100_000])
        data = ("[" * depth + "]" * depth if rng.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth).encode()
    elif choice == "wrong_type":
        data = json.dumps(rng.choice([[1, 2], "s", 5, None, {"k": "x"}, {machine_fingerprint(): "x"},
                                      {machine_fingerprint(): [1]}, {machine_fingerprint(): {"a": 1}},
                                      {machine_fingerprint(): [True, True]}])).encode()
    elif choice == "nan":
        data = json.dumps({machine_fingerprint(): [float("nan"), float("inf")],
                           **({k: float("nan") for k in clean} if isinstance(clean, dict) else {})},
                          allow_nan=True).encode()
    elif choice == "empty":
        data = b""
    elif choice == "huge_table":
        data = json.dumps({f"k{i}": 1.0 for i in range(60_000)}).encode()
    else:  # figures under the right keys: extreme, negative, zero, swapped
        table = dict(clean) if isinstance(clean, dict) else {}
        table[machine_fingerprint()] = rng.choice([[1e-30, 1e30], [1e30, 1e-30], [-1, -1], [0, 0], [1e308, 1e308],
                                                   [5e-324, 5e-324]])
        for k in list(table):
            if k != machine_fingerprint():
                table[k] = rng.choice([1e-12, 1e12, -1.0, 0.0, 1e308, 5e-324, 2**70])
        data = json.dumps(table).encode()
    path.write_bytes(data)
    return choice


def _damage_file(rng: random.Random, path: Path, outside: Path, fifos: list[Path]) -> str:
    """Damage one cache file (or plant one where byoc would read it)."""
    try:
        # (a file an earlier mutation made oversized is not read: the harness's memory is the case's)
        clean = (json.loads(path.read_bytes()) if path.suffix == ".json" and path.is_file()
                 and path.stat().st_size <= 1 << 20 else None)
    except (OSError, ValueError, RecursionError):  # damaged by an earlier mutation of the case
        clean = None
    choice = rng.choice(["content", "content", "content", "symlink_out", "dangling", "fifo", "dir", "unreadable",
                         "empty", "truncate"])
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        path.unlink()
    if choice == "content":
        if path.suffix == ".json":
            return _plant_json(rng, path, clean)
        path.write_bytes(rng.choice([os.urandom(rng.randrange(1, 512)), b"raise SystemExit('planted')\n",
                                     b"import os\nos._exit(3)\n", b"\x00" * 64]))
        return "garbage"
    if choice == "symlink_out":
        target = outside / f"target-{rng.randrange(1 << 30)}"
        if path.suffix == ".json":
            from byoc.partition.placement import machine_fingerprint

            target.write_text(json.dumps({machine_fingerprint(): [1e-30, 1e30]}))
        elif rng.random() < 0.1:
            with open(target, "wb") as f:  # sparse: a large file outside the folder, costs no disk
                f.truncate(300 << 20)
        else:
            target.write_bytes(b"x = 1\n")
        os.symlink(target, path)
        return "symlink_out"
    if choice == "dangling":
        os.symlink(outside / "nowhere" / "x", path)
        return "dangling"
    if choice == "fifo":
        os.mkfifo(path, 0o600)
        fifos.append(path)
        return "fifo"
    if choice == "dir":
        path.mkdir()
        (path / "inner").write_bytes(b"{}")
        return "dir"
    if choice == "unreadable":
        path.write_bytes(b"{}")
        os.chmod(path, 0)
        return "unreadable"
    if choice == "empty":
        path.write_bytes(b"")
        return "empty"
    path.write_bytes(json.dumps(clean).encode()[:3] if clean is not None else b"by")
    return "truncate"


def _damage_folder(rng: random.Random, folder: Path, outside: Path) -> str:
    choice = rng.choice(["open_mode", "symlink", "file", "dangling", "missing", "unreadable"])
    if choice == "open_mode":
        os.chmod(folder, 0o777)
        return "folder:open_mode"
    if choice == "unreadable":
        os.chmod(folder, 0o300)
        return "folder:unreadable"
    _rmtree(folder)
    if choice == "symlink":
        real = outside / f"real-{rng.randrange(1 << 30)}"
        real.mkdir(mode=0o700)
        os.symlink(real, folder)
    elif choice == "file":
        folder.write_bytes(b"{}")
    elif choice == "dangling":
        os.symlink(outside / "nowhere", folder)
    return f"folder:{choice}"


class _FifoGuard:
    """After ``after`` seconds, keep opening the case's FIFOs for writing and closing them, so that
    a reader blocked on one gets end-of-file (the case then ends, over the time limit)."""

    def __init__(self, fifos: list[Path], after: float):
        self.fifos, self.after = fifos, after
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="byoc-fuzz-fifo-guard", daemon=True)

    def _run(self) -> None:
        if self.stop.wait(self.after):
            return
        while not self.stop.is_set():
            for p in self.fifos:
                with contextlib.suppress(OSError):
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            self.stop.wait(0.05)

    def __enter__(self) -> "_FifoGuard":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


@contextlib.contextmanager
def _fresh_memos() -> Iterator[None]:
    """Empty byoc's in-process memos of its cache files for the block (restored after it): the
    host's measured throughput and byoc-cpu's imported generated modules and loops."""
    from byoc.partition import placement

    saved_host = placement._HOST
    cpu_saved = None
    if HAVE_CPU:
        from byoc_cpu import loops as cpu_loops
        from byoc_cpu import runtime as cpu_runtime

        cpu_saved = (cpu_runtime._modules, cpu_loops._loops)
    try:
        placement._HOST = None
        if cpu_saved is not None:
            cpu_runtime._modules, cpu_loops._loops = {}, {}
        yield
    finally:
        placement._HOST = saved_host
        if cpu_saved is not None:
            cpu_runtime._modules, cpu_loops._loops = cpu_saved


def _compile_run(model: bytes, folder: Path, targets: list[str], placement: str, budget, feeds: dict):
    with _environ(BYOC_CACHE_DIR=str(folder / "byoc"), BYOC_CPU_CACHE=str(folder / "cpu")), _fresh_memos():
        cm = byoc.compile(model, targets=targets, placement=placement, budget=budget, wait=True,
                          measure_budget_s=0.3 if placement == "measure" else None)
        return cm.run(feeds), cm.placement()


def caches_case(rng: random.Random, budget) -> list[str]:
    """A clean compile and run, then the same with damaged cache files; returns the mutation names."""
    from byoc_fuzz import TIME_LIMIT

    name = rng.choice(["conv_net", "elementwise", "shapes", "batch"])
    mode = rng.choice(["cost", "measure", "cpu"] if HAVE_CPU else ["cost", "measure"])
    targets = ["cpu"] if HAVE_CPU and (mode == "cpu" or rng.random() < 0.9) else []
    placement = {"cpu": "priority"}.get(mode, mode)
    applied = _applied(rng, f"seed:{name}", f"mode:{mode}", f"targets:{','.join(targets) or 'host'}")
    model = _seed_bytes(name)
    tmp = _private_tmp("byoc-fuzz-caches-")
    try:
        outside = tmp / "outside"
        outside.mkdir(mode=0o700)
        clean_dir, hostile_dir = tmp / "clean", tmp / "hostile"
        clean_dir.mkdir(mode=0o700)
        feeds = None
        # the clean run fills the folder (and gives the feeds' shapes)
        with _environ(BYOC_CACHE_DIR=str(clean_dir / "byoc"), BYOC_CPU_CACHE=str(clean_dir / "cpu")), _fresh_memos():
            cm = byoc.compile(model, targets=targets, placement=placement, budget=budget, wait=True,
                              measure_budget_s=0.3 if placement == "measure" else None)
            feeds = _valid_feeds(cm, rng)
            ref, ref_placement = cm.run(feeds), cm.placement()
        shutil.copytree(clean_dir, hostile_dir, symlinks=True)
        candidates = [hostile_dir / "byoc" / "host-throughput.json", hostile_dir / "byoc" / "placement-measure.json"]
        cpu = hostile_dir / "cpu"
        if cpu.is_dir():
            candidates += sorted(p for p in cpu.iterdir() if p.is_file())
            candidates += [cpu / "__pycache__"]
        fifos: list[Path] = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            if rng.random() < 0.15:
                folder = rng.choice([hostile_dir / "byoc", cpu])
                if os.path.isdir(folder) and not os.path.islink(folder):
                    applied.append(f"{folder.name}/{_damage_folder(rng, folder, outside)}")
                continue
            path = rng.choice(candidates)
            if not os.path.isdir(path.parent) or os.path.islink(path.parent):
                continue
            if path.is_dir() and not path.is_symlink():
                _rmtree(path)
            applied.append(f"{path.parent.name}/{path.name[:24]}:{_damage_file(rng, path, outside, fifos)}")
        with _FifoGuard(fifos, TIME_LIMIT):
            out, out_placement = _compile_run(model, hostile_dir, targets, placement, budget, feeds)
        if out_placement == ref_placement:
            if not _same(out, ref):
                raise AssertionError("with damaged caches the same placement gave other outputs")
        elif not _close(out, ref, rtol=1e-4, atol=1e-4):
            raise AssertionError("damaged caches moved nodes and changed the outputs past the tolerance")
        return applied
    finally:
        _rmtree(tmp)


__all__ = ["HAVE_CPU", "caches_case", "feeds_case", "options_case"]
