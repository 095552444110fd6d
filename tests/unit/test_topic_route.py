"""A Topic's route written by hand or read from a NameServer, and the status that reports it."""

from __future__ import annotations

from typing import Any

import pytest

from mqbalance.contract import NameServerSpec, RouteNotRead, SpecError, read_name_server, read_topic
from mqbalance.contract.topic import route_status
from mqbalance.model import UNKNOWN_ZONE, Broker
from mqbalance.operator.topics import RouteRead, topic_status

NAME_SERVER = {"nameServer": {"addresses": ["10.0.0.5:9876"]}}
READ = RouteRead((Broker("a", 4, 4), Broker("b", 2, 2, perm=4)), address="10.0.0.5:9876")


def condition(status: dict[str, Any], kind: str) -> tuple[str, str, str]:
    c = next(c for c in status["conditions"] if c["type"] == kind)
    return c["status"], c["reason"], c.get("message", "")


def test_a_route_read_from_the_name_server_takes_zones_from_the_spec() -> None:
    spec = {**NAME_SERVER, "brokers": [{"name": "a", "zone": "z1"}]}
    route = read_topic("t", spec, route_status("10.0.0.5:9876", READ.brokers or ()))
    assert [(b.name, b.zone, b.read_queue_nums, b.perm) for b in route.brokers] == [
        ("a", "z1", 4, 6),
        ("b", UNKNOWN_ZONE, 2, 4),
    ]


def test_no_route_read_yet_is_its_own_error() -> None:
    with pytest.raises(RouteNotRead, match="not been read from the NameServer yet"):
        read_topic("t", NAME_SERVER, None)


