"""Time-bounded ownership in the operator: spec.handover's lease fields, the override that never
comes before the grants have expired, and departed owners (pod object gone) that are not gone at
once. Pure functions, so the clock is a number."""

from __future__ import annotations

from typing import Any

import pytest

from mqbalance.contract import (
    Ack,
    AssignmentDocument,
    HandoverMode,
    HandoverSpec,
    LeaseTerms,
    Release,
    SpecError,
    read_handover,
)
from mqbalance.model import MessageModel, MessageQueue
from mqbalance.operator.handover import Alive, step

Q = [MessageQueue("t", "b", i) for i in range(4)]


def doc(
    generation: int, topics: dict[str, tuple[MessageQueue, ...]], *releasing: Release
) -> AssignmentDocument:
    members = {m: "z" for m in topics}
    return AssignmentDocument(
        "g", generation, "STICKY", MessageModel.CLUSTERING, 0.0, "", members, {"t": topics}, {},
        HandoverMode.RELEASE, releasing,
    )  # fmt: skip


# -- spec ------------------------------------------------------------------------------------------


def test_defaults_fill_in_lease_renew_and_margin() -> None:
    spec = read_handover({"mode": "Release"}, MessageModel.CLUSTERING)
    assert (spec.lease, spec.renew, spec.lease_margin) == (20.0, 5.0, 5.0)
    spec = read_handover(
        {"mode": "Orderly", "leaseSeconds": 4, "renewSeconds": 1, "leaseMarginSeconds": 0.5},
        MessageModel.CLUSTERING,
    )
    assert (spec.lease, spec.renew, spec.lease_margin) == (4.0, 1.0, 0.5)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"leaseSeconds": 9, "renewSeconds": 5}, "leaseSeconds (9) must be at least 2 x renewSeconds (5)"),
        ({"leaseSeconds": 5, "renewSeconds": 5}, "raise leaseSeconds to 10 or more, or lower renewSeconds"),
        ({"leaseSeconds": 4}, "at least 2 x renewSeconds"),  # with the default renewSeconds, 5
        ({"leaseMarginSeconds": 0}, "leaseMarginSeconds is 0; use a number of seconds more than 0"),
        ({"leaseMarginSeconds": -1}, "leaseMarginSeconds is -1"),
        ({"leaseMarginSeconds": "5"}, "leaseMarginSeconds is '5'"),
        ({"leaseSeconds": 0}, "leaseSeconds is 0; use a number of seconds from 1 to 3600"),
        ({"renewSeconds": 0.1}, "renewSeconds is 0.1; use a number of seconds from 1 to 1800"),
        ({"renewSeconds": True}, "renewSeconds is True"),
    ],
)
def test_bad_lease_fields_are_refused_saying_what_to_fix(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError, match=says.replace("(", r"\(").replace(")", r"\)")):
        read_handover({"mode": "Release", **fields}, MessageModel.CLUSTERING)


def test_a_bad_lease_makes_the_group_invalid_with_reason_invalid_spec() -> None:
    from mqbalance.operator.reconcile import Observed, reconcile

    spec = {
        "topics": ["t"],
        "selector": {"matchLabels": {"app": "x"}},
        "handover": {"mode": "Release", "leaseSeconds": 3, "renewSeconds": 2},
    }
    outcome = reconcile(Observed("ns", "g", spec, {}, [], {}, None, now=1.0))
    (invalid,) = [c for c in outcome.status["conditions"] if c["type"] == "Invalid"]
    assert (invalid["status"], invalid["reason"]) == ("True", "InvalidSpec")
    assert "leaseSeconds (3) must be at least 2 x renewSeconds (2)" in invalid["message"]


# -- override timing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "timeout", "lock", "expected"),
    [
        (HandoverMode.RELEASE, 30.0, 60.0, 130.0),  # the timeout is longer than lease + margin
        (HandoverMode.RELEASE, 2.0, 60.0, 125.0),  # a short timeout waits for the grants: 20 + 5
        (HandoverMode.ORDERLY, 2.0, 60.0, 160.0),  # and Orderly for the broker lock
        (HandoverMode.ORDERLY, 2.0, 0.0, 125.0),
    ],
)
def test_an_unacknowledged_revocation_is_overridden_no_sooner_than_lease_plus_margin(
    mode: HandoverMode, timeout: float, lock: float, expected: float
) -> None:
    spec = HandoverSpec(mode, release_timeout=timeout, broker_lock=lock)
    assert spec.override_at(100.0) == expected
    revoked = doc(2, {"a": (), "c": ()}, Release("a", 2, 100.0, (Q[0],)))
    target = {"t": {"a": (), "c": (Q[0],)}}
    before = step(
        revoked, target, spec=spec, acks={}, alive=frozenset("ac"), generation=3, now=expected - 0.01
    )
    assert before.topics["t"]["c"] == ()
    assert (before.overridden, before.wake_at) == (0, expected)
    at = step(revoked, target, spec=spec, acks={}, alive=frozenset("ac"), generation=3, now=expected)
    assert at.topics["t"]["c"] == (Q[0],)
    assert (at.overridden, at.overridden_owners) == (1, ("a",))


