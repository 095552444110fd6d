"""Invariants every published assignment must keep, checked in every integration test.

In CLUSTERING no queue has two owners, and while the group has a member every
readable queue has an owner, except under strategies that leave queues out by
design (CONFIG assigns only what is configured, MACHINE_ROOM only the listed idcs),
and except queues in a handover (revoked, held by nobody until released), which no
member may hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from mqbalance.contract import AssignmentDocument
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageModel, MessageQueue

if TYPE_CHECKING:
    from harness.e2e import Score

MAY_LEAVE_QUEUES_OUT = ("CONFIG", "MACHINE_ROOM")


def assignment_problems(
    strategy: str,
    message_model: str,
    members: Mapping[str, str],
    topics: Mapping[str, Mapping[str, Sequence[MessageQueue]]],
    readable: Mapping[str, Sequence[MessageQueue]] | None = None,
    releasing: Iterable[MessageQueue] = (),
) -> list[str]:
    problems = []
    revoked = set(releasing)
    for topic, assignment in topics.items():
        strangers = set(assignment) - set(members)
        if strangers:
            problems.append(f"{topic}: queues given to non-members {sorted(strangers)}")
        if message_model != MessageModel.CLUSTERING:
            continue
        owner: dict[MessageQueue, str] = {}
        for member, queues in assignment.items():
            for mq in queues:
                if mq in owner:
                    problems.append(f"{topic}: {mq} assigned to both {owner[mq]} and {member}")
                if mq in revoked:
                    problems.append(f"{topic}: {mq} is revoked and yet held by {member}")
                owner[mq] = member
        if readable is not None and members and strategy not in MAY_LEAVE_QUEUES_OUT:
            missing = [mq for mq in readable.get(topic, ()) if mq not in owner and mq not in revoked]
            if missing:
                problems.append(f"{topic}: {len(missing)} readable queues unassigned, e.g. {missing[0]}")
    return problems


def check_document(doc: AssignmentDocument, readable: Mapping[str, Sequence[MessageQueue]]) -> None:
    """Both halves of the invariant: no queue with two owners or a non-member, and (``readable``:
    topic -> every readable queue) every readable queue owned while the group has a member."""
    revoked = [mq for r in doc.releasing for mq in r.queues]
    problems = assignment_problems(
        doc.strategy, doc.message_model, doc.members, doc.topics, readable, revoked
    )
    assert not problems, f"generation {doc.generation} of {doc.group}: {problems}"


def check_journal(records: Iterable[JournalRecord]) -> int:
    """Check every journalled generation (each carries its readable queues); returns how many were checked."""
    checked = 0
    for r in records:
        revoked = [mq for release in r.releasing for mq in release.queues]
        problems = assignment_problems(
            r.strategy.name.value, r.message_model, r.members, r.assignment, r.queues, revoked
        )
        assert not problems, f"{r.namespace}/{r.group} generation {r.generation}: {problems}"
        checked += 1
    return checked


def consumer_problems(score: Score) -> list[str]:
    """What is wrong with who consumed what in an end-to-end run (``harness.e2e``): a queue the
    producer wrote to that nobody consumed; with mqbalance, a queue consumed by a member no
    generation named its owner. (Whether a queue's last owner consumed it depends on how soon
    that member started before production stopped, so it is no invariant.)"""
    problems = []
    if not score.produced_queues:
        problems.append(f"{score.variant}: nothing produced")
    for queue in sorted(score.produced_queues - set(score.consumers)):
        problems.append(f"{score.variant}: nobody consumed {queue}")
    if score.owners is None:
        return problems  # RocketMQ's own rebalance: no published assignment to compare with
    for queue in sorted(score.produced_queues & set(score.consumers)):
        consumers = score.consumers[queue]
        strangers = consumers - score.owners.get(queue, frozenset())
        if strangers:
            problems.append(f"{score.variant}: {queue} consumed by {sorted(strangers)}, never its owners")
    return problems
