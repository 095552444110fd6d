"""The level-based reconcile of one ConsumerGroup: observed state in, desired state out.

No I/O and no clock of its own (controller-runtime style): whatever event woke the
operator, the same observation gives the same document, status and journal line.
The caller writes the document (when there is one), then the status, then posts
the notes as Events.

Rules:
- the document is published only when the assignment, members, zones or strategy
  differ from the previous one; otherwise ``document`` is None and the generation
  stays;
- a spec that cannot be honoured (a missing Topic, a strategy setting that cannot
  work) sets Invalid=True with a message and publishes nothing: the last good
  assignment stays in force;
- no members is a real state: the group publishes an assignment with no members
  (so no sidecar keeps serving queues of pods that are gone), Ready=False and
  Degraded=True.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mqbalance.document import AssignmentDocument, configmap_name
from mqbalance.journal import JournalRecord
from mqbalance.model import UNKNOWN_ZONE, Assignment, MessageModel, MessageQueue, TopicRoute, Zones
from mqbalance.operator.membership import PodInfo, members, not_serving
from mqbalance.operator.spec import GroupSpec, SpecError, parse_group, parse_topic, unknown_config_queues
from mqbalance.quality import Figures, measure
from mqbalance.strategies import AllocationError, allocate

CONDITION_TYPES = ("Ready", "Balanced", "Degraded", "Invalid")
MAX_NOT_SERVING_LISTED = 10
"""Pods listed by name in status.notServingPods; status.notServing counts them all."""


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

    @property
    def invalid(self) -> bool:
        return condition_status(self.status, "Invalid") == "True"


def reconcile(obs: Observed) -> Outcome:
    try:
        spec = parse_group(obs.name, obs.spec)
    except SpecError as e:
        return _invalid(obs, "InvalidSpec", str(e), {})
    member_zones = members(obs.pods, spec.selector, obs.node_labels, spec.zone_label)
    try:
        routes = _routes(obs, spec)
    except SpecError as e:
        reason = "TopicNotFound" if "not found" in str(e) else "InvalidTopic"
        return _invalid(obs, reason, str(e), member_zones, spec)

    started = time.perf_counter()
    topics: dict[str, dict[str, tuple[MessageQueue, ...]]] = {}
    queues: dict[str, list[MessageQueue]] = {}
    broker_zones: dict[str, str] = {}
    for route in routes:
        broker_zones.update(route.broker_zones())
    zones = Zones(brokers=broker_zones, consumers=member_zones)
    for route in routes:
        queues[route.topic] = route.readable_queues()
        previous = obs.previous.topics.get(route.topic) if obs.previous else None
        try:
            topics[route.topic] = allocate(
                spec.strategy,
                queues[route.topic],
                member_zones,
                zones=zones,
                previous=previous,
                message_model=spec.message_model,
            )
        except AllocationError as e:
            return _invalid(obs, "AllocationFailed", f"topic {route.topic!r}: {e}", member_zones, spec)
    compute_seconds = time.perf_counter() - started

    generation = (
        max(obs.previous.generation if obs.previous else 0, _int(obs.status.get("assignmentGeneration"))) + 1
    )
    reason = change_reason(obs, spec, member_zones, topics, broker_zones)
    candidate = AssignmentDocument(
        group=spec.group_name,
        generation=generation,
        strategy=spec.strategy.name.value,
        message_model=spec.message_model.value,
        computed_at=obs.now,
        reason=reason,
        members=member_zones,
        topics=topics,
        broker_zones=broker_zones,
    )
    all_queues = [mq for qs in queues.values() for mq in qs]
    current = merged(topics, member_zones)
    changed = not candidate.same_assignment(obs.previous)
    before = merged(obs.previous.topics, obs.previous.members) if changed and obs.previous else None
    figures = measure(before, current, zones=zones, queues=all_queues, message_model=spec.message_model)
    warnings = unknown_config_queues(spec.strategy, {r.topic: r for r in routes})

    if not changed:
        assert obs.previous is not None
        status = _status(obs, obs.previous.generation, figures, current, member_zones, spec, warnings, None)
        return Outcome(None, status, members=member_zones, spec=spec)

    last = {"time": rfc3339(obs.now), "reason": reason, "moved": figures.moved}
    status = _status(obs, generation, figures, current, member_zones, spec, warnings, last)
    record = JournalRecord(
        namespace=obs.namespace,
        group=spec.group_name,
        generation=generation,
        time=obs.now,
        reason=reason,
        strategy=spec.strategy,
        message_model=spec.message_model.value,
        members=member_zones,
        broker_zones=broker_zones,
        queues=queues,
        assignment=topics,
        moved=figures.moved,
        compute_seconds=compute_seconds,
    )
    message = (
        f"published generation {generation} ({reason}): {figures.members} members, {figures.queues} queues, "
        f"loads {figures.min_load}-{figures.max_load}, {figures.moved} moved, {figures.cross_zone} cross-zone"
    )
    notes = [Note("Normal", "Rebalanced", message)]
    if condition_status(obs.status, "Invalid") == "True":
        notes.insert(0, Note("Normal", "SpecValid", "the spec can be honoured again"))
    return Outcome(candidate, status, tuple(notes), record, figures, member_zones, spec)


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
    prev_queues = {t: {mq for qs in a.values() for mq in qs} for t, a in prev.topics.items()}
    now_queues = {t: {mq for qs in a.values() for mq in qs} for t, a in topics.items()}
    if prev_queues != now_queues or dict(broker_zones) != dict(prev.broker_zones):
        return "topics-changed"
    return "resync"


def _routes(obs: Observed, spec: GroupSpec) -> list[TopicRoute]:
    missing = [t for t in spec.topics if t not in obs.topics]
    if missing:
        names = ", ".join(repr(t) for t in missing)
        raise SpecError(
            f"Topic {names} not found in namespace {obs.namespace!r}; create it or remove it from spec.topics"
        )
    routes = [parse_topic(t, obs.topics[t]) for t in spec.topics]
    by_name: dict[str, str] = {}
    for resource, route in zip(spec.topics, routes, strict=True):
        other = by_name.setdefault(route.topic, resource)
        if other != resource:
            raise SpecError(
                f"Topics {other!r} and {resource!r} both name RocketMQ topic "
                f"{route.topic!r}; subscribe to one"
            )
    return routes


def _invalid(
    obs: Observed, reason: str, message: str, member_zones: Mapping[str, str], spec: GroupSpec | None = None
) -> Outcome:
    """Keep the published assignment and its figures; say why nothing new can be published."""
    status = dict(obs.status)
    conditions = list(obs.status.get("conditions") or [])
    generation = obs.previous.generation if obs.previous else _int(obs.status.get("assignmentGeneration"))
    kept = f"generation {generation} stays in force" if generation else "nothing is published yet"
    conditions = set_condition(conditions, "Invalid", "True", reason, message, obs.now, obs.generation)
    conditions = set_condition(
        conditions, "Ready", "False", reason, f"the spec cannot be honoured; {kept}", obs.now, obs.generation
    )
    for kind in ("Balanced", "Degraded"):
        if condition_status({"conditions": conditions}, kind) is None:
            conditions = set_condition(conditions, kind, "Unknown", reason, kept, obs.now, obs.generation)
    status.update(
        observedGeneration=obs.generation,
        assignmentConfigMap=configmap_name(obs.name),
        conditions=conditions,
    )
    if generation:
        status["assignmentGeneration"] = generation
    notes: tuple[Note, ...] = ()
    old = _condition(obs.status, "Invalid")
    if not old or old.get("status") != "True" or old.get("message") != message:
        notes = (Note("Warning", reason, message),)
    return Outcome(None, status, notes, members=member_zones, spec=spec)


def _status(
    obs: Observed,
    generation: int,
    f: Figures,
    current: Assignment,
    member_zones: Mapping[str, str],
    spec: GroupSpec,
    warnings: list[str],
    last_rebalance: dict[str, Any] | None,
) -> dict[str, Any]:
    zones: dict[str, int] = {}
    for zone in member_zones.values():
        zones[zone] = zones.get(zone, 0) + 1
    idle_pods = not_serving(obs.pods, spec.selector)
    why = not_serving_summary(idle_pods)
    conds = list(obs.status.get("conditions") or [])
    now, gen = obs.now, obs.generation
    conds = set_condition(conds, "Invalid", "False", "Valid", "the spec can be honoured", now, gen)
    if f.members:
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
    if not f.members:
        conds = set_condition(conds, "Balanced", "Unknown", "NoMembers", "no members to balance", now, gen)
    elif spec.message_model is MessageModel.BROADCASTING:
        conds = set_condition(
            conds, "Balanced", "True", "Broadcasting", "every member holds every queue", now, gen
        )
    elif f.spread <= 1:
        conds = set_condition(
            conds, "Balanced", "True", "EvenLoads", f"loads {f.min_load}-{f.max_load} queues", now, gen
        )
    else:
        conds = set_condition(
            conds,
            "Balanced",
            "False",
            "UnevenLoads",
            f"loads range from {f.min_load} to {f.max_load} queues",
            now,
            gen,
        )
    idle = sum(1 for qs in current.values() if not qs)
    problems: list[tuple[str, str]] = []
    if not f.members:
        problems.append(("NoMembers", f"{f.queues} queues have no member to consume them"))
    elif f.unassigned:
        problems.append(
            ("UnassignedQueues", f"{f.unassigned} of {f.queues} queues are assigned to no member")
        )
    if f.members and spec.message_model is MessageModel.CLUSTERING and f.members > f.queues:
        problems.append(
            ("IdleMembers", f"{f.members} members for {f.queues} queues: {idle} members hold none")
        )
    if warnings:
        problems.append(
            ("ConfigMismatch", f"spec.strategy.config names queues no topic has: {', '.join(warnings)}")
        )
    if problems:
        reason = problems[0][0]
        conds = set_condition(conds, "Degraded", "True", reason, "; ".join(m for _, m in problems), now, gen)
    else:
        conds = set_condition(
            conds, "Degraded", "False", "AllQueuesServed", "every queue has a member", now, gen
        )
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "assignmentGeneration": generation,
        "assignmentConfigMap": configmap_name(obs.name),
        "members": f.members,
        "queues": f.queues,
        "minLoad": f.min_load,
        "maxLoad": f.max_load,
        "crossZoneQueues": f.cross_zone,
        "unassignedQueues": f.unassigned,
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
    return status


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


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    observed_generation: int,
) -> list[dict[str, Any]]:
    """Conditions with ``kind`` set; lastTransitionTime changes only when its status does."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    new = {
        "type": kind,
        "status": status,
        "reason": reason,
        "lastTransitionTime": since or rfc3339(now),
        "observedGeneration": observed_generation,
    }
    if message:  # omitted when empty, as Kubernetes does (this API server also reads "" as null)
        new["message"] = message
    rest = [c for c in conditions if c.get("type") != kind]
    return sorted([*rest, new], key=lambda c: _order(c.get("type", "")))


def condition_status(status: Mapping[str, Any], kind: str) -> str | None:
    c = _condition(status, kind)
    return c.get("status") if c else None


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def _order(kind: str) -> int:
    return CONDITION_TYPES.index(kind) if kind in CONDITION_TYPES else len(CONDITION_TYPES)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
