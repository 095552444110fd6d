"""Fixtures for tests against a real local control plane (see docs/local-cluster.md).

One cluster serves the whole test session; each test gets a fresh namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from harness.apps.sidecar import SidecarProcess
from harness.kube.cluster import CRD_NAMES, LocalCluster

_HERE = Path(__file__).resolve().parent
REPO = _HERE.parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees every collected item, not only this folder's.
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """A running etcd + kube-apiserver + kube-controller-manager, shared by the session."""
    with LocalCluster() as running:
        yield running


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster) -> None:
    """The project's CustomResourceDefinitions, applied once and Established."""
    cluster.apply_crds(REPO / "crds", CRD_NAMES)


def _client(cluster: LocalCluster) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    return api


@pytest.fixture
def api_client(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """A synchronous kubernetes ApiClient for the session cluster (admin token)."""
    api = _client(cluster)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; deleted afterwards without waiting for it to go."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base or 't'}-{uuid.uuid4().hex[:6]}"
    api = _client(cluster)
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        yield name
    finally:
        try:
            _release_pods(core, name)
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        finally:
            api.close()


def _release_pods(core: client.CoreV1Api, namespace: str) -> None:
    # With no kubelet, bound pods (and pods held by a finalizer) would keep the namespace
    # Terminating for ever: drop finalizers and delete the pods with grace period 0 first.
    pod: Any
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.metadata.finalizers:
            core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": None}})
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)


@pytest.fixture
def start_sidecar(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[..., SidecarProcess]]:
    """Starts ``mqbalance sidecar ARGS`` with the cluster's kubeconfig; stops them all afterwards."""
    started: list[SidecarProcess] = []

    def start(*args: str) -> SidecarProcess:
        proc = SidecarProcess(cluster.kubeconfig, tmp_path / f"sidecar-{len(started)}.log", *args)
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        proc.stop()
