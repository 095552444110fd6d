"""The ConsumerGroup reconciler: one group's observed state read from the world's caches,
reconciled (reconcile.py is pure) and written: the ConfigMap, the status, the journal line, the
metrics, the Events.

A failed reconcile goes back on the work queue with its backoff; a conflict (someone else wrote
the ConfigMap) at once, from a fresh read. The lag loop's readings (lagpoll.py) are written here
too, so one writer keeps the group's conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
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
from mqbalance.operator.conditions import set_condition
from mqbalance.operator.handover import Alive
from mqbalance.operator.journal import Journal
from mqbalance.operator.lagpoll import LAG_CONDITION, without_time
from mqbalance.operator.leases import lease_record
from mqbalance.operator.metrics import LagFigures, OperatorMetrics
from mqbalance.operator.reconcile import Observed, Outcome, decision_size, reconcile
from mqbalance.operator.spec import selector_or_none
from mqbalance.operator.state import GroupState
from mqbalance.operator.status import reconcile_failed
from mqbalance.operator.world import World
from mqbalance.operator.writes import Writer, merge_patch, published_from

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
    _thread_busy: bool = field(default=False, init=False)
    """A large group is being decided off the event loop (one at a time)."""

    async def work(self, namespace: str, name: str) -> None:
        """Reconcile the group, and requeue it as its result asks."""
        state = self.world.groups.get((namespace, name))
        if state is None:
            return
        key = ("group", namespace, name)
        try:
            outcome = await self.reconcile_group(state)
        except ThreadBusy:
            # Another large group is being decided: this one's turn comes without holding a worker.
            self.world.queue.add_after(key, BUSY_RETRY_SECONDS)
            return
        except Conflict as e:
            # Someone else wrote the ConfigMap: read it again and recompute at once.
            self.metrics.reconcile_errors.labels("conflict").inc()
            state.published = None
            state.reread = True
            state.conflicts += 1
            if state.conflicts <= CONFLICT_RETRIES:
                self.world.queue.add(key)
            else:
                self._retry_later(state, "api", str(e))
        except ApiError as e:
            self._retry_later(state, "api", str(e))
        except Exception as e:
            logger.exception("reconcile of %s/%s failed", namespace, name)
            error = f"{type(e).__name__}: {e}"
            self._retry_later(state, "internal", error)
            await self._report_failure(state, error)
        else:
            self.world.queue.forget_failures(key)
            state.conflicts = 0
            result = "published" if outcome.document else "invalid" if outcome.invalid else "unchanged"
            self.metrics.reconciles.labels(result).inc()

    def _retry_later(self, state: GroupState, kind: str, error: str) -> None:
        """Count, log and post the failure, and requeue the group with backoff."""
        self.metrics.reconcile_errors.labels(kind).inc()
        self.metrics.reconciles.labels("error").inc()
        delay = self.world.queue.add_rate_limited(("group", state.namespace, state.name))
        message = f"{error}; retrying in {delay:g}s"
        logger.warning("%s/%s: %s", state.namespace, state.name, message)
        self.writer.post_event(state.body, "Warning", "ReconcileFailed", message)

    async def _report_failure(self, state: GroupState, error: str) -> None:
        """A reconcile raised: Ready says why, the published assignment and its figures stay.
        (An API error does not get here: the status write would meet the API server's trouble too.)"""
        current = state.written_status or {}
        generation = int(state.body["metadata"].get("generation") or 0)
        status = reconcile_failed(current, error, self.clock(), generation)
        if status == current:  # the same failure again
            return
        try:
            await self.writer.patch_status(
                state.namespace, CONSUMER_GROUPS, state.name, merge_patch(state.written_status, status)
            )
        except ApiError as e:
            logger.warning("%s/%s: status not written: %s", state.namespace, state.name, e)
            return
        state.written_status = status

    async def reconcile_group(self, state: GroupState) -> Outcome:
        started = time.perf_counter()
        ns, name, body = state.namespace, state.name, state.body
        finalizers = list(body["metadata"].get("finalizers") or [])
        if LEGACY_FINALIZER in finalizers:
            await self.writer.remove_finalizer(ns, CONSUMER_GROUPS, name, finalizers, LEGACY_FINALIZER)
            finalizers.remove(LEGACY_FINALIZER)
            state.body = body = {**body, "metadata": {**body["metadata"], "finalizers": finalizers}}
        if state.published is None:
            if state.reread:
                state.published = await self.writer.read_published(ns, name)
                state.reread = False
            else:
                state.published = published_from(self.world.configmaps.get((ns, configmap_name(name))))
            problem = state.published.problem
            if problem and problem != state.reported_problem:
                self.writer.post_event(
                    body, "Warning", "UnreadableAssignment", f"{problem}; it will be replaced"
                )
            state.reported_problem = problem
        previous = state.published.document
        state.published.decoded = None  # between reconciles only its text is kept
        spec = dict(body.get("spec") or {})
        pods = self.world.pods.candidates(ns, selector_or_none(spec))
        nodes = {p.node_name for p in pods if p.node_name}
        releases = self.world.configmaps.get((ns, releases_configmap_name(name))) or {}
        # The hysteresis counts lag readings, not reconciles: a reconcile of a sample already
        # counted starts again from the state before it.
        fresh = state.rates is not None and state.rates_sample != state.load_sample
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
            status=state.written_status or {},
            acks=decode_acks(releases.get("data")),
            alive=self._alive(ns, previous),
            loads=state.rates,
            load_state=state.load_state if fresh else state.load_base,
            load_target=state.load_target,
            leases=self.world.member_leases(state),
            releases_configmap=bool(releases) or state.releases_made,
        )
        computing = time.perf_counter()
        outcome = await self.decide(observed)
        compute_seconds = time.perf_counter() - computing
        if await self._lease_renewed_meanwhile(ns, previous, observed, outcome):
            # The watch lagged: judge again with what the API server says.
            observed = replace(observed, leases=self.world.member_leases(state))
            outcome = await self.decide(observed)
        self.world.remember(state, outcome)
        if outcome.ensure_releases:
            # Before anyone is asked to acknowledge, and early enough for applications that
            # acknowledge the generation they first read.
            await self.writer.ensure_releases(body)
            state.releases_made = True
        if outcome.document is not None:
            state.writing = []
            try:
                state.published = await self.writer.publish(body, outcome.document, state.published)
            finally:
                seen, state.writing = state.writing, None
            if all(version == state.published.resource_version for version in seen):
                state.published.share(self.world.configmaps.get((ns, configmap_name(name))))  # back already?
            else:  # changed or deleted by someone else right after our write: read it again
                state.published = None
                self.world.enqueue(state)
            if outcome.journal is not None:
                self.journal.write(replace(outcome.journal, compute_seconds=compute_seconds))
            self.metrics.rebalances.labels(outcome.document.reason).inc()
            if outcome.figures is not None:
                self.metrics.queues_moved.inc(outcome.figures.moved)
            self.metrics.rebalance_duration.observe(time.perf_counter() - started)
        status = with_lag(outcome.status, state.lag, state.lag_condition)
        if status != state.written_status:
            await self.writer.patch_status(
                ns, CONSUMER_GROUPS, name, merge_patch(state.written_status, status)
            )
            # The watch may have brought the patched status back already: keep that copy then.
            cached = state.body.get("status")
            state.written_status = cached if cached == status else status
        state.invalid = outcome.invalid
        for note in outcome.notes:
            self.writer.post_event(body, note.type, note.reason, note.message)
        if outcome.handover is not None:
            self.metrics.observe_handover(outcome.handover)
        if outcome.wake_at is not None:  # a release may time out then
            self.world.queue.add_after(("group", ns, name), max(0.0, outcome.wake_at - self.clock()))
        if outcome.lease_wake_at is not None:  # a member Lease may lapse, or have been silent enough, then
            delay = outcome.lease_wake_at - self.world.monotonic()
            self.world.queue.add_after(("group", ns, name), max(0.0, delay))
        return outcome

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

    # -- lag, from the lag loop (lagpoll.py) ----------------------------------------------------------

    async def set_lag(
        self,
        state: GroupState,
        lag: dict[str, Any],
        condition: tuple[str, str, str],
        figures: LagFigures,
    ) -> None:
        """Take a reading of the group's lag: metrics at once, ``status.lag`` written when it changed.

        A change of the LagAvailable condition goes through the group's work queue (the worker
        writes the conditions, so two writers never race on them); the figures alone are a merge
        patch of ``status.lag``, which touches nothing else. Never raises for the API server.
        """
        if self.world.groups.get((state.namespace, state.name)) is not state:
            return  # deleted meanwhile
        state.lag_figures = figures
        kind, reason, message = condition
        old = state.lag_condition or next(
            (
                c
                for c in (state.written_status or {}).get("conditions") or []
                if c.get("type") == LAG_CONDITION
            ),
            None,
        )
        generation = int(state.body["metadata"].get("generation") or 0)
        if old is None or (old.get("status"), old.get("reason"), old.get("message")) != condition:
            state.lag_condition = set_condition(
                [dict(old)] if old else [], LAG_CONDITION, kind, reason, message, self.clock(), generation
            )[0]
            if kind == "True":
                logger.info("%s/%s: lag read from every broker again", state.namespace, state.name)
            else:
                logger.warning("%s/%s: lag partly unknown: %s", state.namespace, state.name, message)
            state.lag = lag
            self.world.enqueue(state)
            return
        state.lag_condition = dict(old)
        written = (state.written_status or {}).get("lag")
        state.lag = lag
        if without_time(written) == without_time(lag) or state.written_status is None:
            return
        try:
            await self.writer.patch_status(state.namespace, CONSUMER_GROUPS, state.name, {"lag": lag})
        except ApiError as e:
            logger.info("%s/%s: status.lag not written: %s", state.namespace, state.name, e)
            return
        if state.written_status is not None:
            state.written_status = {**state.written_status, "lag": lag}


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


def with_lag(
    status: dict[str, Any], lag: Mapping[str, Any] | None, condition: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The reconcile's status with the lag loop's ``status.lag`` and LagAvailable condition."""
    if lag is None and condition is None:
        return status
    out = dict(status)
    if lag is not None:
        out["lag"] = lag
    if condition is not None:
        rest = [c for c in out.get("conditions") or [] if c.get("type") != LAG_CONDITION]
        out["conditions"] = [*rest, dict(condition)]
    return out
