"""Latency fault tolerance: how a send's latency isolates a broker for a while.

This is RocketMQ's ``MQFaultStrategy.computeNotAvailableDuration`` and
``LatencyFaultToleranceImpl`` (client/latency), without threads or I/O: time comes
from an injected clock, so a test can move it by hand and the sidecar can host
one instance per process. Not thread-safe; one event loop owns it.

Time is kept as Java keeps it: integer milliseconds (``System.currentTimeMillis``),
so a window ends at exactly the millisecond RocketMQ's ``now - startTimestamp >= 0``
says, whatever the clock's origin.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqbalance.producer.index import MovingIndex
from mqbalance.producer.java_map import ConcurrentMapOrder

Clock = Callable[[], int]
"""Integer milliseconds on any timeline that does not go backwards (``monotonic_ms`` by default)."""

JAVA_LONG_MAX = 2**63 - 1


def monotonic_ms() -> int:
    """Milliseconds of ``time.monotonic_ns``: the default clock, immune to wall-clock steps."""
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    """Unix time in milliseconds, as Java's ``System.currentTimeMillis``."""
    return time.time_ns() // 1_000_000


def java_latency(latency_ms: float) -> int:
    """A reported latency as RocketMQ's ``long currentLatency``: fractions truncated, as a ``(long)`` cast.

    RocketMQ measures latencies as differences of ``currentTimeMillis`` and so never
    sees a fraction; a client that measures finer (``12.7``) is taken at the whole
    millisecond below (``12``). The isolation window is the same either way (every
    ``latencyMax`` is a whole number); the stored latency, which ranks brokers in 4.x's
    ``pickOneAtLeast``, is Java's.
    """
    if isinstance(latency_ms, bool) or not isinstance(latency_ms, int | float):
        raise ValueError(f"latency_ms must be a number >= 0 (got {latency_ms!r})")
    if isinstance(latency_ms, float) and not math.isfinite(latency_ms):
        raise ValueError(f"latency_ms must be a number >= 0 (got {latency_ms!r})")
    if latency_ms < 0:
        raise ValueError(f"latency_ms must be a number >= 0 (got {latency_ms!r})")
    whole = int(latency_ms)
    if whole > JAVA_LONG_MAX:
        raise ValueError(f"latency_ms must fit a Java long (at most {JAVA_LONG_MAX}), got {latency_ms!r}")
    return whole


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
        # A fraction changes nothing here: every bound is whole, so x >= b exactly when int(x) >= b.
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
"""MQFaultStrategy of RocketMQ 4.x and 5.0.0-5.1.3: a failure counts as 30000 ms and isolates for 600 s."""

LATENCY_5X = FaultTable(
    name="5.x",
    latency_max_ms=(50, 100, 550, 1800, 3000, 5000, 15000),
    not_available_duration_ms=(0, 0, 2000, 5000, 6000, 10000, 30000),
    failure_latency_ms=10000,
    extend_only=True,
)
"""MQFaultStrategy of RocketMQ 5.1.4 and later: a failure counts as 10000 ms and isolates for 10 s."""

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
    current_latency_ms: int
    """The latency of the last report, as measured (a failure's own latency, not the penalty)."""
    isolated_until_ms: int
    """Clock reading (ms) from which the broker is available again: Java's ``startTimestamp``.

    0 for a 5.x item that was never isolated (Java creates it so).
    """
    isolated_for_ms: int
    """Time left in the isolation when the snapshot was taken; 0 when available."""
    available: bool
    reachable: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "currentLatencyMs": self.current_latency_ms,
            "isolatedUntilMs": self.isolated_until_ms,
            "isolatedForMs": self.isolated_for_ms,
            "available": self.available,
            "reachable": self.reachable,
        }


@dataclass(slots=True)
class _Entry:
    current_latency_ms: int
    start_ms: int  # Java's startTimestamp: available from this clock reading on
    reachable: bool


