"""Helpers of this folder's tests that run the operator against the real RocketMQ: a namespace
of consumer pods, the operator serving it, and a topic with its Topic and ConsumerGroup."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.rocketmq.server import RocketMQ
from tests.integration.operator_support import apply_group, apply_topic


@contextlib.contextmanager
def consumers_namespace(
    api: client.ApiClient, prefix: str, pods: int, labels: Mapping[str, str]
) -> Iterator[tuple[str, str]]:
    """A namespace ``prefix-…`` with ``pods`` Ready pods labelled ``labels`` on a node of its own in
    zone-a: (namespace, node). Both are deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    node = f"node-{prefix}-{uuid.uuid4().hex[:6]}"
    kubelet.create_node(api, node, "zone-a")
    kubelet.start_pods(api, name, "consumer", pods, labels, [node])
    yield name, node
    core.delete_namespace(name)
    kubelet.delete_node(api, node)


@contextlib.contextmanager
def operator_serving(
    cluster: LocalCluster, namespace: str, workdir: Path, *flags: str
) -> Iterator[OperatorProcess]:
    """The operator serving ``namespace`` with ``flags``; the end of its log printed once it stopped."""
    op = OperatorProcess(cluster, [namespace], workdir, *flags)
    op.start()
    yield op
    op.stop()
    print(op.tail(200))


def orders_group(
    api: client.ApiClient,
    rocketmq: RocketMQ,
    namespace: str,
    topic_name: str,
    queues: int,
    labels: Mapping[str, str],
    **spec: Any,
) -> str:
    """A topic named after the test with ``queues`` queues on each broker, the Topic ``orders`` that
    reads its route from the NameServer every 5 s, and the ConsumerGroup ``orders`` of the pods
    labelled ``labels`` on it (``spec`` added to its spec); the topic's name."""
    topic = topic_name[-40:].lstrip("-")
    rocketmq.create_topic(topic, queues)
    apply_topic(api, namespace, "orders", topicName=topic, nameServer={"pollSeconds": 5})
    selector = {"matchLabels": dict(labels)}
    apply_group(
        api,
        namespace,
        "orders",
        {"groupName": f"GID_{topic}", "topics": ["orders"], "selector": selector, **spec},
    )
    return topic