def test_an_acknowledgement_still_hands_on_at_once() -> None:
    spec = HandoverSpec(HandoverMode.RELEASE, release_timeout=2.0)
    revoked = doc(2, {"a": (), "c": ()}, Release("a", 2, 100.0, (Q[0],)))
    result = step(
        revoked, {"t": {"a": (), "c": (Q[0],)}}, spec=spec, acks={"a": Ack(2)}, alive=frozenset("ac"),
        generation=3, now=100.5,
    )  # fmt: skip
    assert (result.topics["t"]["c"], result.released) == ((Q[0],), 1)


def test_off_keeps_overriding_at_once() -> None:
    spec = HandoverSpec(HandoverMode.OFF, release_timeout=2.0)
    assert spec.expired_at(100.0) == 100.0
    # A handover switched Off while a revocation waits: the queue goes on at once, departed or not.
    revoked = doc(2, {"c": ()}, Release("a", 2, 100.0, (Q[0],)))
    for alive in (frozenset("ac"), Alive("c", departed="a")):
        result = step(
            revoked, {"t": {"c": (Q[0],)}}, spec=spec, acks={}, alive=alive, generation=3, now=100.1
        )
        assert result.topics["t"]["c"] == (Q[0],)
        assert result.releasing == ()


# -- departed owners -------------------------------------------------------------------------------


def test_a_departed_owner_is_revoked_and_handed_on_after_lease_plus_margin() -> None:
    spec = HandoverSpec(HandoverMode.RELEASE, release_timeout=600.0, lease=4.0, renew=1.0, lease_margin=1.0)
    published = doc(1, {"a": (Q[0], Q[1]), "c": (Q[2], Q[3])})
    target = {"t": {"c": tuple(Q)}}
    alive = Alive("c", departed="a")  # a's pod object is gone: force-deleted, say
    first = step(published, target, spec=spec, acks={}, alive=alive, generation=2, now=100.0)
    assert first.topics == {"t": {"c": (Q[2], Q[3])}}, "a departed owner's queues are not handed on at once"
    assert first.releasing == (Release("a", 2, 100.0, (Q[0], Q[1])),)
    assert first.wake_at == 105.0, "at lease + margin, not at the release timeout"
    revoked = doc(2, first.topics["t"], *first.releasing)
    waiting = step(revoked, target, spec=spec, acks={}, alive=alive, generation=3, now=104.99)
    assert (waiting.topics, waiting.releasing, waiting.gone) == (first.topics, first.releasing, 0)
    done = step(revoked, target, spec=spec, acks={}, alive=alive, generation=3, now=105.0)
    assert done.topics == {"t": {"c": tuple(Q)}}
    assert (done.gone, done.overridden, done.releasing, done.waited) == (2, 0, (), (5.0,))
    # Its acknowledgement (sent before it went) hands on at once.
    acked = step(revoked, target, spec=spec, acks={"a": Ack(2)}, alive=alive, generation=3, now=100.1)
    assert (acked.topics, acked.released) == ({"t": {"c": tuple(Q)}}, 2)


def test_a_finished_pod_is_gone_at_once_and_a_running_unready_one_waits_for_the_override() -> None:
    spec = HandoverSpec(HandoverMode.RELEASE, release_timeout=30.0)
    published = doc(1, {"a": (Q[0],), "b": (Q[1],), "c": (Q[2], Q[3])})
    target = {"t": {"c": tuple(Q)}}
    # a finished (not alive, not departed); b exists but is NotReady or terminating (alive).
    alive = Alive("bc", departed=())
    first = step(published, target, spec=spec, acks={}, alive=alive, generation=2, now=100.0)
    assert first.topics == {"t": {"c": (Q[0], Q[2], Q[3])}}
    assert first.releasing == (Release("b", 2, 100.0, (Q[1],)),)
    assert first.wake_at == 130.0
    revoked = doc(2, first.topics["t"], *first.releasing)
    # b's pod object disappears meanwhile: it departed, and its queue waits out lease + margin only.
    gone = Alive("c", departed="b")
    early = step(revoked, target, spec=spec, acks={}, alive=gone, generation=3, now=124.9)
    assert early.topics["t"]["c"] == (Q[0], Q[2], Q[3])
    assert early.wake_at == 125.0
    late = step(revoked, target, spec=spec, acks={}, alive=gone, generation=3, now=125.0)
    assert (late.topics["t"]["c"], late.gone) == (tuple(Q), 1)


def test_alive_is_a_set_that_keeps_its_departed_apart() -> None:
    import pickle

    alive = Alive(["a", "b"], departed=["b", "c"])
    assert alive == frozenset("ab")
    assert alive.departed == frozenset("c"), "an owner whose pod exists has not departed"
    again = pickle.loads(pickle.dumps(alive))
    assert (again, again.departed) == (alive, alive.departed)


# -- the published document ------------------------------------------------------------------------


def test_the_document_carries_the_lease_terms_and_reads_without_them() -> None:
    base = doc(1, {"a": (Q[0],)})
    leased = AssignmentDocument(**{**base.__dict__, "lease": LeaseTerms(20.0, 5.0)})
    data = leased.to_json()
    assert data["lease"] == {"seconds": 20.0, "renewSeconds": 5.0}
    assert AssignmentDocument.decode(leased.encode()) == leased
    assert "lease" not in base.to_json()
    assert AssignmentDocument.decode(base.encode()).lease is None
    assert not leased.same_assignment(base), "new lease terms must reach the sidecars"
