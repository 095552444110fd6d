"""Orchestration: the observed world, which groups a change concerns, and the work loop.

The informers (``mqbalance.kube.Informer``) keep ConsumerGroups, Topics, Pods, Nodes and the
assignment ConfigMaps in the caches here and feed their changes in (``on_*``). A change
puts the keys it concerns on a keyed work queue: at once for spec, Topic and ConfigMap
changes, after the group's debounce window for pod and node changes, so a burst of pod
changes becomes one rebalance. Workers take keys off the queue; each key is reconciled by
one worker at a time, level-based, from the whole observed state (reconcile.py is pure),
and the results are written: the ConfigMap, the status, the journal line, the metrics,
the Events. No key is processed before every cache has its first complete listing
(:attr:`Controller.synced`): a restarted operator never sees a half-listed world, so it
reshuffles nothing. A failed reconcile is retried with backoff; a conflict (someone else
wrote the ConfigMap) at once, from a fresh read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mqbalance.contract import (
    CONSUMER_GROUPS,
    GROUP_LABEL,
    TOPICS,
    AssignmentDocument,
    SpecError,
    configmap_name,
    decode_acks,
    reads_name_server,
    releases_configmap_name,
    topic_name,
)
from mqbalance.kube import ApiError, Conflict, Key
from mqbalance.operator.handover import Alive, HandoverMode
from mqbalance.operator.journal import Journal
from mqbalance.operator.membership import PodIndex, PodInfo
from mqbalance.operator.metrics import GroupGauges, OperatorMetrics
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.reconcile import Observed, Outcome, reconcile
from mqbalance.operator.spec import DEFAULT_DEBOUNCE_SECONDS, LabelSelector, parse_selector
from mqbalance.operator.topics import RouteRead, name_server_addresses, poll_seconds, topic_status
from mqbalance.operator.workqueue import WorkQueue
from mqbalance.operator.writes import Published, Writer, published_from

logger = logging.getLogger("mqbalance.operator")

MAX_BACKOFF_SECONDS = 60.0
CONFLICT_RETRIES = 5
LEGACY_FINALIZER = "mqbalance.io/operator"
"""Added to every group by operator 0.1 (kopf's daemons needed it); removed on sight, or a group
could not be deleted any more."""

WorkKey = tuple[str, str, str]
"""("group" or "topic", namespace, name)."""


def work_priority(key: WorkKey) -> int:
    """Groups before Topics: consumers wait for the one; a Topic's route read on a restart is
    already in its status, and a new route reaches the groups through that status anyway."""
    return 0 if key[0] == "group" else 1


@dataclass(slots=True)
class GroupState:
    """What the operator keeps of one ConsumerGroup between reconciles."""

    body: Mapping[str, Any]
    """The resource as last seen: metadata (namespace, name, uid, generation), spec."""
    published: Published | None = None
    """The ConfigMap as we last read or wrote it; None means read it again."""
    reread: bool = False
    """Read the ConfigMap from the API, not the watch cache (which may lag behind a conflicting write)."""
    written_status: dict[str, Any] | None = None
    invalid: bool = False
    selector: LabelSelector | None = None
    """None until reconciled, and while the spec does not parse: any pod change may matter then."""
    topics: Collection[str] = ()
    nodes: Collection[str] = ()
    """Nodes of the pods the selector matched at the last reconcile."""
    pods: Collection[str] = ()
    debounce: float = DEFAULT_DEBOUNCE_SECONDS
    reported_problem: str | None = None
    failures: int = 0
    conflicts: int = 0
    releases_made: bool = False
    """Its releases ConfigMap was created (or found): not asked for again while the watch catches up."""
    writing: list[str | None] | None = None
    """While its ConfigMap is being written: the versions the watch brought meanwhile (None: deleted)."""
    routing: tuple[str, str] | None = None
    """The label pair this group is found under when a pod changes (None: every pod may concern it)."""

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

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


@dataclass(slots=True)
class TopicState:
    body: Mapping[str, Any]
    failures: int = 0
    read: RouteRead | None = None
    """The last read of its route from a NameServer (Topics that name one)."""
    read_generation: int = -1
    read_failures: int = 0
    next_read: float = 0.0
    """When (on the work queue's clock) the route is due to be read again."""


@dataclass
class Controller:
    writer: Writer
    metrics: OperatorMetrics
    journal: Journal
    clock: Callable[[], float] = time.time
    """Wall clock for status times and documents."""
    debounce_override: float | None = None
    queue: WorkQueue[WorkKey] = field(default_factory=lambda: WorkQueue(priority=work_priority))
    routes: RouteReader = field(default_factory=RouteReader)
    """Reads the routes of Topics that name a NameServer."""
    owns: Callable[[str, str], bool] = lambda namespace, name: True
    """Whether this replica works on a group or a Topic's status (sharding: its shard is held here)."""
    groups: dict[tuple[str, str], GroupState] = field(default_factory=dict)
    topics: dict[tuple[str, str], TopicState] = field(default_factory=dict)
    pods: PodIndex = field(default_factory=PodIndex)
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    """(namespace, name) -> our ConfigMaps as last seen by the watch."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every cache has been listed completely."""
    listing: set[str] = field(default_factory=set)
    """Namespaces whose caches are being listed for the first time (sharding by namespace, where a
    replica starts watching a namespace when it takes its shard): nothing there is worked on yet."""
    _by_namespace: dict[str, dict[str, GroupState]] = field(default_factory=dict)
    _routes: dict[str, dict[tuple[str, str] | None, set[str]]] = field(default_factory=dict)
    """Namespace -> label pair (None: any) -> names of the groups a pod carrying it may concern."""
    _topic_specs: dict[str, dict[str, Mapping[str, Any]]] = field(default_factory=dict)
    _topic_routes: dict[str, dict[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Namespace -> Topic -> ``status.route``, for Topics whose route was read from a NameServer."""

    # -- changes in (from the informers) ---------------------------------------------------------

    def on_group(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        namespace, name = key
        if new is None:
            state = self.groups.pop(key, None)
            if state is not None:
                self._route(state, None, remove=True)
                del self._by_namespace[namespace][name]
                if not self._by_namespace[namespace]:
                    del self._by_namespace[namespace]
            self.queue.forget(("group", namespace, name))
            return
        state = self.groups.get(key)
        if state is None:
            state = GroupState(new, written_status=new.get("status") or None)
            self.groups[key] = state
            self._by_namespace.setdefault(namespace, {})[name] = state
            self._route(state, None)
            self._enqueue(state)
            return
        changed = old is None or old["metadata"].get("generation") != new["metadata"].get("generation")
        state.body = new
        if state.written_status is not None and new.get("status") == state.written_status:
            state.written_status = new["status"]  # our status patch come back: one copy, the cache's
        if changed or old is None or old["metadata"].get("uid") != new["metadata"].get("uid"):
            self._enqueue(state)

    def on_pod(self, key: Key, old: PodInfo | None, new: PodInfo | None) -> None:
        """A pod changed; poke the groups it may belong to if anything membership depends on changed."""
        namespace, name = key
        if new is not None:
            self.pods.put(namespace, new)
        else:
            self.pods.remove(namespace, name)
        if not self._settled(namespace):
            return  # no group has reconciled yet: the first reconciles see every pod anyway
        # Each version alone: a pod can start matching because a label went away (DoesNotExist,
        # NotIn), which the union of its old and new labels would hide.
        versions = [pod.labels for pod in (old, new) if pod is not None]
        routes = self._routes.get(namespace, {})
        names = set(routes.get(None, ()))
        for labels in versions:
            for pair in labels.items():
                names.update(routes.get(pair, ()))
        for group in names:
            state = self.groups[(namespace, group)]
            if any(state.concerns_pod(name, labels) for labels in versions):
                self._enqueue(state, debounced=True)

    def on_node(self, key: Key, old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> None:
        name = key[1]
        if new is None:
            self.node_labels.pop(name, None)
        else:
            self.node_labels[name] = dict(new)
        if not self.synced.is_set():
            return
        for state in self.groups.values():
            if name in state.nodes:
                self._enqueue(state, debounced=True)

    def on_topic(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """A Topic changed: its status may need writing, its subscribers a reconcile if its spec changed."""
        namespace, name = key
        specs = self._topic_specs.setdefault(namespace, {})
        routes = self._topic_routes.setdefault(namespace, {})
        if new is None:
            self.topics.pop(key, None)
            specs.pop(name, None)
            routes.pop(name, None)
            self.queue.forget(("topic", namespace, name))
        else:
            topic = self.topics.get(key)
            if topic is None:
                self.topics[key] = TopicState(new)
            else:
                topic.body = new
            specs[name] = new["spec"]
            route = new["status"].get("route")
            if route is None:
                routes.pop(name, None)
            else:
                routes[name] = route
            self.queue.add(("topic", namespace, name))
        if not specs:
            del self._topic_specs[namespace]
        if not routes:
            del self._topic_routes[namespace]
        if not self._settled(namespace):
            return  # before the first listing is whole, no group has run
        if old is not None and new is not None and _route_source(old) == _route_source(new):
            return  # the rest of its status concerns no group
        for state in self._in_namespace(namespace):
            if state.selector is None or name in state.topics:
                self._enqueue(state)

    def on_configmap(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """A group's ConfigMap changed or went away: re-read it unless we wrote it; new release
        acknowledgements may finish a handover."""
        if new is None:
            self.configmaps.pop(key, None)
        else:
            self.configmaps[key] = new
        labels = ((new or old or {}).get("metadata") or {}).get("labels") or {}
        state = self.groups.get((key[0], labels.get(GROUP_LABEL, "")))
        if state is None:
            return
        if key[1] == releases_configmap_name(state.name):
            self._enqueue(state)
            return
        version = ((new or {}).get("metadata") or {}).get("resourceVersion")
        if state.writing is not None:
            # Most likely our write's own echo, ahead of its answer: judged once it is answered.
            state.writing.append(version)
            return
        if state.published is not None and version == state.published.resource_version:
            state.published.share(new)  # our own write come back: keep one copy
            return
        state.published = None
        self._enqueue(state)

    def _enqueue(self, state: GroupState, *, debounced: bool = False) -> None:
        key = ("group", state.namespace, state.name)
        if not debounced:
            self.queue.add(key)
            return
        window = self.debounce_override if self.debounce_override is not None else state.debounce
        self.queue.add_after(key, window)

    def _route(self, state: GroupState, pair: tuple[str, str] | None, *, remove: bool = False) -> None:
        """File ``state`` under ``pair`` for pod changes (and out of where it was)."""
        routes = self._routes.setdefault(state.namespace, {})
        if state.name in routes.get(state.routing, ()):
            routes[state.routing].discard(state.name)
            if not routes[state.routing]:
                del routes[state.routing]
        if remove:
            if not routes:
                del self._routes[state.namespace]
            return
        state.routing = pair
        routes.setdefault(pair, set()).add(state.name)

    def _in_namespace(self, namespace: str) -> list[GroupState]:
        return list(self._by_namespace.get(namespace, {}).values())

    def _settled(self, namespace: str) -> bool:
        """Whether the namespace's caches are whole: changes there may concern groups that ran."""
        return self.synced.is_set() and namespace not in self.listing

    def listed(self, namespace: str) -> None:
        """The namespace's caches are whole: work on all of it."""
        self.listing.discard(namespace)
        self.resync(lambda ns, _: ns == namespace)

    def forget_namespace(self, namespace: str) -> None:
        """Drop everything kept of ``namespace``, which this replica no longer watches (its
        groups' ConfigMaps stay as they are, for the replica that watches it now)."""
        self.listing.discard(namespace)
        for name in self._by_namespace.pop(namespace, {}):
            del self.groups[(namespace, name)]
            self.queue.forget(("group", namespace, name))
        self._routes.pop(namespace, None)
        for key in [key for key in self.topics if key[0] == namespace]:
            del self.topics[key]
            self.queue.forget(("topic", *key))
        self._topic_specs.pop(namespace, None)
        self._topic_routes.pop(namespace, None)
        self.pods.forget(namespace)
        for key in [key for key in self.configmaps if key[0] == namespace]:
            del self.configmaps[key]

    def resync(self, selects: Callable[[str, str], bool] | None = None) -> None:
        """Queue every group and Topic (that ``selects`` picks): after a shard is taken over."""
        for (namespace, name), state in self.groups.items():
            if selects is None or selects(namespace, name):
                self._enqueue(state)
        for namespace, name in self.topics:
            if selects is None or selects(namespace, name):
                self.queue.add(("topic", namespace, name))

    # -- the work loop -------------------------------------------------------------------------------

    async def run_worker(self) -> None:
        """Take keys off the queue and reconcile them, until cancelled."""
        await self.synced.wait()
        while True:
            key = await self.queue.get()
            try:
                kind, namespace, name = key
                if kind == "group":
                    await self._work_group(namespace, name)
                else:
                    await self._work_topic(namespace, name)
            finally:
                self.queue.done(key)

    async def _work_group(self, namespace: str, name: str) -> None:
        state = self.groups.get((namespace, name))
        if state is None or namespace in self.listing or not self.owns(namespace, name):
            return
        try:
            outcome = await self.reconcile_group(state)
        except Conflict as e:
            # Someone else wrote the ConfigMap: read it again and recompute at once.
            self.metrics.reconcile_errors.labels("conflict").inc()
            state.published = None
            state.reread = True
            state.conflicts += 1
            if state.conflicts <= CONFLICT_RETRIES:
                self.queue.add(("group", namespace, name))
            else:
                self._retry_later(state, "api", e)
        except ApiError as e:
            self._retry_later(state, "api", e)
        except Exception as e:
            logger.exception("reconcile of %s/%s failed", namespace, name)
            self._retry_later(state, "internal", e)
        else:
            state.failures = state.conflicts = 0
            result = "published" if outcome.document else "invalid" if outcome.invalid else "unchanged"
            self.metrics.reconciles.labels(result).inc()

    def _retry_later(self, state: GroupState, kind: str, error: Exception) -> None:
        state.failures += 1
        self.metrics.reconcile_errors.labels(kind).inc()
        self.metrics.reconciles.labels("error").inc()
        delay = min(2.0 ** (state.failures - 1), MAX_BACKOFF_SECONDS)
        message = f"{error}; retrying in {delay:g}s"
        logger.warning("%s/%s: %s", state.namespace, state.name, message)
        self.writer.post_event(state.body, "Warning", "ReconcileFailed", message)
        self.queue.add_after(("group", state.namespace, state.name), delay)

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
                state.published = published_from(self.configmaps.get((ns, configmap_name(name))))
            problem = state.published.problem
            if problem and problem != state.reported_problem:
                self.writer.post_event(
                    body, "Warning", "UnreadableAssignment", f"{problem}; it will be replaced"
                )
            state.reported_problem = problem
        previous = state.published.document
        state.published.decoded = None  # between reconciles only its text is kept
        spec = dict(body.get("spec") or {})
        pods = self.pods.candidates(ns, _selector(spec))
        nodes = {p.node_name for p in pods if p.node_name}
        releases = self.configmaps.get((ns, releases_configmap_name(name))) or {}
        observed = Observed(
            namespace=ns,
            name=name,
            spec=spec,
            topics=self._topic_specs.get(ns, {}),
            routes=self._topic_routes.get(ns, {}),
            pods=pods,
            node_labels={n: self.node_labels[n] for n in nodes if n in self.node_labels},
            previous=previous,
            now=self.clock(),
            generation=int(body["metadata"].get("generation") or 0),
            status=state.written_status or {},
            acks=decode_acks(releases.get("data")),
            alive=self._alive(ns, previous),
        )
        computing = time.perf_counter()
        outcome = reconcile(observed)
        compute_seconds = time.perf_counter() - computing
        self._remember(state, outcome, pods, spec)
        handover = outcome.spec is not None and outcome.spec.handover.mode is not HandoverMode.OFF
        if handover and not releases and not state.releases_made:
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
                state.published.share(self.configmaps.get((ns, configmap_name(name))))  # back already?
            else:  # changed or deleted by someone else right after our write: read it again
                state.published = None
                self._enqueue(state)
            if outcome.journal is not None:
                self.journal.write(replace(outcome.journal, compute_seconds=compute_seconds))
            self.metrics.rebalances.labels(outcome.document.reason).inc()
            if outcome.figures is not None:
                self.metrics.queues_moved.inc(outcome.figures.moved)
            self.metrics.rebalance_duration.observe(time.perf_counter() - started)
        if outcome.status != state.written_status:
            await self.writer.patch_status(
                ns, CONSUMER_GROUPS, name, merge_patch(state.written_status, outcome.status)
            )
            # The watch may have brought the patched status back already: keep that copy then.
            cached = state.body.get("status")
            state.written_status = cached if cached == outcome.status else outcome.status
        state.invalid = outcome.invalid
        for note in outcome.notes:
            self.writer.post_event(body, note.type, note.reason, note.message)
        if outcome.handover is not None:
            self.metrics.observe_handover(outcome.handover)
        if outcome.wake_at is not None:  # a release may time out then
            self.queue.add_after(("group", ns, name), max(0.0, outcome.wake_at - self.clock()))
        return outcome

    def _alive(self, namespace: str, document: AssignmentDocument | None) -> Alive:
        """The previous document's members and releasing owners whose pods exist and have not
        finished; departed: those whose pod object is gone (it may still run on a lost node)."""
        if document is None:
            return Alive()
        names = set(document.members) | {r.owner for r in document.releasing}
        alive, departed = set(), set()
        for pod_name in names:
            pod = self.pods.get(namespace, pod_name)
            if pod is None:
                departed.add(pod_name)
            elif not pod.finished:
                alive.add(pod_name)
        return Alive(alive, departed)

    def _remember(
        self, state: GroupState, outcome: Outcome, pods: list[PodInfo], spec: Mapping[str, Any]
    ) -> None:
        """What later changes are matched against: the selector, topics, pods and nodes of this group."""
        if self.groups.get((state.namespace, state.name)) is not state:
            return  # deleted, or its namespace given up, while this reconcile waited: nothing to route
        topics = spec.get("topics")
        state.topics = _small_set(t for t in topics if isinstance(t, str)) if isinstance(topics, list) else ()
        if outcome.spec is None:
            state.selector = None  # unparseable: any change in the namespace may matter
            self._route(state, None)
            return
        state.selector = outcome.spec.selector
        # A pod the selector matches carries every matchLabels pair: one of them finds the group.
        self._route(state, min(state.selector.match_labels.items(), default=None))
        state.debounce = outcome.spec.debounce_seconds
        matched = [p for p in pods if outcome.spec.selector.matches(p.labels)]
        state.pods = _small_set(p.name for p in matched)
        state.nodes = _small_set({p.node_name for p in matched if p.node_name})

    # -- Topic status, in the same loop ---------------------------------------------------------------

    async def _work_topic(self, namespace: str, name: str) -> None:
        state = self.topics.get((namespace, name))
        if state is None or namespace in self.listing or not self.owns(namespace, name):
            return
        try:
            await self.update_topic_status(state)
        except ApiError as e:
            state.failures += 1
            delay = min(2.0 ** (state.failures - 1), MAX_BACKOFF_SECONDS)
            logger.warning(
                "status of Topic %s/%s not written: %s; retrying in %g s", namespace, name, e, delay
            )
            self.queue.add_after(("topic", namespace, name), delay)
        else:
            state.failures = 0

    async def update_topic_status(self, state: TopicState) -> None:
        """Read the route if one is due (Topics that name a NameServer), then write the status."""
        meta, spec = state.body["metadata"], state.body.get("spec")
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation") or 0)
        if reads_name_server(spec):
            now = self.queue.timer.now()
            if state.read is None or state.read_generation != generation or now >= state.next_read:
                await self._read_route(state, name, spec or {}, generation)
            else:  # woken by a change (our own status write, say): the next read stays due
                self.queue.add_after(("topic", namespace, name), state.next_read - now)
        else:
            state.read = None
        current = state.body.get("status") or {}
        status = topic_status(name, spec, generation, current, state.read, self.clock())
        if status != current:
            await self.writer.patch_status(namespace, TOPICS, name, merge_patch(current, status))

    async def _read_route(
        self, state: TopicState, name: str, spec: Mapping[str, Any], generation: int
    ) -> None:
        read = await self.routes.read(topic_name(name, spec), name_server_addresses(spec))
        if read.brokers is None and (state.read is None or state.read.reason != read.reason):
            logger.warning("route of Topic %s not read: %s", name, read.message)
        state.read, state.read_generation = read, generation
        state.read_failures = 0 if read.brokers is not None else state.read_failures + 1
        # Again after the poll interval; sooner, backing off, while it fails.
        wait = poll_seconds(spec)
        if state.read_failures:
            wait = min(wait, 2.0 ** (state.read_failures - 1))
        state.next_read = self.queue.timer.now() + wait
        self.queue.add_after(("topic", state.body["metadata"]["namespace"], name), wait)

    # -- read-outs ------------------------------------------------------------------------------------

    def gauges(self) -> list[GroupGauges]:
        return [s.gauges() for s in list(self.groups.values()) if s.written_status]


def _small_set(items: Iterable[str]) -> Collection[str]:
    """A tuple while a handful (a set of eight strings takes six times the memory), else a frozenset."""
    values = tuple(items)
    return values if len(values) <= 16 else frozenset(values)


def _route_source(topic: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a group's reconcile reads of a Topic: its spec and the route read into its status."""
    return topic["spec"], topic["status"].get("route")


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
