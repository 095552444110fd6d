"""What one reconcile of a ConsumerGroup reads (:class:`Observed`) and what it decides
(:class:`Outcome`): plain values, no I/O. The outcome is the effects the caller carries out as they
are, without reading the spec again: the document to publish, the releases ConfigMap to create, the
status to write, the Events (:class:`Note`), the times to look again, and which changes concern the
group from now on (:class:`Interest`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import Ack, AssignmentDocument, HandoverMode
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageQueue
from mqbalance.operator.conditions import condition_status
from mqbalance.operator.handover import Step
from mqbalance.operator.leases import MemberLeases
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.spec import DEFAULT_DEBOUNCE_SECONDS, GroupSpec, LabelSelector
from mqbalance.quality import Figures
from mqbalance.strategies import LoadState


@dataclass(frozen=True, slots=True)
class LagReading:
    """The lag loop's last reading of a group (lagpoll.py): what the status shows of it."""

    lag: Mapping[str, Any]
    """``status.lag``."""
    available: tuple[str, str, str]
    """The LagAvailable condition's status, reason and message."""

    def same(self, other: LagReading | None) -> bool:
        """Whether ``other`` says the same, the time of its sample aside (a new time alone is not
        worth a status write)."""
        return (
            other is not None
            and self.available == other.available
            and _untimed(self.lag) == _untimed(other.lag)
        )


def _untimed(lag: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in lag.items() if k != "sampledAt"}


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile of a group reads."""

    namespace: str
    name: str
    """The ConsumerGroup resource name."""
    spec: Mapping[str, Any]
    topics: Mapping[str, Mapping[str, Any]]
    """Topic resource name -> spec, for every Topic in the namespace."""
    pods: Sequence[PodInfo]
    """Pods of the namespace; the reconcile applies the selector."""
    node_labels: Mapping[str, Mapping[str, str]]
    previous: AssignmentDocument | None
    """The document in the ConfigMap now, if any."""
    now: float
    """Unix time of this reconcile."""
    generation: int = 0
    """The ConsumerGroup's metadata.generation."""
    status: Mapping[str, Any] = field(default_factory=dict)
    """The ConsumerGroup's current status."""
    acks: Mapping[str, Ack] = field(default_factory=dict)
    """Release acknowledgements, by pod (the releases ConfigMap)."""
    alive: frozenset[str] = frozenset()
    """Pods of the previous document (members and releasing owners) that exist and have not finished;
    a :class:`~mqbalance.operator.handover.Alive` also names those whose pod object is gone."""
    routes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Topic resource name -> ``status.route``, for the Topics that have one (read from a NameServer)."""
    loads: Mapping[MessageQueue, float] | None = None
    """STICKY with ``load``: each queue's measured produce rate (messages/s), None while unknown."""
    load_state: LoadState = field(default_factory=LoadState)
    """STICKY with ``load``: the hysteresis state before the sample ``loads`` is."""
    load_target: Mapping[str, tuple[MessageQueue, ...]] | None = None
    """STICKY with ``load``: the assignment it last computed (member -> queues of every topic), to
    tell where a queue in a handover is going (the document names only its old owner)."""
    leases: MemberLeases | None = None
    """The namespace's member Leases as the operator saw them (None: not watched). Release and
    Orderly only: a member whose Lease lapsed serves nothing; a departed one is handed on once its
    Lease has been silent for leaseSeconds + leaseMarginSeconds."""
    releases_configmap: bool = False
    """Whether the group's releases ConfigMap exists (or was created): where ``acks`` are read."""
    lag: LagReading | None = None
    """The lag loop's last reading (None: none yet, the status keeps the lag it shows)."""
    pause: tuple[str, ...] = ()
    """Why the group is held paused, e.g. ``("spec.paused",)`` (``World.pause_holds``); empty: it is
    not. Paused, every member gives up its queues through the group's handover and the published
    generations assign nobody anything until no reason is left."""

    def lacks_releases(self, spec: GroupSpec) -> bool:
        """Whether the group's handover waits for acknowledgements in a releases ConfigMap it has not."""
        return spec.handover.mode is not HandoverMode.OFF and not self.releases_configmap


