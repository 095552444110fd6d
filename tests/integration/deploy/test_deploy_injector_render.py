"""The chart's injector objects and the sidecar helper, rendered by helm (no cluster): the helper renders
the container of mqbalance/injector/spec.py, the Deployment passes the same settings to the webhook, and
the webhook configuration can never hold up kube-system or the injector's own pods."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mqbalance.injector.main import SETTINGS_ENV, parse_args
from mqbalance.injector.spec import NAMESPACE_LABEL, SidecarSettings, sidecar_container
from tests.integration.deploy.deploy_support import (
    CHART,
    assert_values_refused,
    by_kind,
    documents,
    render,
    run_helm,
)

ON = ["--set", "injector.enabled=true", "--set", "sidecar.namespaces={shop,billing}"]


def helper_container(helm: Path, tmp_path: Path, values: list[str], zone: str = "") -> dict[str, Any]:
    """The container the chart's helper renders into a depending chart's Deployment."""
    parent = tmp_path / "consumer"
    if parent.exists():
        shutil.rmtree(parent)
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: consumer\nversion: 1.0.0\n")
    shutil.copytree(CHART, parent / "charts" / "mqbalance")
    zone_arg = f' "zone" "{zone}"' if zone else ""
    (parent / "templates" / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: orders\nspec:\n  template:\n    spec:\n"
        "      containers:\n"
        '        {{- include "mqbalance.sidecar.container" (dict "root" .Subcharts.mqbalance'
        f' "group" "orders"{zone_arg}) | nindent 8 }}}}\n'
    )
    prefixed = [v if v == "--set" else f"mqbalance.{v}" for v in values]
    out = run_helm(
        helm, "template", "shop", str(parent), "--show-only", "templates/deployment.yaml", *prefixed
    )
    (deployment,) = documents(out.stdout)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.parametrize(
    ("values", "settings", "zone"),
    [
        ([], SidecarSettings(), ""),
        (
            [
                "--set", "sidecar.port=9000",
                "--set", "sidecar.metricsPort=9100",
                "--set", "sidecar.drainTimeoutSeconds=100",
                "--set", "sidecar.watchTopics=false",
                "--set", "sidecar.faultTolerance=true",
                "--set", "sidecar.faultTable=4x",
                "--set", "image.tag=9.9.9",
                "--set", "image.pullPolicy=Always",
            ],
            SidecarSettings(
                image="mqbalance/mqbalance:9.9.9",
                imagePullPolicy="Always",
                port=9000,
                metricsPort=9100,
                drainTimeoutSeconds=100,
                watchTopics=False,
                faultTolerance=True,
                faultTable="4x",
            ),
            "zone-a",
        ),
    ],
)  # fmt: skip
def test_the_chart_helper_renders_the_one_source(
    helm: Path, tmp_path: Path, values: list[str], settings: SidecarSettings, zone: str
) -> None:
    rendered = helper_container(helm, tmp_path, values, zone)
    assert rendered == sidecar_container(settings, "orders", zone or None), (
        "charts/mqbalance/templates/_helpers.tpl (mqbalance.sidecar.container) differs from "
        "mqbalance/injector/spec.py"
    )


def test_the_injector_gets_the_same_sidecar_settings_and_valid_arguments(
    helm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = ["--set", "sidecar.drainTimeoutSeconds=20", "--set", "image.tag=1.2.3"]
    docs = render(helm, *ON, *extra)
    (deployment,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-injector")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    command, *args = container["args"]
    assert command == "injector"
    # The injector reads its settings from the environment the chart gives it, as in its pod.
    monkeypatch.setenv(SETTINGS_ENV, str(env[SETTINGS_ENV]))
    config = parse_args([a.replace("$(POD_NAMESPACE)", "mq-system") for a in args])
    assert config.settings.image == "mqbalance/mqbalance:1.2.3"
    assert config.settings.drainTimeoutSeconds == 20
    # What the webhook adds is what the helper renders with the same values.
    assert sidecar_container(config.settings, "orders") == helper_container(helm, tmp_path, extra)
    # Pods of these accounts get the sidecar Role in each consumer namespace; others are warned.
    assert config.accounts == {"mq-mqbalance-sidecar"}
    assert config.hosts == ("mq-mqbalance-injector.mq-system.svc",)
    # It listens on the pod's IP, which the kubelet expands from the env var before the arguments.
    assert config.host == "$(POD_IP)"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert config.secret == "mq-mqbalance-injector-tls"
    assert config.webhook_config == "mq-mqbalance-injector"
    assert pod["serviceAccountName"] == "mq-mqbalance-injector"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # Its own pods never carry the opt-in label.
    assert pod_labels(deployment)["mqbalance.io/sidecar-injection"] == "disabled"
    # Two replicas by default, spread over nodes, and a disruption budget: a drain takes one at a time.
    assert deployment["spec"]["replicas"] == 2
    (preferred,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    spread = preferred["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert set(spread.items()) <= set(pod_labels(deployment).items())
    (budget,) = by_kind(docs, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert set(budget["spec"]["selector"]["matchLabels"].items()) <= set(pod_labels(deployment).items())
    single = render(helm, *ON, "--set", "injector.replicas=1")
    assert not by_kind(single, "PodDisruptionBudget")
    accounts = render(helm, *ON, "--set", "sidecar.serviceAccounts={orders-app}")
    (deployment,) = [d for d in by_kind(accounts, "Deployment") if d["metadata"]["name"].endswith("injector")]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--sidecar-service-account")] == [
        "--sidecar-service-account=mq-mqbalance-sidecar",
        "--sidecar-service-account=orders-app",
    ]


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def test_the_webhook_configuration_is_opt_in_and_spares_system_and_own_pods(helm: Path) -> None:
    docs = render(helm, *ON)
    (config,) = by_kind(docs, "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Fail"
    assert "caBundle" not in hook["clientConfig"]  # the injector writes it; Helm never resets it
    assert hook["clientConfig"]["service"] == {
        "name": "mq-mqbalance-injector", "namespace": "mq-system", "path": "/mutate", "port": 443,
    }  # fmt: skip
    assert hook["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
         "scope": "Namespaced"}
    ]  # fmt: skip
    selector = hook["namespaceSelector"]
    assert selector["matchLabels"] == {NAMESPACE_LABEL: "enabled"}
    (names,) = selector["matchExpressions"]
    assert names["key"] == "kubernetes.io/metadata.name"
    assert names["operator"] == "NotIn"
    assert {"kube-system", "mq-system"} <= set(names["values"])
    # Pods opt in by label too: no other pod of a labelled namespace waits on the injector.
    assert hook["objectSelector"] == {"matchLabels": {NAMESPACE_LABEL: "enabled"}}
    (ignore,) = by_kind(
        render(helm, *ON, "--set", "injector.failurePolicy=Ignore"), "MutatingWebhookConfiguration"
    )
    assert ignore["webhooks"][0]["failurePolicy"] == "Ignore"


def test_injector_rbac_is_its_secret_and_its_webhook_configuration_only(helm: Path) -> None:
    docs = render(helm, *ON)
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "mq-mqbalance-injector"]
    assert role["metadata"]["namespace"] == "mq-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mq-mqbalance-injector-tls"],
         "verbs": ["get", "update"]}
    ]  # fmt: skip
    (cluster_role,) = [
        r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "mq-mqbalance-injector"
    ]
    assert cluster_role["rules"] == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": ["mq-mqbalance-injector"], "verbs": ["get", "patch"]}
    ]  # fmt: skip
    # No token Secret (a token that never expires and names no pod): a sidecar uses its pod's own.
    (secret,) = by_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "mq-mqbalance-injector-tls"
    assert "data" not in secret


def test_injector_is_off_by_default_and_lints_on(helm: Path) -> None:
    assert not [d for d in render(helm) if "injector" in d["metadata"]["name"]]
    result = run_helm(helm, "lint", "--strict", str(CHART), *ON)
    assert "0 chart(s) failed" in result.stdout
    every_object = render(helm, *ON)
    for doc in every_object:
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "mq", doc["metadata"]["name"]
    assert json.dumps(every_object)  # plain data


def test_values_schema_rejects_bad_injector_values(helm: Path) -> None:
    assert_values_refused(
        helm,
        [
            ("injector.failurePolicy=Sometimes", "injector.failurePolicy"),
            ("injector.timeoutSeconds=31", "injector.timeoutSeconds"),
            ("injector.enable=true", "enable"),
        ],
    )
