"""Where the harness finds things: the checkout, the per-user build cache, scratch space in memory."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository's root: the checkout the harness runs from."""


def cache_dir() -> Path:
    """The per-user cache the build scripts install into (the same rule as the scripts)."""
    explicit = os.environ.get("MQBALANCE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "mqbalance"


def tmpfs_root() -> str | None:
    """/dev/shm where it can be written: the harness's working files in memory, else the default."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
