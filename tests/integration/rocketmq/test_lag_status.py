"""Lag where people look, from a real broker through the real operator and API server.

The operator reads the group's offsets from the shared RocketMQ every second (``--lag-interval``):
``status.lag``, the ``Lag`` printer column and the lag metrics show the messages waiting. A broker
that stops answering (SIGSTOP: its connections stay open, nothing answers) turns condition
LagAvailable False with reason BrokerUnreachable while the published assignment stays and the
group still rebalances; once it answers again the condition turns True.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from harness.rocketmq.server import RocketMQ
from tests.integration.operator_support import (
    condition,
    status_of,
    wait_generation,
)
from tests.integration.rocketmq.rocketmq_support import consumers_namespace, operator_serving, orders_group

POD_LABELS = {"app": "lagged"}


@pytest.fixture(scope="module")
def lag_namespace(cluster: LocalCluster, crds: None, api: client.ApiClient) -> Iterator[tuple[str, str]]:
    with consumers_namespace(api, "lag", 2, POD_LABELS) as namespace_and_node:
        yield namespace_and_node


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    rocketmq: RocketMQ,
    lag_namespace: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    workdir = tmp_path_factory.mktemp("operator-lag")
    flags = [
        "--name-server",
        rocketmq.namesrv_addr,
        "--lag-interval",
        "1",
        "--lag-timeout",
        "1",
        "--lag-queue-metrics",
    ]
    with operator_serving(cluster, lag_namespace[0], workdir, *flags) as op:
        yield op


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_status_column_and_metrics_show_lag_and_an_unreachable_broker_is_a_condition(
    cluster: LocalCluster,
    api: client.ApiClient,
    rocketmq: RocketMQ,
    lag_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace, node = lag_namespace
    topic = orders_group(api, rocketmq, namespace, topic_name, 2, POD_LABELS)  # 2 queues on each broker
    first = wait_generation(api, namespace, "orders", 1)
    assert sum(len(qs) for qs in first.topics[topic].values()) == 4
    rocketmq.send(topic, 40)
    stored = rocketmq.stored(topic)  # 40, unless under load a send was retried (twice) or failed (none)
    assert stored > 0

    # Nobody consumed: every message is lag (as consumerProgress shows a group that never committed).
    def lag_of(total: int) -> dict[str, Any] | None:
        status = status_of(api, namespace, "orders")
        lag = status.get("lag") or {}
        return status if lag.get("total") == total and lag.get("queues") == 4 else None

    status = wait_for(f"status.lag.total {stored}", lambda: lag_of(stored), 60)
    assert condition(status, "LagAvailable")["status"] == "True"
    behind = status["lag"]["mostBehind"]
    assert {m["member"] for m in behind} <= set(first.members)
    assert sum(m["lag"] for m in behind) == stored
    assert condition(status, "Ready")["status"] == "True"

    table = cluster.kubectl("get", "consumergroups", "-n", namespace).stdout.splitlines()
    header = table[0].split()
    assert "LAG" in header
    assert table[1].split()[header.index("LAG")] == str(stored)

    def metrics_show_lag() -> str | None:
        text = operator.metrics_text()
        lag = metric(text, "mqbalance_group_lag", namespace=namespace, group="orders")
        return text if lag == stored else None

    text = wait_for(f"mqbalance_group_lag {stored}", metrics_show_lag, 30)
    members = [metric(text, "mqbalance_member_lag", namespace=namespace, member=m) for m in first.members]
    assert sum(v or 0 for v in members) == stored
    queues = [
        metric(text, "mqbalance_queue_lag", namespace=namespace, broker=b, queue=str(q))
        for b in ("broker-a", "broker-b")
        for q in (0, 1)
    ]
    assert sum(v or 0 for v in queues) == stored
    assert metric(text, "mqbalance_group_lag_available", namespace=namespace, group="orders") == 1

    # broker-b stops answering: the condition says so, the assignment stays, reconciles go on.
    pid = rocketmq.pids["broker broker-b"]
    os.kill(pid, signal.SIGSTOP)
    try:

        def unavailable() -> dict[str, Any] | None:
            status = status_of(api, namespace, "orders")
            c = condition(status, "LagAvailable")
            return status if (c.get("status"), c.get("reason")) == ("False", "BrokerUnreachable") else None

        status = wait_for("LagAvailable False (BrokerUnreachable)", unavailable, 60)
        message = condition(status, "LagAvailable")["message"]
        assert "broker-b" in message
        assert "assignment stays" in message
        assert status["assignmentGeneration"] == first.generation
        assert condition(status, "Ready")["status"] == "True"
        assert status["lag"]["brokersUnavailable"] == ["broker-b"]
        # A new member still gets its queues at once: lag polling blocks no reconcile.
        kubelet.start_pods(api, namespace, "late", 1, POD_LABELS, [node])
        later = wait_generation(api, namespace, "orders", first.generation + 1)
        assert len(later.members) == 3
    finally:
        os.kill(pid, signal.SIGCONT)

    def available() -> dict[str, Any] | None:
        status = status_of(api, namespace, "orders")
        ok = condition(status, "LagAvailable").get("status") == "True"
        return status if ok and (status.get("lag") or {}).get("total") == stored else None

    status = wait_for("LagAvailable True again", available, 60)
    assert "brokersUnavailable" not in status["lag"]
