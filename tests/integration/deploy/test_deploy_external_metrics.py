"""The chart's external metrics switch: the operator's listener, its Service, the APIService whose
caBundle signs the Secret's certificate, and the RoleBinding to the API server's front-proxy CA."""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography import x509

from mqbalance.operator.main import parse_args
from tests.integration.deploy.deploy_support import CHART, render, run_helm

ON = ["--set", "operator.externalMetrics.enabled=true", "--set", "operator.lag.drainSeconds=120"]


def test_off_by_default(helm: Path) -> None:
    docs = render(helm)
    assert not [d for d in docs if "external-metrics" in d["metadata"]["name"] or d["kind"] == "APIService"]


def test_on_serves_external_metrics_through_an_apiservice(helm: Path) -> None:
    assert run_helm(helm, "lint", "--strict", str(CHART), *ON).returncode == 0
    docs = render(helm, *ON)
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    secret = named[("Secret", "mq-mqbalance-external-metrics")]
    service = named[("Service", "mq-mqbalance-external-metrics")]
    apiservice = named[("APIService", "v1beta1.external.metrics.k8s.io")]
    binding = named[("RoleBinding", "mq-mqbalance-external-metrics-auth-reader")]

    assert apiservice["spec"]["service"] == {
        "name": "mq-mqbalance-external-metrics",
        "namespace": "mq-system",
        "port": 443,
    }
    assert apiservice["spec"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "mq-mqbalance-external-metrics.mq-system.svc" in names  # the name the aggregator checks
    assert service["spec"]["ports"][0]["targetPort"] == "ext-metrics"
    assert (binding["metadata"]["namespace"], binding["roleRef"]["name"]) == (
        "kube-system",
        "extension-apiserver-authentication-reader",
    )

    deployment = named[("Deployment", "mq-mqbalance-operator")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config = parse_args(container["args"][1:])
    assert (config.external_metrics_port, config.external_metrics_cert_dir) == (
        6443,
        "/etc/mqbalance/external-metrics",
    )
    assert config.lag_drain_seconds == 120
    assert {"name": "ext-metrics", "containerPort": 6443, "protocol": "TCP"} in container["ports"]
    assert all(len(port["name"]) <= 15 for port in container["ports"])  # the API server's limit
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["external-metrics-tls"]["secret"]["secretName"] == "mq-mqbalance-external-metrics"
