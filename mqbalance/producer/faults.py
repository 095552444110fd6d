"""Latency fault tolerance: how a send's latency isolates a broker for a while.

This is RocketMQ's ``MQFaultStrategy.computeNotAvailableDuration`` and
``LatencyFaultToleranceImpl`` (client/latency), without threads or I/O: time comes
from an injected clock, so a test can move it by hand and the sidecar can host
one instance per process. Not thread-safe; one event loop owns it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqbalance.producer.index import MovingIndex

Clock = Callable[[], float]
"""Seconds on any monotonic timeline (``time.monotonic`` by default)."""


@dataclass(frozen=True, slots=True)
class FaultTable:
    """Maps a send latency to how long its broker is left out (all in milliseconds).

    ``extend_only`` is the one behavioural difference between the generations:
    RocketMQ 5.x (``FaultItem.updateNotAvailableDuration``) only ever lengthens an
    isolation, so a fast send does not lift one early; 4.x overwrites the window
    with every report, so a fast send to an isolated broker makes it available at once.
    """

    name: str
    latency_max_ms: tuple[int, ...]
    not_available_duration_ms: tuple[int, ...]
    failure_latency_ms: int
    """The latency a failed send counts as (``isolation ? 30000/10000 : latency``)."""
    extend_only: bool

    def __post_init__(self) -> None:
        if not self.latency_max_ms or len(self.latency_max_ms) != len(self.not_available_duration_ms):
            raise ValueError(
                f"fault table {self.name!r}: latency_max_ms and not_available_duration_ms must be "
                f"non-empty and of equal length (got {len(self.latency_max_ms)} and "
                f"{len(self.not_available_duration_ms)})"
            )
        if list(self.latency_max_ms) != sorted(self.latency_max_ms):
            raise ValueError(
                f"fault table {self.name!r}: latency_max_ms must ascend, the lookup scans it from "
                f"the top (got {list(self.latency_max_ms)})"
            )
        if any(d < 0 for d in self.not_available_duration_ms) or self.failure_latency_ms < 0:
            raise ValueError(f"fault table {self.name!r}: durations and the failure latency must be >= 0")

    def not_available_duration(self, latency_ms: float) -> int:
        """``computeNotAvailableDuration``: the row of the largest latencyMax <= latency, else 0."""
        for bound, duration in zip(
            reversed(self.latency_max_ms), reversed(self.not_available_duration_ms), strict=True
        ):
            if latency_ms >= bound:
                return duration
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "latencyMaxMs": list(self.latency_max_ms),
            "notAvailableDurationMs": list(self.not_available_duration_ms),
            "failureLatencyMs": self.failure_latency_ms,
            "extendOnly": self.extend_only,
        }


LATENCY_4X = FaultTable(
    name="4.x",
    latency_max_ms=(50, 100, 550, 1000, 2000, 3000, 15000),
    not_available_duration_ms=(0, 0, 30000, 60000, 120000, 180000, 600000),
    failure_latency_ms=30000,
    extend_only=False,
)
"""RocketMQ 4.x MQFaultStrategy: a failure counts as 30000 ms and isolates for 600 s."""

LATENCY_5X = FaultTable(
    name="5.x",
    latency_max_ms=(50, 100, 550, 1800, 3000, 5000, 15000),
    not_available_duration_ms=(0, 0, 2000, 5000, 6000, 10000, 30000),
    failure_latency_ms=10000,
    extend_only=True,
)
"""RocketMQ 5.x MQFaultStrategy: a failure counts as 10000 ms and isolates for 10 s."""

FAULT_TABLES = {t.name: t for t in (LATENCY_4X, LATENCY_5X)}


def fault_table(name: str) -> FaultTable:
    """The table called ``name`` ("4.x" or "5.x")."""
    try:
        return FAULT_TABLES[name]
    except KeyError:
        raise ValueError(f"unknown fault table {name!r}; use one of {sorted(FAULT_TABLES)}") from None


@dataclass(frozen=True, slots=True)
class FaultItem:
    """A snapshot of one broker's fault state (RocketMQ's ``FaultItem``)."""

    broker: str
    current_latency_ms: float
    """The latency of the last report, as measured (a failure's own latency, not the penalty)."""
    isolated_until: float
    """Clock reading (seconds) from which the broker is available again (``startTimestamp``)."""
    isolated_for_ms: float
    """Time left in the isolation when the snapshot was taken; 0 when available."""
    available: bool
    reachable: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "currentLatencyMs": self.current_latency_ms,
            "isolatedUntil": self.isolated_until,
            "isolatedForMs": self.isolated_for_ms,
            "available": self.available,
            "reachable": self.reachable,
        }


@dataclass(slots=True)
class _Entry:
    current_latency_ms: float
    isolated_until: float
    reachable: bool


