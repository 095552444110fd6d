"""A service's working directory: the caller's, kept, or a temporary one, removed at stop; and the
temporary directories of processes that were killed outright, swept by the next run."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from harness.paths import tmpfs_root

_OWNER_FILE = "owner.pid"


class WorkDir:
    """A service's working directory: the one its caller gave (kept), or a temporary one made at
    start and removed at stop."""

    def __init__(self, path: str | os.PathLike[str] | None, service: str, error: type[Exception]) -> None:
        self._path = Path(path) if path is not None else None
        self._owned = path is None
        self._service = service
        self._error = error

    @property
    def path(self) -> Path:
        if self._path is None:
            raise self._error(f"{self._service} not started")
        return self._path

    def make(self, temporary: Callable[[], Path]) -> Path:
        """The directory, created; ``temporary`` makes one when the caller gave none."""
        if self._path is None:
            self._path = temporary()
        self._path.mkdir(parents=True, exist_ok=True)
        return self._path

    def remove(self) -> None:
        """Remove a temporary directory; the caller's stays."""
        if self._owned and self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


def owned_tempdir(prefix: str) -> Path:
    """A temporary directory (in memory where it can be) that names this process as its owner, so
    :func:`sweep_stale_dirs` can tell when it was left behind."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=tmpfs_root()))
    (path / _OWNER_FILE).write_text(str(os.getpid()))
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_dirs(prefixes: tuple[str, ...]) -> None:
    """Remove the directories :func:`owned_tempdir` made with one of ``prefixes`` whose owner is gone.

    A process killed outright (SIGKILL) cannot remove its temporary dirs; on tmpfs they hold memory,
    so the next run removes them."""
    root = Path(tmpfs_root() or tempfile.gettempdir())
    for path in root.iterdir():
        if not path.name.startswith(prefixes) or not path.is_dir():
            continue
        try:
            owner = int((path / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not _pid_alive(owner):
            shutil.rmtree(path, ignore_errors=True)
