"""Which queue a producer sends to: round robin, retries that avoid the last broker,
latency fault tolerance, and the key selectors.

``QueueSelector`` is RocketMQ's ``TopicPublishInfo.selectOneMessageQueue`` plus
``MQFaultStrategy.selectOneMessageQueue`` for either client generation:

- ``Generation.V5`` (default, RocketMQ 5.2.0 and later): without fault tolerance, round robin
  that skips queues of the last broker on a retry. With it, a retry first jumps the
  index to a random place (``resetIndex``), then picks the first queue in turn of a
  broker that is available and not the last one; failing that, reachable and not
  the last one; failing that, the next queue whatever its broker.
- ``Generation.V4`` (RocketMQ 4.9.8): the same round robin without fault tolerance.
  With it, the first queue in turn of an available broker, the last broker not
  considered; when none is available, a queue of ``pickOneAtLeast``'s broker.

Every probe of a queue bumps the topic's moving index, as in Java, so the sequence
of queues is Java's own for the same starting index. How other releases differ is in
docs/producer.md ("Which RocketMQ versions"); tests/oracle checks both modes against
RocketMQ's own classes.
"""

from __future__ import annotations

import enum
import functools
import random
from collections.abc import Callable, Sequence
from typing import Any

from mqbalance.model import MessageQueue, TopicRoute
from mqbalance.producer.faults import (
    LATENCY_4X,
    LATENCY_5X,
    Clock,
    FaultItem,
    FaultTable,
    LatencyFaultTolerance,
    monotonic_ms,
)
from mqbalance.producer.index import MovingIndex, java_abs, java_rem, to_int32
from mqbalance.producer.selectors import (
    KeySelector,
    parse_name,
    select_by_hash,
    select_by_random,
    zone_queues,
)


class Generation(enum.StrEnum):
    """Which RocketMQ client's selection to reproduce: "4.x" is 4.9.8, "5.x" is 5.2.0 and later."""

    V4 = "4.x"
    V5 = "5.x"

    @classmethod
    def parse(cls, name: str | Generation) -> Generation:
        return parse_name(cls, name, "generation")

    @property
    def fault_table(self) -> FaultTable:
        return LATENCY_4X if self is Generation.V4 else LATENCY_5X


class NoWritableQueueError(ValueError):
    """The route offers no queue to send to."""


@functools.lru_cache(maxsize=256)
def writable_queues(route: TopicRoute) -> tuple[MessageQueue, ...]:
    """The route's writable queues in RocketMQ's order (cached: routes are frozen)."""
    queues = tuple(route.writable_queues())
    if not queues:
        raise NoWritableQueueError(
            f"topic {route.topic!r} has no writable queue: give at least one broker "
            "writeQueueNums > 0 and write permission (perm 2 or 6)"
        )
    return queues


QueueFilter = Callable[[MessageQueue], bool]


