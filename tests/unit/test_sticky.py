"""STICKY: balanced, minimal movement, maximal zone locality, checked against exhaustive search."""

from __future__ import annotations

import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.quality import measure, minimum_moves
from mqbalance.strategies import allocate
from tests.unit.sticky_support import AFFINE, STICKY, Case, Shares, cost, least_costs, queue_lists, zone_maps

BROKERS = ("a", "b", "c")


def brute_force(
    queues: list[MessageQueue], consumers: list[str], previous: Shares, zones: Zones
) -> tuple[tuple[int, int] | None, int | None]:
    """Least (cross-zone, moves) and least moves over every balanced assignment."""
    base, extra = divmod(len(queues), len(consumers))
    loads = [base] * (len(consumers) - extra) + [base + 1] * extra
    return least_costs(
        queues, consumers, previous, zones, lambda a: sorted(len(share) for share in a.values()) == loads
    )


def balanced(assignment: Shares, queues: Sequence[MessageQueue]) -> bool:
    loads = [len(share) for share in assignment.values()]
    held = sorted(mq for share in assignment.values() for mq in share)
    return max(loads) - min(loads) <= 1 and held == sorted(set(queues))


@st.composite
def tiny_cases(draw: st.DrawFn) -> Case:
    queues = draw(queue_lists(BROKERS, 4, 7))
    consumers = draw(
        st.lists(st.sampled_from(["c1", "c2", "c3", "c4", "c5"]), min_size=1, max_size=3, unique=True)
    )
    pool = ["c1", "c2", "c3", "c4", "c5"]
    old_queues = queues + [MessageQueue("t", "gone", i) for i in range(2)]
    # Previous owners may have left; some queues may have had several holders (after CONFIG).
    previous: dict[str, list[MessageQueue]] = {}
    for mq in old_queues:
        for holder in draw(st.lists(st.sampled_from(pool), max_size=2, unique=True)):
            previous.setdefault(holder, []).append(mq)
    zones = draw(zone_maps(BROKERS, pool, ["z1", "z2"], ["z1", "z2", "z3"]))
    return queues, consumers, {c: tuple(q) for c, q in previous.items()}, zones


@settings(max_examples=80, deadline=None)
@given(tiny_cases())
def test_sticky_is_optimal_against_exhaustive_search(case: Case) -> None:
    queues, consumers, previous, zones = case
    best_pair, best_moves = brute_force(sorted(queues), sorted(consumers), previous, zones)
    plain = allocate(STICKY, queues, consumers, previous=previous, zones=zones)
    affine = allocate(AFFINE, queues, consumers, previous=previous, zones=zones)
    assert balanced(plain, queues)
    assert balanced(affine, queues)
    assert cost(plain, previous, zones)[1] == best_moves
    assert cost(affine, previous, zones) == best_pair
    assert minimum_moves(previous, queues, consumers) == best_moves


def least_moves(previous: Shares, queues: set[MessageQueue], consumers: list[str]) -> int:
    """Closed form for a previous assignment with one holder per queue (see sticky.py)."""
    before = {mq: c for c, share in previous.items() for mq in share}
    current = set(queues)
    carried = sum(1 for mq in current if mq in before)
    base, extra = divmod(len(current), len(consumers))
    held = [sum(1 for mq in current if before.get(mq) == c) for c in consumers]
    kept = sum(min(k, base) for k in held) + min(extra, sum(1 for k in held if k > base))
    return carried - kept


def most_in_zone(queues: list[MessageQueue], consumers: list[str], zones: Zones) -> int:
    """Closed form: each zone fills its consumers' floor, then the extra slots go where they help."""
    base, extra = divmod(len(queues), len(consumers))
    total = helped = 0
    for zone in {zones.of_broker(mq.broker_name) for mq in queues}:
        demand = sum(1 for mq in queues if zones.of_broker(mq.broker_name) == zone)
        members = sum(1 for c in consumers if zones.of_consumer(c) == zone)
        total += min(demand, members * base)
        helped += min(members, max(0, demand - members * base))
    return total + min(extra, helped)


def churn(rnd: random.Random, queues: set[MessageQueue], consumers: list[str], step: int) -> None:
    """One random change: members join or leave, the topic grows or shrinks."""
    action = rnd.random()
    if action < 0.35 or not consumers:
        consumers.append(f"pod-{step}")
    elif action < 0.7 and len(consumers) > 1:
        consumers.remove(rnd.choice(consumers))
    elif action < 0.85:
        queues.update(
            MessageQueue("t", rnd.choice(BROKERS), rnd.randrange(40)) for _ in range(rnd.randrange(1, 6))
        )
    elif queues:
        queues.difference_update(rnd.sample(sorted(queues), min(len(queues), rnd.randrange(1, 6))))


@settings(max_examples=12, deadline=None)
@given(st.randoms(use_true_random=False), st.booleans())
def test_long_churn_moves_exactly_the_minimum(rnd: random.Random, affine: bool) -> None:
    zones = Zones({"a": "z1", "b": "z2", "c": "z3"}, {})
    queues = {MessageQueue("t", b, i) for b in BROKERS for i in range(rnd.randrange(1, 12))}
    consumers = [f"pod-start-{i}" for i in range(rnd.randrange(1, 5))]
    previous: dict[str, tuple[MessageQueue, ...]] | None = None
    for step in range(60):
        zones = Zones(zones.brokers, {**zones.consumers, f"pod-{step}": rnd.choice(["z1", "z2", "z3", "z4"])})
        current = allocate(AFFINE if affine else STICKY, queues, consumers, previous=previous, zones=zones)
        assert balanced(current, list(queues))
        figures = measure(previous, current, zones=zones, queues=queues)
        if affine:
            assert len(queues) - figures.cross_zone == most_in_zone(list(queues), consumers, zones)
        else:
            assert figures.moved == least_moves(previous or {}, queues, consumers)
        assert figures.minimum_moves == least_moves(previous or {}, queues, consumers)
        previous = current
        churn(rnd, queues, consumers, step)


def test_without_previous_sticky_is_avg() -> None:
    queues = [MessageQueue("t", b, i) for b in BROKERS for i in range(5)]
    consumers = ["x", "y", "z", "w"]
    assert allocate(STICKY, queues, consumers) == allocate(StrategySpec(StrategyName.AVG), queues, consumers)


def test_a_joining_member_takes_only_what_balance_needs() -> None:
    queues = [MessageQueue("t", "a", i) for i in range(128)]
    seven = [f"pod-{i}" for i in range(7)]
    before = allocate(STICKY, queues, seven)
    after = allocate(STICKY, queues, [*seven, "pod-7"], previous=before)
    figures = measure(before, after, queues=queues)
    assert figures.moved == figures.minimum_moves == 16
    assert len(after["pod-7"]) == 16
    assert figures.spread == 0


def test_zone_affinity_prefers_locality_then_stays_put() -> None:
    queues = [MessageQueue("t", b, i) for b in ("a", "b") for i in range(2)]
    zones = Zones({"a": "z1", "b": "z2"}, {"c1": "z1", "c2": "z2"})
    # Everything sits on c1; affinity hands zone z2's queues to c2, plain STICKY keeps any two.
    previous = {"c1": tuple(queues), "c2": ()}
    affine = allocate(AFFINE, queues, ["c1", "c2"], previous=previous, zones=zones)
    assert affine == {"c1": tuple(queues[:2]), "c2": tuple(queues[2:])}
    plain = allocate(STICKY, queues, ["c1", "c2"], previous=previous, zones=zones)
    assert measure(previous, plain).moved == 2
