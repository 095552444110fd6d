"""The key selectors: Java String.hashCode, random, and the machine-room selector."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import Broker, MessageQueue, TopicRoute
from mqbalance.producer import KeySelector, QueueSelector, broker_zone, hash_index, java_string_hash

INT_MIN = -(2**31)

# Values Java prints for "<s>".hashCode().
JAVA_HASHES = [
    ("", 0),
    ("hello", 99162322),
    ("abc", 96354),
    ("Aa", 2112),
    ("BB", 2112),
    ("polygenelubricants", INT_MIN),
    ("é", 233),
    ("中文", 646394),
    ("😀", 1772899),  # U+1F600 as the surrogates D83D DE00
]


@pytest.mark.parametrize(("text", "expected"), JAVA_HASHES)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def reference_hash(text: str) -> int:
    """The javadoc formula s[0]*31^(n-1) + ... + s[n-1], summed exactly, then cut to an int."""
    raw = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
    total: int = sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units))
    total %= 2**32
    return total - 2**32 if total >= 2**31 else total


@settings(max_examples=200)
@given(st.text(max_size=40))
def test_java_string_hash_follows_the_javadoc_formula(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)


@settings(max_examples=200)
@given(st.text(max_size=30), st.integers(1, 64))
def test_hash_index_is_java_abs_modulo_for_every_ordinary_key(text: str, size: int) -> None:
    h = reference_hash(text)
    if h != INT_MIN:
        assert hash_index(text, size) == abs(h) % size


@pytest.mark.parametrize(("size", "expected"), [(1, 0), (3, 2), (4, 0), (7, 2), (10, 8)])
def test_min_value_hash_takes_the_index_of_two_to_the_31(size: int, expected: int) -> None:
    # RocketMQ 4.8.0+: Math.abs(MIN_VALUE % size), never negative (4.7.1 took Math.abs first and threw).
    assert hash_index("polygenelubricants", size) == expected


def test_hash_index_refuses_an_empty_list() -> None:
    with pytest.raises(ValueError, match="0 queues"):
        hash_index("k", 0)


TOPIC = TopicRoute(
    "T",
    (
        Broker("broker-a", 4, 4, zone="zone-a"),
        Broker("broker-b", 4, 4, zone="zone-b"),
        Broker("idc1@broker-c", 2, 2),
    ),
)


def test_hash_selector_picks_by_java_hash_over_the_sorted_writable_queues() -> None:
    selector = QueueSelector(index_start=0)
    queues = TOPIC.writable_queues()
    for key in ("hello", "order-42", "中文", "polygenelubricants"):
        assert selector.select_by_key(TOPIC, "hash", key) == queues[hash_index(key, len(queues))]
    # "hello" = 99162322, 99162322 % 10 = 2: the third queue, broker-a:2.
    assert selector.select_by_key(TOPIC, KeySelector.HASH, "hello") == MessageQueue("T", "broker-a", 2)


def test_random_selector_uses_the_injected_generator() -> None:
    picks = [QueueSelector(rng=random.Random(11)).select_by_key(TOPIC, "random") for _ in range(3)]
    assert len(set(picks)) == 1  # same seed, same first pick
    selector = QueueSelector(rng=random.Random(5))
    counts = Counter(selector.select_by_key(TOPIC, "random") for _ in range(2000))
    assert set(counts) == set(TOPIC.writable_queues())


def test_broker_zone_prefers_the_declared_zone_then_the_idc_prefix() -> None:
    assert [broker_zone(b) for b in TOPIC.brokers] == ["zone-a", "zone-b", "idc1"]
    assert broker_zone(Broker("plain", 1, 1)) == "unknown"


def test_machine_room_keeps_sends_in_the_producers_zone() -> None:
    selector = QueueSelector(index_start=0)
    in_zone = {selector.select_by_key(TOPIC, "machine_room", zone="zone-b") for _ in range(8)}
    assert in_zone == {MessageQueue("T", "broker-b", i) for i in range(4)}
    idc = {selector.select_by_key(TOPIC, "machine_room", zone="idc1") for _ in range(4)}
    assert idc == {MessageQueue("T", "idc1@broker-c", i) for i in range(2)}


def test_machine_room_with_a_key_hashes_among_the_zones_queues() -> None:
    selector = QueueSelector(index_start=0)
    local = [MessageQueue("T", "broker-a", i) for i in range(4)]
    for key in ("hello", "order-1", "order-2"):
        first = selector.select_by_key(TOPIC, "machine_room", key, zone="zone-a")
        assert first == local[hash_index(key, 4)]
        assert selector.select_by_key(TOPIC, "machine_room", key, zone="zone-a") == first


def test_machine_room_falls_back_to_every_queue_when_the_zone_has_no_broker() -> None:
    selector = QueueSelector(index_start=0)
    picks = {selector.select_by_key(TOPIC, "machine_room", zone="zone-z") for _ in range(10)}
    assert picks == set(TOPIC.writable_queues())


@pytest.mark.parametrize(
    ("selector", "key", "zone", "message"),
    [
        ("hash", None, None, "hash selector needs a key"),
        ("machine_room", "k", None, "needs the producer's zone"),
        ("by_magic", "k", None, "unknown selector 'by_magic'; use one of hash, random, machine_room"),
    ],
)
def test_selector_misuse_is_a_clear_error(
    selector: str, key: str | None, zone: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        QueueSelector().select_by_key(TOPIC, selector, key, zone=zone)


def test_docs_hash_example() -> None:
    assert java_string_hash("order-42") == 1234255197
    assert hash_index("order-42", 8) == 5
