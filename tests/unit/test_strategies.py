"""Allocation strategies: behaviour at the edges and properties of the whole group."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import MessageModel, MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.strategies import AllocationError, HashRing, allocate, md5_hash
from mqbalance.strategies.config import config_conflicts

T = "TopicTest"


def mqs(broker: str, count: int, topic: str = T) -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(count)]


EXACTLY_ONCE = [
    StrategySpec(StrategyName.AVG),
    StrategySpec(StrategyName.AVG_BY_CIRCLE),
    StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=5),
    StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.AVG_BY_CIRCLE),
    StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.CONSISTENT_HASH),
    StrategySpec(StrategyName.STICKY),
    StrategySpec(StrategyName.STICKY, zone_affinity=True),
]
BALANCED = [
    StrategySpec(StrategyName.AVG),
    StrategySpec(StrategyName.AVG_BY_CIRCLE),
    StrategySpec(StrategyName.STICKY),
]

queues_st = st.lists(
    st.builds(
        MessageQueue, st.sampled_from([T, "other"]), st.sampled_from(["a", "b", "c"]), st.integers(0, 9)
    ),
    max_size=30,
)
consumers_st = st.lists(st.sampled_from([f"c{i}" for i in range(12)]), min_size=1, max_size=8)
zones_st = st.builds(
    Zones,
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["z1", "z2"])),
    st.dictionaries(st.sampled_from([f"c{i}" for i in range(12)]), st.sampled_from(["z1", "z2"])),
)


@settings(max_examples=40, deadline=None)
@given(queues_st, consumers_st, zones_st, st.sampled_from(EXACTLY_ONCE))
def test_every_queue_exactly_once(
    queues: list[MessageQueue], consumers: list[str], zones: Zones, spec: StrategySpec
) -> None:
    result = allocate(spec, queues, consumers, zones=zones)
    held = [mq for share in result.values() for mq in share]
    assert sorted(held) == sorted(set(queues))
    assert set(result) == set(consumers)


@settings(max_examples=40, deadline=None)
@given(queues_st, consumers_st, st.sampled_from(BALANCED))
def test_loads_differ_by_at_most_one(
    queues: list[MessageQueue], consumers: list[str], spec: StrategySpec
) -> None:
    loads = [len(share) for share in allocate(spec, queues, consumers).values()]
    assert max(loads) - min(loads) <= 1


@settings(max_examples=40, deadline=None)
@given(
    queues_st,
    consumers_st,
    zones_st,
    st.sampled_from([*EXACTLY_ONCE, StrategySpec(StrategyName.CONFIG)]),
    st.randoms(),
)
def test_input_order_does_not_matter(
    queues: list[MessageQueue],
    consumers: list[str],
    zones: Zones,
    spec: StrategySpec,
    rnd: random.Random,
) -> None:
    previous = allocate(StrategySpec(StrategyName.AVG_BY_CIRCLE), queues[: len(queues) // 2], consumers[1:])
    first = allocate(spec, queues, consumers, zones=zones, previous=previous)
    shuffled_queues, shuffled_consumers = queues[:], consumers[:]
    rnd.shuffle(shuffled_queues)
    rnd.shuffle(shuffled_consumers)
    reordered_previous = dict(reversed([(c, tuple(reversed(q))) for c, q in previous.items()]))
    again = allocate(
        spec,
        shuffled_queues + shuffled_queues[:3],
        shuffled_consumers,
        zones=zones,
        previous=reordered_previous,
    )
    assert list(again.items()) == list(first.items())


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 60), st.lists(st.integers(0, 30), min_size=2, max_size=8, unique=True), st.integers(1, 12)
)
def test_consistent_hash_moves_only_what_a_membership_change_must(
    queue_count: int, ids: list[int], vnodes: int
) -> None:
    spec = StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=vnodes)
    queues = mqs("broker-a", queue_count)
    consumers = [f"10.0.0.{i}@{i}" for i in ids]
    before = allocate(spec, queues, consumers[:-1])
    after = allocate(spec, queues, consumers)
    joiner = consumers[-1]
    owner_before = {mq: c for c, share in before.items() for mq in share}
    owner_after = {mq: c for c, share in after.items() for mq in share}
    # A joining consumer only takes queues; a leaving one only gives its own away.
    assert all(owner_after[mq] in (owner_before[mq], joiner) for mq in queues)
    assert all(owner_before[mq] == owner_after[mq] for mq in queues if owner_after[mq] != joiner)


def test_md5_hash_is_the_first_four_digest_bytes_big_endian() -> None:
    # md5("a") = 0cc175b9c0f1b6a8...
    assert md5_hash("a") == 0x0CC175B9
    assert md5_hash("") == 0xD41D8CD9


def test_ring_routes_clockwise_and_wraps() -> None:
    ring = HashRing(["c1", "c2"], 3)
    nodes = sorted((md5_hash(f"{c}-{i}"), c) for c in ("c1", "c2") for i in range(3))
    for key in ("x", "y", "MessageQueue [topic=t, brokerName=b, queueId=0]"):
        h = md5_hash(key)
        later = [c for nh, c in nodes if nh >= h]
        assert ring.route(key) == (later[0] if later else nodes[0][1])
    assert HashRing(["c1"], 0).route("x") is None


def test_no_consumers_and_no_queues() -> None:
    for spec in EXACTLY_ONCE:
        assert allocate(spec, mqs("b", 3), []) == {}
        assert allocate(spec, [], ["c2", "c1"]) == {"c1": (), "c2": ()}


def test_broadcasting_gives_every_consumer_every_queue() -> None:
    queues = mqs("b", 3) + mqs("a", 2)
    result = allocate(
        StrategySpec(StrategyName.AVG), queues, ["c2", "c1"], message_model=MessageModel.BROADCASTING
    )
    assert result == {"c1": tuple(sorted(queues)), "c2": tuple(sorted(queues))}


def test_config_matches_topicless_queues_and_drops_missing_ones() -> None:
    config = {
        "c1": (MessageQueue("", "b", 1), MessageQueue("", "b", 9)),
        "c2": (MessageQueue("other", "b", 0), MessageQueue(T, "b", 0)),
        "gone": (MessageQueue("", "b", 2),),
    }
    spec = StrategySpec(StrategyName.CONFIG, config=config)
    queues = mqs("b", 3) + mqs("b", 2, topic="second")
    result = allocate(spec, queues, ["c1", "c2", "c3"])
    assert result == {
        "c1": (MessageQueue(T, "b", 1), MessageQueue("second", "b", 1)),
        "c2": (MessageQueue(T, "b", 0),),
        "c3": (),
    }


def test_machine_room_takes_remainders_from_the_filtered_list() -> None:
    queues = mqs("room2@b", 5) + mqs("room1@a", 5)
    spec = StrategySpec(StrategyName.MACHINE_ROOM, consumer_idcs=frozenset({"room2"}))
    result = allocate(spec, queues, ["c1", "c2"])
    assert result["c1"] == (queues[0], queues[1], queues[4])
    assert result["c2"] == (queues[2], queues[3])


def test_nearby_keeps_a_zone_to_its_consumers() -> None:
    zones = Zones({"hz": "zone-hz", "sh": "zone-sh"}, {"c-hz": "zone-hz", "c-sh": "zone-sh"})
    spec = StrategySpec(StrategyName.MACHINE_ROOM_NEARBY)
    result = allocate(spec, mqs("hz", 3) + mqs("sh", 1), ["c-sh", "c-hz"], zones=zones)
    assert result == {"c-hz": tuple(mqs("hz", 3)), "c-sh": tuple(mqs("sh", 1))}


@pytest.mark.parametrize(
    ("spec", "consumers", "zones", "words"),
    [
        (
            StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.STICKY),
            ["c"],
            Zones(),
            "inner strategy",
        ),
        (StrategySpec(StrategyName.AVG), ["c", ""], Zones(), "consumer id is empty"),
        (
            StrategySpec(StrategyName.MACHINE_ROOM_NEARBY),
            ["c"],
            Zones({"b": ""}),
            "broker 'b' has an empty zone",
        ),
    ],
)
def test_errors_say_what_to_fix(spec: StrategySpec, consumers: list[str], zones: Zones, words: str) -> None:
    with pytest.raises(AllocationError, match=words):
        allocate(spec, mqs("b", 2), consumers, zones=zones)


@pytest.mark.parametrize("virtual_nodes", [-1, 0, 1001, True, 2.5])
def test_virtual_nodes_have_one_set_of_bounds(virtual_nodes: object) -> None:
    # RocketMQ takes 0 too, which routes every queue to nobody; the CRD, the journal and
    # `mqbalance allocate` all refuse it (and anything over 1000) with the same words.
    with pytest.raises(ValueError, match="virtualNodes must be an integer from 1 to 1000"):
        StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=virtual_nodes)  # type: ignore[arg-type]


def test_config_refuses_a_queue_for_two_consumers_in_clustering() -> None:
    config = {"c1": (MessageQueue("", "b", 0),), "c2": (MessageQueue("t", "b", 0), MessageQueue("", "b", 1))}
    spec = StrategySpec(StrategyName.CONFIG, config=config)
    with pytest.raises(AllocationError, match=r"b/0 \('c1', 'c2'\)"):
        allocate(spec, mqs("b", 2), ["c1", "c2"])
    # Every member holds every queue in BROADCASTING: nothing to refuse.
    both = allocate(spec, mqs("b", 2), ["c1", "c2"], message_model=MessageModel.BROADCASTING)
    assert both["c1"] == both["c2"] == tuple(mqs("b", 2))


def test_config_queues_of_other_topics_do_not_conflict() -> None:
    config = {"c1": (MessageQueue("t1", "b", 0),), "c2": (MessageQueue("t2", "b", 0),)}
    assert config_conflicts(config) == []
    assert config_conflicts({**config, "c3": (MessageQueue("", "b", 0),)}) == ["b/0 ('c1', 'c2', 'c3')"]


def test_nearby_unknown_zone_is_no_machine_room() -> None:
    # A pod on a node without a zone label must not capture the queues of zone-less brokers:
    # those are shared by everyone, like a room with no consumer, and the pod takes part only there.
    zones = Zones({"hz": "zone-hz"}, {"c-hz": "zone-hz"})  # broker "x" and "c-none": no zone
    spec = StrategySpec(StrategyName.MACHINE_ROOM_NEARBY)
    result = allocate(spec, mqs("hz", 2) + mqs("x", 2), ["c-hz", "c-none"], zones=zones)
    assert result == {"c-hz": (*mqs("hz", 2), mqs("x", 2)[0]), "c-none": (mqs("x", 2)[1],)}
