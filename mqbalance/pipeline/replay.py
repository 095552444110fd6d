"""Replay a group's history through every strategy, in one process.

This is the reference the Spark job must equal event by event: Spark only
decides which process replays which group; every figure comes from here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from mqbalance.model import Assignment, MessageModel, MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.pipeline.events import Event, sort_events, strategy_spec
from mqbalance.quality import measure
from mqbalance.strategies import allocate

CANDIDATES: tuple[StrategySpec, ...] = (
    StrategySpec(StrategyName.AVG),
    StrategySpec(StrategyName.AVG_BY_CIRCLE),
    StrategySpec(StrategyName.CONSISTENT_HASH),
    StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.AVG),
    StrategySpec(StrategyName.STICKY),
    StrategySpec(StrategyName.STICKY, zone_affinity=True),
)
"""Replayed for every group. CONFIG and MACHINE_ROOM need the group's own settings,
so they are replayed only where the journal says the group runs them."""


def strategy_label(spec: StrategySpec) -> str:
    """A short name that tells replayed variants apart (parameters only where not the default)."""
    name = spec.name
    if name is StrategyName.CONSISTENT_HASH and spec.virtual_nodes != 10:
        return f"CONSISTENT_HASH(virtualNodes={spec.virtual_nodes})"
    if name is StrategyName.MACHINE_ROOM_NEARBY:
        if spec.inner is StrategyName.AVG:
            return name.value
        if spec.inner is StrategyName.CONSISTENT_HASH and spec.virtual_nodes != 10:
            return f"MACHINE_ROOM_NEARBY({spec.inner.value},virtualNodes={spec.virtual_nodes})"
        return f"MACHINE_ROOM_NEARBY({spec.inner.value})"
    if name is StrategyName.MACHINE_ROOM:
        return f"MACHINE_ROOM({','.join(sorted(spec.consumer_idcs))})"
    if name is StrategyName.STICKY and spec.zone_affinity:
        return "STICKY+zoneAffinity"
    return name.value


CANDIDATE_LABELS: tuple[str, ...] = tuple(strategy_label(s) for s in CANDIDATES)


class FigureRow(NamedTuple):
    """Figures of one event under one strategy, summed over the group's topics
    (``spread`` and ``max_load``: the worst topic; ``min_load``: the lightest)."""

    namespace: str
    group: str
    seq: int
    time: float
    reason: str
    strategy: str
    current: bool
    """This is the strategy the group ran at this event."""
    members: int
    queues: int
    held: int
    """Queue holdings (a queue held by two members counts twice, as in BROADCASTING)."""
    moved: int
    forced: int
    minimum_moves: int
    spread: int
    min_load: int
    max_load: int
    cross_zone: int
    unassigned: int


FIGURE_SCHEMA = (
    "namespace string, group string, seq long, time double, reason string, strategy string, "
    "current boolean, members long, queues long, held long, moved long, forced long, "
    "minimum_moves long, spread long, min_load long, max_load long, cross_zone long, unassigned long"
)
FIGURE_COLUMNS: tuple[str, ...] = FigureRow._fields


class ReplayError(ValueError):
    """A journal state a strategy cannot allocate; the message names the group and event."""


def replay_group(events: Iterable[Event]) -> Iterator[FigureRow]:
    """Figures of every event of one group (any order in, time order out) under every strategy."""
    previous: dict[str, dict[str, Assignment]] = {}
    for event in sorted(events, key=lambda e: (e.time, e.seq)):
        own = strategy_spec(event.strategy)
        own_label = strategy_label(own)
        specs = list(zip(CANDIDATE_LABELS, CANDIDATES, strict=True))
        if own_label not in CANDIDATE_LABELS:
            specs.append((own_label, own))
        zones = Zones(brokers=event.broker_zones, consumers=event.members)
        model = MessageModel(event.message_model)
        topics = {topic: event.queues_of(topic) for topic in event.topics}
        for label, spec in specs:
            before = previous.setdefault(label, {})
            yield _figures(event, label, label == own_label, spec, topics, zones, model, before)


def _figures(
    event: Event,
    label: str,
    current: bool,
    spec: StrategySpec,
    topics: dict[str, list[MessageQueue]],
    zones: Zones,
    model: MessageModel,
    before: dict[str, Assignment],
) -> FigureRow:
    held = moved = forced = least = cross = unassigned = queue_count = spread = max_load = 0
    min_load: int | None = None
    for topic, queues in topics.items():
        try:
            now = allocate(
                spec, queues, event.members, zones=zones, previous=before.get(topic), message_model=model
            )
        except ValueError as e:
            raise ReplayError(
                f"{event.namespace}/{event.group} event {event.seq}, {label}, topic {topic!r}: {e}"
            ) from e
        f = measure(before.get(topic), now, zones=zones, queues=queues, message_model=model)
        before[topic] = now
        queue_count += f.queues
        held += sum(len(share) for share in now.values())
        moved += f.moved
        forced += f.forced
        least += f.minimum_moves
        cross += f.cross_zone
        unassigned += f.unassigned
        spread = max(spread, f.spread)
        max_load = max(max_load, f.max_load)
        min_load = f.min_load if min_load is None else min(min_load, f.min_load)
    for gone in set(before) - set(topics):
        del before[gone]
    return FigureRow(
        event.namespace,
        event.group,
        event.seq,
        event.time,
        event.reason,
        label,
        current,
        len(event.members),
        queue_count,
        held,
        moved,
        forced,
        least,
        spread,
        min_load or 0,
        max_load,
        cross,
        unassigned,
    )


def replay(events: Iterable[Event]) -> Iterator[FigureRow]:
    """Figures of every group's events; groups in (namespace, group) order."""
    for _, group in itertools.groupby(sort_events(events), key=lambda e: (e.namespace, e.group)):
        yield from replay_group(group)
