"""Allocation strategies: a consumer group's whole assignment in one pass.

RocketMQ's clients each run an ``AllocateMessageQueueStrategy`` for themselves; every
strategy here computes the whole group at once and gives each consumer exactly the
queues RocketMQ's class would give it (STICKY is mqbalance's own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mqbalance.model import (
    INNER_STRATEGIES,
    Assignment,
    MessageModel,
    MessageQueue,
    StrategyName,
    StrategySpec,
    Zones,
    sort_consumers,
    sort_queues,
)
from mqbalance.strategies.avg import Shares, allocate_avg, allocate_avg_by_circle
from mqbalance.strategies.config import allocate_config, config_conflicts
from mqbalance.strategies.consistent_hash import HashRing, allocate_consistent_hash, md5_hash
from mqbalance.strategies.load import LoadOutcome, Loads, LoadState, balance_load
from mqbalance.strategies.machine_room import allocate_machine_room
from mqbalance.strategies.nearby import EmptyZoneError, InnerStrategy, allocate_nearby
from mqbalance.strategies.sticky import NO_ZONES, allocate_sticky, max_kept

__all__ = [
    "NO_ZONES",
    "AllocationError",
    "HashRing",
    "LoadOutcome",
    "LoadState",
    "Loads",
    "allocate",
    "allocate_group",
    "balance_group",
    "balance_load",
    "max_kept",
    "md5_hash",
]


class AllocationError(ValueError):
    """A strategy setting or input that cannot be allocated; the message says what to fix."""


def allocate(
    spec: StrategySpec,
    queues: Iterable[MessageQueue],
    consumers: Iterable[str],
    *,
    zones: Zones = NO_ZONES,
    previous: Assignment | None = None,
    message_model: MessageModel = MessageModel.CLUSTERING,
    loads: Loads | None = None,
) -> dict[str, tuple[MessageQueue, ...]]:
    """The whole group's assignment: every consumer is a key, its queues in RocketMQ's order.

    Queues and consumers are deduplicated and sorted first, as RebalanceImpl does, so
    the input order never matters. ``previous`` is used by STICKY only, ``loads`` by STICKY
    with ``load`` set, which here balances at once (no hysteresis: ``balance_group`` keeps it).
    """
    ordered_queues = sort_queues(queues)
    ordered_consumers = sort_consumers(consumers)
    _check(spec, ordered_consumers, message_model)
    if message_model == MessageModel.BROADCASTING:
        everything = tuple(ordered_queues)
        return {consumer: everything for consumer in ordered_consumers}
    shares = _shares(spec, ordered_queues, ordered_consumers, zones, previous, loads)
    if spec.name not in _IN_ORDER:
        rank = {mq: index for index, mq in enumerate(ordered_queues)}
        shares = {consumer: sorted(share, key=rank.__getitem__) for consumer, share in shares.items()}
    return {consumer: tuple(shares.get(consumer, ())) for consumer in ordered_consumers}


def allocate_group(
    spec: StrategySpec,
    topics: Mapping[str, Iterable[MessageQueue]],
    consumers: Iterable[str],
    *,
    zones: Zones = NO_ZONES,
    previous: Assignment | None = None,
    message_model: MessageModel = MessageModel.CLUSTERING,
    loads: Loads | None = None,
) -> dict[str, dict[str, tuple[MessageQueue, ...]]]:
    """A consumer group's assignment for each of its topics: topic -> consumer -> queues.

    RocketMQ's strategies allocate every topic alone, as each client's RebalanceImpl does
    for each subscribed topic. STICKY balances the group's total as well: every topic's
    loads differ by at most one, and so do the members' loads over all topics (see
    ``sticky.py``). ``previous`` holds the last assignment of every topic (queues carry
    their topic).
    """
    members = sort_consumers(consumers)
    if spec.name is StrategyName.STICKY and message_model is MessageModel.CLUSTERING and len(topics) > 1:
        everything = [mq for queues in topics.values() for mq in queues]
        whole = allocate(spec, everything, members, zones=zones, previous=previous, loads=loads)
        return _split(topics, whole)
    return {
        topic: allocate(
            spec, queues, members, zones=zones, previous=previous, message_model=message_model, loads=loads
        )
        for topic, queues in topics.items()
    }


def balance_group(
    spec: StrategySpec,
    topics: Mapping[str, Iterable[MessageQueue]],
    consumers: Iterable[str],
    *,
    loads: Loads,
    state: LoadState | None = None,
    zones: Zones = NO_ZONES,
    previous: Assignment | None = None,
    message_model: MessageModel = MessageModel.CLUSTERING,
) -> tuple[dict[str, dict[str, tuple[MessageQueue, ...]]], LoadState]:
    """One load sample of a group whose strategy is STICKY with ``load`` set: topic -> consumer ->
    queues, and the hysteresis state to pass to the next sample. The members' loads are
    balanced over all topics together (``strategies/load.py``)."""
    if spec.name is not StrategyName.STICKY or spec.load is None:
        raise AllocationError(f"balance_group needs STICKY with load set, got {spec.name}")
    members = sort_consumers(consumers)
    if any(not consumer for consumer in members):
        raise AllocationError("a consumer id is empty; every consumer needs a non-empty id")
    if message_model is MessageModel.BROADCASTING or not members:
        plain = allocate_group(spec, topics, members, zones=zones, message_model=message_model, loads=loads)
        return plain, LoadState()
    everything = [mq for queues in topics.values() for mq in queues]
    outcome = balance_load(
        everything,
        members,
        loads=loads,
        previous=previous,
        zones=zones,
        zone_affinity=spec.zone_affinity,
        settings=spec.load,
        state=state,
    )
    return _split(topics, outcome.assignment), outcome.state


def _split(
    topics: Mapping[str, Iterable[MessageQueue]], whole: Assignment
) -> dict[str, dict[str, tuple[MessageQueue, ...]]]:
    return {
        topic: {consumer: tuple(mq for mq in share if mq.topic == topic) for consumer, share in whole.items()}
        for topic in topics
    }


# These hand out subsequences of the sorted queue list, already in RocketMQ's order.
_IN_ORDER = frozenset(
    {StrategyName.AVG, StrategyName.AVG_BY_CIRCLE, StrategyName.CONSISTENT_HASH, StrategyName.MACHINE_ROOM}
)


def _check(spec: StrategySpec, consumers: list[str], message_model: MessageModel) -> None:
    if any(not consumer for consumer in consumers):
        raise AllocationError("a consumer id is empty; every consumer needs a non-empty id")
    if spec.name == StrategyName.CONFIG and message_model == MessageModel.CLUSTERING:
        conflicts = config_conflicts(spec.config)
        if conflicts:
            raise AllocationError(
                f"config gives queue {conflicts[0]} to more than one consumer; in CLUSTERING every "
                "queue has one owner, so keep each queue under one consumer"
            )
    if spec.name == StrategyName.MACHINE_ROOM_NEARBY and spec.inner not in INNER_STRATEGIES:
        choices = ", ".join(INNER_STRATEGIES)
        raise AllocationError(
            f"inner strategy {spec.inner} cannot be used by MACHINE_ROOM_NEARBY; use one of {choices}"
        )


def _inner(spec: StrategySpec) -> InnerStrategy:
    if spec.inner == StrategyName.AVG:
        return allocate_avg
    if spec.inner == StrategyName.AVG_BY_CIRCLE:
        return allocate_avg_by_circle
    virtual_nodes = spec.virtual_nodes
    return lambda queues, consumers: allocate_consistent_hash(queues, consumers, virtual_nodes)


def _shares(
    spec: StrategySpec,
    queues: list[MessageQueue],
    consumers: list[str],
    zones: Zones,
    previous: Assignment | None,
    loads: Loads | None = None,
) -> Shares:
    if not consumers:
        return {}
    name = spec.name
    if name == StrategyName.AVG:
        return allocate_avg(queues, consumers)
    if name == StrategyName.AVG_BY_CIRCLE:
        return allocate_avg_by_circle(queues, consumers)
    if name == StrategyName.CONSISTENT_HASH:
        return allocate_consistent_hash(queues, consumers, spec.virtual_nodes)
    if name == StrategyName.CONFIG:
        return allocate_config(queues, consumers, spec.config)
    if name == StrategyName.MACHINE_ROOM:
        return allocate_machine_room(queues, consumers, spec.consumer_idcs)
    if name == StrategyName.MACHINE_ROOM_NEARBY:
        try:
            return allocate_nearby(queues, consumers, zones, _inner(spec))
        except EmptyZoneError as error:
            raise AllocationError(f"{error}; name a zone or leave it out to mean 'unknown'") from None
    if name == StrategyName.STICKY and spec.load is not None:
        once = LoadState(over=spec.load.samples)  # one call: the imbalance counts as lasting
        outcome = balance_load(
            queues,
            consumers,
            loads=loads or {},
            previous=previous,
            zones=zones,
            zone_affinity=spec.zone_affinity,
            settings=spec.load,
            state=once,
        )
        return {consumer: list(share) for consumer, share in outcome.assignment.items()}
    if name == StrategyName.STICKY:
        return allocate_sticky(
            queues, consumers, previous=previous, zones=zones, zone_affinity=spec.zone_affinity
        )
    raise AllocationError(f"unknown strategy {name!r}; use one of {', '.join(StrategyName)}")
