"""The operator's external.metrics.k8s.io through the real API server's aggregation layer: an
APIService to the operator's HTTPS listener, read as the HPA controller reads it."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.apps.operator import OperatorProcess
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from harness.processes.net import free_port

APISERVICE = "v1beta1.external.metrics.k8s.io"
BASE = "/apis/external.metrics.k8s.io/v1beta1"
SERVICE = "mqbalance-external-metrics"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def serving_certificate(directory: Path, host: str) -> bytes:
    """A CA and a certificate for ``host`` signed by it, as tls.crt and tls.key; the CA's PEM."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=1)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder(_name("test-ca"), _name("test-ca"), ca_key.public_key(), 1, now, later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder(ca.subject, _name(host), key.public_key(), 2, now, later)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca.public_bytes(serialization.Encoding.PEM)


def request(cluster: LocalCluster, method: str, path: str, body: Any = None) -> Any:
    status, answer = cluster.request(method, path, body)
    assert status < 300, f"{method} {path}: {status} {answer}"
    return answer


def group(
    cluster: LocalCluster, namespace: str, name: str, labels: dict[str, str], lag: dict[str, Any] | None
) -> None:
    """A ConsumerGroup in a namespace no operator serves, its status.lag written here."""
    body = {
        "apiVersion": "mqbalance.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": name, "labels": labels},
        "spec": {"groupName": name, "topics": ["orders"], "selector": {"matchLabels": {"app": name}}},
    }
    path = f"/apis/mqbalance.io/v1alpha1/namespaces/{namespace}/consumergroups"
    request(cluster, "POST", path, body)
    if lag is not None:
        request(cluster, "PATCH", f"{path}/{name}/status", {"status": {"lag": lag}})


@pytest.fixture
def served(cluster: LocalCluster, crds: None, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator with its external metrics listener, registered by an APIService."""
    operator_ns = f"mqbalance-{uuid.uuid4().hex[:6]}"
    request(cluster, "POST", "/api/v1/namespaces", {"metadata": {"name": operator_ns}})
    ca = serving_certificate(tmp_path, f"{SERVICE}.{operator_ns}.svc")
    port = free_port()
    operator = OperatorProcess(
        cluster,
        [operator_ns],
        tmp_path,
        "--external-metrics-port",
        str(port),
        "--external-metrics-host",
        "127.0.0.1",
        "--external-metrics-cert-dir",
        str(tmp_path),
        "--lag-interval",
        "0",
    )
    operator.start()
    # The API server runs on this machine: an ExternalName Service leads it to the loopback
    # listener (a cluster's APIService points at the operator's ClusterIP Service instead).
    service = {
        "metadata": {"name": SERVICE},
        "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": port}]},
    }
    request(cluster, "POST", f"/api/v1/namespaces/{operator_ns}/services", service)
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "service": {"namespace": operator_ns, "name": SERVICE, "port": port},
            "caBundle": base64.b64encode(ca).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    request(cluster, "POST", "/apis/apiregistration.k8s.io/v1/apiservices", apiservice)
    try:
        yield operator
    finally:
        cluster.request("DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        cluster.request("DELETE", f"/api/v1/namespaces/{operator_ns}")
        operator.stop()


def available(cluster: LocalCluster) -> bool:
    _, body = cluster.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
    conditions = (body.get("status") or {}).get("conditions") or [] if isinstance(body, dict) else []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def values(cluster: LocalCluster, namespace: str, metric: str, selector: str) -> dict[str, int]:
    answer = request(cluster, "GET", f"{BASE}/namespaces/{namespace}/{metric}?labelSelector={selector}")
    assert answer["kind"] == "ExternalMetricValueList"
    return {item["metricLabels"]["consumergroup"]: int(item["value"]) for item in answer["items"]}


@pytest.mark.timeout(180)
def test_hpa_reads_lag_and_recommended_members_through_the_api_server(
    cluster: LocalCluster, served: OperatorProcess, namespace: str
) -> None:
    group(
        cluster, namespace, "orders", {"app": "orders"}, {"total": 4210, "queues": 8, "recommendedMembers": 3}
    )
    group(
        cluster,
        namespace,
        "payments",
        {"app": "payments"},
        {"total": 12, "queues": 4, "recommendedMembers": 1},
    )
    group(cluster, namespace, "fresh", {"app": "orders"}, None)  # no reading yet: left out
    wait_for("the APIService to be Available", lambda: available(cluster), 60)
    # 1.20 routes the group a moment after it reports the APIService Available.
    wait_for("the API server to route the group", lambda: cluster.request("GET", BASE)[0] == 200, 30)

    resources = request(cluster, "GET", BASE)["resources"]
    assert {r["name"] for r in resources} == {
        "mqbalance_consumergroup_lag",
        "mqbalance_consumergroup_recommended_members",
    }
    assert values(cluster, namespace, "mqbalance_consumergroup_lag", "app%3Dorders") == {"orders": 4210}
    assert values(cluster, namespace, "mqbalance_consumergroup_recommended_members", "app%3Dorders") == {
        "orders": 3
    }
    every = values(cluster, namespace, "mqbalance_consumergroup_lag", "")
    assert every == {"orders": 4210, "payments": 12}
    status, _ = cluster.request("GET", f"{BASE}/namespaces/{namespace}/no_such_metric")
    assert status == 404

    # The API server authorizes the caller before it proxies: an account without RBAC on
    # external.metrics.k8s.io is refused there.
    request(
        cluster, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nobody"}}
    )
    token = cluster.service_account_token(namespace, "nobody")
    status = _get_with_token(cluster, f"{BASE}/namespaces/{namespace}/mqbalance_consumergroup_lag", token)
    assert status == 403

    # Straight to the listener, without the API server's front-proxy certificate: refused.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _get_without_client_certificate(int(served.extra[1]))


def _get_without_client_certificate(port: int) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        tls.sendall(b"GET /apis HTTP/1.1\r\nHost: x\r\n\r\n")
        if not tls.recv(1):
            raise ConnectionError("closed without an answer")


def _get_with_token(cluster: LocalCluster, path: str, token: str) -> int:
    req = urllib.request.Request(cluster.server + path, headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