def test_a_broker_without_a_master_is_read_but_not_written() -> None:
    status = route_status("x:1", [Broker("a", 2, 2, has_master=False), Broker("b", 2, 2)])
    assert status["brokers"][0]["master"] is False
    route = read_topic("t", NAME_SERVER, status)
    assert len(route.readable_queues()) == 4
    assert {mq.broker_name for mq in route.writable_queues()} == {"b"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec.brokers must list at least one broker, or set spec.nameServer"),
        ({"brokers": [{"name": "a", "readQueueNums": 1}]}, r"brokers\[0\].writeQueueNums is missing"),
    ],
)
def test_without_a_name_server_the_counts_are_required(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        read_topic("t", spec)


def test_a_status_route_edited_into_nonsense_is_an_error_not_a_crash() -> None:
    with pytest.raises(SpecError, match=r"status.route.brokers\[0\] is unreadable"):
        read_topic("t", NAME_SERVER, {"brokers": [{"name": "a", "readQueueNums": "four"}]})


def test_a_good_read_is_available_and_in_sync() -> None:
    status = topic_status("t", NAME_SERVER, 3, {}, READ, 0.0)
    assert condition(status, "RouteAvailable") == ("True", "Read", "read from NameServer 10.0.0.5:9876")
    assert condition(status, "RouteInSync")[:2] == ("True", "InSync")
    assert (status["brokers"], status["readableQueues"], status["writableQueues"]) == (2, 6, 4)
    assert status["observedGeneration"] == 3
    assert [c["type"] for c in status["conditions"]] == ["RouteAvailable", "RouteInSync"]


def test_a_failed_read_keeps_the_route_read_before() -> None:
    before = topic_status("t", NAME_SERVER, 1, {}, READ, 0.0)
    failed = RouteRead(
        None, reason="NameServerUnreachable", message="no NameServer answered (10.0.0.5:9876: refused)"
    )
    after = topic_status("t", NAME_SERVER, 1, before, failed, 60.0)
    assert after["route"] == before["route"]
    assert after["readableQueues"] == 6
    state, reason, message = condition(after, "RouteAvailable")
    assert (state, reason) == ("False", "NameServerUnreachable")
    assert message.endswith("refused); keeping the route read before")
    first = topic_status("t", NAME_SERVER, 1, {}, failed, 0.0)
    assert "route" not in first
    assert condition(first, "RouteAvailable")[2].endswith("no route read yet")
    assert condition(first, "RouteInSync")[:2] == ("Unknown", "NoRoute")


def test_an_unchanged_status_is_equal_so_nothing_is_written() -> None:
    first = topic_status("t", NAME_SERVER, 1, {}, READ, 0.0)
    assert topic_status("t", NAME_SERVER, 1, first, READ, 500.0) == first


def test_drift_names_every_disagreement() -> None:
    spec = {
        **NAME_SERVER,
        "brokers": [
            {"name": "a", "zone": "z1", "readQueueNums": 8, "writeQueueNums": 4},
            {"name": "gone", "zone": "z2"},
        ],
    }
    status = topic_status("t", spec, 1, {}, READ, 0.0)
    state, reason, message = condition(status, "RouteInSync")
    assert (state, reason) == ("False", "Drift")
    assert message.split("; ") == [
        "broker a: spec.brokers says readQueueNums 8, the route 4",
        "broker gone is in spec.brokers but not in the route",
        "brokers b are in the route but not in spec.brokers (zone unknown)",
    ]
    assert status["readableQueues"] == 6  # the route, not the spec, is what consumers use


def test_a_hand_written_topic_reports_its_route_or_what_is_wrong() -> None:
    good = topic_status(
        "t", {"brokers": [{"name": "a", "readQueueNums": 2, "writeQueueNums": 1}]}, 1, {}, None, 0.0
    )
    assert condition(good, "RouteAvailable")[:2] == ("True", "Spec")
    assert "RouteInSync" not in {c["type"] for c in good["conditions"]}
    bad = topic_status("t", {"brokers": [{"name": "a"}]}, 2, good, None, 0.0)
    assert condition(bad, "RouteAvailable")[:2] == ("False", "InvalidSpec")
    assert bad["readableQueues"] == 2  # the counts of the last good spec stay


def test_poll_seconds_default_to_the_java_clients_interval() -> None:
    assert read_name_server(NAME_SERVER) == NameServerSpec(("10.0.0.5:9876",), 30.0)
    assert read_name_server({"nameServer": {"pollSeconds": 5}}) == NameServerSpec((), 5.0)


def test_the_acl_secret_is_read_where_the_name_server_is() -> None:
    spec = {"nameServer": {"aclSecretRef": {"name": "rocketmq-acl"}}}
    assert read_name_server(spec) == NameServerSpec((), 30.0, "rocketmq-acl")
    for ref in ({}, {"name": ""}, "rocketmq-acl", None):
        assert read_name_server({"nameServer": {"aclSecretRef": ref}}) == NameServerSpec()


ZONED = RouteRead((Broker("a", 4, 4, zone="zone-a"), Broker("b", 2, 2), Broker("c", 1, 1, zone="zone-c")))


def test_zones_the_brokers_registered_with_are_used_unless_the_spec_gives_one() -> None:
    spec = {**NAME_SERVER, "brokers": [{"name": "a", "zone": "z1"}, {"name": "b"}]}
    written = route_status("10.0.0.5:9876", ZONED.brokers or ())
    assert [b.get("zone") for b in written["brokers"]] == ["zone-a", None, "zone-c"]
    route = read_topic("t", spec, written)
    assert [(b.name, b.zone) for b in route.brokers] == [("a", "z1"), ("b", UNKNOWN_ZONE), ("c", "zone-c")]
    assert {b.name: b.zone for b in read_topic("t", NAME_SERVER, written).brokers} == {
        "a": "zone-a",
        "b": UNKNOWN_ZONE,
        "c": "zone-c",
    }


def test_a_zone_the_spec_and_the_broker_disagree_on_is_drift_and_a_registered_zone_is_known() -> None:
    spec = {**NAME_SERVER, "brokers": [{"name": "a", "zone": "z1"}]}
    state, reason, message = condition(topic_status("t", spec, 1, {}, ZONED, 0.0), "RouteInSync")
    assert (state, reason) == ("False", "Drift")
    assert message.split("; ") == [
        "broker a: spec.brokers says zone z1, the broker registered zone zone-a (spec.brokers' zone is used)",
        "brokers b are in the route but not in spec.brokers (zone unknown)",  # c registered its zone
    ]
