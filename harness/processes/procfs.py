"""Reading /proc: a file of every live process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def process_files(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, the content of ``/proc/<pid>/<name>``) of every live process; one that ends while it is
    read is passed over."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            content = (entry / name).read_bytes()
        except OSError:
            continue
        yield int(entry.name), content