class QueueSelector:
    """A producer's queue selection state: one moving index per topic and the fault table.

    ``clock`` (integer milliseconds) and ``rng`` are injected so tests drive time and chance;
    ``index_start`` pins where every topic's index starts (Java starts each at a
    random value, which is what happens when it is None). Reports are recorded
    whether fault tolerance is on or not (Java drops them when it is off), so the
    fault state can be served either way; ``fault_tolerance`` only decides whether
    selection consults it. Not thread-safe.
    """

    def __init__(
        self,
        *,
        generation: Generation | str = Generation.V5,
        table: FaultTable | None = None,
        fault_tolerance: bool = False,
        clock: Clock = monotonic_ms,
        rng: random.Random | None = None,
        index_start: int | None = None,
    ) -> None:
        self.generation = Generation.parse(generation)
        self.fault_tolerance = fault_tolerance
        self._rng = rng if rng is not None else random.Random()
        self._index_start = index_start
        self.faults = LatencyFaultTolerance(
            table if table is not None else self.generation.fault_table,
            clock=clock,
            rng=self._rng,
            worst_index_start=index_start,
        )
        self._indexes: dict[str, MovingIndex] = {}

    # -- the moving index ------------------------------------------------------------

    def index(self, topic: str) -> MovingIndex:
        """The topic's ``sendWhichQueue`` (created on first use)."""
        moving = self._indexes.get(topic)
        if moving is None:
            start = (
                self._index_start if self._index_start is not None else MovingIndex.random_start(self._rng)
            )
            moving = self._indexes[topic] = MovingIndex(start)
        return moving

    # -- default selection -----------------------------------------------------------

    def select_queue(
        self,
        route: TopicRoute,
        *,
        last_broker: str | None = None,
        fault_tolerance: bool | None = None,
        queues: Sequence[MessageQueue] = (),
        reset_index: bool | None = None,
    ) -> MessageQueue:
        """The queue for the next send; ``last_broker`` is the broker the previous attempt
        of the same message went to (a retry). ``fault_tolerance`` overrides the
        instance's setting (``sendLatencyFaultEnable``) for this call. ``queues`` is
        ``writable_queues(route)`` when the caller keeps it already (it saves hashing
        the route per call); empty means compute it. ``reset_index`` is 5.x's
        ``resetIndex`` (fault tolerance only): by default true exactly on a retry, as a
        synchronous send does; an asynchronous send's retry passes false."""
        if not queues:
            queues = writable_queues(route)
        index = self.index(route.topic)
        use_faults = self.fault_tolerance if fault_tolerance is None else fault_tolerance
        if not use_faults and last_broker is None:
            # Plain round robin, what every generation's path below reduces to here.
            return _next(queues, index)
        if self.generation is Generation.V4:
            if use_faults:
                return self._select_4x_faults(route, queues, index)
            return self._select_4x(queues, index, last_broker)
        reset = last_broker is not None if reset_index is None else reset_index
        return self._select_5x(queues, index, last_broker, use_faults, reset)

    def _select_4x(
        self, queues: Sequence[MessageQueue], index: MovingIndex, last: str | None
    ) -> MessageQueue:
        # TopicPublishInfo.selectOneMessageQueue(lastBrokerName), 4.9.x.
        if last is not None:
            for _ in range(len(queues)):
                mq = queues[java_rem(java_abs(index.increment_and_get()), len(queues))]
                if mq.broker_name != last:
                    return mq
        return _next(queues, index)

    def _select_4x_faults(
        self, route: TopicRoute, queues: Sequence[MessageQueue], index: MovingIndex
    ) -> MessageQueue:
        # MQFaultStrategy.selectOneMessageQueue, 4.9.8: one index read, then a local
        # int that walks on (and may wrap) without touching the shared index.
        n = len(queues)
        walk = index.increment_and_get()
        for _ in range(n):
            pos = java_rem(java_abs(walk), n)
            walk = to_int32(walk + 1)
            mq = queues[max(pos, 0)]
            if self.faults.is_available(mq.broker_name):
                return mq
        not_best = self.faults.pick_one_at_least()
        write_nums = _write_queue_nums(route, not_best)
        if write_nums > 0 and not_best is not None:
            # Java selects a queue first (moving the index), then sends to not_best instead:
            # 4.9.8 in a new MessageQueue; 4.9.7 and earlier rewrote the route's own element.
            _next(queues, index)
            return MessageQueue(route.topic, not_best, index.increment_and_get() % write_nums)
        if not_best is not None:
            self.faults.remove(not_best)
        return _next(queues, index)

    def _select_5x(
        self,
        queues: Sequence[MessageQueue],
        index: MovingIndex,
        last: str | None,
        use_faults: bool,
        reset: bool,
    ) -> MessageQueue:
        # MQFaultStrategy.selectOneMessageQueue(tpInfo, lastBrokerName, resetIndex), 5.1.4+.
        def not_last(mq: MessageQueue) -> bool:
            return last is None or mq.broker_name != last

        if use_faults:
            if reset:
                index.reset(self._rng)
            faults = self.faults

            def available(mq: MessageQueue) -> bool:
                return faults.is_available(mq.broker_name) and not_last(mq)

            def reachable(mq: MessageQueue) -> bool:
                return faults.is_reachable(mq.broker_name) and not_last(mq)

            for accept in (available, reachable):
                found = _first_passing(queues, index, accept)
                if found is not None:
                    return found
            return _next(queues, index)
        mq = _first_passing(queues, index, not_last)
        return mq if mq is not None else _next(queues, index)

    # -- selectors -------------------------------------------------------------------

    def select_by_key(
        self,
        route: TopicRoute,
        selector: KeySelector | str,
        key: str | None = None,
        *,
        zone: str | None = None,
        queues: Sequence[MessageQueue] = (),
    ) -> MessageQueue:
        """A queue chosen by one of RocketMQ's ``MessageQueueSelector`` implementations.

        - ``hash``: ``SelectMessageQueueByHash`` on the string ``key`` (required).
        - ``random``: a uniform pick; ``key`` is ignored.
        - ``machine_room``: RocketMQ's ``SelectMessageQueueByMachineRoom`` returns null.
          Here it keeps the send in the producer's ``zone`` (required): among the
          queues of brokers in that zone (see ``selectors.broker_zone``) it picks by
          the hash of ``key`` when there is one, so a key's messages stay on one queue,
          else in turn with the topic's moving index. With no broker in the zone it
          does the same over all writable queues.

        ``queues`` is ``writable_queues(route)`` when the caller keeps it, as for ``select_queue``.
        """
        kind = KeySelector.parse(selector)
        if not queues:
            queues = writable_queues(route)
        if kind is KeySelector.RANDOM:
            return select_by_random(queues, self._rng)
        if kind is KeySelector.HASH:
            if key is None:
                raise ValueError("the hash selector needs a key (the sharding key of the message)")
            return select_by_hash(queues, key)
        if zone is None:
            raise ValueError("the machine_room selector needs the producer's zone")
        queues = zone_queues(route, queues, zone) or queues
        if key is not None:
            return select_by_hash(queues, key)
        return _next(queues, self.index(route.topic))

    # -- fault reports ---------------------------------------------------------------

    def report(
        self, broker: str, latency_ms: float, *, failed: bool = False, reachable: bool = True
    ) -> FaultItem:
        """Record a send's outcome (``updateFaultItem``); see ``LatencyFaultTolerance.update``."""
        return self.faults.update(broker, latency_ms, failed=failed, reachable=reachable)

    def mark_reachable(self, broker: str, reachable: bool = True) -> None:
        self.faults.mark_reachable(broker, reachable)

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly state: generation, whether selection uses faults, table and items."""
        return {
            "generation": self.generation.value,
            "faultTolerance": self.fault_tolerance,
            **self.faults.to_json(),
        }


def _next(queues: Sequence[MessageQueue], index: MovingIndex) -> MessageQueue:
    # selectOneMessageQueue(): the index is never negative, so no abs is needed.
    return queues[index.increment_and_get() % len(queues)]


def _first_passing(
    queues: Sequence[MessageQueue], index: MovingIndex, accept: QueueFilter
) -> MessageQueue | None:
    for _ in range(len(queues)):
        mq = _next(queues, index)
        if accept(mq):
            return mq
    return None


def _write_queue_nums(route: TopicRoute, broker: str | None) -> int:
    # getQueueIdByBroker: -1 for a broker the route does not hold, or (4.9.8) cannot write to.
    for b in route.brokers:
        if b.name == broker and b.writable:
            return b.write_queue_nums
    return -1
