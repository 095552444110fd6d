"""This pod's grant: how long it may serve its queues without word from the API server.

Time-bounded ownership: when a document carries lease terms (handover Release or Orderly) and
the sidecar renews its member Lease (:class:`Grant` enabled), this pod may serve its queues only
for ``lease.seconds`` after the last renewal that reached the API server, counted from when it was
*sent*, on the monotonic clock. Past that the group is *fenced*: ``GET /v1/queues`` lists no
queues and says ``"fenced": true`` until a renewal succeeds again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mqbalance.contract import LeaseTerms

Monotonic = Callable[[], float]


class Grant:
    """This pod's confirmed contact with the API server: what bounds how long it may serve."""

    def __init__(self, monotonic: Monotonic = time.monotonic) -> None:
        self.enabled = False
        """Whether a member Lease is renewed (a sidecar fed from files or a test has no grant)."""
        self.confirmed_at: float | None = None
        """Monotonic time at which the last renewal that then succeeded was sent."""
        self.monotonic = monotonic
        self.changed = asyncio.Event()
        """Set when a renewal succeeds or new lease terms arrive (the fence watcher looks again)."""

    def confirm(self, sent_at: float) -> None:
        if self.confirmed_at is None or sent_at > self.confirmed_at:
            self.confirmed_at = sent_at
        self.changed.set()

    def remaining(self, lease: LeaseTerms | None) -> float | None:
        """Seconds this grant still lasts under ``lease`` (0: fenced); None when there is no grant."""
        if not self.enabled or lease is None:
            return None
        if self.confirmed_at is None:
            return 0.0  # no renewal yet: fenced until the first one succeeds
        return max(0.0, self.confirmed_at + lease.seconds - self.monotonic())
