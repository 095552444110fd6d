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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import (
    Ack,
    AssignmentDocument,
    LeaseTerms,
    Release,
    RouteNotRead,
    SpecError,
    configmap_name,
    read_topic,
)
from mqbalance.journal import JournalRecord
from mqbalance.model import UNKNOWN_ZONE, Assignment, MessageModel, MessageQueue, TopicRoute, Zones
from mqbalance.operator.conditions import condition, condition_status, rfc3339
from mqbalance.operator.conditions import set_condition as _set_condition
from mqbalance.operator.handover import HandoverMode, HandoverSpec, Step, step, with_releasing
from mqbalance.operator.membership import PodInfo, members, not_serving
from mqbalance.operator.spec import GroupSpec, parse_group, unknown_config_queues
from mqbalance.quality import Figures, measure
from mqbalance.strategies import AllocationError, allocate_group

CONDITION_TYPES = ("Ready", "Balanced", "Degraded", "Invalid")
MAX_NOT_SERVING_LISTED = 10
"""Pods listed by name in status.notServingPods; status.notServing counts them all."""


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    observed_generation: int,
) -> list[dict[str, Any]]:
    """A ConsumerGroup's conditions with ``kind`` set, in CONDITION_TYPES order."""
    return _set_condition(
        conditions, kind, status, reason, message, now, observed_generation, CONDITION_TYPES
    )


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
    except TopicNotFound as e:
        return _invalid(obs, "TopicNotFound", str(e), member_zones, spec)
    except RouteNotRead as e:
        return _invalid(obs, "TopicRouteNotRead", str(e), member_zones, spec)
    except SpecError as e:
        return _invalid(obs, "InvalidTopic", str(e), member_zones, spec)

    queues = {route.topic: route.readable_queues() for route in routes}
    broker_zones: dict[str, str] = {}
    for route in routes:
        broker_zones.update(route.broker_zones())
    zones = Zones(brokers=broker_zones, consumers=member_zones)
    # Who held what before any handover now under way: the strategy's previous assignment.
    held_before = with_releasing(obs.previous) if obs.previous else None
    previous = merged(held_before, obs.previous.members) if obs.previous and held_before is not None else None
    try:
        topics = allocate_group(
            spec.strategy,
            {topic: qs for topic, qs in queues.items() if qs},
            member_zones,
            zones=zones,
            previous=previous,
            message_model=spec.message_model,
        )
    except AllocationError as e:
        return _invalid(obs, "AllocationFailed", str(e), member_zones, spec)
    # A topic with no readable queue keeps its last assignment, as a RocketMQ client keeps its
    # queues when the route offers none (its strategy refuses an empty queue list).
    empty = sorted(topic for topic, qs in queues.items() if not qs)
    for topic in empty:
        kept = held_before.get(topic, {}) if held_before else {}
        topics[topic] = {member: tuple(kept.get(member, ())) for member in member_zones}
    topics = {route.topic: topics[route.topic] for route in routes}

    generation = (
        max(obs.previous.generation if obs.previous else 0, _int(obs.status.get("assignmentGeneration"))) + 1
    )
    handover: Step | None = None
    releasing: tuple[Release, ...] = ()
    if spec.handover.mode is not HandoverMode.OFF or (obs.previous and obs.previous.releasing):
        handover = step(
            obs.previous,
            topics,
            spec=spec.handover,
            acks=obs.acks,
            alive=obs.alive,
            generation=generation,
            now=obs.now,
        )
        target, topics, releasing = topics, handover.topics, handover.releasing
    else:
        target = topics
    reason = change_reason(obs, spec, member_zones, target, broker_zones)
    if (
        reason == "resync"
        and handover is not None
        and (handover.released or handover.gone or handover.overridden)
    ):
        reason = "released"
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
        handover=spec.handover.mode.value,
        releasing=releasing,
        lease=LeaseTerms(spec.handover.lease, spec.handover.renew) if spec.handover.leased else None,
    )
    all_queues = [mq for qs in queues.values() for mq in qs]
    all_queues += [mq for topic in empty for qs in topics[topic].values() for mq in qs]
    current = merged(topics, member_zones)
    changed = not candidate.same_assignment(obs.previous)
    before = previous if changed else None
    figures = measure(before, current, zones=zones, queues=all_queues, message_model=spec.message_model)
    warnings = unknown_config_queues(spec.strategy, {r.topic: r for r in routes})
    recovered = (
        (Note("Normal", "SpecValid", "the spec can be honoured again"),)
        if condition_status(obs.status, "Invalid") == "True"
        else ()
    )

    wake_at = handover.wake_at if handover else None

    if not changed:
        assert obs.previous is not None
        status = _status(
            obs,
            obs.previous.generation,
            figures,
            current,
            member_zones,
            spec,
            warnings,
            empty,
            None,
            handover,
        )
        return Outcome(None, status, recovered, members=member_zones, spec=spec, wake_at=wake_at)

    last = {"time": rfc3339(obs.now), "reason": reason, "moved": figures.moved}
    status = _status(obs, generation, figures, current, member_zones, spec, warnings, empty, last, handover)
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
        compute_seconds=0.0,  # the caller times the reconcile: no clock here
        releasing=releasing,
    )
    message = (
        f"published generation {generation} ({reason}): {figures.members} members, {figures.queues} queues, "
        f"loads {figures.min_load}-{figures.max_load}, {figures.moved} moved, {figures.cross_zone} cross-zone"
    )
    notes = (*recovered, *handover_notes(handover, spec.handover), Note("Normal", "Rebalanced", message))
    return Outcome(candidate, status, notes, record, figures, member_zones, spec, handover, wake_at)


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
    prev_queues = {t: {mq for qs in a.values() for mq in qs} for t, a in with_releasing(prev).items()}
    now_queues = {t: {mq for qs in a.values() for mq in qs} for t, a in topics.items()}
    if prev_queues != now_queues or dict(broker_zones) != dict(prev.broker_zones):
        return "topics-changed"
    return "resync"


class TopicNotFound(SpecError):
    """A subscribed Topic resource does not exist."""


def _routes(obs: Observed, spec: GroupSpec) -> list[TopicRoute]:
    missing = [t for t in spec.topics if t not in obs.topics]
    if missing:
        names = ", ".join(repr(t) for t in missing)
        raise TopicNotFound(
            f"Topic {names} not found in namespace {obs.namespace!r}; create it or remove it from spec.topics"
        )
    routes = [read_topic(t, obs.topics[t], obs.routes.get(t)) for t in spec.topics]
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
    old = condition(obs.status, "Invalid")
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
    empty: list[str],
    last_rebalance: dict[str, Any] | None,
    handover: Step | None = None,
) -> dict[str, Any]:
    pending = sum(len(r.queues) for r in handover.releasing) if handover else 0
    unassigned = f.unassigned - pending  # queues in a handover have no owner by design
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
    if handover is not None:
        before = obs.status.get("handover") or {}
        overridden = _int(before.get("overriddenQueues")) + handover.overridden
        status["handover"] = {
            "mode": spec.handover.mode.value,
            "releasingQueues": pending,
            "waitingFor": list(handover.waiting_for),
            "overriddenQueues": overridden,
        }
        if handover.releasing:
            status["handover"]["since"] = rfc3339(min(r.since for r in handover.releasing))
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


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
