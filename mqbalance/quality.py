"""Quality figures of an assignment change: movement, balance and zone locality.

Definitions (STICKY is built to meet ``minimum_moves`` exactly):

- a queue *moved* when it was held before and is held now, and none of its holders now
  held it before; a queue nobody held before is new, never a move;
- a move is *forced* when none of the queue's previous holders is still a member;
- *balanced* means loads differ by at most one in every topic (``topic_spread`` <= 1) and in
  total over all topics (``spread`` <= 1), which any group allows (STICKY meets both);
- ``minimum_moves`` is the fewest moves any balanced assignment of the current queues over
  the current members allows from ``previous``;
- ``cross_zone`` counts holdings whose consumer's zone differs from the broker's zone.

In BROADCASTING every member holds every queue, so nothing moves: ``moved``, ``forced``
and ``minimum_moves`` are 0; loads and ``cross_zone`` count every member's holdings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from mqbalance.model import Assignment, MessageModel, MessageQueue, Zones, sort_consumers, sort_queues
from mqbalance.strategies import NO_ZONES, max_kept


@dataclass(frozen=True, slots=True)
class Figures:
    members: int
    """Consumers in the current assignment."""
    queues: int
    """Queues to be held."""
    moved: int
    forced: int
    minimum_moves: int
    spread: int
    """max_load - min_load: the members' loads counting every topic's queues together."""
    min_load: int
    max_load: int
    topic_spread: int
    """The largest spread within one topic (most minus fewest of its queues held by one member)."""
    cross_zone: int
    unassigned: int
    """Queues nobody holds."""

    def to_json(self) -> dict[str, int]:
        """camelCase keys, as the allocate tool and the status figures print them."""
        return {_camel(key): value for key, value in asdict(self).items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _holders(assignment: Assignment) -> dict[MessageQueue, set[str]]:
    holders: dict[MessageQueue, set[str]] = {}
    for consumer, share in assignment.items():
        for mq in share:
            holders.setdefault(mq, set()).add(consumer)
    return holders


def minimum_moves(
    previous: Assignment | None, queues: Iterable[MessageQueue], consumers: Iterable[str]
) -> int:
    """The fewest moves any balanced assignment of ``queues`` over ``consumers`` allows."""
    ordered_queues = sort_queues(queues)
    ordered_consumers = sort_consumers(consumers)
    if not previous or not ordered_consumers:
        return 0
    held_before = _holders(previous)
    carried = sum(1 for mq in ordered_queues if mq in held_before)
    return carried - max_kept(ordered_queues, ordered_consumers, previous)


def measure(
    previous: Assignment | None,
    current: Assignment,
    *,
    zones: Zones = NO_ZONES,
    queues: Iterable[MessageQueue] | None = None,
    message_model: MessageModel = MessageModel.CLUSTERING,
) -> Figures:
    """Figures for going from ``previous`` to ``current``.

    ``queues`` is the full queue set to be held; by default, the queues ``current`` holds.
    """
    now = _holders(current)
    queue_set = set(now) if queues is None else set(queues)
    loads = [len(share) for share in current.values()] or [0]
    per_topic: dict[str, dict[str, int]] = {}
    for consumer, share in current.items():
        for mq in share:
            topic_loads = per_topic.setdefault(mq.topic, {})
            topic_loads[consumer] = topic_loads.get(consumer, 0) + 1
    topic_spread = max(
        (
            max(topic_loads.values()) - (min(topic_loads.values()) if len(topic_loads) == len(current) else 0)
            for topic_loads in per_topic.values()
        ),
        default=0,
    )
    cross_zone = sum(
        1
        for consumer, share in current.items()
        for mq in share
        if zones.of_consumer(consumer) != zones.of_broker(mq.broker_name)
    )
    moved = forced = least = 0
    if previous and message_model == MessageModel.CLUSTERING:
        before = _holders(previous)
        for mq in queue_set:
            was, holds = before.get(mq), now.get(mq)
            if was and holds and not (was & holds):
                moved += 1
                if not any(consumer in current for consumer in was):
                    forced += 1
        least = minimum_moves(previous, queue_set, current)
    return Figures(
        members=len(current),
        queues=len(queue_set),
        moved=moved,
        forced=forced,
        minimum_moves=least,
        spread=max(loads) - min(loads),
        min_load=min(loads),
        max_load=max(loads),
        topic_spread=topic_spread,
        cross_zone=cross_zone,
        unassigned=sum(1 for mq in queue_set if mq not in now),
    )
