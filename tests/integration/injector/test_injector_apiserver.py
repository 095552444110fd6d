"""``mqbalance injector`` against a real kube-apiserver: the injector runs as a process on loopback, a
MutatingWebhookConfiguration points the API server at ``https://127.0.0.1:PORT/mutate``, and the
injector itself makes the certificates and writes the caBundle."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from harness.apps.argv import cluster_env, mqbalance_argv
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from harness.processes.managed import ManagedProcess
from harness.processes.net import free_port
from mqbalance.injector.spec import (
    CONTAINER_NAME,
    GROUP_ANNOTATION,
    NAMESPACE_LABEL,
    NAMESPACE_LABEL_VALUE,
    POD_LABEL,
    TOKEN_VOLUME,
    SidecarSettings,
    sidecar_container,
    token_volume,
)

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
TLS_SECRET = "mq-injector-tls"


@dataclass
class Injector:
    cluster: LocalCluster
    process: ManagedProcess
    port: int
    namespace: str
    config: str
    other_namespace: str

    def secret(self) -> dict[str, Any]:
        status, body = self.cluster.request(
            "GET", f"/api/v1/namespaces/{self.namespace}/secrets/{TLS_SECRET}"
        )
        assert status == 200, body
        return dict(body)

    def ca_pem(self) -> bytes:
        return base64.b64decode(self.secret()["data"]["ca.crt"])

    def served_cert(self) -> bytes:
        """The DER certificate the injector serves now."""
        context = ssl.create_default_context(cadata=self.ca_pem().decode())
        context.check_hostname = False
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=scaled(10)) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der

    def post(self, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
        """A request to the webhook as the API server sends it, trusting the injector's CA."""
        context = ssl.create_default_context(cadata=self.ca_pem().decode())
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.port}/mutate", data=body, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=scaled(10), context=context) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def create_pod(
        self,
        namespace: str,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        **spec: Any,
    ) -> tuple[int, Any]:
        """A pod; ``labels`` default to the opt-in label (``{}``: none)."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "consumer-",
                "annotations": annotations or {},
                "labels": {NAMESPACE_LABEL: NAMESPACE_LABEL_VALUE} if labels is None else labels,
            },
            # The ServiceAccount admission plugin (off here) would set it: a projected token needs it.
            "spec": {
                "serviceAccountName": "default",
                "containers": [{"name": "app", "image": "example/orders:1"}],
                **spec,
            },
        }
        return self.cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)


def _label(cluster: LocalCluster, namespace: str, labels: dict[str, str]) -> None:
    status, body = cluster.request(
        "PATCH", f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": labels}}
    )
    assert status == 200, body


@contextlib.contextmanager
def _start(cluster: LocalCluster, namespace: str, tmp_path: Path, *extra: str) -> Iterator[Injector]:
    """A labelled namespace (``namespace``), an unlabelled one, a webhook configuration for both that
    only namespaces of this test can match, and the injector serving it."""
    run = uuid.uuid4().hex[:8]
    config = f"mqbalance-injector-test-{run}"
    other = f"injector-unlabelled-{run}"
    status, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": other}})
    assert status == 201, body
    # Both carry the run's label; only the first opts in.
    _label(cluster, namespace, {"mqbalance.io/injector-test": run, NAMESPACE_LABEL: "enabled"})
    _label(cluster, other, {"mqbalance.io/injector-test": run})
    port = free_port()
    hook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": config},
        "webhooks": [
            {
                "name": "sidecar.injector.mqbalance.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchLabels": {"mqbalance.io/injector-test": run, NAMESPACE_LABEL: "enabled"}
                },
                "objectSelector": {"matchLabels": {NAMESPACE_LABEL: NAMESPACE_LABEL_VALUE}},
            }
        ],
    }
    status, body = cluster.request("POST", WEBHOOKS, hook)
    assert status == 201, body
    process = ManagedProcess(
        "injector",
        mqbalance_argv(
            "injector",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={namespace}",
            f"--secret={TLS_SECRET}",
            f"--webhook-config={config}",
            "--hosts=127.0.0.1",
            "--host=127.0.0.1",
            f"--port={port}",
            *extra,
        ),
        cluster_env(cluster),
        tmp_path / "injector.log",
    )
    process.spawn()
    injector = Injector(cluster, process, port, namespace, config, other)
    try:
        yield injector
    finally:
        process.stop()
        cluster.request("DELETE", f"{WEBHOOKS}/{config}")
        cluster.request("DELETE", f"/api/v1/namespaces/{other}/pods", None)
        cluster.request("DELETE", f"/api/v1/namespaces/{other}")


CAP = 8
READ_TIMEOUT = 2


@pytest.fixture
def injector(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[Injector]:
    # The API server's calls within small listener limits (the defaults: 64, 10 s).
    limits = (f"--max-connections={CAP}", f"--read-timeout={READ_TIMEOUT}")
    with _start(cluster, namespace, tmp_path, *limits) as running:
        yield running


def _ca_bundle_published(injector: Injector) -> bool:
    injector.process.check()
    status, body = injector.cluster.request("GET", f"{WEBHOOKS}/{injector.config}")
    if status != 200:
        return False
    published = body["webhooks"][0]["clientConfig"].get("caBundle")
    return bool(published) and base64.b64decode(published) == injector.ca_pem()


def _create_injected(injector: Injector, annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    """Create the pod once the API server reaches the injector (a just-written caBundle takes a moment
    to reach the API server's webhook client; until then the Fail policy refuses the pod)."""

    def attempt() -> dict[str, Any] | None:
        injector.process.check()
        status, body = injector.create_pod(injector.namespace, annotations, **spec)
        if status == 201:
            return dict(body)
        assert status >= 500 or "failed calling webhook" in str(body), body
        return None

    return wait_for("the API server to create a pod through the injector", attempt, timeout=60, interval=0.5)


def _holds(actual: Any, expected: Any) -> bool:
    """``actual`` is ``expected`` with defaults added: every key set, every list item in order."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _holds(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_holds(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


def _names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"]["containers"]]


def test_annotated_pods_in_labelled_namespaces_get_the_sidecar_and_nothing_else_changes(
    injector: Injector,
) -> None:
    wait_for("the injector to write the caBundle", lambda: _ca_bundle_published(injector), timeout=60)
    pod = _create_injected(injector, {GROUP_ANNOTATION: "orders-consumer"})
    assert _names(pod) == ["app", CONTAINER_NAME]
    sidecar = pod["spec"]["containers"][1]
    expected = sidecar_container(SidecarSettings(), "orders-consumer", own_token=True)
    # The API server fills in defaults (probe timeouts, a fieldRef's apiVersion...): all we set is there.
    assert _holds(sidecar, expected), f"{sidecar}\nlacks some of\n{expected}"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 60  # above the 45 s drain, not the default 30
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == TOKEN_VOLUME]
    assert _holds(volume, token_volume())  # a projected token of the pod's own account, bound to the pod
    assert pod["metadata"]["labels"][POD_LABEL] == "true"
    assert "volumeMounts" not in pod["spec"]["containers"][0]  # the application gets no token of ours

    # A pod that does not opt in by label, or a namespace that did not: never sent to the injector.
    status, plain = injector.create_pod(injector.namespace, {GROUP_ANNOTATION: "orders-consumer"}, labels={})
    assert status == 201, plain
    assert _names(plain) == ["app"]
    assert plain["spec"]["terminationGracePeriodSeconds"] == 30
    status, elsewhere = injector.create_pod(injector.other_namespace, {GROUP_ANNOTATION: "orders-consumer"})
    assert status == 201, elsewhere
    assert _names(elsewhere) == ["app"]

    # A pod that already carries the sidecar is left as it is.
    own = {"name": CONTAINER_NAME, "image": "mqbalance/mqbalance:custom"}
    status, carried = injector.create_pod(
        injector.namespace,
        {GROUP_ANNOTATION: "orders-consumer"},
        containers=[{"name": "app", "image": "example/orders:1"}, own],
    )
    assert status == 201, carried
    assert [c["image"] for c in carried["spec"]["containers"]] == [
        "example/orders:1",
        "mqbalance/mqbalance:custom",
    ]

    # A pod whose annotation names no valid group, or none at all, is refused, saying why.
    for asked in ({GROUP_ANNOTATION: "Orders_Consumer"}, {}):
        status, refused = injector.create_pod(injector.namespace, asked)
        assert status == 400, refused
        assert GROUP_ANNOTATION in refused["message"]


def test_a_bad_admission_review_gets_a_4xx_json_error(injector: Injector) -> None:
    wait_for("the injector to write the caBundle", lambda: _ca_bundle_published(injector), timeout=60)

    def answered() -> tuple[int, Any] | None:
        injector.process.check()
        try:
            return injector.post(b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}')
        except (ConnectionError, urllib.error.URLError):
            return None  # not listening yet

    status, body = wait_for("the injector to answer", answered, timeout=60)
    assert status == 400
    assert body["status"] == 400
    assert "admission.k8s.io/v1" in body["error"]
    status, body = injector.post(b"not json")
    assert (status, body["status"]) == (400, 400)
    status, body = injector.post(b"{}", content_type="text/plain")
    assert status == 415
    status, body = injector.post(b"[" * 100_000)
    assert (status, body["status"]) == (400, 400)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    request = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": {"metadata": "x"}}
    status, body = injector.post(json.dumps({**review, "request": request}).encode())
    assert (status, body["status"]) == (400, 400)
    assert "object.metadata" in body["error"]


def test_the_webhook_listener_cuts_off_silent_and_surplus_connections(injector: Injector) -> None:
    wait_for("the injector to write the caBundle", lambda: _ca_bundle_published(injector), timeout=60)
    wait_for("the injector to listen", lambda: _answers(injector), timeout=60)
    context = ssl.create_default_context(cadata=injector.ca_pem().decode())
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", injector.port), timeout=scaled(20)) as silent:
        assert silent.recv(1) == b""  # no TLS handshake within the read timeout: closed
    assert time.monotonic() - began >= READ_TIMEOUT
    conns = []
    for _ in range(2 * CAP + 4):
        raw = socket.create_connection(("127.0.0.1", injector.port), timeout=scaled(20))
        conns.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
    try:
        for tls in conns[: CAP + 4]:  # the oldest made room for the newest
            assert tls.recv(1) == b""
        for tls in conns[CAP + 4 :]:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert tls.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for tls in conns:
            tls.close()


def _answers(injector: Injector) -> bool:
    injector.process.check()
    try:
        return injector.post(b"{}")[0] == 400
    except (ConnectionError, urllib.error.URLError):
        return False


def _serves(injector: Injector, der: bytes) -> bool:
    # The caBundle is written before the server listens: refused until it does.
    injector.process.check()
    try:
        return injector.served_cert() == der
    except ConnectionError:
        return False


def test_the_serving_certificate_is_renewed_and_the_api_server_keeps_trusting_it(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    # A 24 s serving certificate is renewed 16 s after it was made; the CA stays (its lifetime is 1 day).
    with _start(cluster, namespace, tmp_path, "--cert-days=0.0003", "--ca-days=1") as injector:
        wait_for("the injector to write the caBundle", lambda: _ca_bundle_published(injector), timeout=60)
        first = base64.b64decode(injector.secret()["data"]["tls.crt"])
        ca = injector.ca_pem()
        first_der = x509.load_pem_x509_certificate(first).public_bytes(Encoding.DER)
        wait_for("the first certificate to be served", lambda: _serves(injector, first_der), timeout=30)

        def renewed() -> bytes | None:
            injector.process.check()
            current = base64.b64decode(injector.secret()["data"]["tls.crt"])
            return current if current != first else None

        second = wait_for("the injector to renew its serving certificate", renewed, timeout=60, interval=0.5)
        assert injector.ca_pem() == ca  # same CA: the caBundle did not have to change
        second_der = x509.load_pem_x509_certificate(second).public_bytes(Encoding.DER)
        wait_for("the renewed certificate to be served", lambda: _serves(injector, second_der), timeout=30)
        pod = _create_injected(injector, {GROUP_ANNOTATION: "orders-consumer"})
        assert _names(pod) == ["app", CONTAINER_NAME]
