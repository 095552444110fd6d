"""The level-based reconcile of one ConsumerGroup: observed state in, desired state out.

No I/O and no clock of its own (controller-runtime style): whatever event woke the
operator, the same observation gives the same document, status and journal line.
The outcome is a list of effects the caller carries out as they are: the releases
ConfigMap created when asked for, the document written (when there is one), then the
status, the notes posted as Events, the group looked at again at the times given, and
its interest kept for routing later changes to it.

Rules:
- the document is published only when the assignment, members, zones or strategy
  differ from the previous one; otherwise ``document`` is None and the generation
  stays;
- a spec that cannot be honoured (a missing Topic, a strategy setting that cannot
  work, a group or route over a bound of ``contract/bounds.py``) sets Invalid=True with
  a message and publishes nothing: the last good assignment stays in force;
- no members is a real state: the group publishes an assignment with no members
  (so no sidecar keeps serving queues of pods that are gone), Ready=False and
  Degraded=True;
- a pod Ready for less than ``minReadySeconds`` (longer after recent restarts) is no member yet;
  the group is reconciled again when it is due;
- a group held paused (``pause`` names why) is assigned nothing: whoever holds a queue lets go of
  it through the handover (revoked, released, then given nobody; with handover Off at once), in a
  generation with reason ``paused``; the first one after the last reason is gone has ``resumed``.
  ``status.history`` lists the last generations published;
- the lag loop's last reading (``lag``) is in every status written: ``status.lag`` and the
  LagAvailable condition;
- STICKY with ``load`` balances the per-queue rates of the observation (``loads``), with the
  hysteresis state the caller kept (``load_state``) in and the next one out; a generation
  published only because load moved queues has reason ``load-imbalance``. Without rates it is
  STICKY, except that an assignment whose members and queues did not change is kept as it is
  (the one load balancing left, say, before an operator restart).

The types in and out are in ``observation.py``; why a generation is published in ``change.py``;
the load balancing in ``load_balance.py``; a spec that cannot be honoured in ``invalid.py``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mqbalance.contract import (
    CONFIGMAP_KEY,
    AssignmentDocument,
    HandoverMode,
    LeaseTerms,
    Release,
    RouteNotRead,
    SpecError,
)
from mqbalance.contract.bounds import OverBound, check_assignment_size
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageModel, MessageQueue, Zones, sort_queues
from mqbalance.operator.change import LOAD_IMBALANCE, change_reason, handover_notes, merged
from mqbalance.operator.conditions import condition_status, rfc3339
from mqbalance.operator.handover import Step, step, with_releasing
from mqbalance.operator.invalid import TopicNotFound, check_group_bounds, invalid_outcome, subscribed_routes
from mqbalance.operator.leases import MemberLeases
from mqbalance.operator.load_balance import balance_by_load
from mqbalance.operator.membership import application_gone, lease_lapsed, members, settling
from mqbalance.operator.observation import Interest, LockRelease, Note, Observed, Outcome
from mqbalance.operator.spec import GroupSpec, parse_group, subscribed_topics, unknown_config_queues
from mqbalance.operator.status import flapping, group_status, history_entry, int_field, with_lag
from mqbalance.quality import measure
from mqbalance.strategies import AllocationError, LoadState, allocate_group

# The reconcile's types and reasons keep this import path (callers, tests, the mutation runs).
__all__ = ["LOAD_IMBALANCE", "Note", "Observed", "Outcome", "decision_size", "reconcile"]


def decision_size(obs: Observed) -> int:
    """What deciding ``obs`` costs, in what STICKY's costliest step grows with: candidate pods
    squared times subscribed topics."""
    return len(obs.pods) ** 2 * max(1, len(subscribed_topics(obs.spec)))


def reconcile(obs: Observed) -> Outcome:
    outcome = _decide(obs)
    return replace(outcome, status=with_lag(outcome.status, obs))


def _decide(obs: Observed) -> Outcome:
    try:
        spec = parse_group(obs.name, obs.spec)
    except OverBound as e:
        return invalid_outcome(obs, e.reason, str(e), {})
    except SpecError as e:
        return invalid_outcome(obs, "InvalidSpec", str(e), {})
    leases = obs.leases if spec.handover.leased else None
    lapsed: tuple[str, ...] = ()
    if leases is not None:
        # A member whose sidecar stopped renewing (cut off from the API server) serves nothing:
        # revoked as if it had left, long before its pod turns NotReady.
        obs = replace(obs, pods=lease_lapsed(obs.pods, leases, spec.handover.lease))
        lapsed = tuple(p.name for p in obs.pods if p.lease_lapsed and spec.selector.matches(p.labels))
    if spec.handover.mode is HandoverMode.RELEASE:
        # A member whose application's connections to its sidecar closed consumes nothing: the group
        # goes on without it at once (its "all" acknowledgement lets its queues go in one step).
        latest = obs.previous.generation if obs.previous else 0
        obs = replace(obs, pods=application_gone(obs.pods, obs.acks, latest))
    # A pod Ready for less than minReadySeconds (longer after restarts) is not given queues yet:
    # its share stays with the stable members, and the group is reconciled again when it is due.
    pods, ready_due = settling(obs.pods, spec.min_ready_seconds, obs.now)
    obs = replace(obs, pods=pods)
    member_zones = members(obs.pods, spec.selector, obs.node_labels, spec.zone_label)
    try:
        routes = subscribed_routes(obs, spec)
        check_group_bounds(spec, routes, member_zones)
    except TopicNotFound as e:
        return invalid_outcome(obs, "TopicNotFound", str(e), member_zones, spec)
    except RouteNotRead as e:
        return invalid_outcome(obs, "TopicRouteNotRead", str(e), member_zones, spec)
    except OverBound as e:
        return invalid_outcome(obs, e.reason, str(e), member_zones, spec)
    except SpecError as e:
        return invalid_outcome(obs, "InvalidTopic", str(e), member_zones, spec)

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
            topics, load_state = balance_by_load(obs, spec, readable, member_zones, zones, previous)
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
        return invalid_outcome(obs, "AllocationFailed", str(e), member_zones, spec)
    load_target = merged(topics, member_zones) if by_load else None
    # A topic with no readable queue keeps its last assignment, as a RocketMQ client keeps its
    # queues when the route offers none (its strategy refuses an empty queue list).
    empty = sorted(topic for topic, qs in queues.items() if not qs)
    for topic in empty:
        kept = held_before.get(topic, {}) if held_before else {}
        topics[topic] = {member: tuple(kept.get(member, ())) for member in member_zones}
    topics = {route.topic: topics[route.topic] for route in routes}
    allotted = topics  # the strategy's share, what a change is judged by even while paused
    withdrawn: list[MessageQueue] = []
    if obs.pause:
        # Held paused: nobody is given anything, and whoever holds a queue lets go of it through
        # the handover (revoked, acknowledged) as if it moved.
        withdrawn = sort_queues({mq for a in (held_before or {}).values() for qs in a.values() for mq in qs})
        topics = {topic: {member: () for member in member_zones} for topic in topics}

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
            leases=leases,
            withdrawn=withdrawn,
        )
        topics, releasing = handover.topics, handover.releasing
    reason = change_reason(obs, spec, member_zones, allotted, broker_zones)
    if (
        reason == "resync"
        and handover is not None
        and (handover.released or handover.gone or handover.overridden)
    ):
        reason = "released"
    if reason == "resync" and load_target is not None and previous is not None and not obs.pause:
        held_then = {m: set(qs) for m, qs in previous.items() if qs}
        if {m: set(qs) for m, qs in load_target.items() if qs} != held_then:
            reason = LOAD_IMBALANCE  # nothing else changed: the strategy moved queues for load
    candidate = AssignmentDocument(
        group=spec.group_name,
        generation=generation,
        strategy=spec.strategy.name.value,
        message_model=spec.message_model,
        computed_at=obs.now,
        reason=reason,
        members=member_zones,
        topics=topics,
        broker_zones=broker_zones,
        handover=spec.handover.mode,
        releasing=releasing,
        lease=LeaseTerms(spec.handover.lease, spec.handover.renew) if spec.handover.leased else None,
    )
    all_queues = [mq for qs in queues.values() for mq in qs]
    all_queues += [mq for topic in empty for qs in topics[topic].values() for mq in qs]
    current = merged(topics, member_zones)
    changed = not candidate.same_assignment(obs.previous)
    if changed:
        try:
            check_assignment_size(len(CONFIGMAP_KEY) + len(candidate.encode()))  # JSON is ASCII
        except OverBound as e:
            return invalid_outcome(obs, e.reason, str(e), member_zones, spec)
    before = previous if changed else None
    figures = measure(before, current, zones=zones, queues=all_queues, message_model=spec.message_model)
    warnings = unknown_config_queues(spec.strategy, {r.topic: r for r in routes})
    recovered = (
        (Note("Normal", "SpecValid", "the spec can be honoured again"),)
        if condition_status(obs.status, "Invalid") == "True"
        else ()
    )

    wake_at = min(
        (t for t in (handover.wake_at if handover else None, ready_due) if t is not None), default=None
    )
    # Monotonic: when a member's Lease would lapse unless renewed, or a departed one's be silent enough.
    lease_wake: list[float] = []
    if leases is not None:
        lease_wake += [leases.quiet_from(m) + spec.handover.lease for m in member_zones if leases.seen(m)]
    if handover is not None and handover.lease_wake_at is not None:
        lease_wake.append(handover.lease_wake_at)
    lease_wake_at = min(lease_wake) if lease_wake else None
    interest = Interest.of(spec, obs.pods, lapsed)
    ensure_releases = obs.lacks_releases(spec)

    # The status describes the generation published now: the new one (with its lastRebalance and
    # history line) when this reconcile publishes, else the one before.
    if changed:
        shown = generation
        last: dict[str, Any] | None = {"time": rfc3339(obs.now), "reason": reason, "moved": figures.moved}
        # The first generation names no one: members that were there from the start did not come and go.
        was = set(obs.previous.members) if obs.previous is not None else set(member_zones)
        joined, left = sorted(set(member_zones) - was), sorted(was - set(member_zones))
        entry = history_entry(
            generation, obs.now, reason, len(member_zones), figures.moved, handover, joined, left
        )
    else:
        assert obs.previous is not None
        shown, last, entry = obs.previous.generation, None, None
    status = group_status(
        obs, shown, figures, current, member_zones, spec, warnings, empty, last, handover, entry
    )
    # Flapping turns False by itself: look again when its oldest change leaves the window.
    flaps_end = flapping(status.get("history") or [], obs.now).wake_at
    wake_at = min((t for t in (wake_at, flaps_end) if t is not None), default=None)
    if not changed:
        return Outcome(
            None,
            status,
            recovered,
            members=member_zones,
            interest=interest,
            wake_at=wake_at,
            load_state=load_state,
            load_target=load_target,
            lease_wake_at=lease_wake_at,
            ensure_releases=ensure_releases,
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
    unlocks = lock_releases(spec, handover, leases)
    return Outcome(
        candidate,
        status,
        notes,
        record,
        figures,
        member_zones,
        interest,
        handover,
        wake_at,
        load_state,
        load_target,
        lease_wake_at,
        ensure_releases,
        unlocks,
    )


def lock_releases(
    spec: GroupSpec, handover: Step | None, leases: MemberLeases | None
) -> tuple[LockRelease, ...]:
    """Handover Orderly: the broker locks of the members the handover knows stopped (pods finished,
    or gone with their grants surely expired), for the queues given on from them now. An orderly
    consumer renews its locks every 20 s and the broker keeps them 60 s: released on its behalf, the
    queues' new owners lock them at once. Only the clients the member's Lease named (its sidecar
    learnt them from the Java helper) can be named: without them the locks expire as before."""
    if handover is None or leases is None or spec.handover.mode is not HandoverMode.ORDERLY:
        return ()
    return tuple(
        LockRelease(spec.group_name, member, clients, queues)
        for member, queues in handover.stopped.items()
        if (clients := leases.clients_of(member))
    )
