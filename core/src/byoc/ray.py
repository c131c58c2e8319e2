"""Batch inference of compiled bundles on Ray Data (``pip install "byoc-core[ray]"``).

byoc does not schedule work over machines itself; Ray Data does, and this module plugs a
compiled bundle into it::

    import ray, byoc.ray
    ray.init(num_cpus=2)                                   # or ray.init(address="auto") on a cluster
    out = byoc.ray.predict(ray.data.read_parquet("in/"), "model.byoc", concurrency=2)
    out.write_parquet("out/")

What happens:

* The driver reads the bundle once, verifies it (manifest, SHA-256 of every member) and puts its
  bytes into Ray's object store. Each actor of the pool fetches those bytes (no path that only
  the driver sees), loads them with :func:`byoc.load` (the bundle is untrusted input there too)
  and keeps the :class:`byoc.CompiledModel` for every batch it is given.
* Each row of the dataset is one run of the model: the row's value in an input's column is that
  input (reshaped to the input's static shape when the sizes agree, so a row may drop a leading
  batch dimension of 1). Outputs are added as columns, one array per row, exactly the arrays
  ``CompiledModel.run`` returns, so a row gives the same bytes as running it locally, on any
  actor, however often Ray retries it.
* Resources follow the bundle (:func:`bundle_resources`): an actor asks for ``num_cpus`` CPUs,
  one GPU (``num_gpus=1``) when a region runs on a ``"gpu"`` target, and one unit of a custom
  resource named after the device kind of any other accelerator target (``{"dpu": 1}``: start
  the nodes that have one with ``ray start --resources='{"dpu": 1}'``). ``resources=`` overrides
  any of it (``{"num_gpus": 0}`` for a GPU target's CPU emulation).
* the CPU engine in each actor uses as many threads as the CPUs the actor asked for
  (``BYOC_NUM_THREADS``), so actors sharing a node do not oversubscribe it, and Numba's cache
  (``NUMBA_CACHE_DIR``) is a folder local to each node.
* Each actor logs (logger ``byoc.ray``, forwarded to the driver by Ray) how long fetching and
  loading the bundle took and how long its first batch took, which includes compiling or
  loading the Numba kernels; the same figures are Ray metrics (``byoc_ray_load_seconds``,
  ``byoc_ray_first_batch_seconds``) when Ray's metrics agent runs.

If an actor dies (node lost, OOM kill), Ray restarts it and retries its batches: the output
still has every input row exactly once.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from byoc.contract import environment as _env
from byoc.errors import BundleError, InputError, OptionError

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

    from byoc.runtime.compiled import CompiledModel

__all__ = ["BundlePredictor", "bundle_resources", "predict", "default_numba_cache_dir"]

log = logging.getLogger("byoc.ray")

#: device kinds that need no resource of their own: they run on the actor's CPUs
CPU_DEVICES = frozenset({"cpu", "host"})


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401 - the Dataset API
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise OptionError(f"byoc.ray needs Ray Data: pip install \"byoc-core[ray]\" ({exc})") from None
    return ray


def default_numba_cache_dir() -> str:
    """The Numba cache folder workers use by default: ``byoc-numba-cache-<uid>`` under the
    temporary folder, a path that is local to every node (never a shared file system by default).
    A worker uses it only where it is private (see :mod:`byoc.numba_cache`)."""
    return os.path.join(tempfile.gettempdir(), f"byoc-numba-cache-{os.getuid() if hasattr(os, 'getuid') else 0}")


# ---------------------------------------------------------------------------------------------
# the bundle on the driver


def _bundle_bytes(bundle: "str | os.PathLike | bytes") -> tuple[bytes, str]:
    from byoc.budget import DEFAULT_BUDGET

    if isinstance(bundle, (bytes, bytearray, memoryview)):
        return bytes(bundle), "<bundle bytes>"
    path = Path(os.fspath(bundle))
    try:
        size = path.stat().st_size
        if size > DEFAULT_BUDGET.max_total_bytes:
            raise BundleError(f"{path}: the bundle ({size} bytes) is over max_total_bytes")
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the bundle: {exc}") from None


def _bundle_meta(data: bytes, origin: str) -> tuple[dict[str, str], list[str]]:
    """(target name -> device kind for every target a region uses, output names), read and
    verified (manifest, SHA-256 of every member) the way :func:`byoc.load` reads a bundle."""
    from byoc.budget import DEFAULT_BUDGET
    from byoc.bundle.format import COMPILED, HOST_GRAPH
    from byoc.bundle.reader import Reader, parse_json, parse_onnx

    with tempfile.TemporaryDirectory(prefix="byoc-ray-") as tmp:
        path = Path(tmp) / "bundle.byoc"
        path.write_bytes(data)
        reader = Reader(path, DEFAULT_BUDGET)
        reader.origin = origin
        reader.read()
    for member in (COMPILED, HOST_GRAPH):
        if member not in reader.members:
            raise BundleError(f"{origin}: member {member!r} is missing")
    info = parse_json(reader.members[COMPILED], COMPILED, origin)
    kinds = {t.get("name"): t.get("device") for t in info.get("targets") or [] if isinstance(t, dict)}
    used: dict[str, str] = {}
    for region in info.get("regions") or []:
        target = region.get("target") if isinstance(region, dict) else None
        if not isinstance(target, str):
            raise BundleError(f"{origin}: member {COMPILED!r}: a region without a target")
        device = kinds.get(target)
        used[target] = device if isinstance(device, str) and device else "accelerator"
    host = parse_onnx(reader.members[HOST_GRAPH], HOST_GRAPH, origin, DEFAULT_BUDGET)
    return used, [v.name for v in host.graph.outputs]


def bundle_resources(bundle: "str | os.PathLike | bytes", *, num_cpus: float = 1) -> dict[str, float]:
    """The Ray resources one actor running ``bundle`` asks for.

    ``num_cpus`` CPUs always; ``num_gpus: 1`` when a region runs on a target whose device kind
    is ``"gpu"``; ``{kind: 1}`` for every other accelerator kind (``"dpu"``, ``"npu"``, ...), a
    Ray custom resource the nodes with that device declare (``ray start --resources``). CPU
    targets and the host need nothing more.

    :returns: e.g. ``{"num_cpus": 1, "num_gpus": 1}`` or ``{"num_cpus": 1, "dpu": 1}``.
    :raises BundleError: the bundle cannot be read or fails verification.
    """
    data, origin = _bundle_bytes(bundle)
    return _resources(_bundle_meta(data, origin)[0], num_cpus)


def _resources(devices: Mapping[str, str], num_cpus: float) -> dict[str, float]:
    out: dict[str, float] = {"num_cpus": num_cpus}
    for kind in sorted(set(devices.values())):
        if kind in CPU_DEVICES:
            continue
        out["num_gpus" if kind == "gpu" else kind] = 1
    return out


def _remote_args(request: Mapping[str, float]) -> dict[str, Any]:
    """``{"num_cpus": 2, "num_gpus": 1, "dpu": 1}`` -> map_batches keyword arguments."""
    args: dict[str, Any] = {}
    custom: dict[str, float] = {}
    for key, value in request.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise OptionError(f"byoc.ray: resource {key!r} must be a number >= 0, got {value!r}")
        if key in ("num_cpus", "num_gpus", "memory"):
            args[key] = value
        elif value:
            custom[key] = value
    if custom:
        args["resources"] = custom
    return args


# ---------------------------------------------------------------------------------------------
# the actor


def _run_rows(model: "CompiledModel", rows: Iterable[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """One ``CompiledModel.run`` per row (the same call, hence the same bytes, as a local run)."""
    for feeds in rows:
        yield model.run(feeds)


def _metric(name: str, description: str):
    try:
        from ray.util.metrics import Gauge

        return Gauge(name, description=description)
    except Exception:  # metrics are optional: no agent, or an older Ray
        return None


def _worker_logging() -> None:
    # worker processes start with Python's defaults (WARNING): make byoc.ray's INFO lines visible
    if not log.handlers and log.level == logging.NOTSET:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class BundlePredictor:
    """The callable class of the actor pool: one loaded bundle per actor, one run per row.

    Built by :func:`predict`; subclass it (and pass ``predictor=``) to add pre- or
    post-processing around :meth:`__call__`.
    """

    def __init__(self, bundle: Any, inputs: Mapping[str, str], outputs: Mapping[str, str], *,
                 threads: int = 1, fallback: str | None = None, keep_inputs: bool = False):
        _worker_logging()
        import byoc
        from byoc.contract.environment import num_threads

        start = time.perf_counter()
        data = bundle
        if not isinstance(data, (bytes, bytearray, memoryview)):
            import ray

            data = ray.get(bundle)  # an ObjectRef: the bytes come from the object store
        self.fetch_seconds = time.perf_counter() - start
        self.bundle_bytes = len(data)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="byoc-ray-") as tmp:
            path = Path(tmp) / "bundle.byoc"
            path.write_bytes(data)
            self.model = byoc.load(path, fallback=fallback)
        self.load_seconds = time.perf_counter() - start
        self.threads = num_threads()
        if self.threads != threads:
            log.warning("pid %d: byoc runs %d thread(s), not the %d asked for (BYOC_NUM_THREADS=%r)",
                        os.getpid(), self.threads, threads, _env.get("BYOC_NUM_THREADS", None))
        self.inputs = dict(inputs) if inputs else {n: n for n in self.model.input_names}
        self.outputs = dict(outputs) if outputs else {n: n for n in self.model.output_names}
        unknown = [n for n in self.outputs if n not in self.model.output_names]
        if unknown:
            raise OptionError(f"byoc.ray: unknown output(s) {unknown}; the model's outputs are {self.model.output_names}")
        self.keep_inputs = keep_inputs
        self.specs = {s.name: s for s in self.model.inputs}
        self.first_batch_seconds: float | None = None
        self.rows = 0
        log.info("pid %d: bundle of %d bytes fetched in %.3f s, loaded in %.3f s; %d thread(s); NUMBA_CACHE_DIR=%s",
                 os.getpid(), self.bundle_bytes, self.fetch_seconds, self.load_seconds, self.threads,
                 os.environ.get("NUMBA_CACHE_DIR", "(numba default)"))
        gauge = _metric("byoc_ray_load_seconds", "seconds to fetch and load a byoc bundle in an actor")
        if gauge is not None:
            gauge.set(self.fetch_seconds + self.load_seconds)

    def _feed(self, name: str, value: Any) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype == object:  # a ragged or list-valued column
            arr = np.asarray(arr.tolist())
        spec = self.specs.get(name)
        shape = spec.shape if spec is not None else None
        if shape is not None and all(isinstance(d, int) for d in shape) and tuple(arr.shape) != tuple(shape):
            if arr.size == math.prod(shape):
                arr = arr.reshape(shape)
            else:
                raise InputError(f"byoc.ray: a row's input {name!r} has shape {list(arr.shape)} "
                                 f"({arr.size} values); the model expects {list(shape)}")
        return arr

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        missing = [col for col in self.inputs.values() if col not in batch]
        if missing:
            raise InputError(f"byoc.ray: column(s) {missing} missing from the dataset (columns: {sorted(batch)}); "
                             f"map model inputs to columns with inputs={{name: column}}")
        clash = [col for col in self.outputs.values() if col in batch and col not in self.inputs.values()]
        if clash:
            raise OptionError(f"byoc.ray: output column(s) {clash} already exist in the dataset; "
                              f"rename them with outputs={{name: column}}")
        n = len(batch[next(iter(self.inputs.values()))]) if self.inputs else len(next(iter(batch.values())))
        rows = ({name: self._feed(name, batch[col][i]) for name, col in self.inputs.items()}
                for i in range(n))
        results: dict[str, list[np.ndarray]] = {name: [] for name in self.outputs}
        for out in _run_rows(self.model, rows):
            for name in self.outputs:
                results[name].append(out[name])
        if not self.keep_inputs:
            batch = {k: v for k, v in batch.items() if k not in self.inputs.values()}
        else:
            batch = dict(batch)
        for name, column in self.outputs.items():
            batch[column] = _column(results[name])
        self.rows += n
        if self.first_batch_seconds is None:
            self.first_batch_seconds = time.perf_counter() - start
            log.info("pid %d: first batch of %d row(s) in %.3f s (Numba compile or cache load included)",
                     os.getpid(), n, self.first_batch_seconds)
            gauge = _metric("byoc_ray_first_batch_seconds", "seconds of an actor's first batch, JIT included")
            if gauge is not None:
                gauge.set(self.first_batch_seconds)
        return batch


def _column(arrays: Sequence[np.ndarray]) -> np.ndarray:
    if arrays and all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype for a in arrays):
        return np.stack(arrays)
    out = np.empty(len(arrays), dtype=object)  # outputs whose shape depends on the row
    for i, a in enumerate(arrays):
        out[i] = a
    return out


# ---------------------------------------------------------------------------------------------
# the public entry point


def _name_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):
        return {value: value}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise OptionError(f"byoc.ray: {what} must map names to column names (strings)")
        return dict(value)
    if isinstance(value, Iterable):
        names = list(value)
        if not all(isinstance(n, str) for n in names):
            raise OptionError(f"byoc.ray: {what} must be names (strings)")
        return {n: n for n in names}
    raise OptionError(f"byoc.ray: {what} must be a name, a list of names or a mapping, got {type(value).__name__}")


def _actor_pool(ray, concurrency: Any):
    """``n`` -> a fixed pool of n actors; ``(lo, hi)`` -> an autoscaling pool."""
    sizes = concurrency if isinstance(concurrency, tuple) else (concurrency,)
    if not 1 <= len(sizes) <= 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes) \
            or sizes[0] > sizes[-1]:
        raise OptionError(f"byoc.ray: concurrency must be an int >= 1 or a pair (min, max), got {concurrency!r}")
    if len(sizes) == 1:
        return ray.data.ActorPoolStrategy(size=sizes[0])
    return ray.data.ActorPoolStrategy(min_size=sizes[0], max_size=sizes[1])


def predict(
    dataset: "ray.data.Dataset",
    bundle: "str | os.PathLike | bytes",
    *,
    inputs: "Mapping[str, str] | Sequence[str] | None" = None,
    outputs: "Mapping[str, str] | Sequence[str] | None" = None,
    batch_size: int = 16,
    concurrency: "int | tuple[int, int]" = 1,
    num_cpus: float = 1,
    resources: Mapping[str, float] | None = None,
    numba_cache_dir: str | None = None,
    fallback: str | None = None,
    keep_inputs: bool = False,
    predictor: type = BundlePredictor,
    ray_remote_args: Mapping[str, Any] | None = None,
) -> "ray.data.Dataset":
    """Run a compiled bundle over a Ray Dataset; returns the Dataset with the outputs as columns.

    :param dataset: rows with one column per model input (one row = one run of the model).
    :param bundle: a bundle file (``byoc compile`` / :meth:`CompiledModel.save`) or its bytes.
    :param inputs: model input -> column (default: the columns named like the inputs).
    :param outputs: the outputs to add: names, or output -> column (default: every output,
        under its own name).
    :param batch_size: rows per batch handed to an actor.
    :param concurrency: actors in the pool, or ``(min, max)`` for an autoscaling pool.
    :param num_cpus: CPUs per actor, and byoc's thread count in it.
    :param resources: overrides of :func:`bundle_resources`' request, e.g. ``{"num_gpus": 0}``
        or ``{"dpu": 0, "fpga": 1}`` (``num_cpus``, ``num_gpus``, ``memory`` or custom names).
    :param numba_cache_dir: the workers' ``NUMBA_CACHE_DIR``, a path on each node (default:
        :func:`default_numba_cache_dir`).
    :param fallback: passed to :func:`byoc.load` in each actor (``"host"``: run regions whose
        plugin the worker lacks on the host).
    :param keep_inputs: keep the input columns in the result (default: dropped; other columns,
        such as row ids, are kept).
    :param predictor: :class:`BundlePredictor` or a subclass.
    :param ray_remote_args: more ``map_batches`` keywords for the actors (``accelerator_type``,
        ``label_selector``, ``scheduling_strategy``, ...); resources go in ``resources=``.
    :raises BundleError: the bundle cannot be read or fails verification (on the driver, before
        any actor starts).
    :raises OptionError: bad names, sizes or resources.
    """
    ray = _import_ray()
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise OptionError(f"byoc.ray: batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(num_cpus, (int, float)) or isinstance(num_cpus, bool) or num_cpus <= 0:
        raise OptionError(f"byoc.ray: num_cpus must be a number > 0, got {num_cpus!r}")
    if not (isinstance(predictor, type) and issubclass(predictor, BundlePredictor)):
        raise OptionError("byoc.ray: predictor must be BundlePredictor or a subclass of it")
    input_map = _name_map(inputs, "inputs")
    output_map = _name_map(outputs, "outputs")
    pool = _actor_pool(ray, concurrency)

    data, origin = _bundle_bytes(bundle)
    request = _resources(_bundle_meta(data, origin)[0], num_cpus)
    request.update(resources or {})
    remote = _remote_args(request)
    extra = dict(ray_remote_args or {})
    taken = sorted(set(extra) & {"num_cpus", "num_gpus", "memory", "resources", "runtime_env", "concurrency",
                                 "batch_size", "batch_format", "fn_constructor_kwargs"})
    if taken:
        raise OptionError(f"byoc.ray: ray_remote_args may not set {taken}: use resources= or predict's own arguments")
    threads = max(1, int(remote.get("num_cpus", num_cpus)))
    env = {
        "BYOC_NUM_THREADS": str(threads),
        "NUMBA_CACHE_DIR": numba_cache_dir or default_numba_cache_dir(),
    }
    start = time.perf_counter()
    ref = ray.put(data)
    log.info("%s: %d bytes into the object store in %.3f s; each actor asks for %s", origin, len(data),
             time.perf_counter() - start, request)
    return dataset.map_batches(
        predictor,
        fn_constructor_kwargs={
            "bundle": ref,
            "inputs": input_map,
            "outputs": output_map,
            "threads": threads,
            "fallback": fallback,
            "keep_inputs": keep_inputs,
        },
        batch_size=batch_size,
        batch_format="numpy",
        compute=pool,
        runtime_env={"env_vars": env},
        **remote,
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# `byoc run BUNDLE --ray --input DIR|FILE.parquet -o OUT`


def _uri(path: str, remote: bool) -> str:
    """A path for Ray's readers/writers: URIs as given; on a cluster a local path gets Ray's
    ``local://`` prefix, so the files are read and written on the driver's node, not a worker's."""
    if "://" in path or not remote:
        return path
    return "local://" + str(Path(path).resolve())


