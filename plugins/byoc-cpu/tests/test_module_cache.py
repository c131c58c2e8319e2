"""byoc-cpu's cache of generated modules (byoc_cpu.cache): what is found at a module's path is read
only when it is a regular file; a link, FIFO or folder planted there is replaced, never followed."""

from __future__ import annotations

import os

import pytest

from byoc_cpu.cache import write_once


def test_a_module_already_written_is_left_alone(tmp_path):
    path = tmp_path / "byoc_cpu_x.py"
    write_once(path, "x = 1\n")
    before = path.stat().st_mtime_ns
    write_once(path, "x = 1\n")
    assert path.stat().st_mtime_ns == before and path.read_text() == "x = 1\n"


@pytest.mark.parametrize("planted", ["fifo", "link", "dangling", "other"])
def test_whatever_else_is_at_the_path_is_replaced_without_reading_it(tmp_path, planted):
    path = tmp_path / "byoc_cpu_x.py"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    if planted == "fifo":
        os.mkfifo(path)  # reading it would block until someone writes
    elif planted == "link":
        path.symlink_to(victim)
    elif planted == "dangling":
        path.symlink_to(tmp_path / "nowhere")
    else:
        path.write_text("y = 2\n")
    write_once(path, "x = 1\n")
    assert path.is_file() and not path.is_symlink() and path.read_text() == "x = 1\n"
    assert victim.read_text() == "keep me"
