"""Pure: what an OffsetReset asks for and the decisions of its phases (reset_reconciler.py does the I/O).

A reset goes Proposed (its preview in the status, waiting for the approval annotation) -> Pausing
(the group is held paused through its own handover) -> Verifying (the committed offsets read again
and compared with the preview; targets that move with the queue resolved now) -> Writing (the
targets written and read back) -> Succeeded, or Failed at any step with the reason. The phase is
kept in the status, so an operator that restarts goes on from where the last one stopped: the
reads of Verifying are repeated, the writes of Writing are made again (they are idempotent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mqbalance.contract.bounds import MAX_RESET_QUEUES
from mqbalance.model import MessageModel
from mqbalance.operator.conditions import rfc3339, set_condition
from mqbalance.operator.spec import GroupSpec

PROPOSED, PAUSING, VERIFYING, WRITING, SUCCEEDED, FAILED = (
    "Proposed",
    "Pausing",
    "Verifying",
    "Writing",
    "Succeeded",
    "Failed",
)
ACTIVE = (PROPOSED, PAUSING, VERIFYING, WRITING)
"""Phases of a reset that is not over: a second reset of its group is refused meanwhile."""
HOLDING = (PAUSING, VERIFYING, WRITING)
"""Phases that hold the group paused."""
PHASE_RANK = {
    phase: rank for rank, phase in enumerate((PROPOSED, PAUSING, VERIFYING, WRITING, SUCCEEDED))
} | {FAILED: 4}
"""How far each phase is along: a status written is never replaced by an older one read back."""
CONDITION_ORDER = ("Approved", "Succeeded")
EARLIEST, LATEST = "Earliest", "Latest"

QueueKey = tuple[str, str, int]
"""(Topic resource, broker name, queue id)."""


class ResetRefused(Exception):
    """The reset cannot be done: it fails with ``reason`` and a message that says what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ResetTarget:
    """Exactly one of these is set."""

    time_ms: int | None = None
    position: str | None = None
    offsets: Mapping[QueueKey, int] = field(default_factory=dict)
    from_group: str | None = None

    @property
    def moves_with_queue(self) -> bool:
        """Targets read again once paused (the queue's ends and another group's offsets move meanwhile)."""
        return self.position is not None or self.from_group is not None


@dataclass(frozen=True)
class ResetSpec:
    group: str
    topics: tuple[str, ...]
    target: ResetTarget
    leave_paused: bool = False


@dataclass(frozen=True)
class QueueReading:
    """One queue as the brokers told it: its min and max offset and the group's committed offset."""

    min: int
    max: int
    committed: int | None
    """None: the group committed none."""


def queue_name(key: QueueKey) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


def read_reset_spec(spec: Any) -> ResetSpec:
    """The spec, checked as the CRD's schema checks it (an API server older than 1.28 drops its CEL rules)."""
    if not isinstance(spec, Mapping):
        raise ResetRefused("InvalidSpec", "the OffsetReset has no spec")
    group = spec.get("group")
    if not isinstance(group, str) or not group:
        raise ResetRefused("InvalidSpec", "spec.group must name a ConsumerGroup in this namespace")
    topics = spec.get("topics") or []
    if not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise ResetRefused("InvalidSpec", "spec.topics must list Topic resources the group subscribes")
    to = spec.get("to")
    if not isinstance(to, Mapping) or sum(k in to for k in ("time", "position", "offsets", "fromGroup")) != 1:
        raise ResetRefused(
            "InvalidSpec", "set exactly one of spec.to.time, to.position, to.offsets or to.fromGroup"
        )
    return ResetSpec(group, tuple(dict.fromkeys(topics)), _read_target(to), spec.get("leavePaused") is True)


def _read_target(to: Mapping[str, Any]) -> ResetTarget:
    if "time" in to:
        text = to["time"]
        try:
            when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
        except ValueError:
            raise ResetRefused(
                "InvalidSpec", f"spec.to.time is {text!r}; use RFC 3339, e.g. 2026-11-29T08:00:00Z"
            ) from None
        if when.tzinfo is None:
            raise ResetRefused(
                "InvalidSpec", f"spec.to.time {text!r} has no time zone; end it with Z or +hh:mm"
            )
        return ResetTarget(time_ms=int(when.timestamp() * 1000))
    if "position" in to:
        if to["position"] not in (EARLIEST, LATEST):
            raise ResetRefused(
                "InvalidSpec", f"spec.to.position is {to['position']!r}; use Earliest or Latest"
            )
        return ResetTarget(position=to["position"])
    if "fromGroup" in to:
        if not isinstance(to["fromGroup"], str) or not to["fromGroup"]:
            raise ResetRefused("InvalidSpec", "spec.to.fromGroup must name a ConsumerGroup in this namespace")
        return ResetTarget(from_group=to["fromGroup"])
    offsets: dict[QueueKey, int] = {}
    for i, entry in enumerate(to.get("offsets") or []):
        try:
            key = (str(entry["topic"]), str(entry["brokerName"]), int(entry["queueId"]))
            offset = int(entry["offset"])
        except (KeyError, TypeError, ValueError):
            raise ResetRefused(
                "InvalidSpec", f"spec.to.offsets[{i}] needs topic, brokerName, queueId and offset"
            ) from None
        if key in offsets:
            raise ResetRefused("InvalidSpec", f"spec.to.offsets names queue {queue_name(key)} twice")
        offsets[key] = offset
    if not offsets:
        raise ResetRefused("InvalidSpec", "spec.to.offsets lists no queue")
    return ResetTarget(offsets=offsets)