def _read_rows(ray, source: str, remote: bool) -> "ray.data.Dataset":
    """Parquet (a file or a folder of them, or a URI), or a folder of ``NAME.npy`` (one per model
    input, rows along the first axis; a ``row`` column numbers them)."""
    if "://" in source:
        return ray.data.read_parquet(source)
    path = Path(source)
    if path.is_file() and path.suffix.lower() == ".parquet" or path.is_dir() and any(path.glob("*.parquet")):
        return ray.data.read_parquet(_uri(source, remote))
    if path.is_dir():
        npys = sorted(path.glob("*.npy"))
        if npys:
            arrays = {}
            for f in npys:
                try:
                    arrays[f.stem] = np.load(f, allow_pickle=False)
                except ValueError as exc:
                    raise InputError(f"input {f.stem!r}: {f} is not a plain .npy array ({exc})") from None
            counts = {name: (len(a) if a.ndim else 0) for name, a in arrays.items()}
            if len(set(counts.values())) != 1 or 0 in counts.values():
                raise InputError(f"{path}: every NAME.npy must hold the same number (> 0) of rows along its "
                                 f"first axis; got {counts}")
            n = next(iter(counts.values()))
            return ray.data.from_items([{"row": i, **{k: a[i] for k, a in arrays.items()}} for i in range(n)])
    raise InputError(f"--input {source}: expected FILE.parquet, a folder of Parquet files, or a folder of "
                     f"NAME.npy files (one per model input, rows along the first axis)")