@dataclass(frozen=True)
class Note:
    """A Kubernetes Event to post on the ConsumerGroup."""

    type: str
    """Normal or Warning."""
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Interest:
    """Which changes concern a group until its next reconcile: the world routes pod, node, Topic
    and Lease changes to it by this."""

    selector: LabelSelector | None = None
    """None while the spec cannot be read: any pod or Topic change in the namespace may matter."""
    topics: Collection[str] = ()
    """The Topic resources ``spec.topics`` names (read even from a spec that cannot be honoured)."""
    pods: Collection[str] = ()
    """The pods the selector matches, whatever their state."""
    nodes: Collection[str] = ()
    """The nodes of those pods (a node's zone is its members' zone)."""
    debounce: float = DEFAULT_DEBOUNCE_SECONDS
    """How long pod and node changes wait, so that a burst of them is one reconcile."""
    lapsed: Collection[str] = ()
    """Pods left out because their member Lease lapsed: a renewal of one concerns the group at once."""
    leased: bool = False
    """Its members are judged by their Leases (handover Release or Orderly)."""

    @classmethod
    def of(cls, spec: GroupSpec, pods: Sequence[PodInfo], lapsed: Collection[str] = ()) -> Interest:
        matched = [p for p in pods if spec.selector.matches(p.labels)]
        return cls(
            spec.selector,
            spec.topics,
            tuple(p.name for p in matched),
            tuple(sorted({p.node_name for p in matched if p.node_name})),
            spec.debounce_seconds,
            tuple(lapsed),
            spec.handover.leased,
        )


@dataclass(frozen=True)
class LockRelease:
    """Broker locks to release on a stopped member's behalf before its queues' new owners start:
    RocketMQ's ``UNLOCK_BATCH_MQ`` of ``queues`` for each of ``clients`` in ``group``."""

    group: str
    """The RocketMQ consumer group."""
    member: str
    clients: tuple[str, ...]
    queues: tuple[MessageQueue, ...]


@dataclass(frozen=True)
class Outcome:
    document: AssignmentDocument | None
    """The generation to publish, or None to leave the ConfigMap as it is."""
    status: dict[str, Any]
    """The whole status to write."""
    notes: tuple[Note, ...] = ()
    journal: JournalRecord | None = None
    figures: Figures | None = None
    """Figures of this change (moved etc.) when a document is published."""
    members: Mapping[str, str] = field(default_factory=dict)
    """Observed member -> zone (even when Invalid)."""
    interest: Interest = field(default_factory=Interest)
    """Which changes concern the group from now on."""
    handover: Step | None = None
    """What the handover did in this reconcile (None when there is no handover to run)."""
    wake_at: float | None = None
    """Reconcile again at this (unix) time even if nothing changes: a release may time out then."""
    load_state: LoadState | None = None
    """STICKY with ``load`` and rates: the hysteresis state after this sample (None: keep the old)."""
    load_target: Mapping[str, tuple[MessageQueue, ...]] | None = None
    """STICKY with ``load``: the assignment computed (member -> queues), for ``Observed.load_target``."""
    lease_wake_at: float | None = None
    """Reconcile again at this *monotonic* time: a member's Lease may lapse, or a departed owner's
    Lease have been silent long enough, then."""
    ensure_releases: bool = False
    """Create the group's releases ConfigMap before anyone is asked to acknowledge: its handover
    waits for acknowledgements there, and it has none."""
    unlocks: tuple[LockRelease, ...] = ()
    """Release these broker locks before publishing ``document`` (handover Orderly: its new owners
    lock the queues at once instead of waiting out a stopped member's locks)."""

    @property
    def invalid(self) -> bool:
        return condition_status(self.status, "Invalid") == "True"
