"""What the STICKY property tests share: the strategy specs, a case's shape, what a case is drawn
from (queues, a previous assignment, zones), the cost of an assignment and the exhaustive search
they are checked against."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

from hypothesis import strategies as st

from mqbalance.contract.document import owners
from mqbalance.model import MessageQueue, StrategyName, StrategySpec, Zones

STICKY = StrategySpec(StrategyName.STICKY)
AFFINE = StrategySpec(StrategyName.STICKY, zone_affinity=True)

Shares = Mapping[str, Sequence[MessageQueue]]
Case = tuple[list[MessageQueue], list[str], dict[str, tuple[MessageQueue, ...]], Zones]
"""Queues, consumers, the previous assignment (holders may have left) and the zones."""


def queue_lists(
    brokers: Sequence[str], ids: int, max_size: int, min_size: int = 0
) -> st.SearchStrategy[list[MessageQueue]]:
    """Distinct queues of topic ``t`` on ``brokers``, with ids below ``ids``."""
    queues = st.builds(MessageQueue, st.just("t"), st.sampled_from(brokers), st.integers(0, ids - 1))
    return st.lists(queues, min_size=min_size, max_size=max_size, unique=True)


@st.composite
def held_once(
    draw: st.DrawFn, queues: Sequence[MessageQueue], holders: Sequence[str], gone: int
) -> dict[str, list[MessageQueue]]:
    """A previous assignment of ``queues`` and of ``gone`` queues of a broker that is gone: each held
    by one of ``holders`` (who may have left) or by nobody."""
    previous: dict[str, list[MessageQueue]] = {}
    for mq in [*queues, *(MessageQueue("t", "gone", i) for i in range(gone))]:
        holder = draw(st.none() | st.sampled_from(holders))
        if holder is not None:
            previous.setdefault(holder, []).append(mq)
    return previous


def zone_maps(
    brokers: Sequence[str],
    consumers: Sequence[str],
    broker_zones: Sequence[str],
    consumer_zones: Sequence[str] | None = None,
) -> st.SearchStrategy[Zones]:
    """The zones of some of ``brokers`` and of some of ``consumers``; the others' zone is unknown."""
    return st.builds(
        Zones,
        st.dictionaries(st.sampled_from(brokers), st.sampled_from(broker_zones)),
        st.dictionaries(st.sampled_from(consumers), st.sampled_from(consumer_zones or broker_zones)),
    )


def cost(assignment: Shares, previous: Shares, zones: Zones) -> tuple[int, int]:
    """(cross-zone placements, moves) of an exactly-once assignment."""
    before = owners(previous)
    cross = moves = 0
    for consumer, share in assignment.items():
        for mq in share:
            cross += zones.of_consumer(consumer) != zones.of_broker(mq.broker_name)
            moves += bool(before.get(mq)) and consumer not in before[mq]
    return cross, moves


def least_costs(
    queues: list[MessageQueue],
    consumers: list[str],
    previous: Shares,
    zones: Zones,
    admissible: Callable[[dict[str, list[MessageQueue]]], bool],
) -> tuple[tuple[int, int] | None, int | None]:
    """Least (cross-zone, moves) and least moves over every admissible assignment of ``queues``,
    each to one of ``consumers`` (None when none is admissible)."""
    best_pair: tuple[int, int] | None = None
    best_moves: int | None = None
    for choice in itertools.product(range(len(consumers)), repeat=len(queues)):
        assignment = {
            c: [q for q, o in zip(queues, choice, strict=True) if o == i] for i, c in enumerate(consumers)
        }
        if not admissible(assignment):
            continue
        pair = cost(assignment, previous, zones)
        best_pair = pair if best_pair is None else min(best_pair, pair)
        best_moves = pair[1] if best_moves is None else min(best_moves, pair[1])
    return best_pair, best_moves