def _write_npy(ds, out: Path, output_names: Sequence[str]) -> int:
    from byoc.cliutil import safe_file_names  # the file names of a local `byoc run -o DIR`

    files = safe_file_names(output_names, taken=["outputs.json"])
    n = 0
    for batch in ds.iter_batches(batch_size=256, batch_format="numpy"):
        ids = batch.get("row")
        size = len(batch[output_names[0]])
        for i in range(size):
            row = int(ids[i]) if ids is not None else n + i
            folder = out / str(row)
            folder.mkdir(parents=True, exist_ok=True)
            for name in output_names:
                np.save(folder / files[name], np.asarray(batch[name][i]), allow_pickle=False)
        n += size
    return n


def run_cli(args) -> int:
    """``byoc run MODEL|BUNDLE --ray``: rows from ``--input``, outputs to ``-o`` (see cli.py)."""
    import byoc
    from byoc.bundle import is_bundle

    ray = _import_ray()
    sources = args.input or []
    if len(sources) != 1 or not args.output_dir:
        raise InputError("byoc run --ray needs one --input DIR|FILE.parquet and -o OUT")
    if args.concurrency < 1 or args.batch_size < 1:
        raise OptionError("--concurrency and --batch-size must be >= 1")
    source, out, remote = sources[0], args.output_dir, bool(args.address)
    with tempfile.TemporaryDirectory(prefix="byoc-ray-") as tmp:
        if is_bundle(args.model):
            if args.target is not None:
                raise InputError(f"{args.model} is a bundle: its targets were fixed when it was compiled; drop --target")
            bundle = Path(args.model)
        else:
            bundle = byoc.compile(args.model, targets=args.target).save(Path(tmp) / "model.byoc")
        started = not ray.is_initialized()
        if started:
            if args.address:
                ray.init(address=args.address)
            else:
                ray.init(include_dashboard=False)
        options, kept_order = None, False
        try:
            options = ray.data.DataContext.get_current().execution_options
            kept_order, options.preserve_order = options.preserve_order, True  # rows in input order
            ds = _read_rows(ray, source, remote)
            # a local cluster runs on this node: its workers may share this process's Numba cache
            cache = os.environ.get("NUMBA_CACHE_DIR") if not args.address else None
            result = predict(ds, bundle, batch_size=args.batch_size, concurrency=args.concurrency,
                             numba_cache_dir=cache, fallback="host" if args.host_fallback else None)
            if args.npy:  # written here, by the driver
                names = _bundle_meta(*_bundle_bytes(bundle))[1]
                n = _write_npy(result, Path(out), names)
                print(f"{n} rows: {out}/<row>/<output>.npy ({', '.join(names)})")
            else:
                result.write_parquet(_uri(out, remote))
                written = ray.data.read_parquet(_uri(out, remote))  # Parquet metadata only
                print(f"{written.count()} rows: {out}/ (Parquet; columns {', '.join(written.columns())})")
        finally:
            if options is not None:
                options.preserve_order = kept_order
            if started:
                ray.shutdown()
    return 0