def reset_topics(reset: ResetSpec, group: GroupSpec) -> tuple[str, ...]:
    """The Topic resources to reset; refused for a broadcasting group or a topic it does not subscribe."""
    if group.message_model is MessageModel.BROADCASTING:
        raise ResetRefused(
            "Broadcasting",
            f"group {reset.group} is BROADCASTING: each consumer keeps its own offsets on its host, the "
            "brokers hold none to reset",
        )
    wanted = reset.topics or group.topics
    stray = [t for t in wanted if t not in group.topics]
    stray += sorted({k[0] for k in reset.target.offsets if k[0] not in wanted and k[0] not in stray})
    if stray:
        raise ResetRefused(
            "TopicNotSubscribed",
            f"group {reset.group} does not subscribe {', '.join(stray)} "
            f"(its spec.topics: {', '.join(group.topics)})",
        )
    return tuple(wanted)


def resolve_targets(
    target: ResetTarget,
    readings: Mapping[QueueKey, QueueReading],
    searched: Mapping[QueueKey, int] | None = None,
    source: Mapping[QueueKey, int | None] | None = None,
) -> dict[QueueKey, int]:
    """Each queue's target: from the time's ``searched`` offsets, the queue's ends, the explicit
    offsets or the ``source`` group's committed ones. Refused when one lies outside its queue's
    [min, max] (naming every such queue) or a queue cannot be given one."""
    if target.offsets:
        unknown = sorted(queue_name(k) for k in target.offsets if k not in readings)
        if unknown:
            raise ResetRefused(
                "UnknownQueue", f"spec.to.offsets names queues the route has not: {', '.join(unknown)}"
            )
        targets = dict(target.offsets)
    elif target.position is not None:
        targets = {k: (r.min if target.position == EARLIEST else r.max) for k, r in readings.items()}
    elif target.from_group is not None:
        source = source or {}
        missing = sorted(queue_name(k) for k in readings if source.get(k) is None)
        if missing:
            raise ResetRefused(
                "SourceHasNoOffset",
                f"group {target.from_group} has committed no offset of {_listed(missing)}: nothing to copy",
            )
        targets = {k: int(source[k]) for k in readings}  # type: ignore[arg-type]
    else:
        targets = {k: (searched or {})[k] for k in readings}
    outside = sorted(
        f"{queue_name(k)} ({t} not in [{readings[k].min}, {readings[k].max}])"
        for k, t in targets.items()
        if not readings[k].min <= t <= readings[k].max
    )
    if outside:
        raise ResetRefused("TargetOutOfRange", f"targets outside their queue's offsets: {_listed(outside)}")
    return targets


def check_size(queues: int) -> None:
    if queues > MAX_RESET_QUEUES:
        raise ResetRefused(
            "TooManyQueues",
            f"the reset covers {queues} queues, at most {MAX_RESET_QUEUES} fit in one; "
            "list fewer spec.topics and reset the rest in another",
        )


def preview_rows(
    readings: Mapping[QueueKey, QueueReading], targets: Mapping[QueueKey, int]
) -> list[dict[str, Any]]:
    """``status.queues``: each queue of ``targets`` with its committed offset, target and ends."""
    rows = []
    for key in sorted(targets):
        reading = readings[key]
        row: dict[str, Any] = {"topic": key[0], "brokerName": key[1], "queueId": key[2]}
        if reading.committed is not None:
            row["committed"] = reading.committed
        row.update(target=targets[key], min=reading.min, max=reading.max)
        rows.append(row)
    return rows


