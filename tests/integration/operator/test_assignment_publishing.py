"""CRDs -> operator -> ConfigMap + status, for every strategy, against the real API server."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from harness.kube import kubelet
from harness.polling import wait_for
from mqbalance.contract import read_topic
from mqbalance.model import UNKNOWN_ZONE, MessageModel, MessageQueue, StrategySpec, Zones
from mqbalance.operator.spec import parse_group
from mqbalance.strategies import allocate
from tests.integration.invariants import check_document, check_journal
from tests.integration.operator_support import (
    apply_group,
    apply_topic,
    condition,
    events_of,
    status_for,
    wait_generation,
)

BROKERS = [
    {"name": "hz@broker-a", "zone": "zone-a", "readQueueNums": 4, "writeQueueNums": 4},
    {"name": "hz@broker-b", "zone": "zone-b", "readQueueNums": 4, "writeQueueNums": 4},
    {"name": "sh@broker-c", "zone": "zone-c", "readQueueNums": 4, "writeQueueNums": 2},
]
POD_LABELS = {"app": "orders"}


@pytest.fixture(scope="module")
def members(
    module_api: client.ApiClient, module_namespace: str, zone_nodes: dict[str, str]
) -> dict[str, str]:
    """Five ready pods over the zoned nodes: pod -> zone."""
    zoned = [n for n, z in zone_nodes.items() if z]
    pods = kubelet.start_pods(module_api, module_namespace, "orders", 5, POD_LABELS, zoned)
    return {kubelet.pod_name(p): zone_nodes[kubelet.pod_node(p)] for p in pods}


STRATEGIES: dict[str, dict[str, Any]] = {
    "avg": {"name": "AVG"},
    "circle": {"name": "AVG_BY_CIRCLE"},
    "hash": {"name": "CONSISTENT_HASH", "virtualNodes": 7},
    "config": {
        "name": "CONFIG",
        "config": {
            "orders-0": [{"broker": "hz@broker-a", "queueId": 0}, {"broker": "sh@broker-c", "queueId": 3}],
            "orders-3": [{"broker": "hz@broker-b", "queueId": 1}],
        },
    },
    "room": {"name": "MACHINE_ROOM", "consumerIdcs": ["hz"]},
    "nearby": {"name": "MACHINE_ROOM_NEARBY", "inner": "AVG_BY_CIRCLE"},
    "sticky": {"name": "STICKY", "zoneAffinity": True},
}


@pytest.mark.parametrize("key", sorted(STRATEGIES))
def test_every_strategy_publishes_what_the_core_computes(
    key: str,
    module_api: client.ApiClient,
    module_namespace: str,
    members: dict[str, str],
    operator_process: Any,
) -> None:
    ns = module_namespace
    apply_topic(module_api, ns, "orders", BROKERS, topicName="TopicOrders")
    spec = {"topics": ["orders"], "selector": {"matchLabels": POD_LABELS}, "strategy": STRATEGIES[key]}
    apply_group(module_api, ns, f"orders-{key}", {**spec, "groupName": f"GID_{key}"})

    doc = wait_generation(module_api, ns, f"orders-{key}", 1)
    route = read_topic("orders", {"topicName": "TopicOrders", "brokers": BROKERS})
    strategy: StrategySpec = parse_group(f"orders-{key}", spec).strategy
    expected = allocate(
        strategy,
        route.readable_queues(),
        members,
        zones=Zones(brokers=route.broker_zones(), consumers=members),
        message_model=MessageModel.CLUSTERING,
    )
    assert doc.group == f"GID_{key}"
    assert doc.strategy == STRATEGIES[key]["name"]
    assert doc.members == members
    assert dict(doc.topics["TopicOrders"]) == expected
    check_document(doc, {"TopicOrders": route.readable_queues()})

    status = status_for(module_api, ns, f"orders-{key}", doc.generation)
    assert status["members"] == 5
    assert status["queues"] == 12
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Invalid")["status"] == "False"
    assert status["zones"] == {"zone-a": 2, "zone-b": 2, "zone-c": 1}
    assert status["lastRebalance"]["reason"] == "initial"
    wait_for("a Rebalanced event", lambda: events_of(module_api, ns, f"orders-{key}", "Rebalanced"))
    assert operator_process.metric("mqbalance_group_members", namespace=ns, group=f"orders-{key}") == 5
    assert check_journal(operator_process.journal_records()) >= 1


def test_hand_checked_avg_example(
    module_api: client.ApiClient, module_namespace: str, zone_nodes: dict[str, str], operator_process: Any
) -> None:
    """8 queues over pods a, b, c by AVG: RocketMQ gives a and b three queues, c two, in order."""
    ns = module_namespace
    nodes = [n for n, z in zone_nodes.items() if z]
    kubelet.start_pods(module_api, ns, "small", 3, {"app": "small"}, nodes)
    apply_topic(module_api, ns, "small", [{"name": "b", "readQueueNums": 8, "writeQueueNums": 8}])
    apply_group(module_api, ns, "small", {"topics": ["small"], "selector": {"matchLabels": {"app": "small"}}})
    doc = wait_generation(module_api, ns, "small", 1)
    got = {m: [q.queue_id for q in qs] for m, qs in doc.topics["small"].items()}
    assert got == {"small-0": [0, 1, 2], "small-1": [3, 4, 5], "small-2": [6, 7]}
    status = status_for(module_api, ns, "small", doc.generation)
    assert (status["minLoad"], status["maxLoad"]) == (2, 3)
    assert condition(status, "Balanced")["status"] == "True"


def test_pod_on_node_without_zone_is_in_unknown_zone(
    module_api: client.ApiClient, module_namespace: str, zone_nodes: dict[str, str], operator_process: Any
) -> None:
    ns = module_namespace
    bare = next(n for n, z in zone_nodes.items() if not z)
    kubelet.start_pods(module_api, ns, "nozone", 1, {"app": "nozone"}, [bare])
    apply_topic(module_api, ns, "nozone", [{"name": "b", "readQueueNums": 2, "writeQueueNums": 2}])
    apply_group(
        module_api, ns, "nozone", {"topics": ["nozone"], "selector": {"matchLabels": {"app": "nozone"}}}
    )
    doc = wait_generation(module_api, ns, "nozone", 1)
    assert doc.members == {"nozone-0": UNKNOWN_ZONE}
    status = status_for(module_api, ns, "nozone", doc.generation)
    assert status["unknownZoneMembers"] == ["nozone-0"]
    assert status["zones"] == {UNKNOWN_ZONE: 1}
    assert MessageQueue("nozone", "b", 1) in doc.topics["nozone"]["nozone-0"]
