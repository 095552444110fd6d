"""The RocketMQ model: message queues, brokers, topic routes and strategy settings.

Orderings follow Java, because RocketMQ's strategies run over queues and consumer ids
sorted with ``Collections.sort``: given the same queues and consumer ids, our result is
RocketMQ's only if we sort as Java does.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# PermName bits (org.apache.rocketmq.common.constant.PermName).
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_READ_WRITE = PERM_READ | PERM_WRITE

UNKNOWN_ZONE = "unknown"
"""Zone of a consumer whose node carries no zone label, or of a broker with none."""


def java_string_key(value: str) -> bytes:
    """Sort key that orders strings as Java's ``String.compareTo`` does.

    Java compares UTF-16 code units; Python compares code points. They differ
    only beyond the Basic Multilingual Plane, but "exactly as RocketMQ" means
    exactly, and big-endian UTF-16 bytes compare like unsigned code units.
    """
    return value.encode("utf-16-be", "surrogatepass")


@dataclass(frozen=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker (org.apache.rocketmq.common.message.MessageQueue)."""

    topic: str
    broker_name: str
    queue_id: int

    def sort_key(self) -> tuple[bytes, bytes, int]:
        """MessageQueue.compareTo: topic, then broker name, then queue id."""
        return (java_string_key(self.topic), java_string_key(self.broker_name), self.queue_id)

    def __lt__(self, other: MessageQueue) -> bool:
        return self.sort_key() < other.sort_key()

    def __str__(self) -> str:
        # MessageQueue.toString(); CONSISTENT_HASH hashes exactly this text.
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


def sort_queues(queues: Iterable[MessageQueue]) -> list[MessageQueue]:
    """Queues in RocketMQ's order, duplicates removed."""
    return sorted(set(queues), key=MessageQueue.sort_key)


def sort_consumers(consumers: Iterable[str]) -> list[str]:
    """Consumer ids in RocketMQ's order (Collections.sort on String), duplicates removed."""
    return sorted(set(consumers), key=java_string_key)


