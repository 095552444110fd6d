"""Deliberately broken variants of the operator, each breaking one property the tests claim to check.

A mutant is a function that monkeypatches the operator's modules in the process about to run it
(``tests/mutation/operator_mutant.py``); nothing here is ever imported by the product. Each patch
replaces the name where its caller looks it up (``reconcile`` imports ``step`` and ``members`` by
name, ``group_reconciler`` imports ``reconcile``), and wraps the original instead of copying its code, so
the mutants follow the product as it changes. :data:`MUTANTS` lists them with the tests that must
fail under each (``tests/mutation/test_mutants.py`` runs them; docs/reliability.md, "Mutation runs").
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

from mqbalance.contract import Ack, AssignmentDocument, HandoverMode, HandoverSpec
from mqbalance.model import Assignment, MessageModel, MessageQueue
from mqbalance.operator import group_reconciler, handover, membership, reconcile
from mqbalance.operator.handover import Step

StepFunction = Callable[..., Step]

HANDOVER = "tests/integration/operator/test_handover.py"
RELIABILITY_HANDOVER = "tests/integration/reliability/test_reliability_handover.py"
LIFECYCLE = "tests/integration/operator/test_group_lifecycle.py"


Change = Callable[
    [AssignmentDocument | None, HandoverSpec, Mapping[str, Ack]], tuple[HandoverSpec, Mapping[str, Ack]]
]
"""What a handover mutant does to the step's spec and acknowledgements."""


def _patch(owner: ModuleType | type, name: str, value: object) -> None:
    """Replace ``owner.name`` (a module's function, a class's method), which must exist: a product
    change that renames it must not leave a mutant silently doing nothing."""
    if not callable(getattr(owner, name, None)):
        raise RuntimeError(f"{owner.__name__}.{name} is gone: the mutant needs updating")
    setattr(owner, name, value)


def _wrap_step(change: Change) -> None:
    """Make the reconcile's handover step see the spec and acknowledgements ``change`` returns."""
    original: StepFunction = handover.step

    def step(
        published: AssignmentDocument | None,
        target: Mapping[str, Assignment],
        *,
        spec: HandoverSpec,
        acks: Mapping[str, Ack],
        **rest: Any,
    ) -> Step:
        spec, acks = change(published, spec, acks)
        return original(published, target, spec=spec, acks=acks, **rest)  # alive, generation, now

    _patch(reconcile, "step", step)  # the name reconcile() calls


def no_revocation() -> None:
    """(a) A queue moved with no revocation: the handover is skipped, every moving queue goes to its
    new owner in the generation that takes it from the old one, though the group asks for Release."""

    def change(
        published: AssignmentDocument | None, spec: HandoverSpec, acks: Mapping[str, Ack]
    ) -> tuple[HandoverSpec, Mapping[str, Ack]]:
        return dataclasses.replace(spec, mode=HandoverMode.OFF), acks

    _wrap_step(change)


def released_before_release() -> None:
    """(b) A revoked queue handed on before its release: the step's ``released(owner, generation)``
    check made always true, by showing it an acknowledgement of every pending revocation."""

    def change(
        published: AssignmentDocument | None, spec: HandoverSpec, acks: Mapping[str, Ack]
    ) -> tuple[HandoverSpec, Mapping[str, Ack]]:
        forged = dict(acks)
        for release in published.releasing if published else ():
            ack = forged.get(release.owner)
            if ack is None or ack.generation < release.generation:
                # Not "all": an older "all" did not cover the latest document either.
                forged[release.owner] = Ack(release.generation)
        return spec, forged

    _wrap_step(change)


def override_at_once() -> None:
    """(c) An override before the timeout: the handover step sees ``releaseTimeoutSeconds``,
    ``brokerLockSeconds``, ``leaseSeconds`` and ``leaseMarginSeconds`` all 0, so no bound the
    override waits for holds (the timeout, the broker lock, grants that must expire, a departed
    owner's Lease that must fall silent): a revoked queue nobody released is overridden at the next
    reconcile, which the step asks for at once. The published lease terms stay as the spec says
    (the sidecars keep their grants), so only the operator's waiting is broken."""

    def change(
        published: AssignmentDocument | None, spec: HandoverSpec, acks: Mapping[str, Ack]
    ) -> tuple[HandoverSpec, Mapping[str, Ack]]:
        zero = dataclasses.replace(spec, release_timeout=0.0, broker_lock=0.0, lease=0.0, lease_margin=0.0)
        return zero, acks

    _wrap_step(change)


