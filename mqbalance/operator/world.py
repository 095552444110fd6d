"""The operator's cache of the observed world and the routing of its changes to work keys.

The informers (``mqbalance.kube.Informer``) keep ConsumerGroups, Topics, Pods, Nodes and the
assignment ConfigMaps in the caches here, and when each member Lease was last seen to change,
and feed their changes in (``on_*``); the lag loop, a source as they are, records its readings
(``record_lag``, ``record_rates``). A change puts the keys it concerns on the keyed work queue:
at once for spec, Topic and ConfigMap changes, after the group's debounce window for pod and node
changes, so a burst of pod changes becomes one rebalance. Nothing here writes to the API server;
the reconcilers (group_reconciler.py, topic_reconciler.py) read these caches and the controller
(controller.py) runs them. Each group is kept as a :class:`CachedGroup`: its object, what its
changes are matched against, the lag loop's last reading, and the parts other rooms own (its
:class:`~mqbalance.operator.publication.Publication`, its measured load).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mqbalance.contract import GROUP_LABEL, read_topic_spec, releases_configmap_name
from mqbalance.kube import Key
from mqbalance.model import MessageQueue
from mqbalance.operator.leases import LeaseRecord, LeaseTable, MemberLeases
from mqbalance.operator.load_balance import LoadTracker
from mqbalance.operator.membership import PodIndex, PodInfo
from mqbalance.operator.metrics import GroupGauges, LagFigures
from mqbalance.operator.observation import Interest, LagReading
from mqbalance.operator.offset_reset import HOLDING, hold_reason, holds_group
from mqbalance.operator.publication import Publication
from mqbalance.operator.status import LAG_CONDITION
from mqbalance.operator.topics import RoutePoll
from mqbalance.operator.workqueue import WorkQueue

WorkKey = tuple[str, str, str]
"""("group", "topic" or "reset", namespace, name)."""

UNREAD = Interest()
"""A group not reconciled yet, or whose spec cannot be read: any change in its namespace may concern it."""


def work_priority(key: WorkKey) -> int:
    """Groups before OffsetResets and Topics: consumers wait for the one; a reset waits on its
    group's pause anyway; a Topic's route read on a restart is already in its status, and a new
    route reaches the groups through that status anyway."""
    return 0 if key[0] == "group" else 1


@dataclass(slots=True, eq=False)
class CachedGroup:
    """One ConsumerGroup as the operator keeps it: the object, the interest its last reconcile
    returned, the lag loop's last reading, and the parts other rooms own, kept and dropped with it."""

    body: Mapping[str, Any]
    """The resource as last seen: metadata (namespace, name, uid, generation, finalizers), spec, status."""
    interest: Interest = UNREAD
    """Which changes concern it (small sets: a set of eight strings takes six times a tuple's memory)."""
    pair: tuple[str, str] | None = None
    """The label pair it is filed under for pod changes (None: every pod may concern it)."""
    leased_since: float | None = None
    """Monotonic time since which it is judged by its member Leases (its first reconcile with a
    leased handover, after its caches were listed); None while not leased."""
    lag: LagReading | None = None
    """The lag loop's last reading; its next reconcile writes it."""
    lag_figures: LagFigures | None = None
    """The same reading as the metrics show it."""
    publication: Publication = field(default_factory=Publication)
    """What was written for it (publication.py)."""
    load: LoadTracker = field(default_factory=LoadTracker)
    """STICKY with load: its measured rates and hysteresis (load_balance.py)."""
    changed_at: float | None = None
    """Monotonic time of the first change routed to it since its last reconcile began (None: none):
    where the time to the generation that answers it starts."""

    def take_change(self) -> float | None:
        """The change a reconcile starting now answers; later ones start anew."""
        at, self.changed_at = self.changed_at, None
        return at

    def keep_change(self, at: float | None) -> None:
        """A reconcile that took the change at ``at`` failed: the next one answers it still."""
        if at is not None and (self.changed_at is None or at < self.changed_at):
            self.changed_at = at

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def work_key(self) -> WorkKey:
        return ("group", self.namespace, self.name)

    def concerns_pod(self, name: str, labels: Mapping[str, str]) -> bool:
        selector = self.interest.selector
        return selector is None or name in self.interest.pods or selector.matches(labels)

    def gauges(self) -> GroupGauges:
        status = self.publication.status or {}
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
            invalid=self.publication.invalid,
            paused=bool(status.get("pausedBy")),
            flapping_members=len(status.get("flappingMembers") or []),
        )


