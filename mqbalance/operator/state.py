"""What the operator keeps of each work key between reconciles: a ConsumerGroup's ``GroupState``,
a Topic's ``TopicState``, and the order the work queue takes their keys in (``work_priority``).

The world (world.py) holds one of these per key and routes changes to them; the reconcilers
(group_reconciler.py, topic_reconciler.py) read and update them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mqbalance.model import MessageQueue
from mqbalance.operator.metrics import GroupGauges, LagFigures
from mqbalance.operator.spec import DEFAULT_DEBOUNCE_SECONDS, LabelSelector
from mqbalance.operator.topics import RouteRead
from mqbalance.operator.writes import Published
from mqbalance.strategies import LoadState

WorkKey = tuple[str, str, str]
"""("group" or "topic", namespace, name)."""


NO_STREAK = LoadState()
"""The load-aware strategy's state with no imbalance counted (one object for every group)."""


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
    conflicts: int = 0
    """Conflicting ConfigMap writes in a row (retried at once, up to CONFLICT_RETRIES)."""
    releases_made: bool = False
    """Its releases ConfigMap was created (or found): not asked for again while the watch catches up."""
    writing: list[str | None] | None = None
    """While its ConfigMap is being written: the versions the watch brought meanwhile (None: deleted)."""
    routing: tuple[str, str] | None = None
    """The label pair this group is found under when a pod changes (None: every pod may concern it)."""
    lag: dict[str, Any] | None = None
    """``status.lag`` as the lag loop last read it (lagpoll.py); every status write carries it."""
    lag_condition: dict[str, Any] | None = None
    """The LagAvailable condition as the lag loop last set it; every status write carries it."""
    lag_figures: LagFigures | None = None
    load_aware: bool = False
    """Its strategy is STICKY with ``load`` (CLUSTERING), as of the last reconcile: new rates reconcile it."""
    rates: dict[MessageQueue, float] | None = None
    """STICKY with ``load``: each queue's produce rate from the lag loop's last two readings."""
    rates_sample: int = 0
    """Counts the rates handed in: a reconcile advances the hysteresis once per sample."""
    load_sample: int = 0
    """The sample ``load_state`` has counted."""
    load_base: LoadState = NO_STREAK
    """The hysteresis state before that sample: a reconcile of the same sample starts from it again."""
    load_state: LoadState = NO_STREAK
    load_target: dict[str, tuple[MessageQueue, ...]] | None = None
    """The assignment the load-aware strategy last computed (where queues in a handover go)."""
    leased_since: float | None = None
    """Monotonic time since which this group is judged by its member Leases (its first reconcile
    with a leased handover, after its caches were listed); None while not leased."""
    lapsed: Collection[str] = ()
    """Pods left out at the last reconcile because their member Lease lapsed: a renewal of one
    reconciles the group at once."""

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
    read: RouteRead | None = None
    """The last read of its route from a NameServer (Topics that name one)."""
    read_generation: int = -1
    read_failures: int = 0
    next_read: float = 0.0
    """When (on the work queue's clock) the route is due to be read again."""
