"""The ConsumerGroup reconciler: one group's observed state read from the world's caches,
reconciled (reconcile.py is pure) and its effects carried out: the ConfigMaps and the status
through the group's publication (publication.py), the journal line, the metrics, the Events, the
times to look again, and the group's interest handed to the world for routing later changes.

It is the one writer of a group's status: the lag loop's readings (lagpoll.py) reach it through
the world, and every status written carries the last one. A failed reconcile goes back on the
work queue with its backoff; a conflict (someone else wrote the ConfigMap) at once, from a fresh
read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from mqbalance.contract import (
    CONSUMER_GROUPS,
    AssignmentDocument,
    configmap_name,
    decode_acks,
    member_lease_name,
    releases_configmap_name,
)
from mqbalance.kube import ApiError, Conflict
from mqbalance.operator.broker_locks import BrokerLocks
from mqbalance.operator.handover import Alive
from mqbalance.operator.journal import Journal
from mqbalance.operator.leases import lease_record
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.observation import LockRelease
from mqbalance.operator.reconcile import Observed, Outcome, decision_size, reconcile
from mqbalance.operator.spec import selector_or_none
from mqbalance.operator.status import reconcile_failed
from mqbalance.operator.world import CachedGroup, World
from mqbalance.operator.writes import Writer

logger = logging.getLogger("mqbalance.operator")

CONFLICT_RETRIES = 5
OFF_LOOP_WORK = 100_000
"""Candidate pods squared times subscribed topics above which a group's decision is computed on the
reconcile thread, off the event loop: what STICKY's costliest step grows with (a thousand pods of
64 topics take minutes of CPU), so that one tenant's large group cannot hold up every other group."""
BUSY_RETRY_SECONDS = 1.0
"""How soon a large group whose turn on the reconcile thread has not come is tried again."""
LEGACY_FINALIZER = "mqbalance.io/operator"
"""Added to every group by operator 0.1 (kopf's daemons needed it); removed on sight, or a group
could not be deleted any more."""


