"""A ConsumerGroup's status: figures, conditions and handover progress, from one reconcile.

Pure like the reconcile (reconcile.py) that calls it: everything comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from mqbalance.contract import configmap_name
from mqbalance.contract.bounds import MAX_HISTORY
from mqbalance.model import UNKNOWN_ZONE, Assignment, MessageModel
from mqbalance.operator.conditions import condition, condition_status, rfc3339
from mqbalance.operator.conditions import set_condition as _set_condition
from mqbalance.operator.handover import Step
from mqbalance.operator.membership import PodInfo, not_serving, unix_time
from mqbalance.operator.spec import GroupSpec

if TYPE_CHECKING:
    from mqbalance.operator.observation import LagReading
from mqbalance.quality import Figures

CONDITION_TYPES = ("Ready", "Balanced", "Degraded", "Invalid", "Paused", "Flapping")
LAG_CONDITION = "LagAvailable"
"""Set from the lag loop's readings (lagpoll.py), after the others."""
MAX_NOT_SERVING_LISTED = 10
"""Pods listed by name in status.notServingPods; status.notServing counts them all."""
FLAPPING_CHANGES = 3
"""A member that joined or left more often than this within FLAPPING_WINDOW is flapping."""
FLAPPING_WINDOW = 600.0
"""Seconds: ten minutes, the window in which restarts lengthen minReadySeconds too."""
MAX_NAMES_LISTED = 10
"""Members named in a history line's joined and left, and in status.flappingMembers."""


@dataclass(frozen=True)
class Flapping:
    """The members that joined or left more than FLAPPING_CHANGES times within FLAPPING_WINDOW, by
    ``status.history``, and when the oldest change counted for them leaves the window."""

    members: Mapping[str, int]
    """Member -> its joins and leaves in the window."""
    wake_at: float | None = None


def flapping(history: Sequence[Mapping[str, Any]], now: float) -> Flapping:
    changes: dict[str, list[float]] = {}
    for entry in history:
        at = unix_time(entry.get("time"))
        if at is None or now - at >= FLAPPING_WINDOW:
            continue
        for member in [*(entry.get("joined") or []), *(entry.get("left") or [])]:
            changes.setdefault(str(member), []).append(at)
    members = {m: len(times) for m, times in changes.items() if len(times) > FLAPPING_CHANGES}
    oldest = [min(changes[m]) for m in members]
    return Flapping(members, min(oldest) + FLAPPING_WINDOW if oldest else None)


class Observation(Protocol):
    """What the status reads of a reconcile's observation (reconcile.Observed)."""

    @property
    def name(self) -> str: ...
    @property
    def pods(self) -> Sequence[PodInfo]: ...
    @property
    def status(self) -> Mapping[str, Any]: ...
    @property
    def now(self) -> float: ...
    @property
    def generation(self) -> int: ...
    @property
    def lag(self) -> LagReading | None: ...
    @property
    def pause(self) -> tuple[str, ...]: ...


set_condition = partial(_set_condition, order=CONDITION_TYPES)
"""A ConsumerGroup's conditions with ``kind`` set, in CONDITION_TYPES order (conditions.set_condition)."""


