"""Why a reconcile publishes a new generation, and the Events a handover's phases are told by."""

from __future__ import annotations

from collections.abc import Mapping

from mqbalance.contract import HandoverSpec
from mqbalance.model import Assignment, MessageQueue
from mqbalance.operator.handover import Step, with_releasing
from mqbalance.operator.observation import Note, Observed
from mqbalance.operator.spec import GroupSpec

LOAD_IMBALANCE = "load-imbalance"
"""The reason of a generation that STICKY with ``load`` published to even out measured traffic."""
PAUSED = "paused"
"""The reason of the generation that takes every queue from the members of a group being paused."""
RESUMED = "resumed"
"""The reason of the first generation that assigns queues again after a pause."""


def merged(
    topics: Mapping[str, Assignment], member_zones: Mapping[str, str]
) -> dict[str, tuple[MessageQueue, ...]]:
    """All topics' queues per member (queues carry their topic, so nothing collides)."""
    out: dict[str, list[MessageQueue]] = {m: [] for m in member_zones}
    for assignment in topics.values():
        for member, qs in assignment.items():
            out.setdefault(member, []).extend(qs)
    return {m: tuple(qs) for m, qs in out.items()}


def change_reason(
    obs: Observed,
    spec: GroupSpec,
    member_zones: Mapping[str, str],
    topics: Mapping[str, Assignment],
    broker_zones: Mapping[str, str],
) -> str:
    """Why a new generation is needed, from the difference between what is published and what is observed."""
    prev = obs.previous
    if prev is None:
        return "initial"
    was_paused = bool(obs.status.get("pausedBy"))
    if obs.pause and not was_paused:
        return PAUSED
    if was_paused and not obs.pause:
        return RESUMED
    observed_generation = obs.status.get("observedGeneration")
    if (observed_generation is not None and observed_generation != obs.generation) or (
        prev.strategy != spec.strategy.name.value or prev.message_model != spec.message_model.value
    ):
        return "spec-changed"
    joined = member_zones.keys() - prev.members.keys()
    left = prev.members.keys() - member_zones.keys()
    if joined and left:
        return "members-changed"
    if joined:
        return "member-joined"
    if left:
        return "member-left"
    if dict(member_zones) != dict(prev.members):
        return "zone-changed"
    if dict(broker_zones) != dict(prev.broker_zones):
        return "topics-changed"
    if obs.pause:
        return "resync"  # a paused document names only the queues still being released
    prev_queues = {t: {mq for qs in a.values() for mq in qs} for t, a in with_releasing(prev).items()}
    now_queues = {t: {mq for qs in a.values() for mq in qs} for t, a in topics.items()}
    if prev_queues != now_queues:
        return "topics-changed"
    return "resync"


def handover_notes(handover: Step | None, spec: HandoverSpec) -> list[Note]:
    """Events for each handover phase: revoked, released, overridden."""
    if handover is None:
        return []
    notes = []
    if handover.revoked:
        notes.append(
            Note(
                "Normal",
                "QueuesRevoked",
                f"revoked {handover.revoked} queue(s) from {', '.join(handover.waiting_for)}; each goes "
                f"to its new owner once released (override after {spec.override_at(0):g} s)",
            )
        )
    if handover.released or handover.gone:
        notes.append(
            Note(
                "Normal",
                "QueuesReleased",
                f"{handover.released} queue(s) released by their owners and {handover.gone} of owners that "
                "are gone: assigned to their new owners",
            )
        )
    if handover.overridden:
        notes.append(
            Note(
                "Warning",
                "ReleaseOverridden",
                f"{', '.join(handover.overridden_owners)} did not release {handover.overridden} queue(s) "
                f"within {spec.override_at(0):g} s: assigned to their new owners anyway",
            )
        )
    return notes