class LatencyFaultTolerance:
    """Per-broker fault items: which brokers are isolated, until when, and reachable or not.

    A broker never reported is available and reachable. ``update`` is
    ``MQFaultStrategy.updateFaultItem``: the latency (or, for a failure, the table's
    failure latency) selects an isolation window that starts now. The items keep the
    order of RocketMQ's ``ConcurrentHashMap`` fault table (``java_map``), which decides
    ties in ``pick_one_at_least``.
    """

    def __init__(
        self,
        table: FaultTable = LATENCY_5X,
        *,
        clock: Clock = monotonic_ms,
        rng: random.Random | None = None,
        worst_index_start: int | None = None,
    ) -> None:
        self.table = table
        self._clock = clock
        self._items: dict[str, _Entry] = {}
        self._order = ConcurrentMapOrder()
        # whichItemWorst of 4.x pickOneAtLeast; random start as in Java unless given.
        start = worst_index_start if worst_index_start is not None else MovingIndex.random_start(rng)
        self._which_item_worst = MovingIndex(start)

    @property
    def which_item_worst(self) -> MovingIndex:
        """The index ``pick_one_at_least`` turns (Java's ``whichItemWorst``)."""
        return self._which_item_worst

    def now(self) -> int:
        """The clock's reading, checked to be integer milliseconds."""
        now = self._clock()
        if isinstance(now, bool) or not isinstance(now, int):
            raise TypeError(
                f"the fault clock must return integer milliseconds (got {now!r}); "
                "use mqbalance.producer.monotonic_ms or wall_ms"
            )
        return now

    def update(
        self, broker: str, latency_ms: float, *, failed: bool = False, reachable: bool = True
    ) -> FaultItem:
        """Record one send to ``broker`` that took ``latency_ms`` (whole ms: see ``java_latency``).

        ``failed`` marks a send that raised (RocketMQ's ``isolation``); pass
        ``reachable=False`` when the broker could not be reached at all, as 5.x does
        for remoting errors, so selection prefers other brokers even after the
        isolation ends, until ``mark_reachable``.
        """
        if not broker:
            raise ValueError("broker name must be a non-empty string")
        latency = java_latency(latency_ms)
        duration_ms = self.table.not_available_duration(self.table.failure_latency_ms if failed else latency)
        now = self.now()
        entry = self._items.get(broker)
        if entry is None:
            # 4.x: startTimestamp = now + duration. 5.x: a new item starts at 0 (available)
            # and only a positive duration moves it (updateNotAvailableDuration).
            start = 0 if self.table.extend_only and duration_ms <= 0 else now + duration_ms
            entry = _Entry(latency, start, reachable)
            self._items[broker] = entry
            self._order.add(broker)
        else:
            entry.current_latency_ms = latency
            entry.reachable = reachable
            if not self.table.extend_only or (duration_ms > 0 and now + duration_ms > entry.start_ms):
                entry.start_ms = now + duration_ms
        return self._snapshot(broker, entry, now)

    def mark_reachable(self, broker: str, reachable: bool = True) -> None:
        """What 5.x's broker detector does when a probe succeeds (no-op for unknown brokers)."""
        entry = self._items.get(broker)
        if entry is not None:
            entry.reachable = reachable

    def remove(self, broker: str) -> None:
        if self._items.pop(broker, None) is not None:
            self._order.discard(broker)

    def clear(self) -> None:
        self._items.clear()
        self._order.clear()

    def is_available(self, broker: str) -> bool:
        """``FaultItem.isAvailable``: now >= startTimestamp; unknown brokers are available."""
        entry = self._items.get(broker)
        return entry is None or self._clock() >= entry.start_ms

    def is_reachable(self, broker: str) -> bool:
        entry = self._items.get(broker)
        return entry is None or entry.reachable

    def item(self, broker: str) -> FaultItem | None:
        entry = self._items.get(broker)
        return None if entry is None else self._snapshot(broker, entry, self.now())

    def items(self) -> list[FaultItem]:
        """Every broker reported so far, by name."""
        now = self.now()
        return [self._snapshot(b, self._items[b], now) for b in sorted(self._items)]

    def java_order(self) -> list[str]:
        """The reported brokers in the order Java's fault table iterates them."""
        return list(self._order)

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly state: the table and every fault item."""
        return {"table": self.table.to_json(), "brokers": [i.to_json() for i in self.items()]}

    def pick_one_at_least(self) -> str | None:
        """4.x ``pickOneAtLeast`` (4.9.4 and later): one of the better half of the known brokers, in turn.

        The items, in the fault table's iteration order, are sorted stably as
        ``FaultItem.compareTo`` orders them: available first, then lower latency, then
        earlier ``startTimestamp``; ties keep the table's order, as ``Collections.sort``
        does. Then ``whichItemWorst.incrementAndGet() % half`` picks among the better
        half (the single item when there is one). Before 4.9.4 Java shuffled the list
        before sorting, so its ties fell at random.
        """
        if not self._items:
            return None
        now = self.now()
        items = self._items

        def rank(broker: str) -> tuple[bool, int, int]:
            entry = items[broker]
            return (now < entry.start_ms, entry.current_latency_ms, entry.start_ms)

        ranked = sorted(self._order, key=rank)
        half = len(ranked) // 2
        if half <= 0:
            return ranked[0]
        return ranked[self._which_item_worst.increment_and_get() % half]

    def _snapshot(self, broker: str, entry: _Entry, now: int) -> FaultItem:
        return FaultItem(
            broker=broker,
            current_latency_ms=entry.current_latency_ms,
            isolated_until_ms=entry.start_ms,
            isolated_for_ms=max(0, entry.start_ms - now),
            available=now >= entry.start_ms,
            reachable=entry.reachable,
        )
