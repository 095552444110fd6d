"""A member whose application's connections to its sidecar closed (an ``absent`` acknowledgement of
the latest generation) is out of the group at once, its queues given on in one step, as RocketMQ's
broker rebalances at a closed channel; an older ``absent`` is stale. Pure: the reconcile."""

from __future__ import annotations

from dataclasses import replace

from mqbalance.contract import Ack, decode_acks
from mqbalance.operator.membership import APPLICATION_GONE
from mqbalance.operator.reconcile import reconcile
from tests.unit.test_member_leases import Q, observe, settled


def test_the_acknowledgement_round_trips_and_absent_means_all() -> None:
    gone = Ack(4, all=True, absent=True)
    assert decode_acks({"p": gone.encode(), "q": Ack(4).encode()}) == {"p": gone, "q": Ack(4)}
    assert decode_acks({"p": '{"generation": 4, "absent": true}'}) == {"p": gone}


def test_a_gone_application_is_out_at_once_and_its_queues_go_on_in_one_step() -> None:
    mode = "Release"
    published = settled(mode)
    obs = observe(mode, published, None, acks={"b": Ack(published.generation, all=True, absent=True)})
    out = reconcile(obs)
    doc = out.document
    assert doc is not None
    assert doc.generation == published.generation + 1
    assert set(doc.members) == {"a"}
    assert set(doc.topics["T"]["a"]) == set(Q), "every queue at once: no revocation to wait for"
    assert doc.releasing == ()
    (idle,) = out.status["notServingPods"]
    assert (idle["name"], idle["reason"]) == ("b", APPLICATION_GONE)


def test_an_absence_older_than_the_latest_generation_is_stale() -> None:
    published = settled()
    later = replace(published, generation=published.generation + 1)
    out = reconcile(
        observe("Release", later, None, acks={"b": Ack(published.generation, all=True, absent=True)})
    )
    assert out.document is None, "nothing changes: b is a member"
    assert out.status["notServing"] == 0


def test_an_absence_told_again_of_the_generation_without_it_keeps_it_out() -> None:
    """The sidecar tells the absence again with each generation served while the application is away:
    the one that took the pod out does not bring it back."""
    published = settled()
    gone = Ack(published.generation, all=True, absent=True)
    out = reconcile(observe("Release", published, None, acks={"b": gone}))
    assert out.document is not None
    again = Ack(out.document.generation, all=True, absent=True)
    kept = reconcile(observe("Release", out.document, None, acks={"b": again}))
    assert kept.document is None, "still out: nothing to publish"
    back = reconcile(observe("Release", out.document, None, acks={"b": Ack(out.document.generation)}))
    assert back.document is not None
    assert set(back.document.members) == {"a", "b"}


def test_orderly_does_not_take_an_absence_for_a_crash() -> None:
    """An orderly consumer that only lost its connection may be processing a batch under the broker's
    lock: an absence (which its sidecar does not send for Orderly) moves nothing."""
    published = settled("Orderly")
    out = reconcile(
        observe("Orderly", published, None, acks={"b": Ack(published.generation, all=True, absent=True)})
    )
    assert out.document is None or set(out.document.members) == {"a", "b"}
    assert out.unlocks == ()
