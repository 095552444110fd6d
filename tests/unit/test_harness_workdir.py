"""The harness services' working directory: the caller's is kept, a temporary one is removed at
stop, and asking for it before start names the service."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from harness.processes.workdir import WorkDir


class NotStarted(RuntimeError):
    pass


def test_a_temporary_directory_is_made_at_start_and_removed_at_stop(tmp_path: Path) -> None:
    workdir = WorkDir(None, "the cluster", NotStarted)
    with pytest.raises(NotStarted, match="the cluster not started"):
        _ = workdir.path
    made = workdir.make(lambda: Path(tempfile.mkdtemp(dir=tmp_path)))
    assert made.is_dir()
    assert workdir.path == made
    workdir.remove()
    assert not made.exists()
    with pytest.raises(NotStarted):
        _ = workdir.path


def test_the_callers_directory_is_created_and_kept(tmp_path: Path) -> None:
    given = tmp_path / "given" / "dir"
    workdir = WorkDir(given, "RocketMQ", NotStarted)
    assert workdir.path == given  # known before start: the caller named it
    assert workdir.make(lambda: pytest.fail("no temporary directory for a given one")) == given
    assert given.is_dir()
    workdir.remove()
    assert given.is_dir()
    assert workdir.path == given
