"""Readable text for the demo: an assignment as a table, and the moves between two of them.

Pure functions of assignment documents, so they are tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mqbalance.contract import AssignmentDocument
from mqbalance.model import MessageQueue, Zones, sort_consumers, sort_queues
from mqbalance.quality import Figures, measure


@dataclass(frozen=True)
class Move:
    queue: MessageQueue
    source: str | None
    """The previous holder; None for a queue nobody held."""
    target: str | None
    """The new holder; None when nobody holds it now."""


def _holders(doc: AssignmentDocument) -> dict[MessageQueue, str]:
    return {
        mq: member for assignment in doc.topics.values() for member, qs in assignment.items() for mq in qs
    }


def _all_queues(doc: AssignmentDocument) -> dict[str, tuple[MessageQueue, ...]]:
    """Member -> its queues over every topic, in RocketMQ's order."""
    out: dict[str, list[MessageQueue]] = {member: [] for member in doc.members}
    for assignment in doc.topics.values():
        for member, queues in assignment.items():
            out.setdefault(member, []).extend(queues)
    return {member: tuple(sort_queues(qs)) for member, qs in out.items()}


def moves(before: AssignmentDocument, after: AssignmentDocument) -> list[Move]:
    """Queues whose holder changed (clustering: one holder per queue), in queue order."""
    was, now = _holders(before), _holders(after)
    changed = [mq for mq in set(was) | set(now) if was.get(mq) != now.get(mq)]
    return [Move(mq, was.get(mq), now.get(mq)) for mq in sort_queues(changed)]


def figures(before: AssignmentDocument | None, after: AssignmentDocument) -> Figures:
    zones = Zones(brokers=dict(after.broker_zones), consumers=dict(after.members))
    return measure(_all_queues(before) if before else None, _all_queues(after), zones=zones)


def compact_queues(queues: Iterable[MessageQueue]) -> str:
    """``broker-a:0,1 broker-b:3`` (per topic when several topics are involved)."""
    ordered = sort_queues(queues)
    topics = {mq.topic for mq in ordered}
    groups: dict[tuple[str, str], list[int]] = {}
    for mq in ordered:
        groups.setdefault((mq.topic, mq.broker_name), []).append(mq.queue_id)
    parts = []
    for (topic, broker), ids in groups.items():
        prefix = f"{topic}/" if len(topics) > 1 else ""
        parts.append(f"{prefix}{broker}:{','.join(str(i) for i in ids)}")
    return " ".join(parts) or "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    lines = [headers, *rows]
    return "\n".join(
        indent + "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip()
        for line in lines
    )


def assignment_table(doc: AssignmentDocument, highlight: Mapping[str, str] | None = None) -> str:
    """One row per member: zone, load, queues held outside the member's zone, the queues.

    ``highlight`` adds a note after a member (e.g. "new", "sidecar").
    """
    per_member = _all_queues(doc)
    rows = []
    for member in sort_consumers(per_member):
        zone = doc.members.get(member, "?")
        queues = per_member[member]
        cross = sum(1 for mq in queues if doc.broker_zones.get(mq.broker_name) != zone)
        note = (highlight or {}).get(member, "")
        rows.append([member, zone, str(len(queues)), str(cross), compact_queues(queues), note])
    header = f"generation {doc.generation} ({doc.strategy}, reason: {doc.reason or '-'})"
    return header + "\n" + table(["MEMBER", "ZONE", "QUEUES", "CROSS-ZONE", "HELD", ""], rows)


def moves_table(found: Sequence[Move]) -> str:
    if not found:
        return "  no queue changed owner"
    rows = [
        [
            f"{m.queue.topic}/{m.queue.broker_name}:{m.queue.queue_id}",
            m.source or "(new)",
            m.target or "(none)",
        ]
        for m in found
    ]
    return table(["QUEUE", "FROM", "TO"], rows)


def summary(before: AssignmentDocument, after: AssignmentDocument) -> str:
    """One line: how many queues moved against the fewest any balanced assignment allows."""
    fig = figures(before, after)
    # The minimum counts moves only; zone affinity may move more to keep queues in their broker's zone.
    zones_aside = " (zones aside)" if len(set(after.members.values())) > 1 else ""
    return (
        f"  {fig.moved} queue(s) moved ({fig.forced} forced by departed members); the minimum any balanced "
        f"assignment allows is {fig.minimum_moves}{zones_aside}. Loads {fig.min_load}..{fig.max_load}, "
        f"{fig.cross_zone} queue(s) held across zones."
    )
