"""byoc.ray on a local Ray cluster (2 CPUs): bit-identical to local runs, every row once when an
actor is killed mid-run, the command line. Run by ``tox -e ray``; skipped where Ray is absent."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import byoc  # noqa: E402
import byoc.ray  # noqa: E402
from byoc.frontend import bounded  # noqa: E402
from byoc.testing.zoo import load_zoo  # noqa: E402

ROWS = 256
INPUT = "data_0"  # SqueezeNet's input, [1, 3, 224, 224]


def _descendants() -> set[int]:
    """Live (not zombie) processes below this one, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.fixture(scope="module")
def cluster():
    before = _descendants() if os.path.isdir("/proc") else None
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()
        if before is not None:  # nothing Ray started is left behind (raylet, GCS, workers); byoc's
            # own helper for onnx's checker and shape inference lives as long as this process
            deadline = time.monotonic() + 30
            while (left := _descendants() - before - {bounded.helper_pid()}) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not left, f"processes left after ray.shutdown(): {sorted(left)}"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """SqueezeNet with seeded random weights, compiled for the CPU plugin where installed."""
    model = load_zoo("squeezenet", seed=0)
    targets = ["cpu"] if any(t.name == "cpu" for t in byoc.list_targets()) else []
    path = tmp_path_factory.mktemp("bundle") / "squeezenet.byoc"
    byoc.compile(model, targets=targets).save(path)
    return path


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(1)
    return rng.standard_normal((ROWS, 1, 3, 224, 224), dtype=np.float32)


@pytest.fixture(scope="module")
def local(bundle, rows):
    """The same rows run one by one through the bundle in this process."""
    model = byoc.load(bundle)
    return np.stack([model.run({INPUT: row})["softmaxout_1"] for row in rows])


def _dataset(rows):
    return ray.data.from_items([{"row": i, INPUT: rows[i]} for i in range(len(rows))])


def _by_row(ds) -> tuple[np.ndarray, np.ndarray]:
    ids, outs = [], []
    for batch in ds.iter_batches(batch_size=64, batch_format="numpy"):
        ids.append(batch["row"])
        outs.append(batch["softmaxout_1"])
    ids, outs = np.concatenate(ids), np.concatenate(outs)
    order = np.argsort(ids, kind="stable")
    return ids[order], outs[order]


def _cache_dir():
    # the tox environment's warm Numba cache (a local folder); the default is a node-local temp folder
    return os.environ.get("NUMBA_CACHE_DIR")


def test_predict_equals_local_bit_for_bit(cluster, bundle, rows, local):
    out = byoc.ray.predict(_dataset(rows), bundle, batch_size=16, concurrency=2, numba_cache_dir=_cache_dir())
    ids, got = _by_row(out)
    assert ids.tolist() == list(range(ROWS))
    assert got.shape == local.shape and got.dtype == local.dtype
    assert got.tobytes() == local.tobytes()
    assert set(out.columns()) == {"row", "softmaxout_1"}  # the input column is dropped, ids kept


def test_actor_killed_mid_run_every_row_once(cluster, bundle, rows, local, tmp_path):
    marker = str(tmp_path / "killed")

    class DyingPredictor(byoc.ray.BundlePredictor):
        """Kills its own process (SIGKILL, no clean-up) on its third batch, once per test."""

        def __call__(self, batch):
            self.batches = getattr(self, "batches", 0) + 1
            if self.batches == 3:
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.write(fd, f"{os.getpid()} {self.rows}".encode())
                    os.close(fd)
                    os.kill(os.getpid(), signal.SIGKILL)
            out = super().__call__(batch)
            out["threads"] = np.full(len(out["row"]), self.threads)  # byoc's pool in this actor
            return out

    out = byoc.ray.predict(_dataset(rows), bundle, batch_size=8, concurrency=2, numba_cache_dir=_cache_dir(),
                           predictor=DyingPredictor).materialize()
    threads = {int(t) for b in out.iter_batches(batch_size=None, batch_format="numpy") for t in b["threads"]}
    assert threads == {1}  # one CPU per actor: one byoc thread, however many cores the node has
    ids, got = _by_row(out)
    assert os.path.exists(marker), "no actor was killed"
    pid, done = map(int, open(marker).read().split())
    assert 0 < done < ROWS  # killed mid-run, after it had finished batches of its own
    assert ids.tolist() == list(range(ROWS))  # every row exactly once
    assert got.tobytes() == local.tobytes()


def test_resources_follow_the_bundle(bundle):
    request = byoc.ray.bundle_resources(bundle, num_cpus=2)
    assert request == {"num_cpus": 2}  # CPU targets and the host need no resource of their own
    # GPU and DPU kinds: core/tests/test_ray_optional.py


def test_tampered_bundle_refused_on_the_driver(cluster, bundle, rows, tmp_path):
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(byoc.BundleError):
        byoc.ray.predict(_dataset(rows[:2]), bytes(data))


def test_cli_npy_folder_and_parquet(cluster, bundle, rows, local, tmp_path, capsys):
    from byoc.cli import main

    src = tmp_path / "in"
    src.mkdir()
    np.save(src / f"{INPUT}.npy", rows[:4])  # rows along the first axis
    out = tmp_path / "out-npy"
    assert main(["run", str(bundle), "--ray", "-i", str(src), "-o", str(out), "--npy", "--batch-size", "2"]) == 0
    for i in range(4):  # the same file names as a local `byoc run -o DIR`
        got = np.load(out / str(i) / "softmaxout_1.npy", allow_pickle=False)
        assert got.tobytes() == local[i].tobytes()

    parquet = tmp_path / "in.parquet"
    _dataset(rows[:4]).repartition(1).write_parquet(str(parquet))
    out = tmp_path / "out-parquet"
    assert main(["run", str(bundle), "--ray", "-i", str(parquet), "-o", str(out)]) == 0
    assert "4 rows" in capsys.readouterr().out
    ids, got = _by_row(ray.data.read_parquet(str(out)))
    assert ids.tolist() == [0, 1, 2, 3]
    assert got.tobytes() == local[:4].tobytes()


def test_cli_bad_input_is_a_byoc_error(cluster, bundle, tmp_path, capsys):
    from byoc.cli import main

    assert main(["run", str(bundle), "--ray", "-i", str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    assert "InputError" in capsys.readouterr().err


def test_bad_options_are_option_errors(bundle):
    with pytest.raises(byoc.OptionError, match="batch_size"):
        byoc.ray.predict(None, bundle, batch_size=0)
    with pytest.raises(byoc.OptionError, match="num_cpus"):
        byoc.ray.predict(None, bundle, num_cpus=0)
    with pytest.raises(byoc.OptionError, match="concurrency"):
        byoc.ray.predict(None, bundle, concurrency=(3, 2))
    with pytest.raises(byoc.OptionError, match="predictor"):
        byoc.ray.predict(None, bundle, predictor=dict)
    with pytest.raises(byoc.OptionError, match="outputs"):
        byoc.ray.predict(None, bundle, outputs=3)
    with pytest.raises(byoc.OptionError, match="num_gpus"):
        byoc.ray.predict(None, bundle, ray_remote_args={"num_gpus": 1})
    with pytest.raises(byoc.BundleError, match="cannot read"):
        byoc.ray.predict(None, bundle.parent / "missing.byoc")