def _queue_twice(doc: AssignmentDocument) -> AssignmentDocument:
    """``doc`` with one queue listed under a second member too: the first queue of the first member
    (by name) holding any, in the first topic where a member sorting after it exists."""
    if doc.message_model is not MessageModel.CLUSTERING:
        return doc
    names = sorted(doc.members)
    for topic in sorted(doc.topics):
        assignment = doc.topics[topic]
        for i, giver in enumerate(names[:-1]):
            if assignment.get(giver):
                taker = names[i + 1]
                extra = (*assignment.get(taker, ()), assignment[giver][0])
                topics = {**doc.topics, topic: {**assignment, taker: extra}}
                return dataclasses.replace(doc, topics=topics)
    return doc


def _queues_once(doc: AssignmentDocument) -> AssignmentDocument:
    """Undo :func:`_queue_twice`: each queue kept only under the first member (by name) listing it."""
    topics: dict[str, Assignment] = {}
    changed = False
    for topic, assignment in doc.topics.items():
        seen: set[MessageQueue] = set()
        kept: dict[str, tuple[MessageQueue, ...]] = {}
        for member in sorted(assignment):
            queues = assignment[member]
            kept[member] = tuple(mq for mq in queues if mq not in seen)
            changed = changed or len(kept[member]) != len(queues)
            seen.update(queues)
        topics[topic] = {member: kept[member] for member in assignment}
    return dataclasses.replace(doc, topics=topics) if changed else doc


def queue_to_two_members() -> None:
    """(d) A queue given to two members: every published document lists one queue under a second
    member as well. The reconcile is shown the document without the extra listing, so it publishes
    only when the product would (no endless stream of generations)."""
    original = reconcile.reconcile

    def mutated(obs: reconcile.Observed) -> reconcile.Outcome:
        if obs.previous is not None:
            obs = dataclasses.replace(obs, previous=_queues_once(obs.previous))
        outcome = original(obs)
        if outcome.document is None:
            return outcome
        return dataclasses.replace(outcome, document=_queue_twice(outcome.document))

    _patch(group_reconciler, "reconcile", mutated)  # the name the group reconciler calls


_previous_members: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "previous_members", default=MappingProxyType({})
)


def departed_member_kept() -> None:
    """(e) A departed member kept: a pod that leaves (unready, terminating, deleted) stays a member,
    with its zone, of every later generation."""
    original_members = membership.members
    original_reconcile = reconcile.reconcile

    def members(*args: Any, **kwargs: Any) -> dict[str, str]:
        out = original_members(*args, **kwargs)
        for member, zone in _previous_members.get().items():
            out.setdefault(member, zone)
        return out

    def mutated(obs: reconcile.Observed) -> reconcile.Outcome:
        token = _previous_members.set(dict(obs.previous.members) if obs.previous else {})
        try:
            return original_reconcile(obs)
        finally:
            _previous_members.reset(token)

    _patch(reconcile, "members", members)  # the name reconcile() calls
    _patch(group_reconciler, "reconcile", mutated)


@dataclass(frozen=True)
class Mutant:
    name: str
    apply: Callable[[], None]
    breaks: str
    """The property it breaks, in a few words."""
    caught_by: tuple[str, ...]
    """pytest node ids (relative to the repository) that must fail under it."""


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "no-revocation",
            no_revocation,
            "a queue moved with no revocation",
            (
                f"{HANDOVER}::test_queues_move_only_after_their_owner_released_them",
                f"{RELIABILITY_HANDOVER}::test_operator_killed_between_revoke_and_assign[default]",
            ),
        ),
        Mutant(
            "released-before-release",
            released_before_release,
            "a revoked queue handed on before its release",
            (
                f"{HANDOVER}::test_queues_move_only_after_their_owner_released_them",
                f"{RELIABILITY_HANDOVER}::test_operator_killed_between_revoke_and_assign[default]",
            ),
        ),
        Mutant(
            "override-at-once",
            override_at_once,
            "an override before the release timeout",
            (
                f"{HANDOVER}::test_queues_move_only_after_their_owner_released_them",
                f"{RELIABILITY_HANDOVER}::test_operator_killed_between_revoke_and_assign[default]",
            ),
        ),
        Mutant(
            "queue-to-two-members",
            queue_to_two_members,
            "a queue given to two members",
            # test_operator_killed_between_revoke_and_assign fails too, but only when its wait for
            # every queue to have one owner times out (6.5 min under load): left out for time.
            (
                f"{LIFECYCLE}::test_membership_zone_and_topic_changes",
                f"{HANDOVER}::test_queues_move_only_after_their_owner_released_them",
            ),
        ),
        Mutant(
            "departed-member-kept",
            departed_member_kept,
            "a departed member kept",
            (
                f"{LIFECYCLE}::test_membership_zone_and_topic_changes",
                f"{LIFECYCLE}::test_no_members_publishes_an_empty_assignment",
            ),
        ),
    )
}
