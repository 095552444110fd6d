"""helm install with the sidecar injector into the local control plane: the injector's RBAC is its
certificate Secret and its webhook configuration only, the injector run here with its ServiceAccount's
token fills the chart's Secret and writes the caBundle, ``helm upgrade`` keeps both, and the token an
injected sidecar mounts authenticates as its pod's ServiceAccount, naming the pod."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.apps.argv import mqbalance_argv
from harness.kube.cluster import LocalCluster
from harness.kube.kubelet import create_pod
from harness.polling import wait_for
from harness.processes.managed import ManagedProcess
from harness.processes.net import free_port
from mqbalance.contract import configmap_name
from tests.integration.deploy.deploy_support import (
    CHART,
    GROUP,
    assert_no_denials,
    can_i,
    installed,
    run_helm,
    service_account_kubeconfig,
    service_account_token,
)

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@pytest.fixture
def release(cluster: LocalCluster, helm: Path, namespace: str) -> Iterator[str]:
    with installed(cluster, helm, namespace, "injector.enabled=true") as name:
        yield name


def test_the_injector_may_touch_its_secret_and_its_webhook_configuration_only(
    cluster: LocalCluster, release: str, namespace: str
) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-injector"
    own_secret = f"secrets/{release}-mqbalance-injector-tls"
    own_config = f"mutatingwebhookconfigurations.admissionregistration.k8s.io/{release}-mqbalance-injector"
    for verb in ("get", "update"):
        assert can_i(cluster, sa, verb, own_secret, namespace), f"injector cannot {verb} {own_secret}"
    for verb in ("get", "patch"):
        assert can_i(cluster, sa, verb, own_config, None), f"injector cannot {verb} its webhook configuration"
    forbidden = [
        ("list", "secrets", namespace),
        ("delete", own_secret, namespace),
        ("get", "pods", namespace),
        ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/other", None),
        ("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io", None),
        ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io", None),
        ("get", "secrets", "kube-system"),
    ]
    for verb, resource, ns in forbidden:
        assert not can_i(cluster, sa, verb, resource, ns), f"injector may {verb} {resource} in {ns}"


def _get(cluster: LocalCluster, path: str) -> dict[str, Any]:
    status, body = cluster.request("GET", path)
    assert status == 200, body
    return dict(body)


def test_the_injector_fills_the_charts_secret_and_ca_bundle_and_upgrades_keep_them(
    cluster: LocalCluster, helm: Path, release: str, namespace: str, tmp_path: Path
) -> None:
    account = f"{release}-mqbalance-injector"
    secret_path = f"/api/v1/namespaces/{namespace}/secrets/{release}-mqbalance-injector-tls"
    config_path = f"{WEBHOOKS}/{release}-mqbalance-injector"
    assert not _get(cluster, secret_path).get("data")  # created empty by the chart
    kubeconfig = service_account_kubeconfig(cluster, namespace, account, tmp_path / "injector.kubeconfig")
    injector = ManagedProcess(
        "injector",
        mqbalance_argv(
            "injector",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--secret={release}-mqbalance-injector-tls",
            f"--webhook-config={release}-mqbalance-injector",
            f"--hosts={release}-mqbalance-injector.{namespace}.svc",
            "--host=127.0.0.1",
            f"--port={free_port()}",
        ),
        {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
        tmp_path / "injector.log",
    )
    injector.spawn()
    try:

        def published() -> bytes | None:
            injector.check()
            data = _get(cluster, secret_path).get("data") or {}
            hook = _get(cluster, config_path)["webhooks"][0]
            bundle = hook["clientConfig"].get("caBundle")
            return base64.b64decode(bundle) if bundle and data and bundle == data["ca.crt"] else None

        ca = wait_for("the injector to fill its Secret and the caBundle", published, timeout=60)
        assert ca.startswith(b"-----BEGIN CERTIFICATE-----")
    finally:
        injector.stop()
    assert_no_denials(injector.log.read_text())
    before = _get(cluster, secret_path)["data"]

    # Helm never sets the Secret's data nor the caBundle: an upgrade keeps what the injector wrote.
    run_helm(
        helm, "upgrade", release, str(CHART),
        "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace, "--reuse-values",
        "--set", "injector.timeoutSeconds=7",
    )  # fmt: skip
    hook = _get(cluster, config_path)["webhooks"][0]
    assert hook["timeoutSeconds"] == 7
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
    assert _get(cluster, secret_path)["data"] == before


def test_the_token_an_injected_sidecar_mounts_names_its_pod(
    cluster: LocalCluster, release: str, namespace: str
) -> None:
    """The injector mounts a projected token of the pod's ServiceAccount, which the kubelet requests
    bound to the pod; the API server gives its user the pod's name (what the admission policy confines
    the sidecar by) and, for a pod of the sidecar account, exactly the sidecar's Role."""
    account = f"{release}-mqbalance-sidecar"
    pod = create_pod(cluster.api, namespace, "orders-0", {"app": "orders"}, service_account=account)
    meta = pod["metadata"]
    bearer = service_account_token(cluster, namespace, account, pod=(meta["name"], meta["uid"]))
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": bearer}}
    status, answer = cluster.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
    assert status == 201, answer
    assert answer["status"]["authenticated"] is True
    user = answer["status"]["user"]
    assert user["username"] == f"system:serviceaccount:{namespace}:{account}"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["orders-0"]
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [meta["uid"]]
    # What that identity may do is the sidecar's Role, nothing more.
    name = user["username"]
    assert can_i(cluster, name, "watch", f"configmaps/{configmap_name(GROUP)}", namespace)
    assert not can_i(cluster, name, "list", "pods", namespace)
    assert not can_i(cluster, name, "get", "secrets", namespace)
    # The chart makes no token Secret (one that never expires and names no pod). 1.20's token
    # controller still makes one per ServiceAccount of its own accord; the chart's would carry its labels.
    path = f"/api/v1/namespaces/{namespace}/secrets?labelSelector=app.kubernetes.io/instance={release}"
    made = cluster.api.request("GET", path)["items"]
    assert not [s for s in made if s.get("type") == "kubernetes.io/service-account-token"]
