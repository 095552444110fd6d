"""kwok beside the local cluster (harness/kube/kwok.py): fake nodes and pods turn Ready without kubelets,
and the operator publishes a group of them with their nodes' zones. The harness the fleet bench
(bench/bench_fleet.py) stands on, kept small: 3 nodes, 6 pods, 1 group."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.kube.kwok import Kwok, condition_true, node_body, pod_body, zone_of
from harness.kube.versions import K8S_VERSION_ENV
from harness.polling import wait_for
from tests.integration.operator_support import apply_group, apply_topic, read_document

ZONES = ("zone-a", "zone-b", "zone-c")

# The fleet bench runs against the current release; so does the smoke test of its harness.
pytestmark = pytest.mark.skipif(
    os.environ.get(K8S_VERSION_ENV, "current") not in ("", "current"),
    reason="kwok's harness is checked with the current Kubernetes release only (make test)",
)


@pytest.fixture
def kwok(cluster: LocalCluster) -> Iterator[Kwok]:
    with Kwok(cluster) as running:
        yield running


@pytest.fixture
def fake_nodes(api_client: client.ApiClient) -> Iterator[list[str]]:
    core = client.CoreV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    names = [f"kwok-{suffix}-{i}" for i in range(3)]
    try:
        for i, name in enumerate(names):
            node: Any = node_body(name, zone_of(i, ZONES))  # the client sends a dict as it is
            core.create_node(node)
        yield names
    finally:
        for name in names:
            kubelet.delete_node(api_client, name)


def test_kwok_nodes_and_pods_turn_ready_and_the_group_is_published(
    cluster: LocalCluster,
    crds: None,
    namespace: str,
    api_client: client.ApiClient,
    kwok: Kwok,
    fake_nodes: list[str],
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api_client)

    def nodes_ready() -> bool:
        return all(
            condition_true(api_client.sanitize_for_serialization(core.read_node(n))) for n in fake_nodes
        )

    wait_for("kwok to turn the fake nodes Ready", nodes_ready, 60)

    brokers: list[dict[str, Any]] = [
        {"name": f"broker-{z[-1]}", "readQueueNums": 4, "writeQueueNums": 4, "zone": z} for z in ZONES
    ]
    apply_topic(api_client, namespace, "orders", brokers)
    apply_group(
        api_client,
        namespace,
        "orders",
        {"topics": ["orders"], "selector": {"matchLabels": {"app": "orders"}}, "debounceSeconds": 0},
    )
    pods = [f"orders-{i}" for i in range(6)]
    for i, name in enumerate(pods):
        pod: Any = pod_body(name, {"app": "orders"}, fake_nodes[i % 3])
        core.create_namespaced_pod(namespace, pod)

    def pods_ready() -> bool:
        listed = api_client.sanitize_for_serialization(core.list_namespaced_pod(namespace))
        return sum(1 for pod in listed["items"] if condition_true(pod)) == len(pods)

    wait_for("kwok to turn the 6 pods Running and Ready", pods_ready, 60)

    operator = OperatorProcess(cluster, [namespace], tmp_path, "--log-level", "WARNING")
    operator.start()
    try:

        def published() -> bool:
            operator.check()
            doc = read_document(api_client, namespace, "orders")
            return doc is not None and set(doc.members) == set(pods)

        wait_for("the group published with its 6 kwok pods", published, 60)
        doc = read_document(api_client, namespace, "orders")
        assert doc is not None
        assert {doc.members[p] for p in pods} == set(ZONES)  # each pod's zone from its kwok node
    finally:
        operator.stop()
    assert kwok.running(), kwok.tail()
