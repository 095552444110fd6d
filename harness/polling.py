"""Waiting for the world to catch up, with a deadline and a message naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.05,
    error: type[Exception] = AssertionError,
) -> T:
    """Call ``probe`` until it returns something truthy and return that.

    Raises ``error`` naming ``what`` and the last value seen after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")
        time.sleep(interval)
