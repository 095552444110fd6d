"""STICKY's typed zone network against the exact per-consumer network it replaces."""

from __future__ import annotations

import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import MessageQueue, Zones, sort_consumers, sort_queues
from mqbalance.strategies import allocate
from mqbalance.strategies.sticky import allocate_transport, previous_holders
from mqbalance.strategies.sticky_zones import _deal, allocate_zone_sticky
from tests.unit.sticky_support import AFFINE, Case, Shares, held_once, queue_lists, zone_maps

BROKERS = tuple(f"broker-{i}" for i in range(6))
POOL = tuple(f"pod-{i}" for i in range(10))
ZONE_NAMES = ("z1", "z2", "z3", "z4")


@st.composite
def medium_cases(draw: st.DrawFn) -> Case:
    queues = draw(queue_lists(BROKERS, 12, 60))
    consumers = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=8, unique=True))
    # One holder per queue, often a pod that has left; some queues are new. Few holders
    # make large holdings, where the one-more slots and the clipping matter.
    holding = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=len(POOL), unique=True))
    previous = draw(held_once(queues, holding, gone=3))
    zones = draw(zone_maps(BROKERS, POOL, ZONE_NAMES))
    return queues, consumers, {c: tuple(share) for c, share in previous.items()}, zones


def objectives(assignment: Shares, previous: Shares, zones: Zones) -> tuple[int, int]:
    """(queues placed in their broker's zone, moves) of an exactly-once assignment."""
    before = {mq: consumer for consumer, share in previous.items() for mq in share}
    in_zone = moves = 0
    for consumer, share in assignment.items():
        for mq in share:
            in_zone += zones.of_consumer(consumer) == zones.of_broker(mq.broker_name)
            moves += mq in before and before[mq] != consumer
    return in_zone, moves


def assert_balanced(assignment: Shares, queues: Sequence[MessageQueue], consumers: Sequence[str]) -> None:
    loads = [len(assignment.get(consumer, ())) for consumer in consumers]
    assert max(loads) - min(loads) <= 1
    assert sorted(mq for share in assignment.values() for mq in share) == sorted(set(queues))


@settings(max_examples=150, deadline=None)
@given(medium_cases())
def test_typed_network_matches_the_exact_network(case: Case) -> None:
    queues, consumers, previous, zones = case
    ordered_queues, ordered_consumers = sort_queues(queues), sort_consumers(consumers)
    holders = previous_holders(previous, ordered_consumers)
    fast = allocate_zone_sticky(ordered_queues, ordered_consumers, holders, zones)
    exact = allocate_transport(ordered_queues, ordered_consumers, holders, zones, True)
    assert_balanced(fast, queues, consumers)
    assert_balanced(exact, queues, consumers)
    assert objectives(fast, previous, zones) == objectives(exact, previous, zones)


@settings(max_examples=40, deadline=None)
@given(medium_cases(), st.randoms(use_true_random=False))
def test_zone_sticky_is_deterministic_whatever_the_input_order(case: Case, rnd: random.Random) -> None:
    queues, consumers, previous, zones = case
    first = allocate(AFFINE, queues, consumers, previous=previous, zones=zones)
    shuffled_previous = {c: tuple(rnd.sample(share, len(share))) for c, share in reversed(previous.items())}
    second = allocate(
        AFFINE,
        rnd.sample(queues, len(queues)),
        rnd.sample(consumers, len(consumers)),
        previous=shuffled_previous,
        zones=zones,
    )
    assert first == second
    assert_balanced(first, queues, consumers)


def test_a_zone_without_consumers_fills_the_cross_zone_slots_with_what_was_held() -> None:
    queues = [MessageQueue("t", b, i) for b in ("a", "b", "c") for i in range(4)]
    zones = Zones({"a": "z1", "b": "z2", "c": "z3"}, {"p1": "z1", "p2": "z2", "p3": "z1"})
    # z3 has no consumer, so its four queues go cross-zone; p3 held two of them and keeps
    # them, and one of p1's five must move: balance allows four each.
    previous = {"p3": (queues[8], queues[9]), "p1": (*queues[:4], queues[10]), "p2": tuple(queues[4:8])}
    shares = allocate(AFFINE, queues, ["p1", "p2", "p3"], previous=previous, zones=zones)
    assert objectives(shares, previous, zones) == (8, 1)
    assert set(queues[8:10]) <= set(shares["p3"])


def test_deal_spreads_each_run_and_the_total_evenly() -> None:
    dealt = _deal(3, [4, 0, 2, 1])
    assert dealt == [[2, 0, 0, 1], [1, 0, 1, 0], [1, 0, 1, 0]]
    assert [sum(counts) for counts in dealt] == [3, 2, 2]
