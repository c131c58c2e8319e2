"""Numba's cache (whose index files are pickles) is read only from a private folder, and a damaged
entry is compiled again: each case runs byoc in a fresh process, as a user would."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="folder ownership is a POSIX notion")

# an audit hook reports any unpickling of os.system; the planted pickles below call it
RUN = textwrap.dedent("""
    import sys
    def hook(event, args):
        if event == "pickle.find_class" and args[1] == "system":
            sys.stderr.write("UNPICKLED-SYSTEM\\n")
    sys.addaudithook(hook)
    import numpy as np, byoc
    x = np.linspace(-1, 1, 2 * 3 * 6 * 6, dtype=np.float32).reshape(2, 3, 6, 6)
    y = byoc.compile(sys.argv[1], targets=[], host="reference").run({"x": x})["y"]
    print("SUM", float(y.sum()))
""")


class Planted:
    """Unpickling it runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    # Erf: a reference kernel that is a (cached) Numba loop
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Erf", ["c"], ["y"], name="erf")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6, 6])], [w])
    path = tmp_path_factory.mktemp("numba-cache") / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def run(model: Path, cache: Path, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BYOC_", "NUMBA_"))}
    env.update(NUMBA_CACHE_DIR=str(cache), BYOC_CACHE_DIR=str(home), BYOC_PLUGINS="")
    done = subprocess.run([sys.executable, "-c", RUN, str(model)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done


def index_files(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.nbi"))


def test_a_folder_others_can_write_is_never_read(model, tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o700)
    first = run(model, cache, tmp_path / "home")
    assert index_files(cache), "the private folder was not used"
    marker = tmp_path / "ran"
    for index in index_files(cache):  # what another user could plant, once the folder is theirs to write
        index.write_bytes(pickle.dumps(Planted(marker)))
    cache.chmod(0o777)
    done = run(model, cache, tmp_path / "home")
    assert not marker.exists() and "UNPICKLED-SYSTEM" not in done.stderr
    assert done.stderr.count("Numba cache folder") == 1 and "writable by group or others" in done.stderr
    assert done.stdout.split("SUM")[1] == first.stdout.split("SUM")[1]


@pytest.mark.parametrize("damage", ["garbled", "truncated", "empty"])
def test_a_damaged_entry_is_compiled_again(model, tmp_path, damage):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    first = run(model, cache, tmp_path / "home")
    originals = {p: p.read_bytes() for p in index_files(cache)}
    assert originals
    rng = np.random.default_rng(1)
    for p, data in originals.items():
        p.write_bytes({"garbled": rng.bytes(len(data)), "truncated": data[: len(data) // 2], "empty": b""}[damage])
    done = run(model, cache, tmp_path / "home")
    assert done.stdout.split("SUM")[1] == first.stdout.split("SUM")[1]
    assert "Unpickling" not in done.stderr and "Traceback" not in done.stderr
    assert all(pickle.loads(p.read_bytes()) is not None for p in index_files(cache))  # replaced by good ones


def test_without_numba_cache_dir_the_default_place_is_used_only_where_trusted(tmp_path, monkeypatch):
    from numba.core import config

    from byoc import numba_cache

    monkeypatch.setattr(config, "CACHE_DIR", "")
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "home"))
    mine = tmp_path / "pkg"
    mine.mkdir(mode=0o755)
    assert numba_cache.secure([mine, tmp_path / "not-yet"]) is None and config.CACHE_DIR == ""
    shared = tmp_path / "shared-pkg"
    shared.mkdir()
    shared.chmod(0o777)
    folder = numba_cache.secure([mine, shared])
    assert folder == tmp_path / "home" / "numba" and config.CACHE_DIR == str(folder)
    assert folder.stat().st_mode & 0o777 == 0o700


def test_byoc_as_installed_here_follows_the_policy(tmp_path):
    from byoc import numba_cache

    env = {k: v for k, v in os.environ.items() if not k.startswith(("BYOC_", "NUMBA_"))}
    env["BYOC_CACHE_DIR"] = str(tmp_path / "home")
    done = subprocess.run([sys.executable, "-c", "import byoc; from numba.core import config; print(config.CACHE_DIR)"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trusted = all(numba_cache._trusted(f) for f in numba_cache._package_folders())
    assert done.stdout.strip() == ("" if trusted else str(tmp_path / "home" / "numba"))
