"""The handover: revoke, release, then assign. Properties over random histories of memberships,
acknowledgements, deaths and clocks: no published document ever gives a queue to two members,
a queue that does not move never stops, a moving queue waits for its old owner's release (or
its death, or the timeout), and every queue is eventually owned."""

from __future__ import annotations

import random
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.contract import Ack, AssignmentDocument, HandoverMode, HandoverSpec, Release
from mqbalance.model import MessageModel, MessageQueue, StrategyName, StrategySpec
from mqbalance.operator.handover import Step, step, with_releasing
from mqbalance.strategies import allocate

QUEUES = [MessageQueue("t", "b", i) for i in range(8)]
PODS = ["p1", "p2", "p3", "p4"]
STICKY = StrategySpec(StrategyName.STICKY)


def document(
    generation: int,
    topics: Mapping[str, Mapping[str, tuple[MessageQueue, ...]]],
    releasing: tuple[Release, ...],
    mode: HandoverMode,
) -> AssignmentDocument:
    members = {m: "z" for a in topics.values() for m in a}
    return AssignmentDocument(
        "g", generation, "STICKY", MessageModel.CLUSTERING, 0.0, "", members, topics, {}, mode, releasing
    )


def owners(topics: Mapping[str, Mapping[str, tuple[MessageQueue, ...]]]) -> dict[MessageQueue, list[str]]:
    out: dict[MessageQueue, list[str]] = {}
    for assignment in topics.values():
        for member, queues in assignment.items():
            for mq in queues:
                out.setdefault(mq, []).append(member)
    return out


def check_exactly_once(doc: AssignmentDocument, queues: list[MessageQueue]) -> None:
    held = owners(doc.topics)
    assert all(len(h) == 1 for h in held.values()), f"a queue with two owners: {held}"
    revoked = [mq for r in doc.releasing for mq in r.queues]
    assert len(revoked) == len(set(revoked)), "a queue revoked twice"
    assert not set(revoked) & set(held), "a revoked queue is also held"
    assert set(held) | set(revoked) == set(queues), "a queue was lost"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(list(HandoverMode)))
def test_a_random_history_never_gives_a_queue_to_two_owners(seed: int, mode: HandoverMode) -> None:
    simulate(seed, mode)


def simulate(seed: int, mode: HandoverMode) -> None:
    """Thirty reconciles of a group whose pods join, die, start terminating, shut their
    application down (saying "all", possibly of the generation before the one just published)
    and release promptly or slowly, checking every published document and what the
    applications consume."""
    rng = random.Random(seed)
    spec = HandoverSpec(mode, release_timeout=10.0, broker_lock=25.0)
    alive = set(rng.sample(PODS, 2))
    members = sorted(alive)
    consuming: dict[str, set[MessageQueue]] = {p: set() for p in PODS}  # what each application consumes
    cut: set[tuple[MessageQueue, str]] = set()  # (queue, pod) whose release an override cut short
    shut: set[str] = set()  # pods whose application shut down: they take nothing any more
    doc: AssignmentDocument | None = None
    acks: dict[str, Ack] = {}
    now = 1000.0
    for _ in range(30):
        event = rng.random()
        if event < 0.2 and len(alive) < len(PODS):  # a pod joins
            alive.add(rng.choice([p for p in PODS if p not in alive]))
        elif event < 0.35 and len(alive) > 1:  # a pod dies: it consumes nothing any more
            dead = rng.choice(sorted(alive))
            alive.discard(dead)
            consuming[dead] = set()
            acks.pop(dead, None)
            shut.discard(dead)
        elif event < 0.45 and len(members) > 1:  # a pod starts terminating: no member, still running
            members.remove(rng.choice(members))
        elif event < 0.55 and len(alive - shut) > 1 and doc is not None:
            # An application shuts down: it stops everything, commits, and says "all" of the last
            # generation it saw, which may be the one before the document just published.
            pod = rng.choice(sorted(alive - shut))
            shut.add(pod)
            consuming[pod] = set()
            seen = doc.generation - 1 if rng.random() < 0.5 and doc.generation > 1 else doc.generation
            acks[pod] = Ack(seen, all=True)
        now += rng.choice([0.5, 3.0, 12.0, 30.0])
        ready = sorted(alive - shut)  # a pod whose application is down is not Ready
        members = sorted(
            set(members) & set(ready) | ({rng.choice(ready)} if ready and rng.random() < 0.5 else set())
        )
        members = members or [ready[0] if ready else sorted(alive)[0]]
        previous = with_releasing(doc) if doc else None
        target = {"t": allocate(STICKY, QUEUES, members, previous=previous["t"] if previous else None)}
        generation = (doc.generation if doc else 0) + 1
        result = step(
            doc, target, spec=spec, acks=acks, alive=frozenset(alive), generation=generation, now=now
        )
        new = document(generation, result.topics, result.releasing, mode)
        check_exactly_once(new, QUEUES)
        held_before = owners(doc.topics) if doc else {}
        pending = {mq: r for r in (doc.releasing if doc else ()) for mq in r.queues}
        for mq, (owner,) in owners(new.topics).items():
            before = held_before.get(mq, [None])[0]
            release = pending.get(mq)
            if mode is HandoverMode.OFF:
                continue
            if before is not None and before != owner:
                # Moved in one step: only when nobody is left to wait for.
                assert before not in alive or (acks[before].all and before not in members), (
                    mq,
                    before,
                    owner,
                )
            if release is not None and release.owner != owner:
                ack = acks.get(release.owner)
                covered = release.generation - 1 if ack is not None and ack.all else release.generation
                released = ack is not None and ack.generation >= covered
                if not released and release.owner in alive:
                    assert now >= spec.override_at(release.since), (mq, release, owner, now)
                    cut.add((mq, release.owner))
            # No two applications consume a queue at once, unless an override cut a release short.
            for other, queues in consuming.items():
                if other != owner and mq in queues:
                    assert (mq, other) in cut, (mq, other, owner)
        # The applications follow: each stops what it lost, commits, acknowledges, takes what it got.
        for pod in sorted(alive - shut):
            share = set(new.queues_of(pod)["t"]) if pod in new.members else set()
            if rng.random() < 0.7:  # a prompt application
                consuming[pod] = share
                acks[pod] = Ack(generation, all=pod not in members and rng.random() < 0.5)
            else:  # a slow one keeps what it had and takes what it got
                consuming[pod] |= share
        doc = new


