"""The operator reads the member Leases (time-bounded ownership): a member whose Lease stopped
changing for leaseSeconds serves nothing and is revoked; a departed member (pod object gone)
whose Lease still changes is held, and handed on once it has been silent for leaseSeconds +
leaseMarginSeconds; Off mode ignores the Leases. Pure: the monotonic clock is a number, and
the wall clock (``now``) is another that never meets it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mqbalance.contract import (
    Ack,
    AssignmentDocument,
    HandoverMode,
    HandoverSpec,
    LeaseTerms,
    Release,
    member_lease_name,
)
from mqbalance.model import MessageModel, MessageQueue
from mqbalance.operator.handover import Alive, step
from mqbalance.operator.leases import LeaseTable, MemberLeases, lease_record
from mqbalance.operator.membership import LEASE_LAPSED, PodInfo
from mqbalance.operator.reconcile import Observed, Outcome, reconcile

Q = [MessageQueue("T", "b1", i) for i in range(4)]
LEASE, RENEW, MARGIN = 4.0, 1.0, 2.0
WALL = 1_800_000_000.0
"""The wall clock of the reconciles: unrelated to the monotonic one (hours apart on purpose)."""
TOPIC = {"topicName": "T", "brokers": [{"name": "b1", "zone": "z1", "readQueueNums": 4, "writeQueueNums": 4}]}


# -- the rule on its own ---------------------------------------------------------------------------


def test_a_lease_lapses_after_lease_seconds_without_a_change_seen() -> None:
    leases = MemberLeases.of_pods(now=110.0, since=50.0, changed={"renewing": 109.0, "silent": 106.0})
    assert not leases.lapsed("renewing", LEASE)
    assert leases.lapsed("silent", LEASE), "4 s without a change seen"
    assert not MemberLeases.of_pods(105.99, 50.0, {"silent": 102.0}).lapsed("silent", LEASE)
    # A member whose Lease was never seen is judged by its pod: a sidecar creates its Lease at its
    # first renewal, and one fed from files renews none.
    assert not leases.seen("new")
    assert not leases.lapsed("new", LEASE)
    # Silence counts from ``since`` at most (the group became leased, or the operator started then).
    late = MemberLeases.of_pods(now=110.0, since=108.0, changed={"silent": 10.0})
    assert late.quiet_for("silent") == 2.0
    assert not late.lapsed("silent", LEASE)
    assert late.quiet_for("never-seen") == 2.0


def test_the_table_counts_renewals_and_deletions_as_changes_and_nothing_else() -> None:
    table = LeaseTable()
    name = member_lease_name("a")

    def body(renew: str, **labels: str) -> dict[str, Any]:
        meta = {"name": name, "namespace": "ns", "uid": "u1", "labels": labels, "resourceVersion": renew}
        return {
            "metadata": meta,
            "spec": {"holderIdentity": "a", "renewTime": renew, "leaseDurationSeconds": 4},
        }

    assert table.seen("ns", name, lease_record(body("t1")), now=10.0) == "a"
    assert table.view("ns", 0.0, 20.0).quiet_from("a") == 10.0
    # A write that renews nothing (a label, say) is no renewal.
    assert table.seen("ns", name, lease_record(body("t1", x="y")), now=12.0) is None
    assert table.view("ns", 0.0, 20.0).quiet_from("a") == 10.0
    assert table.seen("ns", name, lease_record(body("t2")), now=13.0) == "a"
    table.deleted("ns", name, now=15.0)  # the garbage collector after a force delete, say
    view = table.view("ns", 0.0, 20.0)
    assert view.seen("a")
    assert view.quiet_from("a") == 15.0
    assert table.seen("ns", name, lease_record(body("t2")), now=16.0) == "a", "created again: a change"
    assert len(table) == 1
    table.forget("ns")
    assert not table.view("ns", 0.0, 20.0).seen("a")


# -- a member that stops renewing (its pod still Ready) -------------------------------------------


def pod(name: str) -> PodInfo:
    return PodInfo(name, {"app": "a"}, "n1", running=True, ready=True)


def observe(
    mode: str,
    previous: AssignmentDocument | None,
    leases: MemberLeases | None,
    *,
    pods: tuple[str, ...] = ("a", "b"),
    acks: dict[str, Ack] | None = None,
    now: float = WALL,
    alive: frozenset[str] | None = None,
) -> Observed:
    handover = {"mode": mode, "releaseTimeoutSeconds": 1, "leaseSeconds": LEASE, "renewSeconds": RENEW}
    handover["leaseMarginSeconds"] = MARGIN
    spec = {
        "topics": ["t"],
        "selector": {"matchLabels": {"app": "a"}},
        "strategy": {"name": "STICKY"},
        "handover": handover,
    }
    return Observed(
        namespace="ns",
        name="g",
        spec=spec,
        topics={"t": TOPIC},
        pods=[pod(p) for p in pods],
        node_labels={"n1": {"topology.kubernetes.io/zone": "z1"}},
        previous=previous,
        now=now,
        generation=1,
        acks=acks or {},
        alive=alive if alive is not None else frozenset(pods),
        leases=leases,
    )


def settled(mode: str = "Release") -> AssignmentDocument:
    """The two members holding two queues each, nothing under way."""
    out = reconcile(observe(mode, None, None))
    assert out.document is not None
    assert {m: len(qs) for m, qs in out.document.topics["T"].items()} == {"a": 2, "b": 2}
    return out.document


def test_a_member_whose_lease_lapsed_is_revoked_and_its_queues_wait_for_the_floor() -> None:
    published = settled()
    held = published.topics["T"]["a"]
    renewing = MemberLeases.of_pods(now=1003.0, since=900.0, changed={"a": 1000.0, "b": 1002.5})
    same = reconcile(observe("Release", published, renewing))
    assert same.document is None, "both renew: nothing changes"
    assert same.lease_wake_at == 1004.0, "look again when a's Lease would lapse"

    lapsed = MemberLeases.of_pods(now=1004.0, since=900.0, changed={"a": 1000.0, "b": 1003.5})
    out = reconcile(observe("Release", published, lapsed))
    assert out.document is not None
    assert set(out.document.members) == {"b"}, "a serves nothing: no member any more"
    assert out.document.releasing == (Release("a", out.document.generation, WALL, held),)
    assert out.document.topics["T"]["b"] == published.topics["T"]["b"], "nothing handed on yet"
    assert out.interest.lapsed == ("a",)
    assert {k: v for k, v in out.status["notServingPods"][0].items() if k != "message"} == {
        "name": "a",
        "reason": LEASE_LAPSED,
    }
    # Its pod stays Ready and a never acknowledges: the override waits lease + margin from the
    # revocation (the floor), whatever releaseTimeoutSeconds (1) says.
    assert out.wake_at == WALL + LEASE + MARGIN
    later = MemberLeases.of_pods(now=1009.0, since=900.0, changed={"a": 1000.0, "b": 1008.5})
    early = reconcile(observe("Release", out.document, later, now=WALL + LEASE + MARGIN - 0.01))
    assert early.document is None or not set(held) & set(early.document.topics["T"]["b"])
    moved = reconcile(observe("Release", out.document, later, now=WALL + LEASE + MARGIN))
    assert moved.document is not None
    assert set(moved.document.topics["T"]["b"]) == set(Q)
    # a renews again: it is a member again at the next reconcile.
    back = MemberLeases.of_pods(now=1010.0, since=900.0, changed={"a": 1009.9, "b": 1009.5})
    rejoined = reconcile(observe("Release", moved.document, back, now=WALL + 10))
    assert rejoined.document is not None
    assert set(rejoined.document.members) == {"a", "b"}
    assert rejoined.interest.lapsed == ()


def test_a_member_never_seen_renewing_is_judged_by_its_pod() -> None:
    published = settled()
    nothing = MemberLeases.of_pods(now=5000.0, since=900.0, changed={})
    assert reconcile(observe("Release", published, nothing)).document is None


@pytest.mark.parametrize("mode", ["Off", "Release"])
def test_off_ignores_the_leases_and_unwatched_leases_change_nothing(mode: str) -> None:
    published = settled(mode)
    lapsed = MemberLeases.of_pods(now=1004.0, since=900.0, changed={"a": 1.0, "b": 2.0})
    with_leases = reconcile(observe(mode, published, lapsed if mode == "Off" else None))
    without = reconcile(observe(mode, published, None))
    assert with_leases == without
    assert with_leases.document is None
    assert with_leases.lease_wake_at is None


def test_off_is_unchanged_when_a_member_leaves() -> None:
    published = settled("Off")
    lapsed = MemberLeases.of_pods(now=1004.0, since=900.0, changed={"a": 1.0, "b": 2.0})
    one = observe("Off", published, lapsed, pods=("b",))
    out = reconcile(one)
    assert out == reconcile(replace(one, leases=None))
    assert out.document is not None
    assert set(out.document.topics["T"]["b"]) == set(Q), "Off hands on at once"


# -- a departed member (pod object gone) --------------------------------------------------------------


SPEC = HandoverSpec(HandoverMode.RELEASE, release_timeout=1.0, lease=LEASE, renew=RENEW, lease_margin=MARGIN)


def revoked_from_departed() -> tuple[AssignmentDocument, dict[str, dict[str, tuple[MessageQueue, ...]]]]:
    releasing = Release("a", 2, 100.0, (Q[0], Q[1]))
    document = AssignmentDocument(
        "g", 2, "STICKY", MessageModel.CLUSTERING, 100.0, "", {"c": "z"}, {"t": {"c": (Q[2], Q[3])}}, {},
        HandoverMode.RELEASE, (releasing,), LeaseTerms(LEASE, RENEW),
    )  # fmt: skip
    return document, {"t": {"c": tuple(Q)}}


def test_a_departed_member_that_still_renews_is_not_handed_on() -> None:
    document, target = revoked_from_departed()
    alive = Alive("c", departed="a")
    late = 100.0 + 60.0  # far past the floor on the wall clock
    renewing = MemberLeases.of_pods(now=5060.0, since=4000.0, changed={"a": 5059.5})
    held = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=late, leases=renewing)
    assert held.topics == {"t": {"c": (Q[2], Q[3])}}, "its sidecar still renews: it still serves"
    assert held.releasing == document.releasing
    assert held.lease_wake_at == 5059.5 + LEASE + MARGIN
    assert held.wake_at is None, "past the floor: no wake-up on the wall clock (it would come at once)"
    # Its renewals stop: handed on once silent for lease + margin on our clock, not sooner.
    almost = replace(renewing, now=5059.5 + LEASE + MARGIN - 0.01)
    waiting = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=late, leases=almost)
    assert waiting.topics == held.topics
    assert waiting.gone == 0
    silent = replace(renewing, now=5059.5 + LEASE + MARGIN)
    done = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=late, leases=silent)
    assert (done.topics, done.gone, done.releasing) == ({"t": {"c": tuple(Q)}}, 2, ())
    # Its acknowledgement still hands on at once.
    acked = step(
        document, target, spec=SPEC, acks={"a": Ack(2)}, alive=alive, generation=3, now=100.1, leases=renewing
    )
    assert acked.released == 2
    assert acked.topics == {"t": {"c": tuple(Q)}}


def test_a_departed_member_without_a_lease_waits_the_floor_and_a_deleted_one_its_silence() -> None:
    document, target = revoked_from_departed()
    alive = Alive("c", departed="a")
    # Never seen (no Lease, or none since we watch): silent since ``since``; the wall floor still holds.
    never = MemberLeases.of_pods(now=5000.0, since=4000.0, changed={})
    floor = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=105.99, leases=never)
    assert floor.gone == 0
    assert floor.wake_at == 106.0
    assert floor.lease_wake_at is None, "silent long enough already: only the floor is waited for"
    gone = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=106.0, leases=never)
    assert gone.gone == 2
    # Seen deleted a moment ago (the garbage collector removes a deleted pod's Lease; a sidecar that
    # still runs creates it again at its next renewal): silent only since then.
    table = LeaseTable()
    table.deleted("ns", member_lease_name("a"), now=4999.0)
    deleted = table.view("ns", since=4000.0, now=5000.0)
    kept = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=200.0, leases=deleted)
    assert kept.gone == 0
    assert kept.lease_wake_at == 4999.0 + LEASE + MARGIN
    # Without Leases watched, today's rule: the floor only.
    today = step(document, target, spec=SPEC, acks={}, alive=alive, generation=3, now=106.0)
    assert today.gone == 2


def test_the_reconcile_passes_the_leases_to_the_departed_rule() -> None:
    published = settled()
    # b's pod object is gone; its sidecar still renews.
    renewing = MemberLeases.of_pods(now=1003.0, since=900.0, changed={"a": 1002.8, "b": 1002.9})
    obs = observe("Release", published, renewing, pods=("a",), alive=Alive("a", departed="b"))
    first = reconcile(obs)
    assert first.document is not None
    assert first.document.releasing[0].owner == "b"
    later = replace(renewing, now=1060.0, changed={**renewing.changed, member_lease_name("b"): 1059.0})
    later = replace(later, changed={**later.changed, member_lease_name("a"): 1059.5})
    wall_late = WALL + 60.0
    held = reconcile(replace(obs, previous=first.document, leases=later, now=wall_late))
    assert held.document is None, "b renews: nothing handed on, though the wall floor has passed"
    assert held.lease_wake_at == min(1059.5 + LEASE, 1059.0 + LEASE + MARGIN), "a's lapse comes first"
    silent = replace(later, now=1059.0 + LEASE + MARGIN, changed={member_lease_name("a"): 1064.9})
    done = reconcile(replace(obs, previous=first.document, leases=silent, now=wall_late + 6))
    assert done.document is not None
    assert set(done.document.topics["T"]["a"]) == set(Q)


def test_outcome_fields_default_to_no_lease_wake() -> None:
    assert Outcome(None, {}).lease_wake_at is None
    assert Outcome(None, {}).interest.lapsed == ()
