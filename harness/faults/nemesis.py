"""Scoring of the nemesis suite: owner-side figures from what the consumer apps recorded.

Each consumer app (harness/apps/consumer_app.py) records, per queue, the intervals during which it
processed batches under a valid grant; the runner (tests/node/test_nemesis.py) scrapes every
app's record during a round. Pure functions here turn those snapshots into :class:`Interval`
values and score a fault's round:

- **overlapping owners**: two different pods whose processing intervals of one queue overlap in
  time. An interval ends at the end of its last batch, which a client honouring the grant never
  starts unless the grant outlasts it; an app that died with an interval open is taken to have
  processed until the first moment it was known dead (its first failed scrape, or the start of
  its container's next run), an upper bound, so a missed overlap is impossible and a false one
  costs at most one scrape period.
- **longest time unconsumed**: per queue, the longest stretch inside the round during which no
  pod processed it, with the queue and the stretch, compared with
  ``leaseSeconds + leaseMarginSeconds + 2 x the one-step latency`` (:func:`gap_bound`).

With real messages (a producer sending keyed messages, the apps pulling them from the broker and
reporting every message they processed: :class:`Sent`, :class:`Processed`) it also scores what
happened to the messages (:func:`message_score`):

- **lost**: sent and acknowledged by the broker (its queue and offset known from the answer) but
  never processed by anyone by the end;
- **duplicates**, by cause: a queue offset processed again by the same run of a pod, by the same
  pod after its container restarted, or by another pod;
- **order violations**: a message processed for the first time while a later message of the same
  key in the same queue (a higher sequence number) had already been processed. Processing a
  message again (a duplicate) is not counted here: a redelivery replays in order from the replay
  point, and it is counted as a duplicate.

Times are Unix seconds: every node of a ``RealNode`` cluster is a network namespace on the one
machine, so the apps and the runner read the same clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Interval:
    """``member`` (a pod; ``boot`` tells its container's runs apart) processed ``queue`` from
    ``start`` to ``end``; ``open`` when it was still processing at the last snapshot."""

    member: str
    boot: float
    queue: str
    start: float
    end: float
    open: bool = False
    generation: int | None = None
    """The generation of the view the app processed under when the interval began."""


@dataclass(frozen=True)
class Overlap:
    queue: str
    first: Interval
    second: Interval

    @property
    def start(self) -> float:
        return max(self.first.start, self.second.start)

    @property
    def seconds(self) -> float:
        return min(self.first.end, self.second.end) - self.start


@dataclass(frozen=True)
class Gap:
    """``queue`` went unprocessed from ``start`` to ``end``."""

    queue: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Snapshots:
    """What the runner scraped from one pod's app: the last record of each run (``boot``), when it
    was read, and when a read of that run first failed after it (None while it answers)."""

    member: str
    records: dict[float, dict[str, Any]] = field(default_factory=dict)
    read_at: dict[float, float] = field(default_factory=dict)
    failed_at: dict[float, float] = field(default_factory=dict)

    def add(self, record: dict[str, Any], at: float) -> None:
        boot = float(record["boot"])
        self.records[boot] = record
        self.read_at[boot] = at
        self.failed_at.pop(boot, None)

    def failed(self, at: float) -> None:
        """A read that got no answer: the latest run may be stopped, restarting or dead."""
        if self.records:
            latest = max(self.records)
            self.failed_at.setdefault(latest, at)


def intervals(snapshots: Iterable[Snapshots], alive: Mapping[str, bool]) -> list[Interval]:
    """Every interval the snapshots hold. A run is dead when a later run of the same pod answered
    or ``alive[member]`` is False (its pod is gone); a dead run's open intervals end when it was
    first known dead: the next run's start, else its first failed read, else its last read."""
    found: list[Interval] = []
    for snap in snapshots:
        boots = sorted(snap.records)
        for index, boot in enumerate(boots):
            record = snap.records[boot]
            later = boots[index + 1] if index + 1 < len(boots) else None
            dead = later is not None or not alive.get(snap.member, True)
            bounds = [b for b in (later, snap.failed_at.get(boot)) if b is not None]
            known_dead = min(bounds) if bounds else snap.read_at[boot]
            for item in record["intervals"]:
                still_open = bool(item.get("open"))
                end = float(item["end"])
                if still_open and dead:
                    end = max(end, known_dead)
                generation = item.get("generation")
                found.append(
                    Interval(
                        snap.member,
                        boot,
                        str(item["queue"]),
                        float(item["start"]),
                        end,
                        still_open and not dead,
                        None if generation is None else int(generation),
                    )
                )
    return found


def overlaps(found: Iterable[Interval], since: float | None = None) -> list[Overlap]:
    """Pairs of intervals of one queue held by two different members at overlapping times (the
    overlap ending after ``since`` when given); intervals that merely touch do not overlap."""
    by_queue: dict[str, list[Interval]] = {}
    for item in found:
        by_queue.setdefault(item.queue, []).append(item)
    result: list[Overlap] = []
    for queue, items in sorted(by_queue.items()):
        items.sort(key=lambda i: (i.start, i.end))
        for index, first in enumerate(items):
            for second in items[index + 1 :]:
                if second.start >= first.end:
                    break
                if second.member == first.member:
                    continue
                pair = Overlap(queue, first, second)
                if pair.seconds > 0 and (since is None or pair.start + pair.seconds > since):
                    result.append(pair)
    return result


def gaps(found: Iterable[Interval], queues: Iterable[str], start: float, end: float) -> list[Gap]:
    """Each queue's longest stretch inside [start, end] processed by nobody (zero-length when it
    was always processed), longest first."""
    covering: dict[str, list[tuple[float, float]]] = {q: [] for q in queues}
    for item in found:
        if item.queue in covering and item.end > start and item.start < end:
            covering[item.queue].append((max(item.start, start), min(item.end, end)))
    result = []
    for queue, spans in covering.items():
        longest = Gap(queue, start, start)
        reached = start
        for lo, hi in sorted(spans):
            if lo > reached and lo - reached > longest.seconds:
                longest = Gap(queue, reached, lo)
            reached = max(reached, hi)
        if end - reached > longest.seconds:
            longest = Gap(queue, reached, end)
        result.append(longest)
    return sorted(result, key=lambda g: (-g.seconds, g.queue))


def gap_bound(lease: float, margin: float, step: float) -> float:
    """The longest a queue may go unprocessed once the operator has acted on a fault: the lease
    and its margin (an owner that cannot release) plus two steps (revoke, then assign)."""
    return lease + margin + 2 * step


def step_latency(found: Iterable[Interval], computed_at: Mapping[int, float]) -> float:
    """The one-step latency: the longest time from a generation's ``computedAt`` until an app began
    processing a queue under it (the operator's write, the sidecar's watch, the app's long-poll and
    its next batch), over the generations ``computed_at`` names."""
    delays = [
        item.start - at
        for item in found
        if item.generation is not None
        and (at := computed_at.get(item.generation)) is not None
        and item.start >= at
    ]
    if not delays:
        raise ValueError("no app began processing under these generations: no one-step latency to measure")
    return max(delays)


@dataclass(frozen=True)
class FaultScore:
    fault: str
    delay: float
    """The random delay before the fault, seconds."""
    fault_at: float
    intervals: int
    overlaps: list[Overlap]
    longest: Gap
    detected_after: float | None
    """From the fault to the revocation that took the victim's queues (None: nothing revoked)."""
    held: float
    """How long the fault lasted: from the fault to its heal (resume, restart) returning."""
    step: float
    """The one-step latency the bound allows (:func:`step_latency`)."""

    @property
    def bound(self) -> float:
        return gap_bound(self.lease, self.margin, self.step)

    lease: float = 0.0
    margin: float = 0.0
    group: str = ""
    messages: MessageScore | None = None
    """What happened to the messages of the round (None: no messages in this run)."""
    unexplained: int = 0
    """Duplicates not among a killed run's in-flight messages (:func:`only_in_flight`)."""

    @property
    def after_detection(self) -> float:
        """The part of the longest gap after the operator acted (all of it when nothing was revoked)."""
        if self.detected_after is None:
            return self.longest.seconds
        return min(self.longest.seconds, self.longest.end - (self.fault_at + self.detected_after))


def table(scores: Sequence[FaultScore]) -> str:
    """The per-fault table the runner prints and docs/reliability.md copies."""
    head = (
        "fault",
        "group",
        "delay s",
        "held s",
        "overlapping owners",
        "longest unconsumed s",
        "fault to revocation s",
        "unconsumed after revocation s",
        "one step s",
        "bound s",
        "sent",
        "lost",
        "duplicates same run/after restart/two pods",
        "order violations",
        "longest wait s",
    )
    rows = []
    for s in scores:
        m = s.messages
        dups = "-" if m is None else "/".join(str(n) for n in m.by_cause().values())
        rows.append(
            (
                s.fault,
                s.group,
                f"{s.delay:.2f}",
                f"{s.held:.1f}",
                str(len(s.overlaps)),
                f"{s.longest.seconds:.1f} ({s.longest.queue})",
                "-" if s.detected_after is None else f"{s.detected_after:.1f}",
                f"{s.after_detection:.1f}",
                f"{s.step:.2f}",
                f"{s.bound:.1f}",
                "-" if m is None else str(m.sent),
                "-" if m is None else str(len(m.lost)),
                dups,
                "-" if m is None else str(len(m.order_violations)),
                "-" if m is None or m.longest_wait is None else f"{m.longest_wait:.1f}",
            )
        )
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *rows)
    )


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """A message the broker acknowledged: stored in ``queue`` at ``offset``; ``key``'s ``seq``-th."""

    queue: str
    offset: int
    key: str
    seq: int
    at: float