class LatencyFaultTolerance:
    """Per-broker fault items: which brokers are isolated, until when, and reachable or not.

    A broker never reported is available and reachable. ``update`` is
    ``MQFaultStrategy.updateFaultItem``: the latency (or, for a failure, the table's
    failure latency) selects an isolation window that starts now.
    """

    def __init__(
        self,
        table: FaultTable = LATENCY_5X,
        *,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        worst_index_start: int | None = None,
    ) -> None:
        self.table = table
        self._clock = clock
        self._items: dict[str, _Entry] = {}
        # whichItemWorst of 4.x pickOneAtLeast; random start as in Java unless given.
        start = worst_index_start if worst_index_start is not None else MovingIndex.random_start(rng)
        self._which_item_worst = MovingIndex(start)

    def update(
        self, broker: str, latency_ms: float, *, failed: bool = False, reachable: bool = True
    ) -> FaultItem:
        """Record one send to ``broker`` that took ``latency_ms``.

        ``failed`` marks a send that raised (RocketMQ's ``isolation``); pass
        ``reachable=False`` when the broker could not be reached at all, as 5.x does
        for remoting errors, so selection prefers other brokers even after the
        isolation ends, until ``mark_reachable``.
        """
        if not broker:
            raise ValueError("broker name must be a non-empty string")
        if not isinstance(latency_ms, int | float) or math.isnan(latency_ms) or latency_ms < 0:
            raise ValueError(f"latency_ms must be a number >= 0 (got {latency_ms!r})")
        duration_ms = self.table.not_available_duration(
            self.table.failure_latency_ms if failed else latency_ms
        )
        now = self._clock()
        until = now + duration_ms / 1000.0
        entry = self._items.get(broker)
        if entry is None:
            # A new 5.x item keeps startTimestamp 0 (available) unless the duration is
            # positive; "available from now" behaves the same on a monotonic clock.
            entry = _Entry(float(latency_ms), until, reachable)
            self._items[broker] = entry
        else:
            entry.current_latency_ms = float(latency_ms)
            entry.reachable = reachable
            # 4.x overwrites the window; 5.x only ever lengthens it.
            lengthens = duration_ms > 0 and until > entry.isolated_until
            if lengthens or not self.table.extend_only:
                entry.isolated_until = until
        return self._snapshot(broker, entry, now)

    def mark_reachable(self, broker: str, reachable: bool = True) -> None:
        """What 5.x's broker detector does when a probe succeeds (no-op for unknown brokers)."""
        entry = self._items.get(broker)
        if entry is not None:
            entry.reachable = reachable

    def remove(self, broker: str) -> None:
        self._items.pop(broker, None)

    def clear(self) -> None:
        self._items.clear()

    def is_available(self, broker: str) -> bool:
        """``FaultItem.isAvailable``: now >= isolated_until; unknown brokers are available."""
        entry = self._items.get(broker)
        return entry is None or self._clock() >= entry.isolated_until

    def is_reachable(self, broker: str) -> bool:
        entry = self._items.get(broker)
        return entry is None or entry.reachable

    def item(self, broker: str) -> FaultItem | None:
        entry = self._items.get(broker)
        return None if entry is None else self._snapshot(broker, entry, self._clock())

    def items(self) -> list[FaultItem]:
        """Every broker reported so far, by name."""
        now = self._clock()
        return [self._snapshot(b, self._items[b], now) for b in sorted(self._items)]

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly state: the table and every fault item."""
        return {"table": self.table.to_json(), "brokers": [i.to_json() for i in self.items()]}

    def pick_one_at_least(self) -> str | None:
        """4.x ``pickOneAtLeast``: one of the better half of the known brokers, in turn.

        Items sort as ``FaultItem.compareTo`` does: available first, then lower latency,
        then earlier ``isolated_until``. Java shuffles before sorting, so its ties fall at
        random; here they fall by broker name, which keeps the result reproducible.
        """
        if not self._items:
            return None
        now = self._clock()
        ranked = sorted(
            self._items.items(),
            key=lambda kv: (
                now < kv[1].isolated_until,
                kv[1].current_latency_ms,
                kv[1].isolated_until,
                kv[0],
            ),
        )
        half = len(ranked) // 2
        if half <= 0:
            return ranked[0][0]
        return ranked[self._which_item_worst.increment_and_get() % half][0]

    def _snapshot(self, broker: str, entry: _Entry, now: float) -> FaultItem:
        remaining_ms = max(0.0, (entry.isolated_until - now) * 1000.0)
        return FaultItem(
            broker=broker,
            current_latency_ms=entry.current_latency_ms,
            isolated_until=entry.isolated_until,
            isolated_for_ms=remaining_ms,
            available=now >= entry.isolated_until,
            reachable=entry.reachable,
        )
