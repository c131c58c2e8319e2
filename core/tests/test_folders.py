"""The one folder policy (byoc.contract.folders) and the core's cache readers that follow it: a
folder others can write, a link, a FIFO, a huge or deeply nested file is never trusted, and
never hangs or raises."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from byoc.contract import folders
from byoc.partition import measure, placement


def _unsafe(kind: str, tmp_path: Path) -> Path:
    """A folder that must not be trusted, of the given kind."""
    if kind == "world-writable":
        folder = tmp_path / "shared"
        folder.mkdir()
        folder.chmod(0o777)
    elif kind == "group-writable":
        folder = tmp_path / "group"
        folder.mkdir()
        folder.chmod(0o770)
    elif kind == "symlink":
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        folder = tmp_path / "link"
        folder.symlink_to(real)
    else:  # a file where a folder should be
        folder = tmp_path / "file"
        folder.write_text("x")
    return folder


KINDS = ["world-writable", "group-writable", "symlink", "file"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_unsafe_folder_is_refused_and_replaced(tmp_path, kind):
    folder = _unsafe(kind, tmp_path)
    assert not folders.is_private(folder)
    with pytest.raises(PermissionError):
        folders.check_private(folder)
    with pytest.warns(UserWarning, match="cannot be used"):
        used = folders.private_folder(folder, f"test-{kind}")
    assert used != folder and folders.is_private(used)
    assert folders.private_folder(folder, f"test-{kind}") == used  # once per process: no second warning


def test_a_private_folder_is_made_and_used(tmp_path):
    folder = tmp_path / "a" / "b"
    assert folders.private_folder(folder, "test-made") == folder
    assert folders.is_private(folder) and (folder.stat().st_mode & 0o777) == 0o700


def test_read_regular_refuses_links_fifos_and_oversized_files(tmp_path):
    (tmp_path / "f").write_bytes(b"12345")
    assert folders.read_regular(tmp_path / "f", 5) == b"12345"
    assert folders.read_regular(tmp_path / "f", 4) is None
    (tmp_path / "l").symlink_to(tmp_path / "f")
    assert folders.read_regular(tmp_path / "l", 100) is None
    os.mkfifo(tmp_path / "p")
    done = []
    t = threading.Thread(target=lambda: done.append(folders.read_regular(tmp_path / "p", 100)), daemon=True)
    t.start()
    t.join(5)
    assert done == [None], "reading a FIFO must not block"
    assert folders.read_regular(tmp_path / "missing", 100) is None


def test_atomic_write_never_follows_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "cache.json"
    for pid in (os.getpid(), 1, 12345):  # names an attacker might guess
        (tmp_path / f"cache.{pid}.tmp").symlink_to(victim)
    folders.atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and victim.read_text() == "keep"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cache.json.")]


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "byoc-cache"
    monkeypatch.setenv("BYOC_CACHE_DIR", str(root))
    monkeypatch.setattr(placement, "_HOST", None)
    monkeypatch.setattr(placement, "_measure_host", lambda: (1.0e9, 2.0e9))
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_placement_figures_planted_in_an_unsafe_folder_are_ignored(cache_root, monkeypatch, tmp_path, kind):
    folder = _unsafe(kind, tmp_path)
    if folder.is_dir():
        (folder / "host-throughput.json").write_text(json.dumps({placement.machine_fingerprint(): [7.0, 7.0]}))
    monkeypatch.setenv("BYOC_CACHE_DIR", str(folder))
    assert placement.host_throughput() == (1.0e9, 2.0e9)  # measured, not the planted figures
    assert measure._read_table(folder / "placement-measure.json") == {}


@pytest.mark.parametrize("content", ["fifo", "deep", "huge", "garbage", "symlink"])
def test_hostile_cache_files_read_as_empty(cache_root, content):
    cache_root.mkdir(mode=0o700)
    path = cache_root / "host-throughput.json"
    if content == "fifo":
        os.mkfifo(path)
    elif content == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif content == "huge":
        path.write_bytes(b" " * (2 << 20))
    elif content == "symlink":
        (cache_root / "elsewhere.json").write_text(json.dumps({placement.machine_fingerprint(): [7.0, 7.0]}))
        path.symlink_to(cache_root / "elsewhere.json")
    else:
        path.write_bytes(os.urandom(256))
    assert placement.host_throughput() == (1.0e9, 2.0e9)
    measure_path = cache_root / "placement-measure.json"
    os.replace(path, measure_path) if content != "fifo" else os.mkfifo(measure_path)
    assert measure._read_table(measure_path) == {}


@pytest.mark.parametrize("figures", [[5e-324, 5e-324], [1e308, 1e308], [0.5, 1e9], [1e9, 1e30]])
def test_cached_throughput_no_machine_has_is_measured_again(cache_root, figures):
    """A figure that would price every node at 0 or inf seconds (and leave placement="measure" no
    device for a sub-region) is a miss."""
    cache_root.mkdir(mode=0o700)
    (cache_root / "host-throughput.json").write_text(json.dumps({placement.machine_fingerprint(): figures}))
    assert placement.host_throughput() == (1.0e9, 2.0e9)


def test_figures_are_written_privately_and_read_back(cache_root):
    assert placement.host_throughput() == (1.0e9, 2.0e9)
    assert folders.is_private(cache_root)
    table = json.loads((cache_root / "host-throughput.json").read_text())
    assert table[placement.machine_fingerprint()] == [1.0e9, 2.0e9]
