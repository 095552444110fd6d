"""RocketMQ's ``MessageQueueSelector`` implementations: by hash, at random, by machine room.

They choose among a topic's writable queues in RocketMQ's order (what
``TopicRoute.writable_queues`` returns), as ``DefaultMQProducer.send(msg, selector,
arg)`` does.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from typing import TypeVar

from mqbalance.model import UNKNOWN_ZONE, Broker, MessageQueue, TopicRoute
from mqbalance.producer.index import java_rem, to_int32

E = TypeVar("E", bound=enum.StrEnum)


class KeySelector(enum.StrEnum):
    """The built-in selectors, named as the sidecar's API accepts them."""

    HASH = "hash"
    RANDOM = "random"
    MACHINE_ROOM = "machine_room"

    @classmethod
    def parse(cls, name: str | KeySelector) -> KeySelector:
        return parse_name(cls, name, "selector")


def parse_name(kind: type[E], name: str | E, what: str) -> E:
    """The member of ``kind`` called ``name``, or a ValueError that lists the valid names."""
    try:
        return kind(name)
    except ValueError:
        raise ValueError(f"unknown {what} {name!r}; use one of {', '.join(m.value for m in kind)}") from None


def java_string_hash(value: str) -> int:
    """``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as a Java int.

    Characters beyond the Basic Multilingual Plane count as their two surrogates,
    as in Java.
    """
    units = value.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return to_int32(h)


def hash_index(key: str, size: int) -> int:
    """The queue index ``SelectMessageQueueByHash`` picks for a string ``key`` among ``size`` queues.

    RocketMQ 4.8.0 and later take ``key.hashCode() % size`` (Java's remainder, which
    keeps the dividend's sign) and then ``Math.abs`` of a negative remainder. The
    remainder is never ``Integer.MIN_VALUE``, so the result is always in ``0..size-1``:
    a key hashing to ``Integer.MIN_VALUE`` ("polygenelubricants" is one) gets
    ``2**31 % size``. RocketMQ 4.7.1 and earlier took ``Math.abs`` first, which leaves
    ``Integer.MIN_VALUE`` negative, and threw ``IndexOutOfBoundsException`` for such a key.
    """
    if size <= 0:
        raise ValueError(f"cannot select among {size} queues")
    return abs(java_rem(java_string_hash(key), size))


def select_by_hash(queues: Sequence[MessageQueue], key: str) -> MessageQueue:
    return queues[hash_index(key, len(queues))]


def select_by_random(queues: Sequence[MessageQueue], rng: random.Random) -> MessageQueue:
    """``SelectMessageQueueByRandom``: a uniform pick (Python's generator, not ``java.util.Random``)."""
    if not queues:
        raise ValueError("cannot select among 0 queues")
    return queues[rng.randrange(len(queues))]


def broker_zone(broker: Broker) -> str:
    """A broker's zone: its declared zone, else the idc of an ``idc@broker`` name, else unknown.

    The ``idc@`` prefix is the convention of RocketMQ's
    ``AllocateMessageQueueByMachineRoom``.
    """
    if broker.zone != UNKNOWN_ZONE:
        return broker.zone
    if "@" in broker.name:
        return broker.name.split("@", 1)[0]
    return UNKNOWN_ZONE


def zone_queues(route: TopicRoute, queues: Sequence[MessageQueue], zone: str) -> list[MessageQueue]:
    """The queues among ``queues`` whose broker runs in ``zone``, order kept."""
    local = {b.name for b in route.brokers if broker_zone(b) == zone}
    return [q for q in queues if q.broker_name in local]