def group_status(
    obs: Observation,
    generation: int,
    f: Figures,
    current: Assignment,
    member_zones: Mapping[str, str],
    spec: GroupSpec,
    warnings: list[str],
    empty: list[str],
    last_rebalance: dict[str, Any] | None,
    handover: Step | None = None,
    published: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole status of a group that publishes ``generation``: figures, conditions, the pods not
    serving, the handover under way, the pause, the last generations (``published``: the history
    entry of ``generation`` when this reconcile publishes it)."""
    pending = sum(len(r.queues) for r in handover.releasing) if handover else 0
    unassigned = f.unassigned - pending  # queues in a handover have no owner by design
    held = pending + sum(len(qs) for qs in current.values())
    if obs.pause:
        unassigned = 0  # nobody is meant to hold anything
    zones: dict[str, int] = {}
    for zone in member_zones.values():
        zones[zone] = zones.get(zone, 0) + 1
    idle_pods = not_serving(obs.pods, spec.selector)
    why = not_serving_summary(idle_pods)
    conds = list(obs.status.get("conditions") or [])
    now, gen = obs.now, obs.generation
    conds = set_condition(conds, "Invalid", "False", "Valid", "the spec can be honoured", now, gen)
    paused_by = ", ".join(obs.pause)
    if obs.pause:
        conds = set_condition(
            conds, "Ready", "False", "Paused", f"paused by {paused_by}: no member is served", now, gen
        )
    elif f.members:
        conds = set_condition(
            conds,
            "Ready",
            "True",
            "Published",
            f"generation {generation} serves {f.members} members" + (f"; {why}" if why else ""),
            now,
            gen,
        )
    else:
        conds = set_condition(
            conds,
            "Ready",
            "False",
            "NoMembers",
            "no pod matching the selector is Running and Ready" + (f"; {why}" if why else ""),
            now,
            gen,
        )
    if obs.pause:
        conds = set_condition(
            conds, "Balanced", "Unknown", "Paused", "nothing is assigned while paused", now, gen
        )
    elif not f.members:
        conds = set_condition(conds, "Balanced", "Unknown", "NoMembers", "no members to balance", now, gen)
    elif spec.message_model is MessageModel.BROADCASTING:
        conds = set_condition(
            conds, "Balanced", "True", "Broadcasting", "every member holds every queue", now, gen
        )
    elif f.spread <= 1 and f.topic_spread <= 1:
        conds = set_condition(
            conds,
            "Balanced",
            "True",
            "EvenLoads",
            f"loads {f.min_load}-{f.max_load} queues over all topics; each topic within one",
            now,
            gen,
        )
    elif f.topic_spread > 1:
        conds = set_condition(
            conds,
            "Balanced",
            "False",
            "UnevenTopicLoads",
            f"within one topic, members' loads differ by up to {f.topic_spread} queues",
            now,
            gen,
        )
    else:
        conds = set_condition(
            conds,
            "Balanced",
            "False",
            "UnevenLoads",
            f"each topic is within one, but loads over all topics range from {f.min_load} to "
            f"{f.max_load} queues (STICKY balances the total too)",
            now,
            gen,
        )
    idle = sum(1 for qs in current.values() if not qs)
    problems: list[tuple[str, str]] = []
    if not f.members:
        problems.append(("NoMembers", f"{f.queues} queues have no member to consume them"))
    elif unassigned:
        problems.append(("UnassignedQueues", f"{unassigned} of {f.queues} queues are assigned to no member"))
    if f.members and spec.message_model is MessageModel.CLUSTERING and f.members > f.queues:
        problems.append(
            ("IdleMembers", f"{f.members} members for {f.queues} queues: {idle} members hold none")
        )
    if empty:
        problems.append(
            (
                "NoReadableQueues",
                f"topic(s) {', '.join(empty)} have no readable queue; their last assignment stays",
            )
        )
    if warnings:
        problems.append(
            ("ConfigMismatch", f"spec.strategy.config names queues no topic has: {', '.join(warnings)}")
        )
    if obs.pause:
        conds = set_condition(
            conds,
            "Degraded",
            "False",
            "Paused",
            f"paused by {paused_by}: no queue is meant to be served",
            now,
            gen,
        )
    elif problems:
        reason = problems[0][0]
        conds = set_condition(conds, "Degraded", "True", reason, "; ".join(m for _, m in problems), now, gen)
    else:
        conds = set_condition(
            conds, "Degraded", "False", "AllQueuesServed", "every queue has a member", now, gen
        )
    conds = _pause_condition(conds, obs.pause, held, now, gen)
    history = [e for e in obs.status.get("history") or [] if isinstance(e, Mapping)]
    if published is not None:
        history = [published, *history]
    history = [dict(e) for e in history[:MAX_HISTORY]]
    flaps = flapping(history, now)
    conds = _flapping_condition(conds, flaps, now, gen)
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "assignmentGeneration": generation,
        "assignmentConfigMap": configmap_name(obs.name),
        "members": f.members,
        "queues": f.queues,
        "minLoad": f.min_load,
        "maxLoad": f.max_load,
        "topicSpread": f.topic_spread,
        "crossZoneQueues": f.cross_zone,
        "unassignedQueues": unassigned,
        "unknownZoneMembers": sorted(m for m, z in member_zones.items() if z == UNKNOWN_ZONE),
        "notServing": len(idle_pods),
        "notServingPods": [
            {"name": p.name, "reason": p.reason, "message": p.message}
            for p in idle_pods[:MAX_NOT_SERVING_LISTED]
        ],
        "zones": dict(sorted(zones.items())),
        "lastRebalance": last_rebalance or dict(obs.status.get("lastRebalance") or {}),
        "conditions": conds,
    }
    if not status["lastRebalance"]:
        del status["lastRebalance"]
    if obs.pause:
        status["pausedBy"] = list(obs.pause)
        status["heldQueues"] = held
    if history:
        status["history"] = history
    if flaps.members:
        status["flappingMembers"] = sorted(flaps.members)[:MAX_NAMES_LISTED]
    if handover is not None:
        before = obs.status.get("handover") or {}
        overridden = int_field(before.get("overriddenQueues")) + handover.overridden
        status["handover"] = {
            "mode": spec.handover.mode.value,
            "releasingQueues": pending,
            "waitingFor": list(handover.waiting_for),
            "overriddenQueues": overridden,
        }
        if handover.releasing:
            status["handover"]["since"] = rfc3339(min(r.since for r in handover.releasing))
    return status


def _pause_condition(
    conds: list[dict[str, Any]], pause: tuple[str, ...], held: int, now: float, gen: int
) -> list[dict[str, Any]]:
    """Paused: True once no member holds a queue any more, False (``Pausing``) while some still do,
    so that ``kubectl wait --for=condition=Paused`` returns when the group is quiet. A group never
    paused has no Paused condition; a resumed one keeps it, False (``Resumed``)."""
    if pause:
        why = ", ".join(pause)
        if held:
            return set_condition(
                conds, "Paused", "False", "Pausing", f"paused by {why}: {held} queue(s) still held", now, gen
            )
        return set_condition(
            conds, "Paused", "True", "Paused", f"paused by {why}: no queue is held", now, gen
        )
    if condition_status({"conditions": conds}, "Paused") is None:
        return conds
    return set_condition(conds, "Paused", "False", "Resumed", "assigned by its strategy again", now, gen)


def _flapping_condition(
    conds: list[dict[str, Any]], flaps: Flapping, now: float, gen: int
) -> list[dict[str, Any]]:
    """Flapping: True while a member joined or left more than FLAPPING_CHANGES times in the last
    FLAPPING_WINDOW; a group that never flapped has no Flapping condition, one that did keeps it, False."""
    if flaps.members:
        named = ", ".join(f"{m} ({n} times)" for m, n in sorted(flaps.members.items())[:MAX_NAMES_LISTED])
        minutes = f"{FLAPPING_WINDOW / 60:g} minutes"
        message = f"joined or left more than {FLAPPING_CHANGES} times in {minutes}: {named}"
        return set_condition(conds, "Flapping", "True", "MembersFlapping", message, now, gen)
    if condition_status({"conditions": conds}, "Flapping") is None:
        return conds
    message = (
        f"no member joined or left more than {FLAPPING_CHANGES} times in {FLAPPING_WINDOW / 60:g} minutes"
    )
    return set_condition(conds, "Flapping", "False", "Stable", message, now, gen)


def history_entry(
    generation: int,
    now: float,
    reason: str,
    members: int,
    moved: int,
    handover: Step | None,
    joined: Sequence[str] = (),
    left: Sequence[str] = (),
) -> dict[str, Any]:
    """``status.history``'s line for a published generation; ``handoverSeconds``: how long the
    revocations it finished had waited, from revocation to this assignment (the longest);
    ``overriddenQueues``: the revoked queues it gave on without their owner's release; ``joined``
    and ``left``: the members that came and went with it (what Flapping counts)."""
    entry: dict[str, Any] = {
        "generation": generation,
        "time": rfc3339(now),
        "reason": reason,
        "members": members,
        "moved": moved,
    }
    if joined:
        entry["joined"] = sorted(joined)[:MAX_NAMES_LISTED]
    if left:
        entry["left"] = sorted(left)[:MAX_NAMES_LISTED]
    if handover is not None and handover.waited:
        entry["handoverSeconds"] = round(max(handover.waited), 3)
    if handover is not None and handover.overridden:
        entry["overriddenQueues"] = handover.overridden
    return entry


def with_lag(status: dict[str, Any], obs: Observation) -> dict[str, Any]:
    """``status`` with the lag loop's last reading: ``status.lag`` and the LagAvailable condition
    (its transition time kept while it says the same). Without a reading, the lag the status
    showed stays."""
    reading = obs.lag
    if reading is None:
        lag = obs.status.get("lag")
        return status if lag is None else {**status, "lag": lag}
    old = condition(obs.status, LAG_CONDITION)
    kind, reason, message = reading.available
    if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == reading.available:
        available = dict(old)
    else:
        before = [dict(old)] if old else []
        available = _set_condition(before, LAG_CONDITION, kind, reason, message, obs.now, obs.generation)[0]
    rest = [c for c in status.get("conditions") or [] if c.get("type") != LAG_CONDITION]
    return {**status, "lag": reading.lag, "conditions": [*rest, available]}


def not_serving_summary(pods: Sequence[PodInfo]) -> str:
    """E.g. "2 matching pods not serving: 1 CrashLoopBackOff (a-1), 1 NodeNotReady (a-2)"; "" for none."""
    if not pods:
        return ""
    by_reason: dict[str, list[str]] = {}
    for pod in pods:
        by_reason.setdefault(pod.reason or "Unknown", []).append(pod.name)
    parts = []
    for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{len(names)} {reason} ({shown})")
    noun = "pod" if len(pods) == 1 else "pods"
    return f"{len(pods)} matching {noun} not serving: {', '.join(parts)}"


def int_field(value: Any) -> int:
    """An integer status field, 0 when absent or not an integer (status is anyone's to edit)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def reconcile_failed(status: Mapping[str, Any], message: str, now: float, generation: int) -> dict[str, Any]:
    """The status after a reconcile that raised: the last one written, figures and published
    generation kept, with Ready False for ``ReconcileFailed`` and ``message``."""
    assigned = int_field(status.get("assignmentGeneration"))
    kept = f"generation {assigned} stays published" if assigned else "nothing is published yet"
    conditions = set_condition(
        list(status.get("conditions") or []),
        "Ready",
        "False",
        "ReconcileFailed",
        f"{message}; {kept}",
        now,
        generation,
    )
    return {**status, "conditions": conditions}
