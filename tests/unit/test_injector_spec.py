"""The sidecar container's one source (mqbalance.injector.spec), the patch the webhook sends, and the
copies that must agree with it: examples/consumer-deployment.yaml and docs/deploy.md. The chart's
helper is compared in tests/integration/deploy/test_deploy_injector_render.py (it needs helm)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mqbalance.injector.spec import (
    CONTAINER_NAME,
    GROUP_ANNOTATION,
    NAMESPACE_LABEL,
    NAMESPACE_LABEL_VALUE,
    POD_LABEL,
    TOKEN_MOUNT_PATH,
    TOKEN_VOLUME,
    ZONE_ANNOTATION,
    Refused,
    SidecarSettings,
    parse_groups,
    pod_patch,
    sidecar_container,
)
from mqbalance.listener_limits import parse_hosts
from mqbalance.sidecar.config import parse_config
from tests.unit.injector_support import apply_patch

ROOT = Path(__file__).resolve().parents[2]


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": "orders-", "namespace": "shop"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "example/orders:1"}], **spec},
    }


def test_the_example_deployment_carries_the_container_and_a_grace_period_above_the_drain() -> None:
    deployment = yaml.safe_load((ROOT / "examples" / "consumer-deployment.yaml").read_text())
    template = deployment["spec"]["template"]["spec"]
    (sidecar,) = [c for c in template["containers"] if c["name"] == CONTAINER_NAME]
    assert sidecar == sidecar_container(SidecarSettings(), "orders-consumer"), (
        "examples/consumer-deployment.yaml differs from mqbalance/injector/spec.py: "
        "run hack/render-sidecar.py"
    )
    assert template["terminationGracePeriodSeconds"] >= SidecarSettings().min_grace_period
    assert template["terminationGracePeriodSeconds"] > SidecarSettings().drainTimeoutSeconds


def test_the_docs_show_the_same_container() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"<!-- BEGIN sidecar container[^\n]*-->\n```yaml\n(.*?)```\n<!-- END", text, re.DOTALL)
    assert block is not None, (
        "docs/deploy.md lost its generated sidecar container: run hack/render-sidecar.py"
    )
    (container,) = yaml.safe_load(block.group(1))
    assert container == sidecar_container(SidecarSettings(), "orders-consumer"), (
        "docs/deploy.md differs from mqbalance/injector/spec.py: run hack/render-sidecar.py"
    )


def test_the_container_has_probes_drain_and_settings() -> None:
    settings = SidecarSettings(
        port=9000, metricsPort=9100, drainTimeoutSeconds=100, watchTopics=False, faultTolerance=True
    )
    container = sidecar_container(settings, "a,b", zone="zone-a", own_token=True)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["MQBALANCE_GROUP"] == "a,b"
    assert env["MQBALANCE_ZONE"] == "zone-a"
    assert env["MQBALANCE_NO_TOPICS"] == "true"
    assert env["MQBALANCE_FAULT_TOLERANCE"] == "true"
    assert env["MQBALANCE_SIDECAR_PORT"] == "9000"
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "mqb-metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "mqb-metrics"}
    assert container["ports"][0]["containerPort"] == 9100
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "mqbalance", "drain", "--port", "9000", "--timeout", "100",
    ]  # fmt: skip
    assert container["volumeMounts"] == [
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT_PATH, "readOnly": True}
    ]
    assert settings.min_grace_period == 115


def test_the_metrics_listen_on_the_pods_ip_and_loopback_as_the_sidecar_reads_them() -> None:
    container = sidecar_container(SidecarSettings(), "orders")
    names = [e["name"] for e in container["env"]]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # The kubelet expands $(VAR) only from variables defined earlier in the list.
    assert names.index("POD_IP") < names.index("MQBALANCE_METRICS_HOST")
    expanded = {
        name: value.replace("$(POD_IP)", "10.244.1.7")
        for name, value in env.items()
        if isinstance(value, str)
    }
    config = parse_config([], {**expanded, "POD_NAME": "orders-0", "POD_NAMESPACE": "shop"})
    assert parse_hosts(config.metrics_host) == ("10.244.1.7", "127.0.0.1")
    assert config.metrics_port == 9091


def test_settings_read_the_charts_json_and_refuse_unknown_keys() -> None:
    settings = SidecarSettings.from_json('{"image": "r/m:1", "drainTimeoutSeconds": 10}')
    assert (settings.image, settings.drainTimeoutSeconds, settings.port) == ("r/m:1", 10, 8081)
    assert SidecarSettings.from_json("") == SidecarSettings()
    with pytest.raises(ValueError, match="unknown sidecar settings"):
        SidecarSettings.from_json('{"imagePullPolicyy": "Always"}')
    with pytest.raises(ValueError, match="JSON object"):
        SidecarSettings.from_json("[]")


def test_the_patch_adds_container_token_volume_grace_period_and_label() -> None:
    settings = SidecarSettings()
    original = pod({GROUP_ANNOTATION: "orders-consumer", ZONE_ANNOTATION: "zone-b"})
    ops = pod_patch(original, settings)
    patched = apply_patch(original, ops)
    spec = patched["spec"]
    assert [c["name"] for c in spec["containers"]] == ["app", CONTAINER_NAME]
    assert spec["containers"][1] == sidecar_container(settings, "orders-consumer", "zone-b", own_token=True)
    # The token goes to the sidecar only: the application's container is untouched.
    assert spec["containers"][0] == {"name": "app", "image": "example/orders:1"}
    # A token of the pod's own ServiceAccount, bound to the pod (it names the pod to the API server,
    # which is what the admission policy confines the sidecar by), expiring and renewed by the kubelet.
    (volume,) = spec["volumes"]
    assert volume["name"] == TOKEN_VOLUME
    sources = volume["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
    assert {"key": "ca.crt", "path": "ca.crt"} in sources[1]["configMap"]["items"]
    assert "secret" not in json.dumps(volume)
    assert spec["terminationGracePeriodSeconds"] == 60
    assert patched["metadata"]["labels"] == {POD_LABEL: "true"}
    assert "serviceAccountName" not in spec  # the pod keeps its own ServiceAccount
    # The patch is JSON the API server reads (RFC 6902 paths; "/" in a label key escaped).
    labelled = pod({GROUP_ANNOTATION: "g"})
    labelled["metadata"]["labels"] = {"app": "orders"}
    ops = pod_patch(labelled, settings)
    assert {"op": "add", "path": "/metadata/labels/mqbalance.io~1sidecar", "value": "true"} in ops
    assert json.loads(json.dumps(ops)) == ops
    assert apply_patch(labelled, ops)["spec"]["containers"][1]["volumeMounts"][0]["name"] == TOKEN_VOLUME


def test_the_patch_keeps_a_longer_grace_period_and_appends_to_volumes() -> None:
    original = pod({GROUP_ANNOTATION: "g"}, terminationGracePeriodSeconds=300, volumes=[{"name": "data"}])
    patched = apply_patch(original, pod_patch(original, SidecarSettings()))
    assert patched["spec"]["terminationGracePeriodSeconds"] == 300
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["data", TOKEN_VOLUME]
    # Kubernetes' default, 30 s, is below the drain: raised.
    original = pod({GROUP_ANNOTATION: "g"}, terminationGracePeriodSeconds=30)
    patched = apply_patch(original, pod_patch(original, SidecarSettings(drainTimeoutSeconds=45)))
    assert patched["spec"]["terminationGracePeriodSeconds"] == 60


def test_pods_that_do_not_ask_or_already_have_the_sidecar_are_left_alone() -> None:
    settings = SidecarSettings()
    assert pod_patch(pod(), settings) == []
    assert pod_patch(pod({"other": "x"}), settings) == []
    once = apply_patch(pod({GROUP_ANNOTATION: "g"}), pod_patch(pod({GROUP_ANNOTATION: "g"}), settings))
    assert pod_patch(once, settings) == []  # idempotent: a second pass adds nothing


def test_a_pod_labelled_for_injection_without_a_group_is_refused() -> None:
    labelled = pod()
    labelled["metadata"]["labels"] = {NAMESPACE_LABEL: NAMESPACE_LABEL_VALUE}
    with pytest.raises(Refused, match=f"no annotation {GROUP_ANNOTATION}"):
        pod_patch(labelled, SidecarSettings())


@pytest.mark.parametrize(
    "value", ["", " , ", "Orders", "orders_consumer", "-orders", "a,a", "a,,b", "x" * 243]
)
def test_an_unusable_group_annotation_is_refused(value: str) -> None:
    with pytest.raises(Refused, match=GROUP_ANNOTATION):
        pod_patch(pod({GROUP_ANNOTATION: value}), SidecarSettings())


def test_group_lists_are_normalised() -> None:
    assert parse_groups(" orders , billing.v2 ") == "orders,billing.v2"


def test_the_injected_example_gets_the_same_pod_as_the_hand_written_one() -> None:
    injected = yaml.safe_load((ROOT / "examples" / "consumer-deployment-injected.yaml").read_text())
    written = yaml.safe_load((ROOT / "examples" / "consumer-deployment.yaml").read_text())
    template = injected["spec"]["template"]
    pod_of_template = {"metadata": template["metadata"], "spec": template["spec"]}
    patched = apply_patch(pod_of_template, pod_patch(pod_of_template, SidecarSettings()))
    (sidecar,) = [c for c in patched["spec"]["containers"] if c["name"] == CONTAINER_NAME]
    (by_hand,) = [c for c in written["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER_NAME]
    assert {k: v for k, v in sidecar.items() if k != "volumeMounts"} == by_hand
    spec = patched["spec"]
    assert (
        spec["terminationGracePeriodSeconds"]
        == written["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )
    assert patched["metadata"]["labels"][POD_LABEL] == "true"
    # The account that has the sidecar Role: the sidecar's token is the pod's own.
    assert spec["serviceAccountName"] == written["spec"]["template"]["spec"]["serviceAccountName"]
    assert patched["metadata"]["labels"][NAMESPACE_LABEL] == NAMESPACE_LABEL_VALUE