@dataclass(eq=False)
class GroupReconciler:
    """Reconciles ConsumerGroups, each by one worker at a time (the work queue sees to that)."""

    world: World
    writer: Writer
    metrics: OperatorMetrics
    journal: Journal
    clock: Callable[[], float]
    """Wall clock for status times and documents."""
    locks: BrokerLocks | None = None
    """Releases a stopped member's broker locks (handover Orderly); None: they expire."""
    _thread_busy: bool = field(default=False, init=False)
    """A large group is being decided off the event loop (one at a time)."""

    async def work(self, namespace: str, name: str) -> None:
        """Reconcile the group, and requeue it as its result asks."""
        group = self.world.groups.get((namespace, name))
        if group is None:
            return
        key = group.work_key
        try:
            outcome = await self._reconcile_timed(group)
        except ThreadBusy:
            # Another large group is being decided: this one's turn comes without holding a worker.
            self.world.queue.add_after(key, BUSY_RETRY_SECONDS)
            return
        except Conflict as e:
            # Someone else wrote the ConfigMap: read it again and recompute at once.
            self.metrics.reconcile_errors.labels("conflict").inc()
            if group.publication.conflicted() <= CONFLICT_RETRIES:
                self.world.queue.add(key)
            else:
                self._retry_later(group, "api", str(e))
        except ApiError as e:
            self._retry_later(group, "api", str(e))
        except Exception as e:
            logger.exception("reconcile of %s/%s failed", namespace, name)
            error = f"{type(e).__name__}: {e}"
            self._retry_later(group, "internal", error)
            await self._report_failure(group, error)
        else:
            self.world.queue.forget_failures(key)
            group.publication.reconciled()
            result = "published" if outcome.document else "invalid" if outcome.invalid else "unchanged"
            self.metrics.reconciles.labels(result).inc()

    def _retry_later(self, group: CachedGroup, kind: str, error: str) -> None:
        """Count, log and post the failure, and requeue the group with backoff."""
        self.metrics.reconcile_errors.labels(kind).inc()
        self.metrics.reconciles.labels("error").inc()
        delay = self.world.queue.add_rate_limited(group.work_key)
        message = f"{error}; retrying in {delay:g}s"
        logger.warning("%s/%s: %s", group.namespace, group.name, message)
        self.writer.post_event(group.body, "Warning", "ReconcileFailed", message)

    async def _report_failure(self, group: CachedGroup, error: str) -> None:
        """A reconcile raised: Ready says why, the published assignment and its figures stay.
        (An API error does not get here: the status write would meet the API server's trouble too.)"""
        current = group.publication.status or {}
        generation = int(group.body["metadata"].get("generation") or 0)
        status = reconcile_failed(current, error, self.clock(), generation)
        if status == current:  # the same failure again
            return
        try:
            await group.publication.write_status(
                self.writer, group.namespace, group.name, status, lambda: group.body.get("status")
            )
        except ApiError as e:
            logger.warning("%s/%s: status not written: %s", group.namespace, group.name, e)

    async def _reconcile_timed(self, group: CachedGroup) -> Outcome:
        """:meth:`reconcile_group`, observing the time from the change it answers to the generation
        it publishes (the operator's step of a move's trace)."""
        since = group.take_change()
        try:
            return await self.reconcile_group(group, since)
        except BaseException:
            group.keep_change(since)
            raise

    async def reconcile_group(self, group: CachedGroup, since: float | None = None) -> Outcome:
        """One reconcile; ``since``: the monotonic time of the first change it answers, if known."""
        started = time.perf_counter()
        ns, name = group.namespace, group.name
        body = await self._without_legacy_finalizer(group)
        publication = group.publication
        cm_key = (ns, configmap_name(name))
        previous, problem = await publication.read(self.writer, ns, name, self.world.configmaps.get(cm_key))
        if problem:
            self.writer.post_event(body, "Warning", "UnreadableAssignment", f"{problem}; it will be replaced")
        spec = dict(body.get("spec") or {})
        pods = self.world.pods.candidates(ns, selector_or_none(spec))
        nodes = {p.node_name for p in pods if p.node_name}
        releases = self.world.configmaps.get((ns, releases_configmap_name(name)))
        loads, load_state, load_target = group.load.observed()
        observed = Observed(
            namespace=ns,
            name=name,
            spec=spec,
            topics=self.world.topic_specs.get(ns, {}),
            routes=self.world.topic_routes.get(ns, {}),
            pods=pods,
            node_labels={n: self.world.node_labels[n] for n in nodes if n in self.world.node_labels},
            previous=previous,
            now=self.clock(),
            generation=int(body["metadata"].get("generation") or 0),
            status=publication.status or {},
            acks=decode_acks((releases or {}).get("data")),
            alive=self._alive(ns, previous),
            loads=loads,
            load_state=load_state,
            load_target=load_target,
            leases=self.world.member_leases(group),
            releases_configmap=releases is not None or publication.releases_made,
            lag=group.lag,
            pause=self.world.pause_holds(ns, name),
        )
        computing = time.perf_counter()
        outcome = await self.decide(observed)
        compute_seconds = time.perf_counter() - computing
        if await self._lease_renewed_meanwhile(ns, previous, observed, outcome):
            # The watch lagged: judge again with what the API server says.
            observed = replace(observed, leases=self.world.member_leases(group))
            outcome = await self.decide(observed)
        self.world.route(group, outcome.interest)
        group.load.keep(outcome)
        if outcome.ensure_releases:
            # Before anyone is asked to acknowledge, and early enough for applications that
            # acknowledge the generation they first read.
            await publication.ensure_releases(self.writer, body)
        if outcome.document is not None:
            if outcome.unlocks and self.locks is not None:
                # Before the new owners are told: their first lock attempt must find the queue free.
                await self._release_locks(body, outcome.unlocks)
            if await publication.publish(
                self.writer, body, outcome.document, lambda: self.world.configmaps.get(cm_key)
            ):
                self.world.enqueue(group)  # changed or deleted by someone else right after our write
            latency = None if since is None else round(max(0.0, self.world.monotonic() - since), 6)
            if latency is not None:
                self.metrics.generation_latency.labels(outcome.document.reason).observe(latency)
            if outcome.journal is not None:
                timed = replace(outcome.journal, compute_seconds=compute_seconds)
                self.journal.write(replace(timed, since_change_seconds=latency))
            self.metrics.rebalances.labels(outcome.document.reason).inc()
            if outcome.figures is not None:
                self.metrics.queues_moved.inc(outcome.figures.moved)
            self.metrics.rebalance_duration.observe(time.perf_counter() - started)
        await publication.write_status(
            self.writer, ns, name, outcome.status, lambda: group.body.get("status")
        )
        for note in outcome.notes:
            self.writer.post_event(body, note.type, note.reason, note.message)
        if outcome.handover is not None:
            self.metrics.observe_handover(outcome.handover)
        if outcome.wake_at is not None:  # a release may time out then
            self.world.queue.add_after(group.work_key, max(0.0, outcome.wake_at - self.clock()))
        if outcome.lease_wake_at is not None:  # a member Lease may lapse, or have been silent enough, then
            delay = outcome.lease_wake_at - self.world.monotonic()
            self.world.queue.add_after(group.work_key, max(0.0, delay))
        return outcome

    async def _release_locks(self, body: Mapping[str, Any], unlocks: Sequence[LockRelease]) -> None:
        assert self.locks is not None
        ns = body["metadata"]["namespace"]
        for done in await self.locks.release(ns, self.world.topic_specs.get(ns, {}), unlocks):
            unlock = done.unlock
            who = f"member {unlock.member} (RocketMQ clients {', '.join(unlock.clients)})"
            if done.problems:
                message = (
                    f"could not release the broker locks of {len(unlock.queues)} queues held by stopped "
                    f"{who}: {'; '.join(done.problems)}; their new owners wait for the locks to expire (60 s)"
                )
                logger.warning("group %s/%s: %s", ns, body["metadata"]["name"], message)
                self.writer.post_event(body, "Warning", "BrokerLocksKept", message)
            else:
                message = (
                    f"released the broker locks of {done.queues} queues held by stopped {who}: "
                    "their new owners lock them at once"
                )
                self.writer.post_event(body, "Normal", "BrokerLocksReleased", message)

    async def _without_legacy_finalizer(self, group: CachedGroup) -> Mapping[str, Any]:
        """The group's object, rid of operator 0.1's finalizer if it still had it."""
        body = group.body
        finalizers = list(body["metadata"].get("finalizers") or [])
        if LEGACY_FINALIZER not in finalizers:
            return body
        await self.writer.remove_finalizer(
            group.namespace, CONSUMER_GROUPS, group.name, finalizers, LEGACY_FINALIZER
        )
        finalizers.remove(LEGACY_FINALIZER)
        body = {**body, "metadata": {**body["metadata"], "finalizers": finalizers}}
        self.world.wrote(group, body)
        return body

    async def decide(self, observed: Observed) -> Outcome:
        """The pure reconcile of ``observed``: at once for most groups; for a large one (see
        :data:`OFF_LOOP_WORK`) on the reconcile thread, from a copy of what the event loop may change
        meanwhile, while the loop goes on serving the other groups. :class:`ThreadBusy` when another
        large group holds the thread."""
        if decision_size(observed) < OFF_LOOP_WORK:
            return reconcile(observed)
        if self._thread_busy:
            raise ThreadBusy(f"{observed.namespace}/{observed.name}")
        self._thread_busy = True
        try:
            return await off_loop(reconcile, snapshot(observed), f"reconcile {observed.name}")
        finally:
            self._thread_busy = False

    async def _lease_renewed_meanwhile(
        self, namespace: str, previous: AssignmentDocument | None, observed: Observed, outcome: Outcome
    ) -> bool:
        """Before a departed owner's queues are handed on for its silent Lease, read its Lease from
        the API server: a renewal the watch has not delivered yet must hold them back. Whether any
        departed owner's Lease changed."""
        handover = outcome.handover
        if handover is None or not handover.gone or observed.leases is None or previous is None:
            return False
        departed = observed.alive.departed if isinstance(observed.alive, Alive) else frozenset()
        owners = sorted({r.owner for r in previous.releasing if r.owner in departed})
        changed = False
        for owner in owners:
            name = member_lease_name(owner)
            lease = await self.writer.read_lease(namespace, name)
            changed |= self.world.lease_read(namespace, name, lease_record(lease) if lease else None)
        return changed

    def _alive(self, namespace: str, document: AssignmentDocument | None) -> Alive:
        """The previous document's members and releasing owners whose pods exist and have not
        finished; departed: those whose pod object is gone (it may still run on a lost node)."""
        if document is None:
            return Alive()
        names = set(document.members) | {r.owner for r in document.releasing}
        alive, departed = set(), set()
        for pod_name in names:
            pod = self.world.pods.get(namespace, pod_name)
            if pod is None:
                departed.add(pod_name)
            elif not pod.finished:
                alive.add(pod_name)
        return Alive(alive, departed)


T = TypeVar("T")
A = TypeVar("A")


async def off_loop(function: Callable[[A], T], argument: A, name: str) -> T:
    """``function(argument)`` on a daemon thread of its own, awaited: the event loop runs meanwhile
    (the thread yields the interpreter lock every few milliseconds), and a stopping operator does
    not wait for it, as it would for an executor's threads."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(T, result))

    def run() -> None:
        try:
            outcome: tuple[T | None, BaseException | None] = (function(argument), None)
        except BaseException as e:  # handed to the awaiting task, which reports it
            outcome = (None, e)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


class ThreadBusy(Exception):
    """A large group's decision waits for the reconcile thread (another group's is being computed)."""


def snapshot(observed: Observed) -> Observed:
    """``observed`` with its own copies of the world's mappings the event loop changes in place (the
    namespace's Topic specs and routes, the member Leases seen): what a reconcile off the loop reads."""
    leases = observed.leases
    if leases is not None:
        leases = replace(leases, changed=dict(leases.changed))
    return replace(observed, topics=dict(observed.topics), routes=dict(observed.routes), leases=leases)
