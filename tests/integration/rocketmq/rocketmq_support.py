"""Helpers of this folder's tests that run the operator against the real RocketMQ: a namespace
of consumer pods and the operator serving it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from kubernetes import client

from harness import kubelet
from harness.cluster import LocalCluster
from harness.processes import OperatorProcess


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