def test_two_steps_revoke_then_assign_after_the_release() -> None:
    spec = HandoverSpec(HandoverMode.RELEASE, release_timeout=30.0)
    q = QUEUES[:4]
    doc = document(1, {"t": {"a": tuple(q[:2]), "b": tuple(q[2:])}}, (), HandoverMode.RELEASE)
    target = {"t": {"a": (q[0],), "b": (q[2], q[3]), "c": (q[1],)}}  # q1 moves a -> c
    first = step(doc, target, spec=spec, acks={}, alive=frozenset("abc"), generation=2, now=100.0)
    assert first.topics == {"t": {"a": (q[0],), "b": (q[2], q[3]), "c": ()}}
    assert first.releasing == (Release("a", 2, 100.0, (q[1],)),)
    assert (first.revoked, first.waiting_for, first.wake_at) == (1, ("a",), 130.0)
    revoked = document(2, first.topics, first.releasing, HandoverMode.RELEASE)
    # Not yet released: nothing changes (and nothing else stops).
    waiting = step(
        revoked, target, spec=spec, acks={"a": Ack(1)}, alive=frozenset("abc"), generation=3, now=110.0
    )
    assert (waiting.topics, waiting.releasing) == (first.topics, first.releasing)
    done = step(
        revoked, target, spec=spec, acks={"a": Ack(2)}, alive=frozenset("abc"), generation=3, now=111.0
    )
    assert done.topics == {"t": target["t"]}
    assert (done.releasing, done.released, done.waited) == ((), 1, (11.0,))


def test_withdrawn_queues_are_revoked_and_given_nobody_once_released() -> None:
    spec = HandoverSpec(HandoverMode.RELEASE, release_timeout=30.0)
    q = QUEUES[:4]
    doc = document(1, {"t": {"a": tuple(q[:2]), "b": tuple(q[2:])}}, (), HandoverMode.RELEASE)
    nothing = {"t": {"a": (), "b": ()}}  # a paused group: the target gives nobody anything
    alive = frozenset("ab")
    first = step(doc, nothing, spec=spec, acks={}, alive=alive, generation=2, now=100.0, withdrawn=q)
    assert first.topics == nothing
    assert first.releasing == (Release("a", 2, 100.0, tuple(q[:2])), Release("b", 2, 100.0, tuple(q[2:])))
    revoked = document(2, first.topics, first.releasing, HandoverMode.RELEASE)
    # a released, b not yet: a's queues go to nobody, b's stay revoked from b.
    half = step(
        revoked, nothing, spec=spec, acks={"a": Ack(2)}, alive=alive, generation=3, now=104.0, withdrawn=q
    )
    assert half.topics == nothing
    assert (half.releasing, half.released, half.waited) == ((first.releasing[1],), 2, (4.0,))
    # Without ``withdrawn`` a queue the target leaves out is simply dropped, revoked from nobody.
    dropped = step(doc, nothing, spec=spec, acks={}, alive=alive, generation=2, now=100.0)
    assert (dropped.topics, dropped.releasing) == (nothing, ())


