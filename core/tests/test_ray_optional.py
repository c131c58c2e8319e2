"""byoc.ray without Ray installed: importable, and a clear byoc error naming the extra (the Ray
tests themselves are in tests/ray, run by ``tox -e ray``)."""

import numpy as np
import pytest

import byoc
import byoc.ray


def _has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


HAS_RAY = _has_ray()


@pytest.mark.skipif(HAS_RAY, reason="Ray is installed here")
def test_predict_without_ray_names_the_extra():
    with pytest.raises(byoc.OptionError, match=r"byoc-core\[ray\]"):
        byoc.ray.predict(None, b"")


@pytest.mark.skipif(HAS_RAY, reason="Ray is installed here")
def test_cli_ray_without_ray_is_a_byoc_error(tmp_path, capsys):
    from byoc.cli import main

    assert main(["run", str(tmp_path / "m.byoc"), "--ray", "-i", str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    assert "byoc-core[ray]" in capsys.readouterr().err


def test_resource_request_from_device_kinds():
    assert byoc.ray._resources({}, 2) == {"num_cpus": 2}
    assert byoc.ray._resources({"jetson": "gpu", "vitis": "dpu", "cpu": "cpu"}, 1) == {
        "num_cpus": 1, "num_gpus": 1, "dpu": 1}
    assert byoc.ray._remote_args({"num_cpus": 1, "num_gpus": 0, "dpu": 1, "npu": 0}) == {
        "num_cpus": 1, "num_gpus": 0, "resources": {"dpu": 1}}
    with pytest.raises(byoc.OptionError, match="dpu"):
        byoc.ray._remote_args({"dpu": -1})


def test_npy_names_match_a_local_run(tmp_path, monkeypatch):
    """--ray --npy names each row's files as a local `byoc run -o DIR` names its outputs."""
    from byoc.cliutil import safe_file_names

    names = ["softmaxout_1", "a/b", "..", "x:0", "", "über", "A_b", "a_b"]
    batch = {"row": np.array([7]), **{n: np.ones((1, 2), np.float32) * i for i, n in enumerate(names)}}

    class _Ds:
        def iter_batches(self, **_):
            yield batch

    assert byoc.ray._write_npy(_Ds(), tmp_path, names) == 1
    expected = safe_file_names(names, taken=["outputs.json"])
    assert sorted(p.name for p in (tmp_path / "7").iterdir()) == sorted(expected.values())
    for n in names:
        assert np.array_equal(np.load(tmp_path / "7" / expected[n]), batch[n][0])
