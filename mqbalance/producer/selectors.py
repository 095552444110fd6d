"""RocketMQ's ``MessageQueueSelector`` implementations: by hash, at random, by machine room.

They choose among a topic's writable queues in RocketMQ's order (what
``TopicRoute.writable_queues`` returns), as ``DefaultMQProducer.send(msg, selector,
arg)`` does.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence

from mqbalance.model import UNKNOWN_ZONE, Broker, MessageQueue, TopicRoute
from mqbalance.producer.index import INT_MIN, java_abs, java_rem, to_int32


class KeySelector(enum.StrEnum):
    """The built-in selectors, named as the sidecar's API accepts them."""

    HASH = "hash"
    RANDOM = "random"
    MACHINE_ROOM = "machine_room"

    @classmethod
    def parse(cls, name: str | KeySelector) -> KeySelector:
        try:
            return cls(name)
        except ValueError:
            raise ValueError(
                f"unknown selector {name!r}; use one of {', '.join(s.value for s in cls)}"
            ) from None


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

    Java takes ``Math.abs(hashCode) % size``. For a hash of ``Integer.MIN_VALUE``
    ("polygenelubricants" is one) ``Math.abs`` stays negative, the remainder is
    negative and Java's ``mqs.get`` throws ``IndexOutOfBoundsException``. Here that
    case uses 2**31 % size, the index the absolute value would give had it not
    overflowed, so every key maps to a queue; every other key agrees with Java.
    """
    if size <= 0:
        raise ValueError(f"cannot select among {size} queues")
    value = java_string_hash(key)
    if value == INT_MIN:
        return 2**31 % size
    return java_rem(java_abs(value), size)


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
