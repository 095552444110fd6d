"""Handing queues over without two consumers at once: revoke, release, then assign.

When a queue moves, its new owner must not start before the old owner has stopped: else
both consume it for a while (duplicates after every rebalance; broken order for orderly
consumers). With a handover mode other than ``Off`` a move takes two published generations:

1. **revoke**: the queue is taken from its old owner and given to nobody; the old owner's
   application stops fetching it, finishes or abandons what is in flight, commits its offset
   and acknowledges through its sidecar (``contract.releases``);
2. **assign**: once the old owner has released it (or is gone), the queue goes to its new owner.

Queues that do not move never stop. An owner whose pod finished (phase Succeeded or Failed)
needs no acknowledgement. One that does not acknowledge within the release timeout is
overridden (counted and reported), in ``Release`` mode at the timeout; in ``Orderly`` mode
only once RocketMQ's broker lock on the queue has expired too (``brokerLockSeconds`` after
the revocation), so an orderly consumer that never saw the revocation still holds the
broker's lock and keeps the new owner out until then.

Time-bounded ownership (Release and Orderly): each member's sidecar renews a Lease and stops
serving its queues (is *fenced*) once ``leaseSeconds`` pass without a renewal that reached the
API server. So an override never comes before ``leaseSeconds + leaseMarginSeconds`` after the
revocation, whatever the release timeout says: by then an owner cut off from the API server
has fenced itself (the margin covers the drift between its clock and ours). An owner whose pod
object is gone (deleted, even force-deleted, its containers perhaps still running on an
unreachable node) is *departed*, not finished: its queues are revoked like any other and handed
on at that same bound (or at its acknowledgement), never at once; and, where the operator watches
the member Leases (``leases``), only once its Lease has not changed for ``leaseSeconds +
leaseMarginSeconds`` on the operator's own monotonic clock: a force-deleted pod whose sidecar still
reaches the API server keeps renewing, so it still serves (leases.py).

Everything here is pure: the published document carries the revocations (with their
generation and time), the acknowledgements come from the releases ConfigMap, the clock
reading is an argument. A restarted operator therefore carries on where it stopped, and no
published document ever gives a queue to two members.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import Ack, AssignmentDocument, HandoverMode, HandoverSpec, Release
from mqbalance.model import Assignment, MessageQueue, sort_queues
from mqbalance.operator.leases import MemberLeases


class Alive(frozenset[str]):
    """The ``alive`` argument of :func:`step`, with the owners that *departed*.

    As a set: owners whose pods exist and have not finished. ``departed``: owners whose pod object
    is gone without being seen to finish (deleted or force-deleted): their containers may still run
    on a node the API server cannot reach, so they are not gone before their grant has expired.
    A plain set as ``alive`` means nobody departed: every owner outside it is gone at once.
    """

    departed: frozenset[str]

    def __new__(cls, alive: Iterable[str] = (), departed: Iterable[str] = ()) -> Alive:
        self = super().__new__(cls, alive)
        self.departed = frozenset(departed) - self
        return self

    def __reduce__(self) -> Any:
        return (Alive, (frozenset(self), self.departed))


@dataclass(frozen=True)
class Step:
    """The next generation's assignment and revocations, and what happened on the way."""

    topics: dict[str, dict[str, tuple[MessageQueue, ...]]]
    releasing: tuple[Release, ...]
    revoked: int = 0
    """Queues revoked in this step."""
    released: int = 0
    """Queues assigned because their old owner acknowledged."""
    gone: int = 0
    """Queues assigned because their old owner is gone."""
    overridden: int = 0
    """Queues assigned because their old owner did not acknowledge in time."""
    overridden_owners: tuple[str, ...] = ()
    waited: tuple[float, ...] = ()
    """How long each finished revocation (acknowledged, gone or overridden) was pending, seconds."""
    wake_at: float | None = None
    """When a pending revocation may be overridden: reconcile again then."""
    lease_wake_at: float | None = None
    """Monotonic time at which a departed owner's Lease will have been silent long enough."""
    waiting_for: tuple[str, ...] = field(default=())
    """Owners whose acknowledgement is awaited."""
    stopped: Mapping[str, tuple[MessageQueue, ...]] = field(default_factory=dict)
    """Queues given on in this step from owners known to consume nothing any more (their pods
    finished, or gone with their grants surely expired), by owner: the broker locks their orderly
    consumers held may be released on their behalf."""


