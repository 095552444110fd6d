"""The controller, as controller-runtime's manager: it has the world's caches (world.py), one
reconciler per kind (group_reconciler.py, topic_reconciler.py, reset_reconciler.py) and the
workers that run them.

Workers take keys off the keyed work queue (workqueue.py); each key is reconciled by one worker
at a time, level-based, from the whole observed state. No key is processed before every cache
has its first complete listing (:attr:`World.synced`): a restarted operator never sees a
half-listed world, so it reshuffles nothing. Nor is a key of a namespace still being listed,
or of a shard another replica holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mqbalance.operator.group_reconciler import GroupReconciler
from mqbalance.operator.journal import Journal
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.offsets import OffsetReader
from mqbalance.operator.reset_reconciler import ResetReconciler
from mqbalance.operator.topic_reconciler import TopicReconciler
from mqbalance.operator.workqueue import WorkQueue
from mqbalance.operator.world import WorkKey, World, work_priority
from mqbalance.operator.writes import Writer

logger = logging.getLogger("mqbalance.operator")


class Controller:
    """The world (the informers feed its ``on_*``, the lag loop its ``record_*``), the reconcilers
    that read it and the work loop."""

    def __init__(
        self,
        writer: Writer,
        metrics: OperatorMetrics,
        journal: Journal,
        clock: Callable[[], float] = time.time,
        debounce_override: float | None = None,
        queue: WorkQueue[WorkKey] | None = None,
        routes: RouteReader | None = None,
        offsets: OffsetReader | None = None,
    ) -> None:
        self.world = World(
            queue=queue if queue is not None else WorkQueue(priority=work_priority),
            debounce_override=debounce_override,
        )
        self.queue = self.world.queue
        self.metrics = metrics
        self.journal = journal
        self.owns: Callable[[str, str], bool] = lambda namespace, name: True
        """Whether this replica works on a group or a Topic's status (sharding: its shard is held here)."""
        self.group_reconciler = GroupReconciler(self.world, writer, metrics, journal, clock)
        self.topic_reconciler = TopicReconciler(self.world, writer, metrics, routes or RouteReader(), clock)
        self.reset_reconciler = ResetReconciler(self.world, writer, metrics, offsets or OffsetReader(), clock)

    @property
    def writer(self) -> Writer:
        return self.group_reconciler.writer

    @writer.setter
    def writer(self, writer: Writer) -> None:
        self.group_reconciler.writer = self.topic_reconciler.writer = self.reset_reconciler.writer = writer

    async def run_worker(self) -> None:
        """Take keys off the queue and reconcile them, until cancelled.

        Whatever one key's work raises (the reconcilers report what they catch on the resource;
        this is what escapes them), the worker goes on, as controller-runtime recovers a reconcile
        that panics: the key is logged, counted and retried with its backoff."""
        await self.world.synced.wait()
        while True:
            key = await self.queue.get()
            try:
                kind, namespace, name = key
                # An OffsetReset is worked on where its group is (it holds the group paused).
                owner = self.world.reset_owner(namespace, name) if kind == "reset" else name
                if namespace in self.world.listing or not self.owns(namespace, owner):
                    continue
                if kind == "group":
                    await self.group_reconciler.work(namespace, name)
                elif kind == "reset":
                    await self.reset_reconciler.work(namespace, name)
                else:
                    await self.topic_reconciler.work(namespace, name)
            except Exception:
                delay = self.queue.add_rate_limited(key)
                logger.exception("work on %s %s/%s failed; retrying in %g s", *key, delay)
                self.metrics.reconcile_errors.labels("internal").inc()
            finally:
                self.queue.done(key)
