"""What a handover costs: how long each queue that moved between live members went unconsumed.

A move is read from the operator's journal (one line per published generation, with its time):
queue ``q`` held by ``old`` is taken from it by one generation and given to ``new`` by the same
generation (the one-step path, handover Off) or by a later one (with a handover: the first
generation lists ``q`` under ``releasing``, the later one assigns it once ``old`` released it).
Its **unconsumed time** runs from the generation that took it from ``old`` to the first
consumption of ``q`` by ``new`` (the consumers write every message down with the time). The old
owner may still finish what it holds during that time in the one-step path, but nobody starts
anything new of ``q`` before the new owner does in either path, so the figure is the time ``q``
waits for its new owner; with the producer keeping every queue supplied, that is the stall its
keys see.

Moves whose old owner was SIGKILLed are left out (nobody hands anything over), and so are moves
whose old owner never consumed the queue while it held it (nothing to hand over: an orderly
consumer given a SIGKILLed one's queue cannot take the broker's lock until it expires), queues
that come back to their old owner before anyone else took them, and moves outside the time the
producer sent (members starting before it, leaving after it).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from mqbalance.journal import JournalRecord

QueueId = tuple[str, int]
"""(broker, queue id)."""


@dataclass(frozen=True)
class Move:
    queue: QueueId
    old: str
    new: str
    held_from: float
    """Unix time of the generation that gave the queue to ``old``."""
    taken_at: float
    """Unix time of the generation that took the queue from ``old``."""
    assigned_at: float
    """Unix time of the generation that gave it to ``new`` (``taken_at`` in one step)."""
    first_consumed_at: float | None
    """Unix time of the first consumption by ``new`` at or after ``taken_at``; None if none."""
    old_consumed: bool = True
    """Whether ``old`` consumed the queue while it held it (else there was nothing to hand over:
    e.g. an orderly consumer that never got the broker's lock a SIGKILLed one still held)."""

    @property
    def unconsumed_s(self) -> float | None:
        return None if self.first_consumed_at is None else self.first_consumed_at - self.taken_at

    @property
    def waited_s(self) -> float:
        """How long the handover held the queue back (revoked to assigned); 0 in one step."""
        return self.assigned_at - self.taken_at


def journal_moves(records: Iterable[JournalRecord], group: str, topic: str) -> list[Move]:
    """The moves of ``topic``'s queues in ``group``'s generations, in order (first consumption unknown)."""
    held: dict[QueueId, str] = {}
    since: dict[QueueId, float] = {}
    """When the holder (or the releasing owner) got each queue."""
    pending: dict[QueueId, tuple[str, float]] = {}
    """Queues revoked and not yet assigned: old owner, when revoked."""
    out: list[Move] = []
    for r in sorted((r for r in records if r.group == group), key=lambda r: r.generation):
        now: dict[QueueId, str] = {}
        for member, queues in r.assignment.get(topic, {}).items():
            for mq in queues:
                now[(mq.broker_name, mq.queue_id)] = member
        for rel in r.releasing:
            for mq in rel.queues:
                q = (mq.broker_name, mq.queue_id)
                if mq.topic == topic and q not in pending:
                    pending[q] = (rel.owner, rel.since)
        for q, new in now.items():
            before = pending.pop(q, None)
            if before is not None:
                old, taken = before
                if old != new:
                    out.append(Move(q, old, new, since.get(q, taken), taken, r.time, None))
                    since[q] = r.time
            elif q in held and held[q] != new:
                out.append(Move(q, held[q], new, since.get(q, r.time), r.time, r.time, None))
                since[q] = r.time
            elif q not in held:
                since[q] = r.time
        held = now
    return out


Consumption = tuple[int, str, int, str]
"""(time ms, broker, queue id, member)."""


def with_first_consumption(moves: Sequence[Move], consumed: Iterable[Consumption]) -> list[Move]:
    """``moves`` with the first consumption of each queue by its new owner after it was taken."""
    by_queue_member: dict[tuple[QueueId, str], list[float]] = {}
    for at_ms, broker, queue, member in consumed:
        by_queue_member.setdefault(((broker, queue), member), []).append(at_ms / 1000)
    for times in by_queue_member.values():
        times.sort()
    out = []
    for m in moves:
        times = by_queue_member.get((m.queue, m.new), [])
        first = next((t for t in times if t >= m.taken_at), None)
        old_times = by_queue_member.get((m.queue, m.old), [])
        old_consumed = any(m.held_from <= t <= m.taken_at for t in old_times)
        out.append(replace(m, first_consumed_at=first, old_consumed=old_consumed))
    return out


@dataclass(frozen=True)
class MoveFigures:
    moves: int
    """Moves from live owners that the new owner consumed."""
    unconsumed_median_s: float
    unconsumed_max_s: float
    waited_median_s: float
    """Median of revoked-to-assigned (0 in one step)."""
    staying: int = 0
    """Of ``moves``, those whose old owner stayed in the group (moved by a join or a rebalance, not
    by its owner leaving): with a handover each of them waits for its owner's release."""
    staying_waited_min_s: float = float("nan")
    """The shortest revoked-to-assigned of those (nan if none). A leaving owner may release its
    queues before the operator has revoked them, and then they move in one step."""


def figures(
    moves: Sequence[Move],
    killed: Collection[str] = (),
    window: tuple[float, float] | None = None,
    left: Mapping[str, float] | None = None,
) -> MoveFigures:
    """Figures of the moves whose old owner was not killed, taken within ``window`` (unix times:
    while the producer sent), and whose new owner consumed the queue; ``left``: the members that
    left the group meanwhile, and when their leaving began (unix time)."""
    kept = [
        m
        for m in moves
        if m.old not in killed
        and m.old_consumed
        and m.unconsumed_s is not None
        and (window is None or window[0] <= m.taken_at <= window[1])
    ]
    unconsumed = [m.unconsumed_s for m in kept if m.unconsumed_s is not None]
    if not unconsumed:
        nan = float("nan")
        return MoveFigures(0, nan, nan, nan)
    gone = left or {}
    staying = [m.waited_s for m in kept if m.taken_at < gone.get(m.old, math.inf)]
    return MoveFigures(
        moves=len(kept),
        unconsumed_median_s=statistics.median(unconsumed),
        unconsumed_max_s=max(unconsumed),
        waited_median_s=statistics.median(m.waited_s for m in kept),
        staying=len(staying),
        staying_waited_min_s=min(staying, default=float("nan")),
    )


OLD_OWNER_STEPS = ("propagation", "read", "applied", "committed", "released", "recorded")
"""A revoking move's steps on the old owner's sidecar, in order (docs/sidecar.md, "The trace of a move")."""
NEW_OWNER_STEPS = ("propagation", "read", "pulled", "consumed")


@dataclass(frozen=True)
class TraceFigures:
    """Medians, in milliseconds, of a group's move steps: the operator's and its sidecars'."""

    generation_ms: float
    """From the change a generation answered to its publication (the journal's ``sinceChangeSeconds``)."""
    old_owner_ms: Mapping[str, float]
    """Step -> median over moves that revoked queues, from the old owner's receipt of the generation."""
    new_owner_ms: Mapping[str, float]
    """Step -> median over moves that only gained queues on a pod that held some before, from the new
    owner's receipt."""
    joining_ms: Mapping[str, float]
    """The same over a pod's first move (it joined: its application had just started)."""
    moves: int
    """Move lines read."""


JOINED = "joined"
"""Key :func:`move_lines` adds: whether the line is the sidecar's first move (its pod joined)."""


def move_lines(log_text: str) -> list[dict[str, object]]:
    """The move lines (``"kind": "mqbalance.move"``) of one sidecar's log, the first marked
    :data:`JOINED`."""
    marker = '{"kind":"mqbalance.move"'
    found = [json.loads(line[line.index(marker) :]) for line in log_text.splitlines() if marker in line]
    return [{**m, JOINED: i == 0} for i, m in enumerate(found)]


def trace_figures(
    lines: Iterable[Mapping[str, object]],
    journal: Iterable[JournalRecord],
    group: str,
    since: float = float("-inf"),
) -> TraceFigures:
    """The medians of ``group``'s move steps: its generations' time from their change (journal) and
    its sidecars' move lines (:func:`move_lines`), the revoking and the gaining apart. Only the
    generations published at ``since`` (epoch seconds: the producer's start) or later count: before
    it, a gained queue waits for the first message sent, which says nothing of the move."""
    nan = float("nan")

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else nan

    def steps(moves: list[Mapping[str, object]], names: Sequence[str]) -> dict[str, float]:
        return {
            n: median([float(v) for m in moves if isinstance(v := m.get(f"{n}Ms"), int | float)])
            for n in names
        }

    published = [r for r in journal if r.group == group and r.time >= since]
    counted = {r.generation for r in published}
    mine = [line for line in lines if line.get("group") == group and line.get("generation") in counted]
    revoking = [m for m in mine if m.get("revoked")]
    gaining = [m for m in mine if m.get("gained") and not m.get("revoked")]
    joining = [m for m in gaining if m.get(JOINED)]
    from_change = [r.since_change_seconds * 1000 for r in published if r.since_change_seconds is not None]
    return TraceFigures(
        generation_ms=median(from_change),
        old_owner_ms=steps(revoking, OLD_OWNER_STEPS),
        new_owner_ms=steps([m for m in gaining if not m.get(JOINED)], NEW_OWNER_STEPS),
        joining_ms=steps(joining, NEW_OWNER_STEPS),
        moves=len(mine),
    )
