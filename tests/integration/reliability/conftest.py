"""Fixtures of the reliability tests: CRDs, zoned nodes, topics, operator processes, a generation watcher.

It reuses the helpers of ``tests.integration.operator_support`` and ``tests.integration.invariants``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from mqbalance.contract import read_topic
from mqbalance.model import MessageQueue
from tests.integration.operator_support import apply_topic
from tests.integration.reliability.reliability_support import GenerationWatcher, Rig

ZONES = ("zone-a", "zone-b", "zone-c")

# Two topics every reliability test subscribes its groups to: 2 brokers x 8 and one broker of 5
# readable queues (of 6 written: readQueueNums < writeQueueNums is allowed).
TOPICS: dict[str, list[dict[str, object]]] = {
    "orders": [
        {"name": "broker-a", "zone": "zone-a", "readQueueNums": 8, "writeQueueNums": 8},
        {"name": "broker-b", "zone": "zone-b", "readQueueNums": 8, "writeQueueNums": 8},
    ],
    "payments": [{"name": "broker-c", "zone": "zone-c", "readQueueNums": 5, "writeQueueNums": 6}],
}


@pytest.fixture(scope="module")
def nodes(cluster: LocalCluster) -> Iterator[list[str]]:
    """One node per zone."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    suffix = uuid.uuid4().hex[:6]
    names = [f"rel-{zone}-{suffix}" for zone in ZONES]
    for name, zone in zip(names, ZONES, strict=True):
        kubelet.create_node(api, name, zone)
    yield names
    for name in names:
        kubelet.delete_node(api, name)
    api.close()


def readable_queues() -> dict[str, list[MessageQueue]]:
    return {name: read_topic(name, {"brokers": b}).readable_queues() for name, b in TOPICS.items()}


@pytest.fixture
def topics(crds: None, api_client: client.ApiClient, namespace: str) -> dict[str, list[MessageQueue]]:
    for name, brokers in TOPICS.items():
        apply_topic(api_client, namespace, name, brokers)
    return readable_queues()


@pytest.fixture
def watcher(
    api_client: client.ApiClient, namespace: str, topics: dict[str, list[MessageQueue]]
) -> Iterator[GenerationWatcher]:
    """Every generation published in the test's namespace, checked as it arrives."""
    w = GenerationWatcher(api_client, namespace, topics).start()
    yield w
    w.stop()


@pytest.fixture
def start_operator(
    cluster: LocalCluster, crds: None, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Starts operators on the test's namespace, or on ``namespaces`` (none: give --all-namespaces in
    ``extra``); ``name`` separates their logs; stops them afterwards."""
    started: list[OperatorProcess] = []

    def start(
        *extra: str, name: str = "operator", wait: bool = True, namespaces: list[str] | None = None
    ) -> OperatorProcess:
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        op = OperatorProcess(cluster, [namespace] if namespaces is None else namespaces, workdir, *extra)
        started.append(op)
        op.spawn()
        if wait:
            op.wait_healthy()
        return op

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def rig(
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    topics: dict[str, list[MessageQueue]],
    watcher: GenerationWatcher,
    start_operator: Callable[..., OperatorProcess],
) -> Rig:
    """The test's namespace with its nodes, Topics, generation watcher and operator starter."""
    return Rig(api_client, namespace, nodes, topics, watcher, start_operator)
