"""What one reconcile of a ConsumerGroup reads (:class:`Observed`) and what it decides
(:class:`Outcome`, with the Events as :class:`Note`): plain values, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import Ack, AssignmentDocument
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageQueue
from mqbalance.operator.conditions import condition_status
from mqbalance.operator.handover import Step
from mqbalance.operator.leases import MemberLeases
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.spec import GroupSpec
from mqbalance.quality import Figures
from mqbalance.strategies import LoadState


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


@dataclass(frozen=True)
class Note:
    """A Kubernetes Event to post on the ConsumerGroup."""

    type: str
    """Normal or Warning."""
    reason: str
    message: str


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
    spec: GroupSpec | None = None
    """The parsed spec, None when it is invalid."""
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
    lapsed: tuple[str, ...] = ()
    """Matching pods left out because their member Lease lapsed (a renewal brings them back)."""

    @property
    def invalid(self) -> bool:
        return condition_status(self.status, "Invalid") == "True"
