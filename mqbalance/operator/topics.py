"""A Topic's status: the route it resolves to, where that came from, and whether the spec agrees.

Pure, like the group reconcile: the Topic reconciler reads the NameServer (when the Topic names
one) when its :class:`RoutePoll` says a read is due, and hands the outcome in as a
:class:`RouteRead`; :func:`topic_status` says what the status should be. A failed read keeps the
route read before, so consumers keep their queues while a NameServer is away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqbalance.contract import SpecError
from mqbalance.contract.bounds import OverBound, check_route
from mqbalance.contract.topic import (
    BrokerEntry,
    broker_entries,
    read_route_status,
    read_topic,
    reads_name_server,
    route_status,
)
from mqbalance.model import UNKNOWN_ZONE, Broker, TopicRoute
from mqbalance.operator.conditions import set_condition

CONDITION_TYPES = ("RouteAvailable", "RouteInSync")


@dataclass(frozen=True)
class RouteRead:
    """One attempt to read a Topic's route from its NameServers."""

    brokers: tuple[Broker, ...] | None
    """The route's brokers (with the zones they registered with, if any), or None when the read failed."""
    address: str = ""
    """The NameServer that answered."""
    reason: str = "Read"
    """On failure: NameServerUnreachable, TopicNotFound, RequestFailed, NoNameServer or RouteTooLarge
    (an answer over a bound is not taken: the route read before stays)."""
    message: str = ""


@dataclass(slots=True, eq=False)
class RoutePoll:
    """A Topic's route as last read from its NameServers, and when to read it again (Topics that
    name one)."""

    read: RouteRead | None = None
    generation: int = -1
    """The Topic's generation that read was made for."""
    failures: int = 0
    """Failed reads in a row."""
    due: float = 0.0
    """When (on the work queue's clock) the route is due to be read again."""

    def is_due(self, generation: int, now: float) -> bool:
        return self.read is None or self.generation != generation or now >= self.due

    def record(self, read: RouteRead, generation: int, poll_seconds: float, now: float) -> float:
        """Take a read; how long until the next: the poll interval, sooner (backing off) while reads fail."""
        self.read, self.generation = read, generation
        self.failures = 0 if read.brokers is not None else self.failures + 1
        wait = min(poll_seconds, 2.0 ** (self.failures - 1)) if self.failures else poll_seconds
        self.due = now + wait
        return wait

    def clear(self) -> None:
        """The Topic names no NameServer (any more): nothing read is kept."""
        self.read = None


def topic_status(
    resource_name: str,
    spec: Mapping[str, Any] | None,
    generation: int,
    current: Mapping[str, Any],
    read: RouteRead | None,
    now: float,
) -> dict[str, Any]:
    """The Topic's status after ``read`` (None for a Topic written by hand)."""
    status: dict[str, Any] = {
        k: current[k] for k in ("brokers", "readableQueues", "writableQueues") if k in current
    }
    status["observedGeneration"] = generation
    conditions = [dict(c) for c in current.get("conditions") or []]

    def put(kind: str, state: str, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, kind, state, reason, message, now, generation, CONDITION_TYPES)

    spec = spec if isinstance(spec, Mapping) else {}
    if not reads_name_server(spec):
        conditions = [c for c in conditions if c.get("type") != "RouteInSync"]
        try:
            route = read_topic(resource_name, spec)
        except OverBound as e:
            put("RouteAvailable", "False", e.reason, str(e))
        except SpecError as e:
            put("RouteAvailable", "False", "InvalidSpec", str(e))
        else:
            status.update(_counts(route.brokers))
            put("RouteAvailable", "True", "Spec", "the route is spec.brokers")
        status["conditions"] = conditions
        return status

    kept = current.get("route")
    if read is not None and read.brokers is not None:
        kept = route_status(read.address, read.brokers)
        put("RouteAvailable", "True", "Read", f"read from NameServer {read.address}")
    elif read is not None:
        held = "keeping the route read before" if kept else "no route read yet"
        put("RouteAvailable", "False", read.reason, f"{read.message}; {held}")
    if kept is not None:
        status["route"] = kept
    try:
        entries = broker_entries(resource_name, spec)
        brokers = read_route_status(resource_name, kept) if kept is not None else None
        if brokers is not None:
            check_route(f"Topic {resource_name!r}: status.route", brokers)  # edited by hand
    except OverBound as e:
        put("RouteAvailable", "False", e.reason, str(e))
        put("RouteInSync", "Unknown", e.reason, "the route is over a bound")
        status["conditions"] = conditions
        return status
    except SpecError as e:
        put("RouteAvailable", "False", "InvalidSpec", str(e))
        put("RouteInSync", "Unknown", "InvalidSpec", "the spec cannot be compared with the route")
        status["conditions"] = conditions
        return status
    if brokers is None:
        put("RouteInSync", "Unknown", "NoRoute", "no route read yet")
    else:
        status.update(_counts(brokers))
        drift = route_drift(entries, brokers)
        if drift:
            put("RouteInSync", "False", "Drift", "; ".join(drift))
        else:
            put("RouteInSync", "True", "InSync", "spec.brokers agrees with the route")
    status["conditions"] = conditions
    return status


def reconcile_failed(current: Mapping[str, Any], message: str, now: float, generation: int) -> dict[str, Any]:
    """The status after a reconcile that raised: the one written before, its route and counts
    kept, with RouteAvailable False for ``ReconcileFailed`` and ``message``."""
    held = "keeping the route read before" if current.get("route") else "keeping the status written before"
    conditions = set_condition(
        [dict(c) for c in current.get("conditions") or []],
        "RouteAvailable",
        "False",
        "ReconcileFailed",
        f"{message}; {held}",
        now,
        generation,
        CONDITION_TYPES,
    )
    return {**current, "conditions": conditions}


def route_drift(entries: Sequence[BrokerEntry], brokers: Sequence[Broker]) -> list[str]:
    """Where ``spec.brokers`` disagrees with the route read: brokers it names that the route lacks,
    queue counts or zones it gives that differ (its zone is used), and (when it lists any broker)
    brokers it does not name that registered no zone, whose zone is therefore unknown."""
    read = {b.name: b for b in brokers}
    named = {e.name for e in entries}
    drift = []
    for e in entries:
        b = read.get(e.name)
        if b is None:
            drift.append(f"broker {e.name} is in spec.brokers but not in the route")
            continue
        for key, want, got in (
            ("readQueueNums", e.read_queue_nums, b.read_queue_nums),
            ("writeQueueNums", e.write_queue_nums, b.write_queue_nums),
        ):
            if want is not None and want != got:
                drift.append(f"broker {e.name}: spec.brokers says {key} {want}, the route {got}")
        if UNKNOWN_ZONE not in (e.zone, b.zone) and e.zone != b.zone:
            drift.append(
                f"broker {e.name}: spec.brokers says zone {e.zone}, the broker registered zone {b.zone} "
                "(spec.brokers' zone is used)"
            )
    if entries:
        unnamed = sorted(n for n in read.keys() - named if read[n].zone == UNKNOWN_ZONE)
        if unnamed:
            drift.append(
                f"brokers {', '.join(unnamed)} are in the route but not in spec.brokers (zone unknown)"
            )
    return drift


def _counts(brokers: Sequence[Broker]) -> dict[str, int]:
    route = TopicRoute("", tuple(brokers))
    return {
        "brokers": len(route.brokers),
        "readableQueues": route.readable_count(),
        "writableQueues": route.writable_count(),
    }