@dataclass(frozen=True)
class Processed:
    """``member`` (run ``boot``) processed the message at ``queue``/``offset`` at ``at``."""

    member: str
    boot: float
    queue: str
    offset: int
    key: str
    seq: int
    at: float


DUPLICATE_CAUSES = ("same run", "after restart", "two pods")


@dataclass(frozen=True)
class Duplicate:
    first: Processed
    again: Processed

    @property
    def cause(self) -> str:
        if self.first.member != self.again.member:
            return "two pods"
        return "same run" if self.first.boot == self.again.boot else "after restart"


@dataclass(frozen=True)
class OrderViolation:
    """``late`` was processed for the first time after ``ahead``, a later message of its key."""

    ahead: Processed
    late: Processed


@dataclass(frozen=True)
class MessageScore:
    sent: int
    processed: int
    lost: list[Sent]
    duplicates: list[Duplicate]
    order_violations: list[OrderViolation]
    longest_wait: float | None = None
    """The longest a message sent in the window waited until first processed (None: none was)."""

    def by_cause(self) -> dict[str, int]:
        counts = Counter(d.cause for d in self.duplicates)
        return {cause: counts.get(cause, 0) for cause in DUPLICATE_CAUSES}


def message_score(
    sent: Iterable[Sent],
    processed: Iterable[Processed],
    start: float | None = None,
    end: float | None = None,
) -> MessageScore:
    """Lost, duplicates and order violations over the whole record; with ``start``/``end`` only
    the ones that belong to that window count: a message lost when it was sent in it, a duplicate
    or an order violation when its later processing happened in it."""

    def inside(at: float) -> bool:
        return (start is None or at >= start) and (end is None or at < end)

    done = sorted(processed, key=lambda p: (p.at, p.queue, p.offset))
    first: dict[tuple[str, int], Processed] = {}
    duplicates: list[Duplicate] = []
    violations: list[OrderViolation] = []
    ahead: dict[tuple[str, str], Processed] = {}
    for item in done:
        where = (item.queue, item.offset)
        if where in first:
            if inside(item.at):
                duplicates.append(Duplicate(first[where], item))
            continue
        first[where] = item
        highest = ahead.get((item.queue, item.key))
        if highest is not None and highest.seq > item.seq:
            if inside(item.at):
                violations.append(OrderViolation(highest, item))
        else:
            ahead[(item.queue, item.key)] = item
    all_sent = [s for s in sent if inside(s.at)]
    lost = sorted(
        (s for s in all_sent if (s.queue, s.offset) not in first), key=lambda s: (s.queue, s.offset)
    )
    in_window = sum(1 for p in done if inside(p.at))
    waits = [first[(s.queue, s.offset)].at - s.at for s in all_sent if (s.queue, s.offset) in first]
    return MessageScore(len(all_sent), in_window, lost, duplicates, violations, max(waits, default=None))


