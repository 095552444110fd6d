"""Orchestration: the observed world, which groups an event concerns, and each group's reconcile loop.

The informers (informer.py) keep the Pods, Nodes, Topics and assignment ConfigMaps
in the caches here and feed their changes in; kopf runs :meth:`Controller.run_group`
as one daemon per ConsumerGroup. No group reconciles before every cache has its
first complete listing (:attr:`Controller.synced`): a restarted operator never sees
a half-listed world, so it reshuffles nothing. A group's loop sleeps until poked,
waits out the debounce window so a burst of pod changes becomes one rebalance,
reconciles once from the whole observed state (reconcile.py), then writes the
ConfigMap, the status, the journal line, the metrics and the Events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.document import configmap_name
from mqbalance.operator.journal import Journal
from mqbalance.operator.kubeapi import ApiError, Conflict, KubeApi, Published, published_from
from mqbalance.operator.membership import PodIndex, PodInfo
from mqbalance.operator.metrics import GroupGauges, OperatorMetrics
from mqbalance.operator.reconcile import Observed, Outcome, reconcile
from mqbalance.operator.spec import (
    DEFAULT_DEBOUNCE_SECONDS,
    LabelSelector,
    SpecError,
    parse_selector,
    parse_topic,
)

logger = logging.getLogger("mqbalance.operator")

MAX_BACKOFF_SECONDS = 60.0
CONFLICT_RETRIES = 5

PostEvent = Callable[[Mapping[str, Any], str, str, str], None]
"""(object body, type, reason, message) -> None: posts a Kubernetes Event."""


@dataclass
class GroupState:
    namespace: str
    name: str
    trigger: asyncio.Event = field(default_factory=asyncio.Event)
    urgent: bool = False
    """Skip the debounce window (spec, Topic and ConfigMap changes, retries)."""
    published: Published | None = None
    """The ConfigMap as we last read or wrote it; None means read it again."""
    reread: bool = False
    """Read the ConfigMap from the API, not the watch cache (which may lag behind a conflicting write)."""
    written_status: dict[str, Any] | None = None
    invalid: bool = False
    """The last reconcile found the spec invalid (only this of its outcome is kept: memory per group)."""
    selector: LabelSelector | None = None
    topics: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()
    """Nodes of the pods the selector matched at the last reconcile."""
    pods: frozenset[str] = frozenset()
    seen_generation: int | None = None
    debounce: float = DEFAULT_DEBOUNCE_SECONDS
    reported_problem: str | None = None

    def poke(self, urgent: bool = False) -> None:
        self.urgent = self.urgent or urgent
        self.trigger.set()

    def concerns_pod(self, name: str, labels: Mapping[str, str]) -> bool:
        return self.selector is None or name in self.pods or self.selector.matches(labels)

    def gauges(self) -> GroupGauges:
        status = self.written_status or {}
        return GroupGauges(
            namespace=self.namespace,
            group=self.name,
            members=int(status.get("members", 0)),
            queues=int(status.get("queues", 0)),
            imbalance=int(status.get("maxLoad", 0)) - int(status.get("minLoad", 0)),
            topic_imbalance=int(status.get("topicSpread", 0)),
            cross_zone_queues=int(status.get("crossZoneQueues", 0)),
            unassigned_queues=int(status.get("unassignedQueues", 0)),
            generation=int(status.get("assignmentGeneration", 0)),
            invalid=self.invalid,
        )


class Controller:
    def __init__(
        self,
        api: KubeApi,
        metrics: OperatorMetrics,
        journal: Journal,
        post_event: PostEvent,
        clock: Callable[[], float] = time.time,
        debounce_override: float | None = None,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.journal = journal
        self.post_event = post_event
        self.clock = clock
        self.debounce_override = debounce_override
        self.groups: dict[tuple[str, str], GroupState] = {}
        self._by_namespace: dict[str, dict[str, GroupState]] = {}
        self.pods = PodIndex()
        self.node_labels: dict[str, dict[str, str]] = {}
        self.topics: dict[str, dict[str, Mapping[str, Any]]] = {}
        """Namespace -> Topic resource name -> spec."""
        self.configmaps: dict[tuple[str, str], Mapping[str, Any]] = {}
        """(namespace, name) -> our assignment ConfigMaps as last seen by the watch."""
        self.synced = asyncio.Event()
        """Set once every cache above has been listed completely."""

    # -- events in (from the informers, in the event loop) ---------------------------------------

    def on_pod(self, namespace: str, name: str, info: PodInfo | None) -> None:
        """A pod changed; poke the groups it may belong to if anything membership depends on changed."""
        old = self.pods.put(namespace, info) if info is not None else self.pods.remove(namespace, name)
        if old == info or not self.synced.is_set():
            return  # before the first listing is whole no group has reconciled: nothing to poke
        # Each version alone: a pod can start matching because a label went away (DoesNotExist,
        # NotIn), which the union of its old and new labels would hide.
        versions = [pod.labels for pod in (old, info) if pod is not None]
        for state in self._in_namespace(namespace):
            if any(state.concerns_pod(name, labels) for labels in versions):
                state.poke()

    def on_node(self, name: str, labels: Mapping[str, str] | None) -> None:
        new = dict(labels) if labels is not None else None
        if self.node_labels.get(name) == new:
            return
        if new is None:
            self.node_labels.pop(name, None)
        else:
            self.node_labels[name] = new
        if not self.synced.is_set():
            return
        for state in self.groups.values():
            if name in state.nodes:
                state.poke()

    def on_topic(self, namespace: str, name: str, spec: Mapping[str, Any] | None) -> None:
        """A Topic's spec changed or it went away (``spec`` None); its status alone concerns no group."""
        topics = self.topics.setdefault(namespace, {})
        if topics.get(name) == spec:
            return
        if spec is None:
            topics.pop(name, None)
        else:
            topics[name] = spec
        if not topics:
            del self.topics[namespace]
        if not self.synced.is_set():
            return
        for state in self._in_namespace(namespace):
            if state.selector is None or name in state.topics:
                state.poke(urgent=True)

    def on_group(self, namespace: str, name: str, generation: int | None) -> None:
        state = self.groups.get((namespace, name))
        if state is not None and generation != state.seen_generation:
            state.poke(urgent=True)

    def on_configmap(self, namespace: str, name: str, group: str, body: Mapping[str, Any] | None) -> None:
        """Group ``group``'s ConfigMap changed or went away (``body`` None): re-read it unless we wrote it."""
        if body is None:
            self.configmaps.pop((namespace, name), None)
        else:
            self.configmaps[(namespace, name)] = body
        state = self.groups.get((namespace, group))
        if state is None:
            return
        resource_version = (body or {}).get("metadata", {}).get("resourceVersion")
        if state.published is not None and resource_version == state.published.resource_version:
            return
        state.published = None
        state.poke(urgent=True)

    def _in_namespace(self, namespace: str) -> list[GroupState]:
        return list(self._by_namespace.get(namespace, {}).values())

    def _register(self, state: GroupState) -> None:
        self.groups[(state.namespace, state.name)] = state
        self._by_namespace.setdefault(state.namespace, {})[state.name] = state

    def _unregister(self, state: GroupState) -> None:
        if self.groups.get((state.namespace, state.name)) is state:
            del self.groups[(state.namespace, state.name)]
            in_namespace = self._by_namespace[state.namespace]
            del in_namespace[state.name]
            if not in_namespace:
                del self._by_namespace[state.namespace]

    # -- the per-group loop ------------------------------------------------------------------

    async def run_group(self, body: Mapping[str, Any]) -> None:
        """Reconcile one ConsumerGroup until cancelled (kopf cancels the daemon when the group goes)."""
        meta = body["metadata"]
        state = GroupState(meta["namespace"], meta["name"])
        state.written_status = json.loads(json.dumps(body.get("status") or {})) or None
        self._register(state)
        state.poke(urgent=True)
        failures = conflicts = 0
        try:
            await self.synced.wait()
            while True:
                await state.trigger.wait()
                if not state.urgent:
                    window = self.debounce_override if self.debounce_override is not None else state.debounce
                    if window > 0:
                        await asyncio.sleep(window)
                state.trigger.clear()
                state.urgent = False
                try:
                    outcome = await self.reconcile_group(state, body)
                    failures = conflicts = 0
                    result = (
                        "published" if outcome.document else "invalid" if outcome.invalid else "unchanged"
                    )
                    self.metrics.reconciles.labels(result).inc()
                except Conflict as e:
                    # Someone else wrote the ConfigMap: read it again and recompute at once.
                    self.metrics.reconcile_errors.labels("conflict").inc()
                    state.published = None
                    state.reread = True
                    conflicts += 1
                    if conflicts <= CONFLICT_RETRIES:
                        state.poke(urgent=True)
                    else:
                        failures += 1
                        self._retry_later(state, body, "api", e, failures)
                except ApiError as e:
                    failures += 1
                    self._retry_later(state, body, "api", e, failures)
                except Exception as e:
                    failures += 1
                    logger.exception("reconcile of %s/%s failed", state.namespace, state.name)
                    self._retry_later(state, body, "internal", e, failures)
        finally:
            self._unregister(state)

    def _retry_later(
        self, state: GroupState, body: Mapping[str, Any], kind: str, error: Exception, failures: int
    ) -> None:
        self.metrics.reconcile_errors.labels(kind).inc()
        self.metrics.reconciles.labels("error").inc()
        delay = min(2.0 ** (failures - 1), MAX_BACKOFF_SECONDS)
        message = f"{error}; retrying in {delay:g}s"
        logger.warning("%s/%s: %s", state.namespace, state.name, message)
        self.post_event(body, "Warning", "ReconcileFailed", message)
        asyncio.get_running_loop().call_later(delay, state.poke, True)

    async def reconcile_group(self, state: GroupState, body: Mapping[str, Any]) -> Outcome:
        started = time.perf_counter()
        ns, name = state.namespace, state.name
        meta = body["metadata"]
        if state.published is None:
            if state.reread:
                state.published = await self.api.read_published(ns, name)
                state.reread = False
            else:
                state.published = published_from(self.configmaps.get((ns, configmap_name(name))))
            problem = state.published.problem
            if problem and problem != state.reported_problem:
                self.post_event(body, "Warning", "UnreadableAssignment", f"{problem}; it will be replaced")
            state.reported_problem = problem
        spec = dict(body.get("spec") or {})
        pods = self.pods.candidates(ns, _selector(spec))
        nodes = {p.node_name for p in pods if p.node_name}
        observed = Observed(
            namespace=ns,
            name=name,
            spec=spec,
            topics=self.topics.get(ns, {}),
            pods=pods,
            node_labels={n: self.node_labels[n] for n in nodes if n in self.node_labels},
            previous=state.published.document,
            now=self.clock(),
            generation=int(meta.get("generation") or 0),
            status=state.written_status or {},
        )
        outcome = reconcile(observed)
        self._remember(state, outcome, pods, spec, observed.generation)
        if outcome.document is not None:
            state.published = await self.api.publish(ns, body, outcome.document, state.published)
            if outcome.journal is not None:
                self.journal.write(outcome.journal)
            self.metrics.rebalances.labels(outcome.document.reason).inc()
            if outcome.figures is not None:
                self.metrics.queues_moved.inc(outcome.figures.moved)
            self.metrics.rebalance_duration.observe(time.perf_counter() - started)
        if outcome.status != state.written_status:
            await self.api.patch_status(
                ns, "consumergroups", name, merge_patch(state.written_status, outcome.status)
            )
            state.written_status = outcome.status
        state.invalid = outcome.invalid
        for note in outcome.notes:
            self.post_event(body, note.type, note.reason, note.message)
        return outcome

    def _remember(
        self,
        state: GroupState,
        outcome: Outcome,
        pods: list[PodInfo],
        spec: Mapping[str, Any],
        generation: int,
    ) -> None:
        """What later events are matched against: the selector, topics, pods and nodes of this group."""
        state.seen_generation = generation
        topics = spec.get("topics")
        state.topics = (
            frozenset(t for t in topics if isinstance(t, str)) if isinstance(topics, list) else frozenset()
        )
        if outcome.spec is None:
            state.selector = None  # unparseable: any change in the namespace may matter
            return
        state.selector = outcome.spec.selector
        state.debounce = outcome.spec.debounce_seconds
        matched = [p for p in pods if outcome.spec.selector.matches(p.labels)]
        state.pods = frozenset(p.name for p in matched)
        state.nodes = frozenset(p.node_name for p in matched if p.node_name)

    # -- Topic status ------------------------------------------------------------------------

    async def update_topic_status(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        try:
            route = parse_topic(meta["name"], body.get("spec"))
        except SpecError:
            return
        status = {
            "observedGeneration": int(meta.get("generation") or 0),
            "brokers": len(route.brokers),
            "readableQueues": len(route.readable_queues()),
            "writableQueues": len(route.writable_queues()),
        }
        current = body.get("status") or {}
        if any(current.get(k) != v for k, v in status.items()):
            await self.api.patch_status(meta["namespace"], "topics", meta["name"], status)

    # -- read-outs ---------------------------------------------------------------------------

    def gauges(self) -> list[GroupGauges]:
        return [s.gauges() for s in list(self.groups.values()) if s.written_status]


def _selector(spec: Mapping[str, Any]) -> LabelSelector | None:
    """The spec's selector, to narrow the pods looked at; None (every pod) when it does not parse."""
    try:
        return parse_selector(spec.get("selector"))
    except SpecError:
        return None


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch from ``old`` to ``new``; keys that disappeared become null, else they would stay."""
    patch: dict[str, Any] = {}
    old = old or {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        elif value != before or key not in old:
            patch[key] = value
    return patch