def step(
    published: AssignmentDocument | None,
    target: Mapping[str, Assignment],
    *,
    spec: HandoverSpec,
    acks: Mapping[str, Ack],
    alive: Set[str],
    generation: int,
    now: float,
    leases: MemberLeases | None = None,
    withdrawn: Iterable[MessageQueue] = (),
) -> Step:
    """From the published document and the strategy's ``target`` to the next generation's share.

    ``alive``: pods that still exist and have not finished (an owner not in it is gone); an
    :class:`Alive` also names the owners that departed (pod object gone, not seen to finish):
    outside Off mode their queues wait for their acknowledgement or :meth:`HandoverSpec.expired_at`.
    ``generation``: the number the next document will carry, should it revoke anything.
    ``leases``: the member Leases as the operator saw them (None: not watched); a departed owner's
    queues wait for its Lease to be silent for ``lease + lease_margin`` too.
    ``withdrawn``: queues ``target`` gives nobody whose holder must still let go of them (a paused
    group): revoked like a move, and given nobody once released.
    """
    held = _holders(published.topics) if published else {}
    latest = published.generation if published else 0
    departed = alive.departed if isinstance(alive, Alive) and spec.leased else frozenset()
    silence = spec.lease + spec.lease_margin

    def lease_silent(owner: str) -> bool:
        """Whether a departed owner's Lease has been silent long enough: its sidecar has fenced itself."""
        return leases is None or leases.quiet_for(owner) >= silence

    def released(owner: str, generation: int) -> bool:
        """Whether ``owner`` let go of what ``generation`` revoked from it: it acknowledged that
        generation, or said "all" (holds nothing, takes nothing more) having seen the share the
        revocation took, that of the generation before (an application shutting down races the
        revocation its pod's termination causes)."""
        ack = acks.get(owner)
        return ack is not None and (
            ack.generation >= generation or (ack.all and ack.generation >= generation - 1)
        )

    def holds_nothing(owner: str) -> bool:
        """``owner`` said "all" after the latest document: it holds nothing, not even what that
        gave it (an "all" older than a later grant does not cover the grant)."""
        ack = acks.get(owner)
        return ack is not None and ack.all and ack.generation >= latest

    pending = {mq: r for r in (published.releasing if published else ()) for mq in r.queues}
    topics: dict[str, dict[str, list[MessageQueue]]] = {
        topic: {member: [] for member in assignment} for topic, assignment in target.items()
    }
    revoking: dict[str, list[MessageQueue]] = {}
    kept: dict[tuple[str, int, float], list[MessageQueue]] = {}
    outcome = {"released": 0, "gone": 0, "overridden": 0}
    finished: dict[tuple[str, int, float], str] = {}
    overridden_owners: set[str] = set()
    stopped: dict[str, list[MessageQueue]] = {}

    def give(topic: str, member: str | None, mq: MessageQueue) -> None:
        if member is not None:  # None: withdrawn, nobody takes it
            topics[topic][member].append(mq)

    wanted: list[tuple[str, str | None, MessageQueue]] = [
        (topic, member, mq)
        for topic, assignment in target.items()
        for member, qs in assignment.items()
        for mq in qs
    ]
    wanted += [(mq.topic, None, mq) for mq in withdrawn]
    for topic, member, mq in wanted:
        owner = held.get(mq)
        release = pending.get(mq)
        if (owner is not None and owner == member) or (owner is None and release is None):
            give(topic, member, mq)  # staying, or new
        elif owner is not None:
            if spec.mode is HandoverMode.OFF or holds_nothing(owner):
                give(topic, member, mq)  # nobody to wait for
            elif owner not in alive and owner not in departed:
                give(topic, member, mq)  # finished: nobody to wait for
                stopped.setdefault(owner, []).append(mq)
            else:
                revoking.setdefault(owner, []).append(mq)
        else:
            assert release is not None
            key = (release.owner, release.generation, release.since)
            if release.owner == member:
                give(topic, member, mq)  # back to where it was: nothing to release
            elif released(release.owner, release.generation):
                give(topic, member, mq)
                outcome["released"] += 1
                finished[key] = "released"
            elif release.owner in departed:
                if now >= spec.expired_at(release.since) and lease_silent(release.owner):
                    give(topic, member, mq)  # its grant has surely expired
                    outcome["gone"] += 1
                    finished[key] = "gone"
                    stopped.setdefault(release.owner, []).append(mq)
                else:
                    kept.setdefault(key, []).append(mq)
            elif release.owner not in alive:
                give(topic, member, mq)
                outcome["gone"] += 1
                finished[key] = "gone"
                stopped.setdefault(release.owner, []).append(mq)
            elif spec.mode is HandoverMode.OFF or now >= spec.override_at(release.since):
                give(topic, member, mq)
                outcome["overridden"] += 1
                overridden_owners.add(release.owner)
                finished[key] = "overridden"
            else:
                kept.setdefault(key, []).append(mq)

    releasing = [
        Release(owner, release_generation, since, tuple(sort_queues(queues)))
        for (owner, release_generation, since), queues in sorted(kept.items())
    ]
    releasing += [
        Release(owner, generation, now, tuple(sort_queues(queues)))
        for owner, queues in sorted(revoking.items())
    ]
    # A departed owner past the floor waits for its Lease's silence only (``lease_wake``).
    wake = [spec.override_at(r.since) for r in releasing if r.owner not in departed]
    wake += [at for r in releasing if r.owner in departed and (at := spec.expired_at(r.since)) > now]
    # Only Leases not yet silent long enough: one that is waits for the wall-clock floor (``wake``).
    lease_wake = (
        [
            at
            for r in releasing
            if r.owner in departed and (at := leases.quiet_from(r.owner) + silence) > leases.now
        ]
        if leases is not None
        else []
    )
    return Step(
        topics={t: {m: tuple(sort_queues(qs)) for m, qs in a.items()} for t, a in topics.items()},
        releasing=tuple(releasing),
        revoked=sum(len(qs) for qs in revoking.values()),
        released=outcome["released"],
        gone=outcome["gone"],
        overridden=outcome["overridden"],
        overridden_owners=tuple(sorted(overridden_owners)),
        waited=tuple(now - since for (_, _, since) in finished),
        wake_at=min(wake) if wake else None,
        lease_wake_at=min(lease_wake) if lease_wake else None,
        waiting_for=tuple(sorted({r.owner for r in releasing})),
        stopped={owner: tuple(sort_queues(qs)) for owner, qs in sorted(stopped.items())},
    )


def _holders(topics: Mapping[str, Assignment]) -> dict[MessageQueue, str]:
    return {
        mq: member for assignment in topics.values() for member, queues in assignment.items() for mq in queues
    }


def with_releasing(document: AssignmentDocument) -> dict[str, dict[str, tuple[MessageQueue, ...]]]:
    """The document's share with every revoked queue given back to its old owner: who held what
    before the handover started (the strategy's ``previous``, and the base of the move figures)."""
    if not document.releasing:
        return {topic: dict(assignment) for topic, assignment in document.topics.items()}
    out = {
        topic: {m: list(qs) for m, qs in assignment.items()} for topic, assignment in document.topics.items()
    }
    for release in document.releasing:
        for mq in release.queues:
            out.setdefault(mq.topic, {}).setdefault(release.owner, []).append(mq)
    return {t: {m: tuple(sort_queues(qs)) for m, qs in a.items()} for t, a in out.items()}
