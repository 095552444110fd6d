"""Member Leases as the operator sees them (time-bounded ownership, handover Release and Orderly).

Each member's sidecar renews a coordination.k8s.io Lease, ``member_lease_name(pod)`` in the pod's
namespace, every ``renewSeconds`` while its documents carry lease terms, and fences itself once
``leaseSeconds`` pass without a renewal that reached the API server. The operator watches those
Leases and judges them as client-go's leader election does: by how long, on its *own monotonic
clock*, it has not seen a Lease change (created, renewed, deleted), never by comparing the
``renewTime`` written in it with its own wall clock. So no clocks need to agree, only their rates.

Two rules follow (both only in Release and Orderly mode; Off keeps no grants):

- a member whose Lease the operator has seen and not seen renewed for ``leaseSeconds`` is *not
  serving* (:meth:`MemberLeases.lapsed`): it is cut off from the API server, or its sidecar is
  stuck. Its queues are revoked as from a member that left, and handed on no sooner than the
  usual bound. A member whose Lease was never seen is judged by its pod alone: a sidecar creates
  its Lease only at its first renewal, and one fed from files has none;
- a departed member (pod object gone) is handed on only once its Lease has not changed for
  ``leaseSeconds + leaseMarginSeconds`` (:meth:`MemberLeases.quiet_for`): a force-deleted pod
  whose sidecar still reaches the API server keeps renewing, so it still serves. A missing Lease
  counts as silent since it was seen deleted (the garbage collector deletes the Lease of a deleted
  pod, and a sidecar that still runs creates it again at its next renewal), or, never seen, since
  the operator started judging the group (``since``).

Everything here is pure: the caller hands in the times it saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import member_clients, member_lease_name

LeaseRecord = tuple[Any, ...]
"""What a change of a member Lease is judged by: its uid and spec (holder, renew and acquire times,
duration, transitions), and the RocketMQ client ids it names (a sidecar writes them with a renewal).
Anything else (labels, managedFields) changing is no renewal."""
CLIENTS = 6
"""Where a :data:`LeaseRecord` holds the client ids (``member_clients``)."""

DELETED_KEPT_SECONDS = 7200.0
"""How long the time a Lease was seen deleted is kept: longer than any leaseSeconds plus margin."""


def lease_record(body: Mapping[str, Any]) -> LeaseRecord:
    """A member Lease as the operator keeps it (the informer's transform)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return (
        meta.get("uid"),
        spec.get("holderIdentity"),
        spec.get("renewTime"),
        spec.get("acquireTime"),
        spec.get("leaseDurationSeconds"),
        spec.get("leaseTransitions"),
        member_clients(meta.get("annotations")),
    )


@dataclass(frozen=True)
class MemberLeases:
    """What one reconcile reads of a namespace's member Leases: plain numbers on the operator's
    monotonic clock (never compared with a wall clock or with the times written in the Leases)."""

    now: float
    """Monotonic time of this reconcile."""
    since: float
    """Monotonic time from which silence counts: when the operator began judging this group by its
    Leases (after its caches were listed, and when the group's handover became leased). Whatever
    was seen before counts as seen then."""
    changed: Mapping[str, float] = field(default_factory=dict)
    """Lease name -> monotonic time the Lease was last seen to change (created, renewed, deleted)."""
    clients: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Lease name -> the RocketMQ client ids it named last (kept a while after it was deleted)."""

    @classmethod
    def of_pods(cls, now: float, since: float, changed: Mapping[str, float]) -> MemberLeases:
        """From pod name -> last change seen (tests, and readers who think in pods)."""
        return cls(now, since, {member_lease_name(pod): at for pod, at in changed.items()})

    def seen(self, pod: str) -> bool:
        """Whether the pod's Lease was ever seen (it exists, or was seen deleted)."""
        return member_lease_name(pod) in self.changed

    def quiet_from(self, pod: str) -> float:
        """Monotonic time since which the pod's Lease has not been seen to change."""
        return max(self.changed.get(member_lease_name(pod), self.since), self.since)

    def quiet_for(self, pod: str) -> float:
        """Seconds the pod's Lease has not been seen to change."""
        return self.now - self.quiet_from(pod)

    def clients_of(self, pod: str) -> tuple[str, ...]:
        """The RocketMQ client ids the pod's Lease named last (none when it named none)."""
        return self.clients.get(member_lease_name(pod), ())

    def lapsed(self, pod: str, lease: float) -> bool:
        """A live member that stopped serving: its Lease, once seen, not renewed for ``lease`` seconds."""
        return self.seen(pod) and self.quiet_for(pod) >= lease


class LeaseTable:
    """Every member Lease seen, by namespace: its record and when it was last seen to change."""

    def __init__(self) -> None:
        self._changed: dict[str, dict[str, float]] = {}
        self._records: dict[str, dict[str, LeaseRecord]] = {}
        self._deleted: dict[str, dict[str, float]] = {}
        self._clients: dict[str, dict[str, tuple[str, ...]]] = {}
        """The client ids each Lease named last: kept after a deletion (the garbage collector
        deletes a gone pod's Lease before its queues are handed on, and their locks released)."""

    def seen(self, namespace: str, name: str, record: LeaseRecord, now: float) -> str | None:
        """A Lease listed or watched; its holder when this is a change (a renewal), else None."""
        records = self._records.setdefault(namespace, {})
        if records.get(name) == record and name not in self._deleted.get(namespace, {}):
            return None
        records[name] = record
        if len(record) > CLIENTS and record[CLIENTS]:
            self._clients.setdefault(namespace, {})[name] = record[CLIENTS]
        self._changed.setdefault(namespace, {})[name] = now
        deleted = self._deleted.get(namespace)
        if deleted is not None:
            deleted.pop(name, None)
        holder = record[1] if len(record) > 1 else None
        return holder if isinstance(holder, str) else ""

    def known(self, namespace: str, name: str) -> bool:
        """Whether the Lease exists as last seen (not new, nor created again after a deletion)."""
        return name in self._records.get(namespace, {})

    def deleted(self, namespace: str, name: str, now: float) -> None:
        """A Lease went away: a change too (a sidecar that still runs creates it again)."""
        self._records.get(namespace, {}).pop(name, None)
        self._changed.setdefault(namespace, {})[name] = now
        deleted = self._deleted.setdefault(namespace, {})
        deleted[name] = now
        for old, at in list(deleted.items()):
            if now - at > DELETED_KEPT_SECONDS:
                del deleted[old]
                self._changed[namespace].pop(old, None)
                self._clients.get(namespace, {}).pop(old, None)

    def view(self, namespace: str, since: float, now: float) -> MemberLeases:
        """The namespace's Leases for one reconcile (the table's own mapping: read it at once)."""
        return MemberLeases(now, since, self._changed.get(namespace, {}), self._clients.get(namespace, {}))

    def forget(self, namespace: str) -> None:
        for table in (self._changed, self._records, self._deleted, self._clients):
            table.pop(namespace, None)

    def __len__(self) -> int:
        return sum(len(r) for r in self._records.values())
