"""byoc.ray without Ray installed: importable, and a clear byoc error naming the extra (the Ray
tests themselves are in tests/ray, run by ``tox -e ray``)."""

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


def test_npy_names_match_a_local_run():
    from byoc.cli import _safe_filename

    for name in ["softmaxout_1", "a/b", "..", "x:0", "", "über"]:
        assert byoc.ray._safe_filename(name) == _safe_filename(name)
