"""Spec parsing and label selectors of the operator."""

from __future__ import annotations

from typing import Any

import pytest

from mqbalance.contract import SpecError, read_topic
from mqbalance.model import UNKNOWN_ZONE, MessageModel, MessageQueue, StrategyName
from mqbalance.operator.membership import PodInfo, members, pod_info
from mqbalance.operator.spec import LabelSelector, parse_group, parse_selector, unknown_config_queues


def test_defaults_fill_in() -> None:
    g = parse_group("orders", {"topics": ["t"], "selector": {"matchLabels": {"app": "a"}}})
    assert g.group_name == "orders"
    assert g.message_model is MessageModel.CLUSTERING
    assert g.strategy.name is StrategyName.AVG
    assert g.zone_label == "topology.kubernetes.io/zone"
    assert g.debounce_seconds == 2.0


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {"x": "1"}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "1"}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
        (
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]}]},
            {"tier": "y"},
            True,
        ),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, {"tier": "x"}, False),
        ({"matchExpressions": [{"key": "canary", "operator": "Exists"}]}, {"canary": ""}, True),
        ({"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}, {"canary": ""}, False),
        (
            {
                "matchLabels": {"app": "a"},
                "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}],
            },
            {"app": "a"},
            True,
        ),
    ],
)
def test_selector_matching(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(selector).matches(labels) is expected


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "needs at least one value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "use one of In"),
        (None, "select the member pods"),
    ],
)
def test_bad_selectors_say_what_to_fix(selector: object, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_selector(selector)


@pytest.mark.parametrize(
    ("strategy", "fragment"),
    [
        ({"name": "MACHINE_ROOM"}, "consumerIdcs"),
        ({"name": "CONFIG"}, "spec.strategy.config"),
        ({"name": "RANDOM"}, "use one of AVG"),
        ({"name": "MACHINE_ROOM_NEARBY", "inner": "STICKY"}, "inner"),
        ({"name": "CONSISTENT_HASH", "virtualNodes": 0}, "virtualNodes"),
        (
            {
                "name": "CONFIG",
                "config": {"a": [{"broker": "b", "queueId": 1}], "c": [{"broker": "b", "queueId": 1}]},
            },
            "b/1 \\('a', 'c'\\)",
        ),
    ],
)
def test_strategies_that_cannot_work(strategy: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_group("g", {"topics": ["t"], "selector": {}, "strategy": strategy})


def test_config_duplicates_are_fine_when_broadcasting() -> None:
    spec = {
        "name": "CONFIG",
        "config": {"a": [{"broker": "b", "queueId": 1}], "c": [{"broker": "b", "queueId": 1}]},
    }
    g = parse_group("g", {"topics": ["t"], "selector": {}, "strategy": spec, "messageModel": "BROADCASTING"})
    assert g.strategy.config["a"] == (MessageQueue("", "b", 1),)


def test_unknown_config_queues_are_listed() -> None:
    g = parse_group(
        "g",
        {
            "topics": ["t"],
            "selector": {},
            "strategy": {
                "name": "CONFIG",
                "config": {"p": [{"broker": "b", "queueId": 1}, {"broker": "x", "queueId": 0}]},
            },
        },
    )
    route = read_topic("t", {"brokers": [{"name": "b", "readQueueNums": 2, "writeQueueNums": 2}]})
    assert unknown_config_queues(g.strategy, {"t": route}) == ["x/0"]


def test_topic_parsing() -> None:
    route = read_topic(
        "orders",
        {
            "topicName": "TopicOrders",
            "brokers": [
                {"name": "a", "zone": "z1", "readQueueNums": 2, "writeQueueNums": 4},
                {"name": "b", "readQueueNums": 3, "writeQueueNums": 3, "perm": 2},
            ],
        },
    )
    assert route.topic == "TopicOrders"
    assert len(route.readable_queues()) == 2  # b is write-only
    assert len(route.writable_queues()) == 7
    assert route.broker_zones() == {"a": "z1", "b": UNKNOWN_ZONE}
    with pytest.raises(SpecError, match="listed twice"):
        read_topic("t", {"brokers": [{"name": "a", "readQueueNums": 1, "writeQueueNums": 1}] * 2})


def _pod(name: str, phase: str = "Running", ready: str = "True", **meta: object) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "a"}, **meta},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


def test_membership_needs_running_ready_and_not_terminating() -> None:
    pods = [
        pod_info(_pod("ok")),
        pod_info(_pod("pending", phase="Pending")),
        pod_info(_pod("unready", ready="False")),
        pod_info(_pod("leaving", deletionTimestamp="2026-01-01T00:00:00Z")),
        PodInfo("other", {"app": "b"}, "n1", True, True),
        PodInfo("no-node-label", {"app": "a"}, "n2", True, True),
    ]
    got = members(pods, LabelSelector({"app": "a"}), {"n1": {"zone": "z1"}, "n2": {}}, "zone")
    assert got == {"ok": "z1", "no-node-label": UNKNOWN_ZONE}
