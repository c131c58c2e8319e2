"""Acceptance 4 of issue 18: no code path reads a pickle (Numba's index files) from a folder a bundle
can name, and byoc-cpu caches only in a folder this user owns, nobody else can write and byoc-cpu made."""

from __future__ import annotations

import json
import os
import pickle
import sys
import zipfile

import numpy as np
import pytest

import byoc

byoc_cpu_runtime = pytest.importorskip("byoc_cpu.runtime")

from test_target_options import conv_model  # noqa: E402

_opened: list[str] = []
_watch: list[str] = []


def _audit(event, args):
    if event == "open" and _watch and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if any(path.startswith(w) for w in _watch):
            _opened.append(path)


sys.addaudithook(_audit)


class _Boom:
    """Unpickling this creates ``path`` (proof that the pickle was executed)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*"))


def rewrite_options(path, edit):
    """Change compiled.json's target_options and recompute the manifest hashes, as an attacker would."""
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    compiled = json.loads(members["compiled.json"])
    edit(compiled["options"]["target_options"] if "options" in compiled else compiled["target_options"])
    members["compiled.json"] = json.dumps(compiled).encode()
    manifest = json.loads(members["manifest.json"])
    import hashlib
    manifest["members"] = {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                           for n, d in members.items() if n != "manifest.json"}
    members["manifest.json"] = json.dumps(manifest).encode()
    path.unlink()
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)


@pytest.mark.parametrize("exists", [True, False])
def test_bundle_cache_dir_is_never_read_or_written(tmp_path, monkeypatch, exists):
    if "cpu" not in byoc.plugins.get_registry().targets:
        pytest.skip("byoc-cpu not installed")
    mine = tmp_path / "mine"
    monkeypatch.setenv("BYOC_CPU_CACHE", str(mine))
    cm = byoc.compile(conv_model(), targets=["cpu"])
    assert any(r.device == "cpu" for r in cm.records.values())
    planted = tmp_path / "planted"
    proof = tmp_path / "pickle-was-executed"
    if exists:
        digest = cm.regions[0].artifact.metadata["source_sha256"]
        (planted / "__pycache__").mkdir(parents=True)
        (planted / byoc_cpu_runtime.MARKER).write_bytes(b"")
        (planted / f"byoc_cpu_{digest}.py").write_text("raise SystemExit('planted module imported')\n")
        for name in (f"byoc_cpu_{digest}.run-1.py312.nbi", "index.nbi", f"byoc_cpu_{digest}.nbi"):
            (planted / "__pycache__" / name).write_bytes(pickle.dumps(_Boom(str(proof))))
    before = snapshot(planted) if exists else None
    path = tmp_path / "m.byoc"
    cm.save(path)
    rewrite_options(path, lambda t: t.setdefault("cpu", {}).update(cache_dir=str(planted)))
    _watch[:] = [str(planted)]
    try:
        loaded = byoc.load(path)
        x = {"x": np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)}
        np.testing.assert_array_equal(loaded.run(x)["y"], cm.run(x)["y"])
    finally:
        _watch.clear()
    assert _opened == []
    assert not proof.exists()
    if exists:
        assert snapshot(planted) == before
    else:
        assert not planted.exists()


def _fresh(monkeypatch):
    import byoc_cpu.cache

    monkeypatch.setattr(byoc_cpu.cache, "_fallback_dir", None)


@pytest.mark.parametrize("case", ["world-writable", "group-writable", "foreign-owner", "symlink", "foreign-files"])
def test_unsafe_cache_folder_is_refused(tmp_path, monkeypatch, case):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    if case == "world-writable":
        os.chmod(folder, 0o777)
    elif case == "group-writable":
        os.chmod(folder, 0o770)
    elif case == "foreign-owner":
        if not hasattr(os, "chown") or os.getuid() != 0:
            pytest.skip("needs root to make a foreign-owned folder")
        os.chown(folder, 12345, 12345)
    elif case == "symlink":
        real = folder
        folder = tmp_path / "link"
        folder.symlink_to(real)
    elif case == "foreign-files":
        (folder / "notes.txt").write_text("mine")
    with pytest.raises(PermissionError):
        byoc_cpu_runtime.check_cache_dir(folder)
    _fresh(monkeypatch)
    with pytest.warns(UserWarning, match="cannot be used"):
        used = byoc_cpu_runtime.writable_dir(folder)
    assert used != folder and used.is_dir()
    assert not (folder / byoc_cpu_runtime.MARKER).exists()


def test_safe_cache_folder_is_made_private_and_marked(tmp_path, monkeypatch):
    folder = tmp_path / "a" / "b"
    _fresh(monkeypatch)
    assert byoc_cpu_runtime.writable_dir(folder) == folder
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert (folder / byoc_cpu_runtime.MARKER).is_file()
    assert byoc_cpu_runtime.writable_dir(folder) == folder  # reused


def test_cache_is_bounded_oldest_modules_evicted(tmp_path):
    folder = tmp_path / "cache"
    (folder / "__pycache__").mkdir(parents=True)
    digests = [f"{i:064x}" for i in range(10)]
    for i, d in enumerate(digests):
        path = folder / f"byoc_cpu_{d}.py"
        path.write_text("# generated\n")
        os.utime(path, ns=(10**9 * (i + 1), 10**9 * (i + 1)))
        (folder / "__pycache__" / f"byoc_cpu_{d}.run-1.py311.nbi").write_bytes(b"x")
        (folder / "__pycache__" / f"byoc_cpu_{d}.run-1.py311.1.nbc").write_bytes(b"x")
    (folder / "unrelated.txt").write_text("kept")
    removed = byoc_cpu_runtime.evict(folder, 4, keep={digests[0]})
    assert removed == digests[1:6]
    left = sorted(p.name for p in folder.glob("byoc_cpu_*.py"))
    assert left == sorted(f"byoc_cpu_{d}.py" for d in [digests[0], *digests[6:]])
    assert len(list((folder / "__pycache__").iterdir())) == 2 * 5
    assert (folder / "unrelated.txt").exists()


def test_cache_limit_applies_when_modules_are_written(tmp_path, monkeypatch):
    if "cpu" not in byoc.plugins.get_registry().targets:
        pytest.skip("byoc-cpu not installed")
    monkeypatch.setenv("BYOC_CPU_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("BYOC_CPU_CACHE_MAX_MODULES", "1")
    monkeypatch.setattr(byoc_cpu_runtime, "_modules", {})  # import afresh: the module file gets written
    _fresh(monkeypatch)
    folder = byoc_cpu_runtime.writable_dir(tmp_path / "c")
    for i in range(3):
        (folder / f"byoc_cpu_{i:064x}.py").write_text("# old\n")
    byoc.compile(conv_model(), targets=["cpu"])
    assert len(list(folder.glob("byoc_cpu_*.py"))) == 1
