"""Releasing a stopped member's broker locks on its behalf (handover Orderly).

An orderly consumer consumes a queue only under the broker's lock, which it renews every 20 s and
the broker keeps 60 s. A consumer that dies without unlocking (SIGKILL, a lost node) keeps its
queues from their new owners until then, however soon mqbalance hands them on. When the handover
knows the member consumes nothing any more (its pod finished, or gone with its grant surely
expired: ``handover.Step.stopped``) the reconcile lists its locks (``Outcome.unlocks``) and they
are released here, before the generation that gives the queues on is published: RocketMQ's
``UNLOCK_BATCH_MQ`` to each queue's master, naming the client ids the member's Lease named. The
broker drops a lock only if that client holds it, so a lock a new owner already took stays. Never
for a live member: a paused or slow consumer is never listed, and keeps its locks until it lets go
or they expire, as in RocketMQ.

Best effort, within :data:`BUDGET` seconds: a lock that cannot be released expires as before, and
the generation is published either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqbalance.contract import TopicSpec, read_topic_spec
from mqbalance.model import MessageQueue
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.observation import LockRelease
from mqbalance.operator.offsets import BrokerFailure, OffsetReader, broker_address
from mqbalance.rocketmq.admin import AdminError, BrokerAdmin, BrokerQueue
from mqbalance.rocketmq.remoting import Credentials

logger = logging.getLogger("mqbalance.operator")

BUDGET = 3.0
"""Seconds the lock releases of one reconcile may take before the generation is published anyway."""


@dataclass(frozen=True)
class Released:
    """What :meth:`BrokerLocks.release` did for one stopped member."""

    unlock: LockRelease
    queues: int
    """Queues whose locks were released (for every client named)."""
    problems: tuple[str, ...]


class BrokerLocks:
    """Sends the lock releases a reconcile asks for, to the brokers the Topics' routes name."""

    def __init__(self, reader: OffsetReader, metrics: OperatorMetrics, budget: float = BUDGET) -> None:
        self.reader, self.metrics, self.budget = reader, metrics, budget

    async def release(
        self, namespace: str, topics: Mapping[str, Any], unlocks: Sequence[LockRelease]
    ) -> list[Released]:
        """Each of ``unlocks`` of a group of ``namespace``, whose Topic specs (resource name ->
        spec) are ``topics``."""
        by_name = {t.topic_name: t for t in (read_topic_spec(r, body) for r, body in topics.items())}
        results = []
        for unlock in unlocks:
            try:
                async with asyncio.timeout(self.budget):
                    problems = await self._release(namespace, by_name, unlock)
            except TimeoutError:
                problems = [f"not done within {self.budget:g} s"]
            done = 0 if problems else len(unlock.queues)
            self.metrics.broker_unlocks.labels("released" if done else "failed").inc(len(unlock.queues))
            results.append(Released(unlock, done, tuple(problems)))
        return results

    async def _release(
        self, namespace: str, specs: Mapping[str, TopicSpec], unlock: LockRelease
    ) -> list[str]:
        by_topic: dict[str, list[MessageQueue]] = {}
        for mq in unlock.queues:
            by_topic.setdefault(mq.topic, []).append(mq)
        calls = []
        problems = []
        for topic_name, queues in sorted(by_topic.items()):
            topic = specs.get(topic_name)
            if topic is None:
                problems.append(f"no Topic of namespace {namespace} names RocketMQ topic {topic_name}")
                continue
            located = await self._brokers(namespace, topic, queues)
            if isinstance(located, str):
                problems.append(located)
                continue
            admin, addresses = located
            for broker, qs in sorted(addresses.items()):
                for client in unlock.clients:
                    calls.append(admin.unlock(broker, unlock.group, client, qs))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, AdminError):
                problems.append(str(result))
            elif isinstance(result, BaseException):
                raise result
        return problems

    async def _brokers(
        self, namespace: str, topic: TopicSpec, queues: Sequence[MessageQueue]
    ) -> tuple[BrokerAdmin, dict[str, list[BrokerQueue]]] | str:
        """The admin client for ``topic``'s brokers and ``queues`` by their master's address, or
        why they cannot be reached."""
        credentials: Credentials | None = None
        name_server = topic.name_server
        if name_server is not None and name_server.acl_secret:
            got = await self.reader.credentials(namespace, name_server.acl_secret, topic.topic_name)
            if not isinstance(got, Credentials):
                return got.message
            credentials = got
        self.reader.begin_round()  # the route as it is now
        route = await self.reader.route(topic.topic_name, list(name_server.addresses) if name_server else [])
        if isinstance(route, BrokerFailure):
            return route.message
        addresses: dict[str, list[BrokerQueue]] = {}
        for mq in queues:
            broker = route.broker(mq.broker_name)
            address = broker_address(broker.addresses) if broker is not None else None
            if address is None:
                return f"broker {mq.broker_name}: the route of {topic.topic_name} names no master for it"
            addresses.setdefault(address, []).append(BrokerQueue(mq.topic, mq.broker_name, mq.queue_id))
        return BrokerAdmin(self.reader.timeout, credentials), addresses
