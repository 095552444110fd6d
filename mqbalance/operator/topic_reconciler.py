"""The Topic status reconciler: a Topic's route read from its NameServers when one is due (Topics
that name one), and its status written (topics.py says what it should be).

It runs in the groups' work loop, after them (``work_priority``): nothing waits on a Topic's
status, and a new route reaches the groups through that status anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from mqbalance.contract import TOPIC_KIND, TOPICS, TopicSpec, read_topic_spec
from mqbalance.kube import ApiError
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.topics import reconcile_failed, topic_status
from mqbalance.operator.world import CachedTopic, World
from mqbalance.operator.writes import Writer, merge_patch

logger = logging.getLogger("mqbalance.operator")


@dataclass(eq=False)
class TopicReconciler:
    """Reconciles Topic status."""

    world: World
    writer: Writer
    metrics: OperatorMetrics
    routes: RouteReader
    """Reads the routes of Topics that name a NameServer."""
    clock: Callable[[], float]

    async def work(self, namespace: str, name: str) -> None:
        """Write the Topic's status; requeue it with backoff when the API server refuses, or when
        anything else goes wrong (a bug): that is reported on the Topic too."""
        topic = self.world.topics.get((namespace, name))
        if topic is None:
            return
        key = ("topic", namespace, name)
        try:
            await self.update_topic_status(topic)
        except ApiError as e:
            self.metrics.reconcile_errors.labels("api").inc()
            delay = self.world.queue.add_rate_limited(key)
            logger.warning(
                "status of Topic %s/%s not written: %s; retrying in %g s", namespace, name, e, delay
            )
        except Exception as e:
            logger.exception("reconcile of Topic %s/%s failed", namespace, name)
            self.metrics.reconcile_errors.labels("internal").inc()
            delay = self.world.queue.add_rate_limited(key)
            await self.report_failure(topic, f"{type(e).__name__}: {e}", delay)
        else:
            self.world.queue.forget_failures(key)

    async def report_failure(self, topic: CachedTopic, error: str, delay: float) -> None:
        """A Warning Event and the RouteAvailable condition say why; the route read before stays.

        The condition leaves the delay out, so the same failure again writes nothing: our own
        write coming back through the watch queues the Topic at once, which would cut the backoff
        short every time."""
        meta = topic.body["metadata"]
        message = f"{error}; retrying in {delay:g}s"
        self.writer.post_event({**topic.body, "kind": TOPIC_KIND}, "Warning", "ReconcileFailed", message)
        current = topic.body.get("status") or {}
        status = reconcile_failed(current, error, self.clock(), int(meta.get("generation") or 0))
        if status == current:
            return
        try:
            await self.writer.patch_status(
                meta["namespace"], TOPICS, meta["name"], merge_patch(current, status)
            )
        except ApiError as e:
            logger.warning("status of Topic %s/%s not written: %s", meta["namespace"], meta["name"], e)

    async def update_topic_status(self, cached: CachedTopic) -> None:
        """Read the route if one is due (Topics that name a NameServer), then write the status."""
        meta, spec = cached.body["metadata"], cached.body.get("spec")
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation") or 0)
        topic = read_topic_spec(name, spec)
        poll = cached.poll
        if topic.name_server is not None:
            now = self.world.queue.timer.now()
            if poll.is_due(generation, now):
                await self._read_route(cached, topic, generation)
            else:  # woken by a change (our own status write, say): the next read stays due
                self.world.queue.add_after(("topic", namespace, name), poll.due - now)
        else:
            poll.clear()
        current = cached.body.get("status") or {}
        status = topic_status(name, spec, generation, current, poll.read, self.clock())
        if status != current:
            await self.writer.patch_status(namespace, TOPICS, name, merge_patch(current, status))

    async def _read_route(self, cached: CachedTopic, topic: TopicSpec, generation: int) -> None:
        assert topic.name_server is not None
        meta = cached.body["metadata"]
        poll = cached.poll
        read = await self.routes.read(topic.topic_name, list(topic.name_server.addresses))
        if read.brokers is None and (poll.read is None or poll.read.reason != read.reason):
            logger.warning("route of Topic %s not read: %s", meta["name"], read.message)
        wait = poll.record(read, generation, topic.name_server.poll_seconds, self.world.queue.timer.now())
        self.world.queue.add_after(("topic", meta["namespace"], meta["name"]), wait)
