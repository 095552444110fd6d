"""Replay a group's history through every strategy, in one process.

This is the reference the Spark job must equal event by event: Spark only
decides which process replays which group; every figure comes from here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from mqbalance.model import (
    Assignment,
    LoadBalance,
    MessageModel,
    MessageQueue,
    StrategyName,
    StrategySpec,
    Zones,
)
from mqbalance.pipeline.events import Event, sort_events, strategy_spec
from mqbalance.quality import measure
from mqbalance.strategies import Loads, LoadState, allocate_group, balance_group

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

LOAD_CANDIDATE = StrategySpec(StrategyName.STICKY, zone_affinity=True, load=LoadBalance())
"""Replayed, beside the others, at the events that carry per-queue rates: each event is one
sample, and its hysteresis state is carried from event to event."""


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
    if name is StrategyName.STICKY:
        label = "STICKY+zoneAffinity" if spec.zone_affinity else name.value
        if spec.load is not None:
            label += "+load"
            if spec.load != LoadBalance():
                load = spec.load
                label += (
                    f"(tolerance={load.tolerance:g},samples={load.samples},"
                    f"maxQueueFactor={load.max_queue_factor:g})"
                )
        return label
    return name.value


CANDIDATE_LABELS: tuple[str, ...] = tuple(strategy_label(s) for s in CANDIDATES)
LOAD_LABEL = strategy_label(LOAD_CANDIDATE)


class FigureRow(NamedTuple):
    """Figures of one event under one strategy, for the group as a whole (loads count every
    topic's queues together; ``spread`` is the larger of the total spread and the most uneven
    topic's, so a value over 1 means not balanced in the sense of ``quality.py``)."""

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
    load_spread: float = 0.0
    """The busiest member's rate over the mean member's (1 is even); 0 where the event carries no
    rates or they add up to 0."""


FIGURE_SCHEMA = (
    "namespace string, group string, seq long, time double, reason string, strategy string, "
    "current boolean, members long, queues long, held long, moved long, forced long, "
    "minimum_moves long, spread long, min_load long, max_load long, cross_zone long, unassigned long, "
    "load_spread double"
)
FIGURE_COLUMNS: tuple[str, ...] = FigureRow._fields


class ReplayError(ValueError):
    """A journal state a strategy cannot allocate; the message names the group and event."""


def replay_group(events: Iterable[Event]) -> Iterator[FigureRow]:
    """Figures of every event of one group (any order in, time order out) under every strategy."""
    previous: dict[str, dict[str, Assignment]] = {}
    states: dict[str, LoadState] = {}
    for event in sorted(events, key=lambda e: (e.time, e.seq)):
        own = strategy_spec(event.strategy, event.message_model)
        own_label = strategy_label(own)
        specs = list(zip(CANDIDATE_LABELS, CANDIDATES, strict=True))
        loads = event.loads()
        if loads:
            specs.append((LOAD_LABEL, LOAD_CANDIDATE))
        if own_label not in {label for label, _ in specs}:
            specs.append((own_label, own))
        zones = Zones(brokers=event.broker_zones, consumers=event.members)
        model = MessageModel(event.message_model)
        topics = {topic: event.queues_of(topic) for topic in event.topics}
        for label, spec in specs:
            before = previous.setdefault(label, {})
            yield _figures(
                event, label, label == own_label, spec, topics, zones, model, before, loads, states
            )


def _figures(
    event: Event,
    label: str,
    current: bool,
    spec: StrategySpec,
    topics: dict[str, list[MessageQueue]],
    zones: Zones,
    model: MessageModel,
    before: dict[str, Assignment],
    loads: Loads,
    states: dict[str, LoadState],
) -> FigureRow:
    previous = _merged(before.values())
    try:
        if spec.load is not None and spec.name is StrategyName.STICKY:
            now, states[label] = balance_group(
                spec,
                topics,
                event.members,
                loads=loads,
                state=states.get(label),
                zones=zones,
                previous=previous,
                message_model=model,
            )
        else:
            now = allocate_group(
                spec, topics, event.members, zones=zones, previous=previous, message_model=model, loads=loads
            )
    except ValueError as e:
        raise ReplayError(f"{event.namespace}/{event.group} event {event.seq}, {label}: {e}") from e
    current_all = _merged(now.values())
    queues = [mq for qs in topics.values() for mq in qs]
    f = measure(previous or None, current_all, zones=zones, queues=queues, message_model=model)
    before.clear()
    before.update(now)
    return FigureRow(
        event.namespace,
        event.group,
        event.seq,
        event.time,
        event.reason,
        label,
        current,
        len(event.members),
        f.queues,
        sum(len(share) for share in current_all.values()),
        f.moved,
        f.forced,
        f.minimum_moves,
        max(f.spread, f.topic_spread),
        f.min_load,
        f.max_load,
        f.cross_zone,
        f.unassigned,
        load_spread(current_all, loads),
    )


def load_spread(assignment: Assignment, loads: Loads) -> float:
    """The busiest member's load over the mean member load; 0 with no members or no load."""
    totals = [sum(loads.get(mq, 0.0) for mq in share) for share in assignment.values()]
    total = sum(totals)
    if not totals or total <= 0:
        return 0.0
    return max(totals) / (total / len(totals))


def _merged(assignments: Iterable[Assignment]) -> dict[str, tuple[MessageQueue, ...]]:
    """Each member's queues of every topic (queues carry their topic)."""
    out: dict[str, list[MessageQueue]] = {}
    for assignment in assignments:
        for member, share in assignment.items():
            out.setdefault(member, []).extend(share)
    return {member: tuple(share) for member, share in out.items()}


def replay(events: Iterable[Event]) -> Iterator[FigureRow]:
    """Figures of every group's events; groups in (namespace, group) order."""
    for _, group in itertools.groupby(sort_events(events), key=lambda e: (e.namespace, e.group)):
        yield from replay_group(group)