@dataclass(frozen=True, slots=True)
class Broker:
    """A broker's share of one topic (RocketMQ's QueueData), plus the zone it runs in."""

    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    zone: str = UNKNOWN_ZONE
    has_master: bool = True
    """Whether the broker group has a master: a producer sends only to one that has (a consumer
    reads from a slave too)."""

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE) and self.has_master


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A topic and the brokers that host its queues (RocketMQ's TopicRouteData)."""

    topic: str
    brokers: tuple[Broker, ...]

    def readable_queues(self) -> list[MessageQueue]:
        """Queues consumers allocate over: readQueueNums of every readable broker."""
        return self._queues(lambda b: b.read_queue_nums if b.readable else 0)

    def writable_queues(self) -> list[MessageQueue]:
        """Queues producers send to: writeQueueNums of every writable broker with a master."""
        return self._queues(lambda b: b.write_queue_nums if b.writable else 0)

    def readable_count(self) -> int:
        """``len(self.readable_queues())``, counted without building the queues."""
        return self._count(lambda b: b.read_queue_nums if b.readable else 0)

    def writable_count(self) -> int:
        """``len(self.writable_queues())``, counted without building the queues."""
        return self._count(lambda b: b.write_queue_nums if b.writable else 0)

    def _queues(self, count: Callable[[Broker], int]) -> list[MessageQueue]:
        return sort_queues(MessageQueue(self.topic, b.name, i) for b in self.brokers for i in range(count(b)))

    def _count(self, count: Callable[[Broker], int]) -> int:
        # A broker named twice adds its larger count once, as the set in _queues does.
        by_name: dict[str, int] = {}
        for b in self.brokers:
            by_name[b.name] = max(by_name.get(b.name, 0), count(b))
        return sum(by_name.values())

    def broker_zones(self) -> dict[str, str]:
        return {b.name: b.zone for b in self.brokers}


class MessageModel(enum.StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class StrategyName(enum.StrEnum):
    """Strategy names as RocketMQ's ``AllocateMessageQueueStrategy.getName()`` returns them."""

    AVG = "AVG"
    AVG_BY_CIRCLE = "AVG_BY_CIRCLE"
    CONSISTENT_HASH = "CONSISTENT_HASH"
    CONFIG = "CONFIG"
    MACHINE_ROOM = "MACHINE_ROOM"
    MACHINE_ROOM_NEARBY = "MACHINE_ROOM_NEARBY"
    STICKY = "STICKY"


INNER_STRATEGIES = (StrategyName.AVG, StrategyName.AVG_BY_CIRCLE, StrategyName.CONSISTENT_HASH)
"""Strategies MACHINE_ROOM_NEARBY may delegate to inside a zone."""

DEFAULT_VIRTUAL_NODES = 10
MIN_VIRTUAL_NODES = 1
MAX_VIRTUAL_NODES = 1000
"""CONSISTENT_HASH's virtual nodes per consumer, the same bounds everywhere (the CRD, the journal,
``mqbalance allocate``). RocketMQ also accepts 0, which routes every queue to nobody; more than
1000 only makes the ring bigger."""


def check_virtual_nodes(value: object) -> int:
    """``value`` if it is an integer within the bounds; else ValueError saying what to give."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_VIRTUAL_NODES <= value <= MAX_VIRTUAL_NODES
    ):
        raise ValueError(
            f"virtualNodes must be an integer from {MIN_VIRTUAL_NODES} to {MAX_VIRTUAL_NODES} "
            f"(default {DEFAULT_VIRTUAL_NODES}), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class LoadBalance:
    """STICKY's load-aware setting: balance measured traffic, not queue counts
    (``mqbalance/strategies/load.py`` has the rules)."""

    tolerance: float = 0.2
    """The busiest member may carry up to ``(1 + tolerance)`` times the larger of the mean member
    load and the hottest queue's load."""
    samples: int = 3
    """Consecutive samples the busiest member must stay above that limit before queues move for
    load (a membership or queue change rebalances at once)."""
    max_queue_factor: float = 2.0
    """No member holds more than ``ceil(max_queue_factor * queues / members)`` queues."""

    def __post_init__(self) -> None:
        if not (isinstance(self.tolerance, int | float) and math.isfinite(self.tolerance)):
            raise ValueError(f"load tolerance must be a number, got {self.tolerance!r}")
        if not 0 <= self.tolerance <= 10:
            raise ValueError(f"load tolerance must be from 0 to 10, got {self.tolerance!r}")
        samples = self.samples
        if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= 1000:
            raise ValueError(f"load samples must be an integer from 1 to 1000, got {self.samples!r}")
        if not (isinstance(self.max_queue_factor, int | float) and 1 <= self.max_queue_factor <= 100):
            raise ValueError(f"load maxQueueFactor must be from 1 to 100, got {self.max_queue_factor!r}")


@dataclass(frozen=True)
class StrategySpec:
    """A strategy and its parameters, as a ConsumerGroup or an allocate request names them."""

    name: StrategyName
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES
    """CONSISTENT_HASH (also as the inner strategy of MACHINE_ROOM_NEARBY)."""
    inner: StrategyName = StrategyName.AVG
    """MACHINE_ROOM_NEARBY: the strategy used inside each zone."""
    consumer_idcs: frozenset[str] = frozenset()
    """MACHINE_ROOM: the idcs (the part before '@' of a broker name) this group consumes."""
    config: Mapping[str, tuple[MessageQueue, ...]] = field(default_factory=dict)
    """CONFIG: the explicit queues of each consumer."""
    zone_affinity: bool = False
    """STICKY: place queues in their broker's zone where balance allows."""
    load: LoadBalance | None = None
    """STICKY: balance measured per-queue traffic instead of queue counts (``balance_load``)."""

    def __post_init__(self) -> None:
        check_virtual_nodes(self.virtual_nodes)


Assignment = Mapping[str, tuple[MessageQueue, ...]]
"""Consumer id -> its queues in RocketMQ's order. Every consumer of the group is a key."""


@dataclass(frozen=True)
class Zones:
    """Where brokers and consumers run. Missing entries are in UNKNOWN_ZONE."""

    brokers: Mapping[str, str] = field(default_factory=dict)
    consumers: Mapping[str, str] = field(default_factory=dict)

    def of_broker(self, broker_name: str) -> str:
        return self.brokers.get(broker_name, UNKNOWN_ZONE)

    def of_consumer(self, consumer: str) -> str:
        return self.consumers.get(consumer, UNKNOWN_ZONE)
