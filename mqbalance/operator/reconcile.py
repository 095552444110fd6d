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
  Degraded=True;
- STICKY with ``load`` balances the per-queue rates of the observation (``loads``), with the
  hysteresis state the caller kept (``load_state``) in and the next one out; a generation
  published only because load moved queues has reason ``load-imbalance``. Without rates it is
  STICKY, except that an assignment whose members and queues did not change is kept as it is
  (the one load balancing left, say, before an operator restart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mqbalance.contract import (
    Ack,
    AssignmentDocument,
    HandoverMode,
    HandoverSpec,
    LeaseTerms,
    Release,
    RouteNotRead,
    SpecError,
    configmap_name,
    read_topic,
)
from mqbalance.journal import JournalRecord
from mqbalance.model import Assignment, MessageModel, MessageQueue, TopicRoute, Zones
from mqbalance.operator.conditions import condition, condition_status, rfc3339
from mqbalance.operator.handover import Step, step, with_releasing
from mqbalance.operator.membership import PodInfo, members
from mqbalance.operator.spec import GroupSpec, parse_group, unknown_config_queues
from mqbalance.operator.status import group_status, int_field, set_condition
from mqbalance.quality import Figures, measure
from mqbalance.strategies import AllocationError, LoadState, allocate_group, balance_group

LOAD_IMBALANCE = "load-imbalance"
"""The reason of a generation that STICKY with ``load`` published to even out measured traffic."""


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
    readable = {topic: qs for topic, qs in queues.items() if qs}
    load_state: LoadState | None = None
    by_load = spec.strategy.load is not None and spec.message_model is MessageModel.CLUSTERING
    try:
        if by_load:
            topics, load_state = _balance(obs, spec, readable, member_zones, zones, previous)
        else:
            topics = allocate_group(
                spec.strategy,
                readable,
                member_zones,
                zones=zones,
                previous=previous,
                message_model=spec.message_model,
            )
    except AllocationError as e:
        return _invalid(obs, "AllocationFailed", str(e), member_zones, spec)
    load_target = merged(topics, member_zones) if by_load else None
    # A topic with no readable queue keeps its last assignment, as a RocketMQ client keeps its
    # queues when the route offers none (its strategy refuses an empty queue list).
    empty = sorted(topic for topic, qs in queues.items() if not qs)
    for topic in empty:
        kept = held_before.get(topic, {}) if held_before else {}
        topics[topic] = {member: tuple(kept.get(member, ())) for member in member_zones}
    topics = {route.topic: topics[route.topic] for route in routes}

    generation = (
        max(obs.previous.generation if obs.previous else 0, int_field(obs.status.get("assignmentGeneration")))
        + 1
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
    if reason == "resync" and load_target is not None and previous is not None:
        held_then = {m: set(qs) for m, qs in previous.items() if qs}
        if {m: set(qs) for m, qs in load_target.items() if qs} != held_then:
            reason = LOAD_IMBALANCE  # nothing else changed: the strategy moved queues for load
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
        status = group_status(
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
        return Outcome(
            None,
            status,
            recovered,
            members=member_zones,
            spec=spec,
            wake_at=wake_at,
            load_state=load_state,
            load_target=load_target,
        )

    last = {"time": rfc3339(obs.now), "reason": reason, "moved": figures.moved}
    status = group_status(
        obs, generation, figures, current, member_zones, spec, warnings, empty, last, handover
    )
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
    return Outcome(
        candidate,
        status,
        notes,
        record,
        figures,
        member_zones,
        spec,
        handover,
        wake_at,
        load_state,
        load_target,
    )


def _balance(
    obs: Observed,
    spec: GroupSpec,
    topics: Mapping[str, Sequence[MessageQueue]],
    member_zones: Mapping[str, str],
    zones: Zones,
    previous: Assignment | None,
) -> tuple[dict[str, dict[str, tuple[MessageQueue, ...]]], LoadState | None]:
    """STICKY with ``load``: the assignment, and the hysteresis state after ``obs.loads`` (None
    without rates: the state stays as it was)."""
    if previous is not None and obs.previous is not None and obs.previous.releasing and obs.load_target:
        # A handover under way: its revoked queues count where the last balancing sent them, so
        # that the balancing sees its own move and does not undo it.
        going = {mq: m for m, qs in obs.load_target.items() if m in member_zones for mq in qs}
        revoked = {mq for r in obs.previous.releasing for mq in r.queues}
        moved = {mq: going[mq] for mq in revoked if mq in going}
        previous = {
            m: tuple(mq for mq in qs if mq not in moved) + tuple(q for q, to in moved.items() if to == m)
            for m, qs in previous.items()
        }
    if obs.loads is not None:
        return balance_group(
            spec.strategy,
            topics,
            member_zones,
            loads=obs.loads,
            state=obs.load_state,
            zones=zones,
            previous=previous,
            message_model=spec.message_model,
        )
    everything = {mq for qs in topics.values() for mq in qs}
    held = {mq for qs in (previous or {}).values() for mq in qs}
    if previous is not None and set(previous) == set(member_zones) and held == everything:
        # Nothing to rebalance for: keep what is held (zero loads move nothing but the count bounds).
        kept, _ = balance_group(
            spec.strategy,
            topics,
            member_zones,
            loads={},
            zones=zones,
            previous=previous,
            message_model=spec.message_model,
        )
        return kept, None
    plain = replace(spec.strategy, load=None)
    return (
        allocate_group(
            plain, topics, member_zones, zones=zones, previous=previous, message_model=spec.message_model
        ),
        None,
    )


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
    generation = (
        obs.previous.generation if obs.previous else int_field(obs.status.get("assignmentGeneration"))
    )
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
