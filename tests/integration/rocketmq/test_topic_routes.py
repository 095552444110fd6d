"""Topics whose route the operator reads from a real NameServer: groups follow the route, drift and
an unreachable NameServer are reported, the last good route is kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client

from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from harness.rocketmq.server import RocketMQ
from mqbalance.model import PERM_READ
from tests.integration.operator_support import (
    GROUP,
    VERSION,
    apply_group,
    condition,
    custom,
    read_document,
    wait_generation,
)
from tests.integration.rocketmq.conftest import ZONES
from tests.integration.rocketmq.rocketmq_support import consumers_namespace, operator_serving

DEAD = "127.0.0.1:1"  # nothing listens on port 1
POD_LABELS = {"app": "routes"}


@pytest.fixture(scope="module")
def ns(
    cluster: LocalCluster,
    crds: None,
    api: client.ApiClient,
    rocketmq: RocketMQ,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """A namespace of three consumer pods and the operator serving it, with the real NameServer as
    its own (for Topics that name none)."""
    with consumers_namespace(api, "routes", 3, POD_LABELS) as (name, _):
        workdir = tmp_path_factory.mktemp("operator-routes")
        with operator_serving(cluster, name, workdir, "--name-server", rocketmq.namesrv_addr):
            yield name


def put_topic(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": spec,
    }
    topics = custom(api)
    try:
        current = cast(
            dict[str, Any], topics.get_namespaced_custom_object(GROUP, VERSION, namespace, "topics", name)
        )
    except client.ApiException as e:
        if e.status != 404:
            raise
        topics.create_namespaced_custom_object(GROUP, VERSION, namespace, "topics", body)
        return
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    topics.replace_namespaced_custom_object(GROUP, VERSION, namespace, "topics", name, body)


def status_of(api: client.ApiClient, namespace: str, plural: str, name: str) -> dict[str, Any]:
    obj = cast(
        dict[str, Any], custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    )
    return obj.get("status") or {}


def topic_status(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return status_of(api, namespace, "topics", name)


def wait_topic(
    api: client.ApiClient, namespace: str, name: str, kind: str, state: str, reason: str
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = topic_status(api, namespace, name)
        c = condition(status, kind) if status.get("conditions") else {}
        return status if (c.get("status"), c.get("reason")) == (state, reason) else None

    return wait_for(f"Topic {name} {kind}={state} ({reason})", probe, 60)


def route_counts(status: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    return {
        b["name"]: (b["readQueueNums"], b["writeQueueNums"], b["perm"]) for b in status["route"]["brokers"]
    }


def test_a_group_follows_the_route_the_name_server_gives(
    api: client.ApiClient, rocketmq: RocketMQ, ns: str, topic_name: str
) -> None:
    rocketmq.create_topic(topic_name, read_queues=4, write_queues=2, brokers=["broker-a"])
    rocketmq.create_topic(topic_name, 2, perm=PERM_READ, brokers=["broker-b"])
    spec: dict[str, Any] = {
        "topicName": topic_name,
        "nameServer": {"addresses": [DEAD, rocketmq.namesrv_addr], "pollSeconds": 5},
        "brokers": [{"name": "broker-a", "zone": "zone-a"}, {"name": "broker-b", "zone": "zone-b"}],
    }
    put_topic(api, ns, "orders", spec)
    status = wait_topic(api, ns, "orders", "RouteAvailable", "True", "Read")
    assert route_counts(status) == {"broker-a": (4, 2, 6), "broker-b": (2, 2, PERM_READ)}
    assert status["route"]["nameServer"] == rocketmq.namesrv_addr  # the dead one was skipped
    assert (status["readableQueues"], status["writableQueues"]) == (6, 2)
    assert condition(status, "RouteInSync")["status"] == "True"

    apply_group(api, ns, "orders", {"topics": ["orders"], "selector": {"matchLabels": POD_LABELS}})
    doc = wait_generation(api, ns, "orders", 1)
    queues = [mq for qs in doc.topics[topic_name].values() for mq in qs]
    assert len(queues) == 6
    assert doc.broker_zones == {"broker-a": "zone-a", "broker-b": "zone-b"}

    # The topic grows on the broker: within a poll the Topic and the group follow.
    rocketmq.create_topic(topic_name, read_queues=8, write_queues=8, brokers=["broker-a"])
    grown = wait_generation(api, ns, "orders", doc.generation + 1)
    assert sum(len(qs) for qs in grown.topics[topic_name].values()) == 10
    assert topic_status(api, ns, "orders")["readableQueues"] == 10

    # Counts written in the spec that the route does not have are drift, reported, not obeyed.
    spec["brokers"][0] |= {"readQueueNums": 4, "writeQueueNums": 2}
    put_topic(api, ns, "orders", spec)
    drift = wait_topic(api, ns, "orders", "RouteInSync", "False", "Drift")
    assert (
        "broker broker-a: spec.brokers says readQueueNums 4, the route 8"
        in condition(drift, "RouteInSync")["message"]
    )
    assert drift["readableQueues"] == 10

    # No NameServer answers: the route read before stays, and so does the assignment.
    before = route_counts(drift)
    spec["nameServer"]["addresses"] = [DEAD]
    put_topic(api, ns, "orders", spec)
    away = wait_topic(api, ns, "orders", "RouteAvailable", "False", "NameServerUnreachable")
    message = condition(away, "RouteAvailable")["message"]
    assert DEAD in message
    assert message.endswith("keeping the route read before")
    assert route_counts(away) == before
    kept = read_document(api, ns, "orders")
    assert kept is not None
    assert kept.generation == grown.generation


def test_zones_come_from_the_brokers_when_the_spec_names_none(
    api: client.ApiClient, rocketmq: RocketMQ, ns: str, topic_name: str
) -> None:
    """5.x brokers started with ``$ROCKETMQ_ZONE`` register their zone with the NameServer
    (RocketMQ's zoneName): a Topic without spec.brokers gets its zones from there."""
    if not rocketmq.is_5x:
        pytest.skip(f"{rocketmq.version} brokers register no zone")
    rocketmq.create_topic(topic_name, 2)
    assert rocketmq.route(topic_name).registered_zones() == ZONES
    put_topic(
        api, ns, "zoned", {"topicName": topic_name, "nameServer": {"addresses": [rocketmq.namesrv_addr]}}
    )
    status = wait_topic(api, ns, "zoned", "RouteAvailable", "True", "Read")
    assert {b["name"]: b.get("zone") for b in status["route"]["brokers"]} == ZONES
    apply_group(api, ns, "zoned", {"topics": ["zoned"], "selector": {"matchLabels": POD_LABELS}})
    assert wait_generation(api, ns, "zoned", 1).broker_zones == ZONES


def test_the_operators_own_name_server_and_a_missing_topic(
    api: client.ApiClient, rocketmq: RocketMQ, ns: str, topic_name: str
) -> None:
    put_topic(api, ns, "missing", {"topicName": topic_name, "nameServer": {}})
    missing = wait_topic(api, ns, "missing", "RouteAvailable", "False", "TopicNotFound")
    assert "no route read yet" in condition(missing, "RouteAvailable")["message"]
    apply_group(api, ns, "waiting", {"topics": ["missing"], "selector": {"matchLabels": POD_LABELS}})

    def invalid() -> dict[str, Any] | None:
        status = status_of(api, ns, "consumergroups", "waiting")
        c = condition(status, "Invalid") if status.get("conditions") else None
        return c if c and c.get("reason") == "TopicRouteNotRead" else None

    assert (
        "not been read from the NameServer yet"
        in wait_for("group waiting on the route", invalid, 60)["message"]
    )
    # The topic is created in RocketMQ: the next poll (30 s by default) finds it; the group publishes.
    rocketmq.create_topic(topic_name, 2)
    found = wait_for(
        "the route of a topic created later",
        lambda: topic_status(api, ns, "missing") if topic_status(api, ns, "missing").get("route") else None,
        90,
    )
    assert found["route"]["nameServer"] == rocketmq.namesrv_addr
    doc = wait_generation(api, ns, "waiting", 1)
    assert sum(len(qs) for qs in doc.topics[topic_name].values()) == 4  # 2 queues on each broker


def test_a_static_topic_is_assigned_by_its_logical_queues(
    api: client.ApiClient, rocketmq: RocketMQ, ns: str, topic_name: str
) -> None:
    """A 5.x static topic (``mqadmin updateStaticTopic``): its consumers name their queues
    ``__syslo__global__`` 0..n-1 whatever broker hosts each, so the route, and every assignment,
    is made of those logical queues rather than the brokers' physical ones."""
    if not rocketmq.is_5x:
        pytest.skip(f"{rocketmq.version} has no static topics")
    route = rocketmq.create_static_topic(topic_name, 4)
    assert {m.broker_name for m in route.queue_mappings} == {"broker-a", "broker-b"}
    put_topic(
        api, ns, "static", {"topicName": topic_name, "nameServer": {"addresses": [rocketmq.namesrv_addr]}}
    )
    status = wait_topic(api, ns, "static", "RouteAvailable", "True", "Read")
    assert route_counts(status) == {"__syslo__global__": (4, 4, 6)}
    # Its queues live on brokers of two zones: the logical broker's zone is unknown.
    assert "zone" not in status["route"]["brokers"][0]
    apply_group(api, ns, "static", {"topics": ["static"], "selector": {"matchLabels": POD_LABELS}})
    doc = wait_generation(api, ns, "static", 1)
    assigned = sorted((mq.broker_name, mq.queue_id) for qs in doc.topics[topic_name].values() for mq in qs)
    assert assigned == [("__syslo__global__", q) for q in range(4)]
