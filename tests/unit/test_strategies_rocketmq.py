"""RocketMQ exactness: the one-pass strategies agree with RocketMQ's per-consumer Java loops.

The reference functions below transcribe the Java classes literally, one consumer at a
time, as each RocketMQ client runs them (AllocateMessageQueueAveragely,
...AveragelyByCircle, ...ConsistentHash over ConsistentHashRouter with MD5Hash,
...ByMachineRoom on develop, AllocateMachineRoomNearby).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import (
    UNKNOWN_ZONE,
    MessageQueue,
    StrategyName,
    StrategySpec,
    Zones,
    sort_consumers,
    sort_queues,
)
from mqbalance.strategies import NO_ZONES, allocate

JavaStrategy = Callable[[str, list[MessageQueue], list[str]], list[MessageQueue]]


def java_avg(current: str, mq_all: list[MessageQueue], cid_all: list[str]) -> list[MessageQueue]:
    if not mq_all or current not in cid_all:
        return []
    index = cid_all.index(current)
    mod = len(mq_all) % len(cid_all)
    if len(mq_all) <= len(cid_all):
        average_size = 1
    elif mod > 0 and index < mod:
        average_size = len(mq_all) // len(cid_all) + 1
    else:
        average_size = len(mq_all) // len(cid_all)
    start_index = index * average_size if (mod > 0 and index < mod) else index * average_size + mod
    range_ = min(average_size, len(mq_all) - start_index)
    return [mq_all[(start_index + i) % len(mq_all)] for i in range(range_)]


def java_circle(current: str, mq_all: list[MessageQueue], cid_all: list[str]) -> list[MessageQueue]:
    if not mq_all or current not in cid_all:
        return []
    index = cid_all.index(current)
    return [mq_all[i] for i in range(index, len(mq_all)) if i % len(cid_all) == index]


def java_md5(key: str) -> int:
    digest = hashlib.md5(key.encode("utf-8")).digest()
    h = 0
    for i in range(4):
        h <<= 8
        h |= digest[i] & 0xFF
    return h


def java_consistent_hash(virtual_nodes: int) -> JavaStrategy:
    def strategy(current: str, mq_all: list[MessageQueue], cid_all: list[str]) -> list[MessageQueue]:
        if not mq_all or current not in cid_all:
            return []
        ring: dict[int, str] = {}  # a TreeMap: put overwrites
        for cid in cid_all:
            for i in range(virtual_nodes):
                ring[java_md5(f"{cid}-{i}")] = cid
        keys = sorted(ring)
        results = []
        for mq in mq_all:
            if not keys:
                continue
            h = java_md5(str(mq))
            tail = [k for k in keys if k >= h]
            node = ring[tail[0] if tail else keys[0]]
            if node == current:
                results.append(mq)
        return results

    return strategy


def java_split_at(text: str) -> list[str]:
    parts = text.split("@")
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return [] if parts == [""] and text else parts


def java_machine_room(idcs: frozenset[str]) -> JavaStrategy:
    def strategy(current: str, mq_all: list[MessageQueue], cid_all: list[str]) -> list[MessageQueue]:
        if current not in cid_all:
            return []
        current_index = cid_all.index(current)
        premq_all = [mq for mq in mq_all if len(t := java_split_at(mq.broker_name)) == 2 and t[0] in idcs]
        mod = len(premq_all) // len(cid_all)
        rem = len(premq_all) % len(cid_all)
        result = [premq_all[i] for i in range(mod * current_index, mod * current_index + mod)]
        if rem > current_index:
            result.append(premq_all[current_index + mod * len(cid_all)])
        return result

    return strategy


def java_nearby(inner: JavaStrategy, zones: Zones) -> JavaStrategy:
    """AllocateMachineRoomNearby with a resolver that names a room for everything: the unknown
    zone is no room, so a zone-less broker is in a room without consumers and a zone-less
    consumer in a room without queues (Java itself refuses a null room)."""

    def broker_room(broker: str) -> str:
        zone = zones.of_broker(broker)
        return "\0no room: broker" if zone == UNKNOWN_ZONE else zone

    def consumer_room(cid: str) -> str:
        zone = zones.of_consumer(cid)
        return "\0no room: consumer" if zone == UNKNOWN_ZONE else zone

    def strategy(current: str, mq_all: list[MessageQueue], cid_all: list[str]) -> list[MessageQueue]:
        if not mq_all or current not in cid_all:
            return []
        mr2mq: dict[str, list[MessageQueue]] = {}
        for mq in mq_all:
            mr2mq.setdefault(broker_room(mq.broker_name), []).append(mq)
        mr2c: dict[str, list[str]] = {}
        for cid in cid_all:
            mr2c.setdefault(consumer_room(cid), []).append(cid)
        results: list[MessageQueue] = []
        here = consumer_room(current)
        mine = mr2mq.pop(here, [])
        if mine:
            results += inner(current, mine, mr2c[here])
        for room in sorted(mr2mq):
            if room not in mr2c:
                results += inner(current, mr2mq[room], cid_all)
        return results

    return strategy


BROKERS = ["broker-a", "broker-b", "room1@b1", "room2@b2", "room1@b3@x", "room2@", "@b4"]
ZONES = ["z1", "z2", "z3"]

queue_lists = st.lists(
    st.builds(MessageQueue, st.sampled_from(["t", "u"]), st.sampled_from(BROKERS), st.integers(0, 7)),
    max_size=40,
)
consumer_lists = st.lists(st.text("abc12-@", min_size=1, max_size=4), min_size=1, max_size=9)


def java_group(
    strategy: JavaStrategy, queues: list[MessageQueue], consumers: list[str]
) -> dict[str, list[MessageQueue]]:
    mq_all, cid_all = sort_queues(queues), sort_consumers(consumers)
    return {cid: sorted(strategy(cid, mq_all, cid_all)) for cid in cid_all}


def ours(
    spec: StrategySpec, queues: list[MessageQueue], consumers: list[str], zones: Zones = NO_ZONES
) -> dict[str, list[MessageQueue]]:
    return {c: list(qs) for c, qs in allocate(spec, queues, consumers, zones=zones).items()}


@settings(max_examples=60, deadline=None)
@given(queue_lists, consumer_lists)
def test_avg_and_circle_match_java(queues: list[MessageQueue], consumers: list[str]) -> None:
    assert ours(StrategySpec(StrategyName.AVG), queues, consumers) == java_group(java_avg, queues, consumers)
    assert ours(StrategySpec(StrategyName.AVG_BY_CIRCLE), queues, consumers) == java_group(
        java_circle, queues, consumers
    )


@settings(max_examples=40, deadline=None)
@given(queue_lists, consumer_lists, st.integers(1, 12))
def test_consistent_hash_matches_java(queues: list[MessageQueue], consumers: list[str], vnodes: int) -> None:
    spec = StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=vnodes)
    assert ours(spec, queues, consumers) == java_group(java_consistent_hash(vnodes), queues, consumers)


@settings(max_examples=60, deadline=None)
@given(queue_lists, consumer_lists, st.frozensets(st.sampled_from(["room1", "room2", "", "broker-a"])))
def test_machine_room_matches_java(
    queues: list[MessageQueue], consumers: list[str], idcs: frozenset[str]
) -> None:
    spec = StrategySpec(StrategyName.MACHINE_ROOM, consumer_idcs=idcs)
    assert ours(spec, queues, consumers) == java_group(java_machine_room(idcs), queues, consumers)


@settings(max_examples=60, deadline=None)
@given(queue_lists, consumer_lists, st.data(), st.sampled_from(["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]))
def test_machine_room_nearby_matches_java(
    queues: list[MessageQueue], consumers: list[str], data: st.DataObject, inner: str
) -> None:
    # Some brokers and consumers get a zone, the rest stay in the unknown zone.
    zones = Zones(
        data.draw(st.dictionaries(st.sampled_from(BROKERS), st.sampled_from(ZONES))),
        data.draw(st.dictionaries(st.sampled_from(consumers), st.sampled_from(ZONES))),
    )
    java_inner = {"AVG": java_avg, "AVG_BY_CIRCLE": java_circle, "CONSISTENT_HASH": java_consistent_hash(3)}[
        inner
    ]
    spec = StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName(inner), virtual_nodes=3)
    assert ours(spec, queues, consumers, zones) == java_group(
        java_nearby(java_inner, zones), queues, consumers
    )


def test_reference_split_matches_java_semantics() -> None:
    # Java: "a@b@".split("@") == ["a", "b"], "room2@" -> ["room2"], "@b4" -> ["", "b4"], "@" -> [].
    assert java_split_at("a@b@") == ["a", "b"]
    assert java_split_at("room2@") == ["room2"]
    assert java_split_at("@b4") == ["", "b4"]
    assert java_split_at("@") == []