@dataclass(slots=True, eq=False)
class CachedTopic:
    """One Topic as the operator keeps it, and its route's reads (the Topic reconciler's)."""

    body: Mapping[str, Any]
    poll: RoutePoll = field(default_factory=RoutePoll)


@dataclass
class World:
    """The caches, and which keys a change concerns."""

    queue: WorkQueue[WorkKey] = field(default_factory=lambda: WorkQueue(priority=work_priority))
    debounce_override: float | None = None
    groups: dict[tuple[str, str], CachedGroup] = field(default_factory=dict)
    topics: dict[tuple[str, str], CachedTopic] = field(default_factory=dict)
    pods: PodIndex = field(default_factory=PodIndex)
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    """(namespace, name) -> our ConfigMaps as last seen by the watch."""
    resets: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    """(namespace, name) -> OffsetReset as last seen by the watch."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every cache has been listed completely."""
    listing: set[str] = field(default_factory=set)
    """Namespaces whose caches are being listed for the first time (sharding by namespace, where a
    replica starts watching a namespace when it takes its shard): nothing there is worked on yet."""
    _by_namespace: dict[str, dict[str, CachedGroup]] = field(default_factory=dict)
    _routes: dict[str, dict[tuple[str, str] | None, set[str]]] = field(default_factory=dict)
    """Namespace -> label pair (None: any) -> names of the groups a pod carrying it may concern."""
    topic_specs: dict[str, dict[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Namespace -> Topic -> spec."""
    topic_routes: dict[str, dict[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Namespace -> Topic -> ``status.route``, for Topics whose route was read from a NameServer."""
    leases: LeaseTable | None = None
    """The member Leases and when each was last seen to change; None when they are not watched
    (then no member is judged by its Lease: a departed one waits the lease floor only)."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock Lease changes and their silence are measured on (never the wall clock)."""

    # -- changes in (from the informers) ---------------------------------------------------------

    def on_group(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        namespace, name = key
        if new is None:
            group = self.groups.pop(key, None)
            if group is not None:
                self._file(group, None, remove=True)
                del self._by_namespace[namespace][name]
                if not self._by_namespace[namespace]:
                    del self._by_namespace[namespace]
            self.queue.forget(("group", namespace, name))
            return
        group = self.groups.get(key)
        if group is None:
            group = CachedGroup(new, publication=Publication(status=new.get("status") or None))
            # A new object starts without backoff, even if a reconcile of the one deleted failed late.
            self.queue.forget_failures(("group", namespace, name))
            self.groups[key] = group
            self._by_namespace.setdefault(namespace, {})[name] = group
            self._file(group, None)
            self.enqueue(group)
            return
        changed = old is None or old["metadata"].get("generation") != new["metadata"].get("generation")
        group.body = new
        group.publication.status_seen(new.get("status"))
        if changed or old is None or old["metadata"].get("uid") != new["metadata"].get("uid"):
            self.enqueue(group)
        if old is not None and old.get("status") != new.get("status"):
            for reset in self.resets_of(namespace, name):  # a reset pausing it waits for its status
                if (reset.get("status") or {}).get("phase") in HOLDING:
                    self.queue.add(("reset", namespace, reset["metadata"]["name"]))

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
        for group_name in names:
            group = self.groups[(namespace, group_name)]
            if any(group.concerns_pod(name, labels) for labels in versions):
                self.enqueue(group, debounced=True)

    def on_node(self, key: Key, old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> None:
        name = key[1]
        if new is None:
            self.node_labels.pop(name, None)
        else:
            self.node_labels[name] = dict(new)
        if not self.synced.is_set():
            return
        for group in self.groups.values():
            if name in group.interest.nodes:
                self.enqueue(group, debounced=True)

    def on_lease(self, key: Key, old: LeaseRecord | None, new: LeaseRecord | None) -> None:
        """A member Lease was created, renewed or deleted: note when (on our monotonic clock); a
        member left out for a lapsed Lease that renews again is reconciled at once."""
        if self.leases is None:
            self.leases = LeaseTable()
        namespace, name = key
        now = self.monotonic()
        if new is None:
            self.leases.deleted(namespace, name, now)
            return
        first = not self.leases.known(namespace, name)
        holder = self.leases.seen(namespace, name, new, now)
        if not holder or not self._settled(namespace):
            return
        for group in self._in_namespace(namespace):
            # A renewal matters only to a member left out (it is back); a Lease first seen starts
            # the reconciles that look again when it would lapse (each asks for the next).
            if holder in group.interest.lapsed or (first and holder in group.interest.pods):
                self.enqueue(group)

    def lease_read(self, namespace: str, name: str, record: LeaseRecord | None) -> bool:
        """A member Lease as just read from the API server (``None``: there is none); whether it
        shows a change the watch has not delivered yet (then it counts as seen changing now)."""
        if self.leases is None:
            return False
        if record is None:
            if not self.leases.known(namespace, name):
                return False
            self.leases.deleted(namespace, name, self.monotonic())
            return True
        return self.leases.seen(namespace, name, record, self.monotonic()) is not None

    def member_leases(self, group: CachedGroup) -> MemberLeases | None:
        """The group's namespace's member Leases for one reconcile (None when not watched)."""
        if self.leases is None:
            return None
        now = self.monotonic()
        if group.leased_since is None:
            group.leased_since = now
        return self.leases.view(group.namespace, group.leased_since, now)

    def on_topic(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """A Topic changed: its status may need writing, its subscribers a reconcile if its spec changed."""
        namespace, name = key
        specs = self.topic_specs.setdefault(namespace, {})
        routes = self.topic_routes.setdefault(namespace, {})
        if new is None:
            self.topics.pop(key, None)
            specs.pop(name, None)
            routes.pop(name, None)
            self.queue.forget(("topic", namespace, name))
        else:
            topic = self.topics.get(key)
            if topic is None:
                self.topics[key] = CachedTopic(new)
                self.queue.forget_failures(("topic", namespace, name))
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
            del self.topic_specs[namespace]
        if not routes:
            del self.topic_routes[namespace]
        if not self._settled(namespace):
            return  # before the first listing is whole, no group has run
        if old is not None and new is not None and _route_source(old) == _route_source(new):
            return  # the rest of its status concerns no group
        for group in self._in_namespace(namespace):
            if group.interest.selector is None or name in group.interest.topics:
                self.enqueue(group)

    def on_configmap(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """A group's ConfigMap changed or went away: its publication says whether that was our own
        write; new release acknowledgements may finish a handover."""
        if new is None:
            self.configmaps.pop(key, None)
        else:
            self.configmaps[key] = new
        labels = ((new or old or {}).get("metadata") or {}).get("labels") or {}
        group = self.groups.get((key[0], labels.get(GROUP_LABEL, "")))
        if group is None:
            return
        if key[1] == releases_configmap_name(group.name) or group.publication.seen(new):
            self.enqueue(group)

    def on_reset(self, key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """An OffsetReset changed: it is worked on; its group is reconciled when the reset starts or
        stops holding it paused."""
        namespace, name = key
        if new is None:
            self.resets.pop(key, None)
            self.queue.forget(("reset", namespace, name))
        else:
            self.resets[key] = new
            self.queue.add(("reset", namespace, name))
        if old is None and new is None:
            return
        held = [_holds(body) for body in (old, new)]
        if held[0] != held[1]:
            group = self.groups.get((namespace, str(((new or old or {}).get("spec") or {}).get("group"))))
            if group is not None:
                self.enqueue(group)

    # -- readings in (from the lag loop, lagpoll.py) -----------------------------------------------

    def record_lag(self, group: CachedGroup, reading: LagReading, figures: LagFigures) -> bool:
        """A reading of the group's lag: the metrics show it at once, its next reconcile writes it,
        and it is reconciled at once when the reading says something new (the time of the sample
        aside). Whether the LagAvailable condition changed."""
        if self.groups.get((group.namespace, group.name)) is not group:
            return False  # deleted meanwhile
        before = group.lag or _written_lag(group.publication.status)
        group.lag, group.lag_figures = reading, figures
        if not reading.same(before):
            self.enqueue(group)
        return before is None or before.available != reading.available

    def record_rates(self, group: CachedGroup, rates: Mapping[MessageQueue, float]) -> None:
        """New per-queue produce rates from the lag loop: a group balanced by load takes them in a
        reconcile after its debounce window; any other group keeps none."""
        if self.groups.get((group.namespace, group.name)) is group and group.load.take(rates):
            self.enqueue(group, debounced=True)

    # -- routing -------------------------------------------------------------------------------------

    def enqueue(self, group: CachedGroup, *, debounced: bool = False) -> None:
        if group.changed_at is None:
            group.changed_at = self.monotonic()
        key = group.work_key
        if not debounced:
            self.queue.add(key)
            return
        window = self.debounce_override if self.debounce_override is not None else group.interest.debounce
        self.queue.add_after(key, window)

    def route(self, group: CachedGroup, interest: Interest) -> None:
        """What later changes are matched against: the interest a reconcile of ``group`` returned."""
        if self.groups.get((group.namespace, group.name)) is not group:
            return  # deleted, or its namespace given up, while this reconcile waited: nothing to route
        if not interest.leased:
            group.leased_since = None  # judged by Leases again only after a lease's time
        if interest.selector is None:
            # Unreadable: any change in the namespace may matter; what its last reading matched stays.
            old = group.interest
            group.interest = replace(
                interest,
                topics=_small_set(interest.topics),
                pods=old.pods,
                nodes=old.nodes,
                debounce=old.debounce,
            )
            self._file(group, None)
            return
        group.interest = replace(
            interest,
            topics=_small_set(interest.topics),
            pods=_small_set(interest.pods),
            nodes=_small_set(interest.nodes),
            lapsed=_small_set(interest.lapsed),
        )
        # A pod the selector matches carries every matchLabels pair: one of them finds the group.
        self._file(group, min(interest.selector.match_labels.items(), default=None))

    def wrote(self, group: CachedGroup, body: Mapping[str, Any]) -> None:
        """Our own write to the group's object, kept until the watch brings it (so it is not made twice)."""
        group.body = body

    def _file(self, group: CachedGroup, pair: tuple[str, str] | None, *, remove: bool = False) -> None:
        """File ``group`` under ``pair`` for pod changes (and out of where it was)."""
        routes = self._routes.setdefault(group.namespace, {})
        if group.name in routes.get(group.pair, ()):
            routes[group.pair].discard(group.name)
            if not routes[group.pair]:
                del routes[group.pair]
        if remove:
            if not routes:
                del self._routes[group.namespace]
            return
        group.pair = pair
        routes.setdefault(pair, set()).add(group.name)

    def _in_namespace(self, namespace: str) -> list[CachedGroup]:
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
        self.topic_specs.pop(namespace, None)
        self.topic_routes.pop(namespace, None)
        self.pods.forget(namespace)
        if self.leases is not None:
            self.leases.forget(namespace)
        for key in [key for key in self.configmaps if key[0] == namespace]:
            del self.configmaps[key]
        for key in [key for key in self.resets if key[0] == namespace]:
            del self.resets[key]
            self.queue.forget(("reset", *key))

    def resync(self, selects: Callable[[str, str], bool] | None = None) -> None:
        """Queue every group and Topic (that ``selects`` picks): after a shard is taken over."""
        for (namespace, name), group in self.groups.items():
            if selects is None or selects(namespace, name):
                self.enqueue(group)
        for namespace, name in self.topics:
            if selects is None or selects(namespace, name):
                self.queue.add(("topic", namespace, name))
        for (namespace, name), reset in self.resets.items():
            if selects is None or selects(namespace, reset_group(reset)):
                self.queue.add(("reset", namespace, name))

    # -- read-outs ------------------------------------------------------------------------------------

    def lag_topics(self, group: CachedGroup, rocketmq_topics: Collection[str]) -> list[tuple[str, list[str]]]:
        """The group's RocketMQ topics with the NameServers their Topic names (none: the operator's)."""
        wanted = set(rocketmq_topics)
        out: dict[str, list[str]] = {}
        for resource, spec in self.topic_specs.get(group.namespace, {}).items():
            if resource not in group.interest.topics:
                continue
            topic = read_topic_spec(resource, spec)
            if topic.topic_name in wanted:
                name_server = topic.name_server
                out[topic.topic_name] = list(name_server.addresses) if name_server is not None else []
        return sorted(out.items())

    def lag_secrets(self, group: CachedGroup, rocketmq_topics: Collection[str]) -> dict[str, str]:
        """The Secrets (``spec.nameServer.aclSecretRef``) that sign the offset reads of the
        group's RocketMQ topics, for the topics whose Topic names one."""
        wanted = set(rocketmq_topics)
        out: dict[str, str] = {}
        for resource, spec in self.topic_specs.get(group.namespace, {}).items():
            if resource not in group.interest.topics:
                continue
            topic = read_topic_spec(resource, spec)
            if topic.topic_name in wanted and topic.name_server is not None and topic.name_server.acl_secret:
                out[topic.topic_name] = topic.name_server.acl_secret
        return out

    def pause_holds(self, namespace: str, name: str) -> tuple[str, ...]:
        """Why the group is held paused (empty: it is not): ``spec.paused``, and each OffsetReset
        of it between its approval and its end (or after it, asked to leave the group paused)."""
        group = self.groups.get((namespace, name))
        spec = (group.body.get("spec") or {}) if group is not None else {}
        holds = ["spec.paused"] if spec.get("paused") is True else []
        holds += sorted(
            hold_reason(r["metadata"]["name"]) for r in self.resets_of(namespace, name) if _holds(r)
        )
        return tuple(holds)

    def reset_owner(self, namespace: str, name: str) -> str:
        """The group an OffsetReset resets (the reset's own name when it is not cached)."""
        reset = self.resets.get((namespace, name))
        return reset_group(reset) if reset is not None else name

    def resets_of(self, namespace: str, group: str) -> list[Mapping[str, Any]]:
        """The OffsetResets of one group (few: a namespace rarely holds more than a handful)."""
        return [r for (ns, _), r in self.resets.items() if ns == namespace and reset_group(r) == group]

    def lag_gauges(self) -> list[tuple[str, str, LagFigures]]:
        return [(g.namespace, g.name, g.lag_figures) for g in list(self.groups.values()) if g.lag_figures]

    def gauges(self) -> list[GroupGauges]:
        return [g.gauges() for g in list(self.groups.values()) if g.publication.status]


def reset_group(reset: Mapping[str, Any]) -> str:
    """The ConsumerGroup an OffsetReset names."""
    return str((reset.get("spec") or {}).get("group") or "")


def _holds(reset: Mapping[str, Any] | None) -> bool:
    if reset is None:
        return False
    return holds_group(reset.get("status") or {}, (reset.get("spec") or {}).get("leavePaused") is True)


def _written_lag(status: Mapping[str, Any] | None) -> LagReading | None:
    """What a status written before shows of the lag (None: no LagAvailable condition)."""
    available = next(
        (c for c in (status or {}).get("conditions") or [] if c.get("type") == LAG_CONDITION), None
    )
    if available is None:
        return None
    triple = (available.get("status"), available.get("reason"), available.get("message"))
    return LagReading((status or {}).get("lag") or {}, triple)


def _small_set(items: Iterable[str]) -> Collection[str]:
    """A tuple while a handful (a set of eight strings takes six times the memory), else a frozenset."""
    values = tuple(items)
    return values if len(values) <= 16 else frozenset(values)


def _route_source(topic: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a group's reconcile reads of a Topic: its spec and the route read into its status."""
    return topic["spec"], topic["status"].get("route")
