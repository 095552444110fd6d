"""helm install into the local control plane, then the operator and a sidecar run as local processes
with the tokens of the chart's ServiceAccounts: they work with exactly the RBAC the chart grants.

No kubelet runs the operator pod the chart creates (it stays Pending); the operator runs here,
authenticated as the operator ServiceAccount, which is what the pod would do.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.cluster import LocalCluster, free_port
from harness.kubelet import create_node, start_pods
from harness.polling import wait_for
from harness.processes import ManagedProcess, mqbalance_argv
from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument, configmap_name
from tests.integration.deploy.deploy_support import (
    CHART,
    REPO,
    can_i,
    run_helm,
    service_account_kubeconfig,
)

GROUP = "orders-consumer"
TIMEOUT = 60.0


@pytest.fixture
def release(cluster: LocalCluster, helm: Path, namespace: str) -> Iterator[str]:
    """The chart installed in ``namespace``, watching only that namespace, sidecars narrowed to GROUP."""
    name = f"mqb-{uuid.uuid4().hex[:6]}"
    run_helm(
        helm, "install", name, str(CHART),
        "--kubeconfig", str(cluster.kubeconfig),
        "--namespace", namespace,
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        "--set", f"sidecar.groups={{{GROUP}}}",
        "--wait=false",
    )  # fmt: skip
    try:
        yield name
    finally:
        # Cluster-scoped objects outlive the namespace: uninstall removes them.
        run_helm(helm, "uninstall", name, "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace)


def test_install_creates_the_objects(cluster: LocalCluster, release: str, namespace: str) -> None:
    for kind, name in [
        ("deployment", f"{release}-mqbalance-operator"),
        ("serviceaccount", f"{release}-mqbalance-operator"),
        ("serviceaccount", f"{release}-mqbalance-sidecar"),
        ("role", f"{release}-mqbalance-operator"),
        ("rolebinding", f"{release}-mqbalance-operator"),
        ("role", f"{release}-mqbalance-operator-leader-election"),
        ("rolebinding", f"{release}-mqbalance-operator-leader-election"),
        ("role", f"{release}-mqbalance-sidecar"),
        ("rolebinding", f"{release}-mqbalance-sidecar"),
        ("service", f"{release}-mqbalance-metrics"),
        ("configmap", f"{release}-mqbalance-dashboard"),
    ]:
        cluster.kubectl("get", "-n", namespace, kind, name)
    cluster.kubectl("get", "clusterrole", f"{release}-mqbalance-operator")
    cluster.kubectl("get", "clusterrolebinding", f"{release}-mqbalance-operator")
    cluster.kubectl("get", "crd", "topics.mqbalance.io", "consumergroups.mqbalance.io")


def test_operator_has_what_it_needs_and_no_more(cluster: LocalCluster, release: str, namespace: str) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-operator"
    needed = [
        ("list", "topics.mqbalance.io"),
        ("watch", "topics.mqbalance.io"),
        ("list", "consumergroups.mqbalance.io"),
        ("watch", "consumergroups.mqbalance.io"),
        ("patch", "consumergroups.mqbalance.io"),
        ("list", "pods"),
        ("watch", "pods"),
        ("get", "configmaps"),
        ("create", "configmaps"),
        ("update", "configmaps"),
        ("watch", "configmaps"),
        ("create", "events"),
    ]
    for verb, resource in needed:
        assert can_i(cluster, sa, verb, resource, namespace), f"operator cannot {verb} {resource}"
    for resource in ("topics.mqbalance.io", "consumergroups.mqbalance.io"):
        assert can_i(cluster, sa, "patch", resource, namespace, "status"), (
            f"operator cannot patch {resource} status"
        )
        assert not can_i(cluster, sa, "update", resource, namespace, "status")
    assert can_i(cluster, sa, "update", "consumergroups.mqbalance.io", namespace, "finalizers")
    for verb, resource in [("list", "nodes"), ("watch", "nodes")]:
        assert can_i(cluster, sa, verb, resource, None), f"operator cannot {verb} {resource}"
    for verb, resource in [("list", "namespaces"), ("list", "customresourcedefinitions")]:
        assert not can_i(cluster, sa, verb, resource, None), f"operator may {verb} {resource}: not needed"
    forbidden = [
        ("delete", "configmaps", namespace),
        ("get", "secrets", namespace),
        ("create", "pods", namespace),
        ("delete", "pods", namespace),
        ("update", "topics.mqbalance.io", namespace),
        ("delete", "consumergroups.mqbalance.io", namespace),
        ("list", "pods", "default"),  # it watches only its namespace
        ("create", "configmaps", "default"),
        ("patch", "nodes", None),
    ]
    for verb, resource, ns in forbidden:
        assert not can_i(cluster, sa, verb, resource, ns), f"operator may {verb} {resource} in {ns}"


def test_operator_may_hold_its_lease_and_no_other(
    cluster: LocalCluster, release: str, namespace: str
) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-operator"
    lease = f"leases.coordination.k8s.io/{release}-mqbalance-operator"
    for verb in ("get", "update"):
        assert can_i(cluster, sa, verb, lease, namespace), f"operator cannot {verb} its Lease"
    # create cannot be narrowed to a name by RBAC: allowed for Leases of the release namespace only.
    assert can_i(cluster, sa, "create", "leases.coordination.k8s.io", namespace)
    other = "leases.coordination.k8s.io/someone-else"
    forbidden = [
        ("get", other, namespace),
        ("update", other, namespace),
        ("patch", lease, namespace),
        ("delete", lease, namespace),
        ("list", "leases.coordination.k8s.io", namespace),
        ("watch", "leases.coordination.k8s.io", namespace),
        ("create", "leases.coordination.k8s.io", "default"),
        ("get", lease, "default"),
        ("update", "leases.coordination.k8s.io/kube-controller-manager", "kube-system"),
    ]
    for verb, resource, ns in forbidden:
        assert not can_i(cluster, sa, verb, resource, ns), f"operator may {verb} {resource} in {ns}"


def test_sidecar_can_read_its_assignment_and_topics_only(
    cluster: LocalCluster, release: str, namespace: str
) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-sidecar"
    own = f"configmaps/{configmap_name(GROUP)}"
    for verb in ("get", "list", "watch"):
        assert can_i(cluster, sa, verb, own, namespace), f"sidecar cannot {verb} {own}"
        assert can_i(cluster, sa, verb, "topics.mqbalance.io", namespace), f"sidecar cannot {verb} topics"
    forbidden = [
        ("list", "pods"),
        ("get", "pods"),
        ("update", own),
        ("patch", own),
        ("delete", own),
        ("create", "configmaps"),
        ("get", "configmaps/other-assignment"),
        ("list", "configmaps"),  # only with a fieldSelector naming its own ConfigMap
        ("get", "secrets"),
        ("patch", "topics.mqbalance.io"),
        ("get", "consumergroups.mqbalance.io"),
    ]
    for verb, resource in forbidden:
        assert not can_i(cluster, sa, verb, resource, namespace), f"sidecar may {verb} {resource}"
    assert not can_i(cluster, sa, "list", "topics.mqbalance.io", "default")


def test_operator_and_sidecar_work_as_the_chart_service_accounts(
    cluster: LocalCluster, release: str, namespace: str, api_client: client.ApiClient, tmp_path: Path
) -> None:
    operator_config = service_account_kubeconfig(
        cluster, namespace, f"{release}-mqbalance-operator", tmp_path / "operator.kubeconfig"
    )
    sidecar_config = service_account_kubeconfig(
        cluster, namespace, f"{release}-mqbalance-sidecar", tmp_path / "sidecar.kubeconfig"
    )
    for name in ("topic.yaml", "consumergroup.yaml"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / name))
    node = f"node-{namespace}"
    create_node(api_client, node, "zone-a")
    pods = start_pods(api_client, namespace, GROUP, 2, {"app": "orders-consumer"}, [node])
    members = {f"{GROUP}-0", f"{GROUP}-1"}
    assert len(pods) == len(members)

    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    # With the chart's leader-election arguments: the Lease is taken with the chart's RBAC too.
    lease = f"{release}-mqbalance-operator"
    operator = ManagedProcess(
        "operator",
        mqbalance_argv(
            "operator", "--namespace", namespace, "--kubeconfig", str(operator_config),
            "--metrics-port", str(free_port()), f"--leader-election={lease}", "--lease-duration=15",
        ),
        {**env, "POD_NAMESPACE": namespace, "POD_NAME": f"{release}-operator-0"},
        tmp_path / "operator.log",
    )  # fmt: skip
    sidecar_port = free_port()
    sidecar = ManagedProcess(
        "sidecar",
        mqbalance_argv(
            "sidecar", "--kubeconfig", str(sidecar_config), "--port", str(sidecar_port),
            "--metrics-host", "127.0.0.1", "--metrics-port", str(free_port()),
        ),
        {**env, "POD_NAME": f"{GROUP}-0", "POD_NAMESPACE": namespace, "MQBALANCE_GROUP": GROUP},
        tmp_path / "sidecar.log",
    )  # fmt: skip
    operator.spawn()
    sidecar.spawn()
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    try:

        def published() -> AssignmentDocument | None:
            operator.check()
            try:
                cm = core.read_namespaced_config_map(configmap_name(GROUP), namespace)
            except client.exceptions.ApiException:
                return None
            doc = AssignmentDocument.decode((cm.data or {})[CONFIGMAP_KEY])
            return doc if set(doc.members) == members else None

        doc = wait_for("the operator to publish the assignment", published)

        def status() -> dict[str, Any] | None:
            body: Any = custom.get_namespaced_custom_object(
                "mqbalance.io", "v1alpha1", namespace, "consumergroups", GROUP
            )
            found: dict[str, Any] = body.get("status") or {}
            return found if found.get("assignmentGeneration") == doc.generation else None

        assert wait_for("the ConsumerGroup status", status)["members"] == 2

        def served() -> dict[str, Any] | None:
            sidecar.check()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{sidecar_port}/v1/queues", timeout=5) as resp:
                    body: dict[str, Any] = json.loads(resp.read())
            except OSError:
                return None
            return body if body.get("generation") == doc.generation else None

        view = wait_for("the sidecar to serve the assignment", served)
        assert view["queueCount"] == 6  # 12 queues over 2 members
        held = client.CoordinationV1Api(api_client).read_namespaced_lease(lease, namespace)
        assert held.spec is not None
        assert held.spec.holder_identity == f"{release}-operator-0"
    finally:
        sidecar.stop()
        operator.stop()
        core.delete_node(node)
    logs = (tmp_path / "operator.log").read_text() + (tmp_path / "sidecar.log").read_text()
    assert not re.search(r"(?<!\d)403(?!\d)", logs), logs
    assert "forbidden" not in logs.lower(), logs
