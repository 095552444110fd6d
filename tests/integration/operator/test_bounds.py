"""The bounds (docs/operator.md, "Bounds") on the real API server: a NameServer route over a bound
is not taken and a group over one is Invalid, each with a condition that names the bound and the
value, while the published assignment stays as it was; back under the bounds, it is published again.

The NameServer is a fake in this process, on 127.0.0.1, that answers every route request with the
body the test sets.
"""

from __future__ import annotations

import json
import socketserver
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client

from harness.kube import kubelet
from harness.polling import wait_for
from harness.processes.net import serving_in_thread
from mqbalance.contract import configmap_name
from mqbalance.contract.bounds import MAX_QUEUES_PER_GROUP, MAX_QUEUES_PER_TOPIC
from mqbalance.rocketmq.remoting import RemotingCommand, decode_payload, encode, frame_length
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import (
    GROUP,
    VERSION,
    apply_group,
    apply_topic,
    condition,
    custom,
    status_of,
    wait_generation,
)


class FakeNameServer(socketserver.ThreadingTCPServer):
    """Answers every request with ``self.body`` as a successful route."""

    daemon_threads = True
    body = b""


class Answer(socketserver.StreamRequestHandler):
    server: FakeNameServer

    def handle(self) -> None:
        while prefix := self.rfile.read(4):
            request = decode_payload(self.rfile.read(frame_length(prefix)))
            self.wfile.write(
                encode(RemotingCommand(code=0, opaque=request.opaque, flag=1, body=self.server.body))
            )


def route(read_queues: int) -> bytes:
    return json.dumps(
        {
            "queueDatas": [
                {"brokerName": "broker-a", "readQueueNums": read_queues, "writeQueueNums": 4, "perm": 6}
            ],
            "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:1"}}],
        }
    ).encode()


@pytest.fixture
def name_server() -> Iterator[FakeNameServer]:
    with serving_in_thread(FakeNameServer(("127.0.0.1", 0), Answer), "fake-nameserver") as server:
        yield server


def topic_status(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = cast(
        dict[str, Any], custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "topics", name)
    )
    return dict(obj.get("status") or {})


def configmap(api: client.ApiClient, namespace: str, group: str) -> tuple[str, dict[str, str]]:
    """The assignment ConfigMap's resourceVersion and data."""
    cm = client.CoreV1Api(api).read_namespaced_config_map(configmap_name(group), namespace)
    assert cm.metadata is not None
    assert cm.metadata.resource_version is not None
    return cm.metadata.resource_version, dict(cm.data or {})


def test_a_name_server_route_over_a_bound_is_not_taken_and_the_assignment_stays(
    testbed: Testbed, name_server: FakeNameServer
) -> None:
    api, ns, name = testbed.api, testbed.ns, "bounded-route"
    address = f"127.0.0.1:{name_server.server_address[1]}"
    name_server.body = route(8)
    labels = {"app": name}
    kubelet.start_pods(api, ns, name, 3, labels, testbed.nodes)
    apply_topic(api, ns, name, None, nameServer={"addresses": [address], "pollSeconds": 5})
    apply_group(api, ns, name, {"topics": [name], "selector": {"matchLabels": labels}, "debounceSeconds": 0})
    first = wait_generation(api, ns, name, 1)
    assert sum(len(qs) for qs in first.topics[name].values()) == 8
    published = configmap(api, ns, name)
    read_before = topic_status(api, ns, name)["route"]

    name_server.body = route(10**9)

    def refused() -> dict[str, Any] | None:
        status = topic_status(api, ns, name)
        available = condition(status, "RouteAvailable")
        return (
            status
            if (available.get("status"), available.get("reason")) == ("False", "RouteTooLarge")
            else None
        )

    status = wait_for("the Topic to say its route is over a bound", refused)
    message = condition(status, "RouteAvailable")["message"]
    assert f"NameServer {address}: topic '{name}': broker broker-a has readQueueNums 1000000000" in message
    assert "over the bound of 1024 queues per broker (docs/operator.md, Bounds)" in message
    assert message.endswith("keeping the route read before")
    assert status["route"] == read_before
    assert status["readableQueues"] == 8
    assert configmap(api, ns, name) == published  # the same generation, the same bytes
    assert condition(status_of(api, ns, name), "Ready")["status"] == "True"

    # Back under the bounds: the route read is taken and the group follows it.
    name_server.body = route(12)
    grown = wait_generation(api, ns, name, first.generation + 1)
    assert sum(len(qs) for qs in grown.topics[name].values()) == 12
    assert condition(topic_status(api, ns, name), "RouteAvailable")["reason"] == "Read"


def test_a_group_over_its_queue_bound_is_invalid_and_keeps_its_assignment(testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "bounded-group"
    # Topics at the per-topic bound (64 x 64 queues): the schema takes each, the group not five.
    brokers = [{"name": f"b{i:02d}", "readQueueNums": 64, "writeQueueNums": 64} for i in range(64)]
    topics = [f"{name}-{i}" for i in range(MAX_QUEUES_PER_GROUP // MAX_QUEUES_PER_TOPIC + 1)]
    for topic in topics:
        apply_topic(api, ns, topic, brokers)
    labels = {"app": name}
    kubelet.start_pods(api, ns, name, 3, labels, testbed.nodes)
    spec = {"selector": {"matchLabels": labels}, "debounceSeconds": 0}
    apply_group(api, ns, name, {**spec, "topics": topics[:1]})
    first = wait_generation(api, ns, name, 1)
    published = configmap(api, ns, name)

    apply_group(api, ns, name, {**spec, "topics": topics})

    def invalid() -> dict[str, Any] | None:
        status = status_of(api, ns, name)
        c = condition(status, "Invalid")
        return status if (c.get("status"), c.get("reason")) == ("True", "TooManyQueues") else None

    status = wait_for("the group to be Invalid with TooManyQueues", invalid)
    assert condition(status, "Invalid")["message"] == (
        "the group's topics have 20480 read queues, over the bound of 16384 queues per group "
        "(docs/operator.md, Bounds)"
    )
    assert status["assignmentGeneration"] == first.generation
    assert configmap(api, ns, name) == published

    # Back under the bound, with a topic more than before: published again.
    apply_group(api, ns, name, {**spec, "topics": topics[:2]})
    second = wait_generation(api, ns, name, first.generation + 1)
    assert (
        sum(len(qs) for topic in topics[:2] for qs in second.topics[topic].values())
        == 2 * MAX_QUEUES_PER_TOPIC
    )
    assert condition(status_of(api, ns, name), "Invalid")["status"] == "False"
