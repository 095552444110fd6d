"""Orderly failover: the operator releases the broker locks of a member it knows stopped (pod
finished, or gone with its grant surely expired), naming the RocketMQ clients its Lease named, and
never those of a live member. Pure parts: the annotation, the Lease table, the handover's
``stopped`` and the reconcile's ``unlocks``; the request itself is tested on a real broker
(tests/integration/rocketmq/test_broker_admin.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from mqbalance.contract import (
    MAX_MEMBER_CLIENTS,
    MEMBER_CLIENTS_ANNOTATION,
    Ack,
    HandoverMode,
    HandoverSpec,
    member_clients,
    member_lease_name,
    valid_client_id,
)
from mqbalance.operator.handover import Alive, step
from mqbalance.operator.leases import DELETED_KEPT_SECONDS, LeaseTable, MemberLeases, lease_record
from mqbalance.operator.reconcile import reconcile
from tests.unit.test_handover_lease import Q, doc
from tests.unit.test_member_leases import LEASE, MARGIN, WALL, observe, settled
from tests.unit.test_member_leases import Q as ROUTE_QUEUES

A_CLIENTS = ("10.0.0.1@4321#88172", "10.0.0.1@4400#90001")


def annotated(*ids: Any) -> dict[str, str]:
    return {MEMBER_CLIENTS_ANNOTATION: json.dumps(list(ids))}


# -- the annotation ---------------------------------------------------------------------------------


def test_a_lease_names_its_clients_and_anything_else_there_is_ignored() -> None:
    assert member_clients(annotated(*A_CLIENTS)) == A_CLIENTS
    assert member_clients(None) == ()
    assert member_clients({MEMBER_CLIENTS_ANNOTATION: "not json"}) == ()
    assert member_clients({MEMBER_CLIENTS_ANNOTATION: '{"a": 1}'}) == ()
    # Invalid ids are dropped, valid ones kept; only the newest MAX_MEMBER_CLIENTS count.
    assert member_clients(annotated("ok@1", 7, "with space", "x" * 256, "é@1", "ok@2")) == ("ok@1", "ok@2")
    many = [f"10.0.0.1@{i}" for i in range(MAX_MEMBER_CLIENTS + 3)]
    assert member_clients(annotated(*many)) == tuple(many[-MAX_MEMBER_CLIENTS:])
    assert member_clients({MEMBER_CLIENTS_ANNOTATION: json.dumps(["a"] * 100_000)}) == (), "too long to read"


@pytest.mark.parametrize(
    ("text", "valid"),
    [("172.17.0.3@12345#1679089#1", True), ("a", True), ("", False), ("a b", False), ("a\n", False)],
)
def test_a_client_id_is_printable_ascii_without_spaces(text: str, valid: bool) -> None:
    assert valid_client_id(text) is valid


def test_the_table_keeps_a_deleted_leases_clients_until_it_forgets_the_deletion() -> None:
    table, name = LeaseTable(), member_lease_name("a")
    meta: dict[str, Any] = {"name": name, "uid": "u1", "annotations": annotated(*A_CLIENTS)}
    body = {"metadata": meta, "spec": {"holderIdentity": "a", "renewTime": "t1"}}
    assert table.seen("ns", name, lease_record(body), now=10.0) == "a"
    assert table.view("ns", 0.0, 11.0).clients_of("a") == A_CLIENTS
    # Naming a new client is a change: the sidecar wrote it with a renewal.
    newer = {**body, "metadata": {**meta, "annotations": annotated(*A_CLIENTS, "n@1")}}
    assert table.seen("ns", name, lease_record(newer), now=12.0) == "a"
    # The garbage collector deletes a gone pod's Lease before its queues are handed on.
    table.deleted("ns", name, now=13.0)
    assert table.view("ns", 0.0, 14.0).clients_of("a") == (*A_CLIENTS, "n@1")
    table.deleted("ns", "other", now=13.0 + DELETED_KEPT_SECONDS + 1)  # prunes old deletions
    assert table.view("ns", 0.0, 14.0).clients_of("a") == ()


# -- the handover's stopped members -----------------------------------------------------------------


def test_only_members_known_stopped_are_listed_stopped() -> None:
    spec = HandoverSpec(
        HandoverMode.ORDERLY, release_timeout=10.0, broker_lock=60.0, lease=4.0, lease_margin=1.0
    )
    published = doc(1, {"a": (Q[0],), "b": (Q[1],), "d": (Q[2],), "c": (Q[3],)})
    target = {"t": {"c": tuple(Q)}}
    # a departed (pod object gone), b is alive but not a member (NotReady, say), d finished.
    alive = Alive("bc", departed="a")
    first = step(published, target, spec=spec, acks={}, alive=alive, generation=2, now=100.0)
    assert first.stopped == {"d": (Q[2],)}, "a finished pod consumes nothing: its queue is given on now"
    revoked = doc(2, first.topics["t"], *first.releasing)
    early = step(revoked, target, spec=spec, acks={}, alive=alive, generation=3, now=104.9)
    assert early.stopped == {}
    expired = step(revoked, target, spec=spec, acks={}, alive=alive, generation=3, now=105.0)
    assert expired.stopped == {"a": (Q[0],)}, "gone, its grant surely expired"
    # b still runs: overridden at the broker lock's expiry, never listed stopped.
    late = step(revoked, target, spec=spec, acks={}, alive=alive, generation=3, now=160.0)
    assert late.overridden == 1
    assert set(late.stopped) == {"a"}
    # An owner that acknowledged let go of its locks itself.
    acks = {"a": Ack(2), "b": Ack(2)}
    acked = step(revoked, target, spec=spec, acks=acks, alive=alive, generation=3, now=101.0)
    assert (acked.released, acked.stopped) == (2, {})


# -- the reconcile's unlocks ------------------------------------------------------------------------


def departed_b(mode: str, clients: tuple[str, ...]) -> tuple[Any, Any]:
    """b's pod object went and its Lease fell silent; the reconcile that revokes its queues and
    the one that hands them on."""
    published = settled(mode)
    leases = MemberLeases.of_pods(now=1003.0, since=900.0, changed={"a": 1002.8, "b": 1000.0})
    leases = replace(leases, clients={member_lease_name("b"): clients} if clients else {})
    obs = observe(mode, published, leases, pods=("a",), alive=Alive("a", departed="b"))
    revoked = reconcile(obs)
    assert revoked.document is not None
    assert revoked.unlocks == (), "nothing handed on yet"
    silent = replace(leases, now=1000.0 + LEASE + MARGIN + 1, changed={member_lease_name("a"): 1006.5})
    done = reconcile(replace(obs, previous=revoked.document, leases=silent, now=WALL + LEASE + MARGIN))
    assert done.document is not None
    assert set(done.document.topics["T"]["a"]) == set(ROUTE_QUEUES)
    return revoked, done


def test_orderly_releases_a_gone_members_locks_for_the_clients_its_lease_named() -> None:
    _, done = departed_b("Orderly", A_CLIENTS)
    (unlock,) = done.unlocks
    assert (unlock.group, unlock.member, unlock.clients) == ("g", "b", A_CLIENTS)
    assert set(unlock.queues) == set(settled("Orderly").topics["T"]["b"])


@pytest.mark.parametrize(("mode", "clients"), [("Release", A_CLIENTS), ("Orderly", ())])
def test_no_unlock_without_orderly_or_without_the_clients(mode: str, clients: tuple[str, ...]) -> None:
    _, done = departed_b(mode, clients)
    assert done.unlocks == ()
