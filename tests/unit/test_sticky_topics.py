"""STICKY over a group of several topics: every topic balanced, the total balanced too, and
still the fewest moves (and with zone affinity the most in-zone placements) any such
assignment allows, checked against exhaustive search."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.strategies import allocate, allocate_group
from tests.unit.sticky_support import AFFINE, STICKY, Case, Shares, cost, least_costs


def spreads(assignment: Shares) -> tuple[int, int]:
    """(total spread, largest per-topic spread)."""
    totals = [len(share) for share in assignment.values()]
    topics = {mq.topic for share in assignment.values() for mq in share}
    per_topic = [[sum(mq.topic == t for mq in share) for share in assignment.values()] for t in topics]
    return max(totals) - min(totals), max((max(c) - min(c) for c in per_topic), default=0)


def brute_force(
    queues: list[MessageQueue], consumers: list[str], previous: Shares, zones: Zones
) -> tuple[tuple[int, int], int]:
    """Least (cross-zone, moves) and least moves over every assignment balanced per topic and in total."""
    best_pair, best_moves = least_costs(queues, consumers, previous, zones, lambda a: max(spreads(a)) <= 1)
    assert best_pair is not None, "a doubly balanced assignment always exists"
    assert best_moves is not None
    return best_pair, best_moves


@st.composite
def cases(draw: st.DrawFn) -> Case:
    queues = draw(
        st.lists(
            st.builds(
                MessageQueue,
                st.sampled_from(["t1", "t2", "t3"]),
                st.sampled_from(["a", "b"]),
                st.integers(0, 2),
            ),
            min_size=1,
            max_size=7,
            unique=True,
        )
    )
    consumers = draw(st.lists(st.sampled_from(["c1", "c2", "c3", "c4"]), min_size=1, max_size=3, unique=True))
    previous: dict[str, list[MessageQueue]] = {}
    for mq in queues:
        # Held by nobody, one member (present or gone), or, rarely, two (as after BROADCASTING).
        for holder in draw(st.lists(st.sampled_from(["c1", "c2", "c3", "c4"]), max_size=2, unique=True)):
            previous.setdefault(holder, []).append(mq)
    zones = Zones(
        brokers=draw(st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["z1", "z2"]))),
        consumers=draw(st.dictionaries(st.sampled_from(consumers), st.sampled_from(["z1", "z2"]))),
    )
    return queues, consumers, {c: tuple(qs) for c, qs in previous.items()}, zones


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_topic_and_the_total_balanced_with_the_fewest_moves(case: Case) -> None:
    queues, consumers, previous, zones = case
    best_pair, best_moves = brute_force(queues, consumers, previous, zones)
    plain = allocate(STICKY, queues, consumers, previous=previous, zones=zones)
    assert sorted(mq for share in plain.values() for mq in share) == sorted(queues)
    assert max(spreads(plain)) <= 1
    assert cost(plain, previous, zones)[1] == best_moves
    affine = allocate(AFFINE, queues, consumers, previous=previous, zones=zones)
    assert sorted(mq for share in affine.values() for mq in share) == sorted(queues)
    assert max(spreads(affine)) <= 1
    assert cost(affine, previous, zones) == best_pair


@settings(max_examples=50, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(case: Case, rnd: random.Random) -> None:
    queues, consumers, previous, zones = case
    for spec in (STICKY, AFFINE):
        first = allocate(spec, queues, consumers, previous=previous, zones=zones)
        shuffled_q, shuffled_c = list(queues), list(consumers)
        rnd.shuffle(shuffled_q)
        rnd.shuffle(shuffled_c)
        assert allocate(spec, shuffled_q, shuffled_c, previous=previous, zones=zones) == first


def test_the_extra_queues_of_several_topics_are_dealt_out_in_turn() -> None:
    # Three topics of 5 over 2 members: each topic alone would give its extra queue to c1 (9 and 6).
    topics = {t: [MessageQueue(t, "b", i) for i in range(5)] for t in ("t1", "t2", "t3")}
    group = allocate_group(STICKY, topics, ["c1", "c2"])
    assert {t: (len(a["c1"]), len(a["c2"])) for t, a in group.items()} == {
        "t1": (3, 2),
        "t2": (2, 3),
        "t3": (3, 2),
    }


def test_other_strategies_still_allocate_each_topic_alone() -> None:
    topics = {t: [MessageQueue(t, "b", i) for i in range(5)] for t in ("t1", "t2", "t3")}
    group = allocate_group(StrategySpec(StrategyName.AVG), topics, ["c1", "c2"])
    assert all(len(a["c1"]) == 3 for a in group.values())  # RocketMQ's own tilt, kept exact