@dataclass(frozen=True)
class CutRun:
    """An app run (``pod``, ``boot``) a fault killed or cut off mid-batch: the last batch of each
    queue it reported by ``until`` (None: the run ended) may be processed again by another."""

    pod: str
    boot: float
    until: float | None = None


@dataclass(frozen=True)
class Batch:
    """Messages ``member`` (run ``boot``) processed of ``queue`` and reported together, as they
    came to the collector at ``came``."""

    member: str
    boot: float
    queue: str
    came: float
    offsets: frozenset[int]


def in_flight(
    batches: Iterable[Batch], runs: Iterable[CutRun]
) -> dict[tuple[str, float], set[tuple[str, int]]]:
    """(member, boot) of each cut run -> the (queue, offset)s of its last batch of every queue
    that came by its ``until``: processed and reported, the commit after it may not have happened.
    A run cut off goes on after the heal, so its later batches (of the same queue, too) do not
    count."""
    last: dict[tuple[str, float, str], Batch] = {}
    cut = {(r.pod, r.boot): r.until for r in runs}
    for batch in batches:
        key = (batch.member, batch.boot)
        if key in cut and ((until := cut[key]) is None or batch.came <= until):
            last[(batch.member, batch.boot, batch.queue)] = batch
    result: dict[tuple[str, float], set[tuple[str, int]]] = {}
    for batch in last.values():
        result.setdefault((batch.member, batch.boot), set()).update((batch.queue, o) for o in batch.offsets)
    return result


def only_in_flight(
    duplicates: Iterable[Duplicate], in_flight: Mapping[tuple[str, float], set[tuple[str, int]]]
) -> list[Duplicate]:
    """The duplicates that are *not* explained by a killed run's in-flight messages: ``in_flight``
    maps (member, boot) of a run that died to the (queue, offset) it had processed but not
    committed when it died; an empty answer means every duplicate was one of those."""
    return [
        d
        for d in duplicates
        if (d.first.queue, d.first.offset) not in in_flight.get((d.first.member, d.first.boot), set())
    ]