def row_key(row: Mapping[str, Any]) -> QueueKey:
    return (str(row["topic"]), str(row["brokerName"]), int(row["queueId"]))


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Messages skipped (targets ahead of committed) and replayed (behind), over queues that had committed."""
    skipped = replayed = 0
    for row in rows:
        if "committed" in row:
            delta = int(row["target"]) - int(row["committed"])
            skipped += max(0, delta)
            replayed += max(0, -delta)
    return {"queues": len(rows), "skipped": skipped, "replayed": replayed}


def drifted(
    rows: Sequence[Mapping[str, Any]], now: Mapping[QueueKey, int | None], paused_at_preview: bool
) -> list[str]:
    """The compare-and-set: queues whose committed offset changed since the preview in a way the
    group's own consumption cannot explain. Consumption only moves an offset forward, so one that
    went back (or vanished) was written by something else; once the group was paused at the preview,
    any change was."""
    out = []
    for row in rows:
        key = row_key(row)
        before, after = row.get("committed"), now.get(key)
        if before == after:
            continue
        if paused_at_preview or after is None or (before is not None and after < before):
            out.append(f"{queue_name(key)} ({_offset(before)} -> {_offset(after)})")
    return out


def changed(before: Mapping[QueueKey, int | None], after: Mapping[QueueKey, int | None]) -> list[str]:
    """Queues whose committed offset differs between two readings."""
    return [
        f"{queue_name(k)} ({_offset(before.get(k))} -> {_offset(after.get(k))})"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    ]


def holds_group(status: Mapping[str, Any], leave_paused: bool) -> bool:
    """Whether a reset in this status holds its group paused."""
    phase = status.get("phase")
    return phase in HOLDING or (phase == SUCCEEDED and leave_paused)


def hold_reason(name: str) -> str:
    """How ``status.pausedBy`` of the group names a reset that holds it."""
    return f"OffsetReset/{name}"


def proposed(
    status: Mapping[str, Any],
    group_name: str,
    rows: list[dict[str, Any]],
    paused: bool,
    resource: str,
    now: float,
    generation: int,
) -> dict[str, Any]:
    """The preview, waiting for approval."""
    conditions = _conditions(
        status,
        "Approved",
        "False",
        "WaitingForApproval",
        f"kubectl annotate offsetreset {resource} mqbalance.io/approve=true",
        now,
        generation,
    )
    conditions = set_condition(
        conditions,
        "Succeeded",
        "Unknown",
        PROPOSED,
        "previewed; waiting for approval",
        now,
        generation,
        CONDITION_ORDER,
    )
    return {
        **status,
        "phase": PROPOSED,
        "observedGeneration": generation,
        "groupName": group_name,
        "previewedAt": rfc3339(now),
        "pausedAtPreview": paused,
        "totals": totals(rows),
        "queues": rows,
        "conditions": conditions,
    }


def advanced(
    status: Mapping[str, Any], phase: str, message: str, now: float, generation: int
) -> dict[str, Any]:
    """Moved on to ``phase`` (Pausing, Verifying, Writing), still under way."""
    conditions = list(status.get("conditions") or [])
    if phase == PAUSING:
        conditions = set_condition(
            conditions, "Approved", "True", "Approved", "", now, generation, CONDITION_ORDER
        )
    conditions = set_condition(
        conditions, "Succeeded", "Unknown", phase, message, now, generation, CONDITION_ORDER
    )
    return {**status, "phase": phase, "conditions": conditions}


def retrying(status: Mapping[str, Any], message: str, now: float, generation: int) -> dict[str, Any]:
    """The phase stays; condition Succeeded says what it waits for (a broker, a route)."""
    conditions = set_condition(
        list(status.get("conditions") or []),
        "Succeeded",
        "Unknown",
        "BrokerUnavailable",
        message,
        now,
        generation,
        CONDITION_ORDER,
    )
    return {**status, "observedGeneration": generation, "conditions": conditions}


def finished(
    status: Mapping[str, Any], ok: bool, reason: str, message: str, now: float, generation: int
) -> dict[str, Any]:
    """Succeeded or Failed, for good."""
    conditions = set_condition(
        list(status.get("conditions") or []),
        "Succeeded",
        "True" if ok else "False",
        reason,
        message,
        now,
        generation,
        CONDITION_ORDER,
    )
    return {
        **status,
        "phase": SUCCEEDED if ok else FAILED,
        "observedGeneration": generation,
        "completedAt": rfc3339(now),
        "conditions": conditions,
    }


def _conditions(
    status: Mapping[str, Any], kind: str, value: str, reason: str, message: str, now: float, generation: int
) -> list[dict[str, Any]]:
    return set_condition(
        list(status.get("conditions") or []), kind, value, reason, message, now, generation, CONDITION_ORDER
    )


def _offset(value: int | None) -> str:
    return "none" if value is None else str(value)


def _listed(items: Sequence[str], most: int = 10) -> str:
    shown = ", ".join(items[:most])
    return shown if len(items) <= most else f"{shown} and {len(items) - most} more"
