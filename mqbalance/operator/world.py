"""The operator's cache of the observed world and the routing of its changes to work keys.

The informers (``mqbalance.kube.Informer``) keep ConsumerGroups, Topics, Pods, Nodes and the
assignment ConfigMaps in the caches here, and when each member Lease was last seen to change,
and feed their changes in (``on_*``). A change puts the keys it concerns on the keyed work queue:
at once for spec, Topic and ConfigMap changes, after the group's debounce window for pod and node
changes, so a burst of pod changes becomes one rebalance. Nothing here writes to the API server;
the reconcilers (group_reconciler.py, topic_reconciler.py) read these caches and the controller
(controller.py) runs them. What is kept of each key (``GroupState``, ``TopicState``) is in state.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import GROUP_LABEL, read_topic_spec, releases_configmap_name
from mqbalance.kube import Key
from mqbalance.model import MessageQueue
from mqbalance.operator.leases import LeaseRecord, LeaseTable, MemberLeases
from mqbalance.operator.membership import PodIndex, PodInfo
from mqbalance.operator.metrics import GroupGauges, LagFigures
from mqbalance.operator.reconcile import Outcome
from mqbalance.operator.state import NO_STREAK, GroupState, TopicState, WorkKey, work_priority
from mqbalance.operator.workqueue import WorkQueue


@dataclass
class World:
    """The caches, and which keys a change concerns."""

    queue: WorkQueue[WorkKey] = field(default_factory=lambda: WorkQueue(priority=work_priority))
    debounce_override: float | None = None
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
            state.lag = (new.get("status") or {}).get("lag")  # kept until the lag loop reads it again
            # A new object starts without backoff, even if a reconcile of the one deleted failed late.
            self.queue.forget_failures(("group", namespace, name))
            self.groups[key] = state
            self._by_namespace.setdefault(namespace, {})[name] = state
            self._route(state, None)
            self.enqueue(state)
            return
        changed = old is None or old["metadata"].get("generation") != new["metadata"].get("generation")
        state.body = new
        if state.written_status is not None and new.get("status") == state.written_status:
            state.written_status = new["status"]  # our status patch come back: one copy, the cache's
        if changed or old is None or old["metadata"].get("uid") != new["metadata"].get("uid"):
            self.enqueue(state)

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
                self.enqueue(state, debounced=True)

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
                self.enqueue(state, debounced=True)

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
        for state in self._in_namespace(namespace):
            # A renewal matters only to a member left out (it is back); a Lease first seen starts
            # the reconciles that look again when it would lapse (each asks for the next).
            if holder in state.lapsed or (first and holder in state.pods):
                self.enqueue(state)

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

    def member_leases(self, state: GroupState) -> MemberLeases | None:
        """The group's namespace's member Leases for one reconcile (None when not watched)."""
        if self.leases is None:
            return None
        now = self.monotonic()
        if state.leased_since is None:
            state.leased_since = now
        return self.leases.view(state.namespace, state.leased_since, now)

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
                self.topics[key] = TopicState(new)
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
        for state in self._in_namespace(namespace):
            if state.selector is None or name in state.topics:
                self.enqueue(state)

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
            self.enqueue(state)
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
        self.enqueue(state)

    def on_rates(self, state: GroupState, rates: Mapping[MessageQueue, float]) -> None:
        """New per-queue produce rates from the lag loop: a group balanced by load takes them in a
        reconcile after its debounce window; any other group keeps none."""
        if self.groups.get((state.namespace, state.name)) is not state or not state.load_aware:
            state.rates = None
            return
        state.rates = dict(rates)
        state.rates_sample += 1
        self.enqueue(state, debounced=True)

    def enqueue(self, state: GroupState, *, debounced: bool = False) -> None:
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
        self.topic_specs.pop(namespace, None)
        self.topic_routes.pop(namespace, None)
        self.pods.forget(namespace)
        if self.leases is not None:
            self.leases.forget(namespace)
        for key in [key for key in self.configmaps if key[0] == namespace]:
            del self.configmaps[key]

    def resync(self, selects: Callable[[str, str], bool] | None = None) -> None:
        """Queue every group and Topic (that ``selects`` picks): after a shard is taken over."""
        for (namespace, name), state in self.groups.items():
            if selects is None or selects(namespace, name):
                self.enqueue(state)
        for namespace, name in self.topics:
            if selects is None or selects(namespace, name):
                self.queue.add(("topic", namespace, name))

    def remember(self, state: GroupState, outcome: Outcome) -> None:
        """What later changes are matched against: the interest a reconcile returned."""
        if self.groups.get((state.namespace, state.name)) is not state:
            return  # deleted, or its namespace given up, while this reconcile waited: nothing to route
        _remember_load(state, outcome)
        interest = outcome.interest
        state.topics = _small_set(interest.topics)
        state.lapsed = _small_set(interest.lapsed)
        if not interest.leased:
            state.leased_since = None  # judged by Leases again only after a lease's time
        state.selector = interest.selector
        if interest.selector is None:
            self._route(state, None)  # unreadable: any change in the namespace may matter
            return
        # A pod the selector matches carries every matchLabels pair: one of them finds the group.
        self._route(state, min(interest.selector.match_labels.items(), default=None))
        state.debounce = interest.debounce
        state.pods = _small_set(interest.pods)
        state.nodes = _small_set(interest.nodes)

    # -- read-outs ------------------------------------------------------------------------------------

    def lag_topics(self, state: GroupState, rocketmq_topics: Collection[str]) -> list[tuple[str, list[str]]]:
        """The group's RocketMQ topics with the NameServers their Topic names (none: the operator's)."""
        wanted = set(rocketmq_topics)
        out: dict[str, list[str]] = {}
        for resource, spec in self.topic_specs.get(state.namespace, {}).items():
            if resource not in state.topics:
                continue
            topic = read_topic_spec(resource, spec)
            if topic.topic_name in wanted:
                name_server = topic.name_server
                out[topic.topic_name] = list(name_server.addresses) if name_server is not None else []
        return sorted(out.items())

    def lag_secrets(self, state: GroupState, rocketmq_topics: Collection[str]) -> dict[str, str]:
        """The Secrets (``spec.nameServer.aclSecretRef``) that sign the offset reads of the
        group's RocketMQ topics, for the topics whose Topic names one."""
        wanted = set(rocketmq_topics)
        out: dict[str, str] = {}
        for resource, spec in self.topic_specs.get(state.namespace, {}).items():
            if resource not in state.topics:
                continue
            topic = read_topic_spec(resource, spec)
            if topic.topic_name in wanted and topic.name_server is not None and topic.name_server.acl_secret:
                out[topic.topic_name] = topic.name_server.acl_secret
        return out

    def lag_gauges(self) -> list[tuple[str, str, LagFigures]]:
        return [(s.namespace, s.name, s.lag_figures) for s in list(self.groups.values()) if s.lag_figures]

    def gauges(self) -> list[GroupGauges]:
        return [s.gauges() for s in list(self.groups.values()) if s.written_status]


def _remember_load(state: GroupState, outcome: Outcome) -> None:
    """Keep the load-aware strategy's hysteresis and target; forget them when load is not set."""
    if outcome.invalid:
        return  # nothing is published while invalid: what was measured stays for when it is valid
    if outcome.load_target is None:  # not STICKY with load (or BROADCASTING)
        state.load_aware = False
        state.rates = state.load_target = None
        state.load_base = state.load_state = NO_STREAK
        state.load_sample = state.rates_sample
        return
    state.load_aware = True
    state.load_target = dict(outcome.load_target)
    if outcome.load_state is not None:
        if state.load_sample != state.rates_sample:  # this reconcile counted a new sample
            state.load_base = state.load_state
            state.load_sample = state.rates_sample
        state.load_state = outcome.load_state


def _small_set(items: Iterable[str]) -> Collection[str]:
    """A tuple while a handful (a set of eight strings takes six times the memory), else a frozenset."""
    values = tuple(items)
    return values if len(values) <= 16 else frozenset(values)


def _route_source(topic: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a group's reconcile reads of a Topic: its spec and the route read into its status."""
    return topic["spec"], topic["status"].get("route")