def test_an_owner_that_never_releases_is_overridden_at_the_timeout() -> None:
    q = QUEUES[0]
    revoked = document(2, {"t": {"a": (), "c": ()}}, (Release("a", 2, 100.0, (q,)),), HandoverMode.RELEASE)
    target = {"t": {"a": (), "c": (q,)}}
    for mode, at, expected in (
        (HandoverMode.RELEASE, 129.9, ()),
        (HandoverMode.RELEASE, 130.0, (q,)),
        (HandoverMode.ORDERLY, 130.0, ()),  # the broker lock may still be held
        (HandoverMode.ORDERLY, 160.0, (q,)),
    ):
        result: Step = step(
            revoked,
            target,
            spec=HandoverSpec(mode, release_timeout=30.0, broker_lock=60.0),
            acks={},
            alive=frozenset("ac"),
            generation=3,
            now=at,
        )
        assert result.topics["t"]["c"] == expected, (mode, at)
        assert result.overridden == len(expected)


def test_gone_owners_and_a_shutting_down_application_need_no_wait() -> None:
    q = QUEUES[:2]
    doc = document(1, {"t": {"a": (q[0],), "b": (q[1],)}}, (), HandoverMode.ORDERLY)
    target = {"t": {"c": tuple(q)}}
    spec = HandoverSpec(HandoverMode.ORDERLY)
    # a's pod is gone; b said "all" (it is shutting down): both queues go to c at once.
    result = step(
        doc, target, spec=spec, acks={"b": Ack(1, all=True)}, alive=frozenset("bc"), generation=2, now=5.0
    )
    assert result.topics == {"t": {"c": tuple(q)}}
    assert result.releasing == ()


def test_a_queue_given_back_to_its_releasing_owner_is_simply_kept() -> None:
    q = QUEUES[0]
    revoked = document(2, {"t": {"a": (), "c": ()}}, (Release("a", 2, 100.0, (q,)),), HandoverMode.RELEASE)
    result = step(
        revoked,
        {"t": {"a": (q,), "c": ()}},
        spec=HandoverSpec(HandoverMode.RELEASE),
        acks={},
        alive=frozenset("ac"),
        generation=3,
        now=101.0,
    )
    assert result.topics["t"]["a"] == (q,)
    assert (result.releasing, result.overridden, result.released) == ((), 0, 0)


def test_an_all_acknowledged_just_before_the_revocation_covers_it() -> None:
    # a's application shut down and said "all" of generation 1, the last it had seen, while the
    # operator published generation 2 revoking a's queue (its pod terminating): it holds nothing,
    # so the queue goes on at once rather than at the timeout.
    q = QUEUES[0]
    spec = HandoverSpec(HandoverMode.RELEASE, release_timeout=30.0)
    revoked = document(2, {"t": {"c": ()}}, (Release("a", 2, 100.0, (q,)),), HandoverMode.RELEASE)
    target = {"t": {"c": (q,)}}
    acks = {"a": Ack(1, all=True)}
    result = step(revoked, target, spec=spec, acks=acks, alive=frozenset("ac"), generation=3, now=101.0)
    assert result.topics["t"]["c"] == (q,)
    assert (result.released, result.overridden, result.releasing) == (1, 0, ())
    # An "all" older than the share the revocation took (a may have been given q after it) does not.
    later = document(3, {"t": {"c": ()}}, (Release("a", 3, 100.0, (q,)),), HandoverMode.RELEASE)
    result = step(later, target, spec=spec, acks=acks, alive=frozenset("ac"), generation=4, now=101.0)
    assert result.topics["t"]["c"] == ()
    assert result.releasing == (Release("a", 3, 100.0, (q,)),)
