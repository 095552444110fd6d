"""Fixtures of the operator's integration tests: CRDs, a module namespace, zoned nodes, the operator,
sidecars."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from harness.apps.operator import OperatorProcess
from harness.apps.sidecar import SidecarProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for

ZONES = ("zone-a", "zone-b", "zone-c")


@pytest.fixture(scope="module")
def module_api(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="module")
def module_namespace(
    cluster: LocalCluster, module_api: client.ApiClient, request: pytest.FixtureRequest
) -> Iterator[str]:
    """One namespace for the whole module (one operator serves it)."""
    base = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")[:40]
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(module_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture(scope="module")
def zone_nodes(module_api: client.ApiClient) -> Iterator[dict[str, str]]:
    """Two nodes in each of three zones, plus one node without a zone label: node name -> zone (or '')."""
    suffix = uuid.uuid4().hex[:6]
    nodes: dict[str, str] = {}
    for zone in ZONES:
        for i in range(2):
            name = f"node-{zone}-{i}-{suffix}"
            kubelet.create_node(module_api, name, zone)
            nodes[name] = zone
    bare = f"node-nozone-{suffix}"
    kubelet.create_node(module_api, bare, None)
    nodes[bare] = ""
    yield nodes
    for name in nodes:
        kubelet.delete_node(module_api, name)


@pytest.fixture(scope="module")
def operator_process(
    cluster: LocalCluster, crds: None, module_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    workdir: Path = tmp_path_factory.mktemp("operator")
    op = OperatorProcess(cluster, [module_namespace], workdir)
    op.start()
    yield op
    op.stop()
    # Print the operator's log when something in the module failed (pytest shows captured output).
    print(op.tail(200))


@dataclass(frozen=True)
class Testbed:
    """What most operator tests work with (the ``testbed`` fixture): the module's API client and
    namespace, its zoned nodes (node -> zone, "" for the node without one) and the running operator."""

    api: client.ApiClient
    ns: str
    zone_nodes: dict[str, str]
    operator: OperatorProcess

    @property
    def nodes(self) -> list[str]:
        """The nodes that have a zone."""
        return [n for n, z in self.zone_nodes.items() if z]


@pytest.fixture
def testbed(
    module_api: client.ApiClient,
    module_namespace: str,
    zone_nodes: dict[str, str],
    operator_process: OperatorProcess,
) -> Testbed:
    return Testbed(module_api, module_namespace, zone_nodes, operator_process)


__all__ = ["ZONES", "Testbed", "wait_for"]


@pytest.fixture
def sidecars(
    cluster: LocalCluster, module_namespace: str, tmp_path: Path
) -> Iterator[dict[str, SidecarProcess]]:
    """``sidecars(pod, group)`` starts the sidecar of a pod of ``group`` (no topics); all stop after."""
    started: dict[str, SidecarProcess] = {}

    def start(pod: str, group: str) -> SidecarProcess:
        proc = SidecarProcess(
            cluster.kubeconfig,
            tmp_path / f"sidecar-{pod}.log",
            "--pod-name", pod, "--namespace", module_namespace, "--group", group, "--no-topics",
        )  # fmt: skip
        proc.start()
        started[pod] = proc
        return proc

    started_fn: Any = start
    yield started_fn
    for proc in started.values():
        proc.stop()
