"""The product on a real node: the chart installed with the local image, the example consumer
Deployment adapted to it, and reading back what pods, the operator and the sidecars did.

Used by the real-pod tests (tests/node), the demo on real pods and the real-pod benchmark.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.apps.pods import CONSUMER_APP, pod_app_command
from harness.node.cluster import RealNode
from harness.node.images import Images
from harness.paths import REPO
from harness.polling import scaled, wait_for, work_timeout
from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument, configmap_name
from mqbalance.journal import KIND, JournalRecord

CHART = REPO / "charts" / "mqbalance"
EXAMPLES = REPO / "examples"
RELEASE = "mqbalance"
RELEASE_NAMESPACE = "mqbalance"
NAMESPACE = "shop"
"""Where the consumers, their Topic and ConsumerGroup live (the chart's sidecar namespace)."""
GROUP = "orders-consumer"
OPERATOR = f"{RELEASE}-operator"
APP_PORT = 8080


POD_START = 30.0
"""Seconds one consumer pod may take to become Ready on an unloaded node (its image already in
containerd): deadlines for N pods allow 60 s plus this for each, scaled like every wait."""


def pods_timeout(count: int) -> float:
    """The allowance, unscaled, for ``count`` pods to start and be published."""
    return work_timeout(60, POD_START, count)


def rollout_status(node: RealNode, deployment: str, namespace: str = NAMESPACE, timeout: float = 240) -> None:
    """``kubectl rollout status`` of ``deploy/<deployment>``, with ``timeout`` scaled for the machine."""
    allowed = scaled(timeout)
    wait = f"--timeout={allowed:.0f}s"
    node.kubectl("rollout", "status", "-n", namespace, f"deploy/{deployment}", wait, timeout=allowed + 20)


def helm(node: RealNode, *args: str, timeout: float = 300) -> str:
    argv = [str(node.helm), "--kubeconfig", str(node.kubeconfig), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(timeout), check=False)
    if result.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def install_chart(node: RealNode, images: Images, groups: Sequence[str] = ()) -> None:
    """``helm install`` of charts/mqbalance with the locally built image, never pulled.
    ``groups``: the chart's ``sidecar.groups`` (the sidecars may then acknowledge releases and renew
    their member Leases for these groups: spec.handover)."""
    extra = ["--set", f"sidecar.groups={{{','.join(groups)}}}"] if groups else []
    helm(
        node,
        "install", RELEASE, str(CHART),
        "--namespace", RELEASE_NAMESPACE, "--create-namespace",
        "--set", f"image.repository={images.repository}",
        "--set", f"image.tag={images.tag}",
        "--set", "image.pullPolicy=Never",
        "--set", f"sidecar.namespaces={{{NAMESPACE}}}",
        *extra,
        "--wait", "--timeout", f"{scaled(240):.0f}s",
        timeout=360,
    )  # fmt: skip


def kubectl_json(node: RealNode, *args: str) -> Any:
    return json.loads(node.kubectl(*args, "-o", "json").stdout)


def consumer_deployment(images: Images, replicas: int = 3, *, spread_zones: bool = False) -> dict[str, Any]:
    """examples/consumer-deployment.yaml with the local image, and a real consumer app.

    The app container runs harness/apps/consumer_app.py: it long-polls the sidecar and has a
    readinessProbe the test can fail; the sidecar container is the example's, unchanged but
    for the image and the pull policy. ``spread_zones``: the pods are spread evenly over the
    nodes' zones (a topology spread constraint on ``topology.kubernetes.io/zone``).
    """
    deployment: dict[str, Any] = yaml.safe_load((EXAMPLES / "consumer-deployment.yaml").read_text())
    deployment["metadata"]["namespace"] = NAMESPACE
    deployment["spec"]["replicas"] = replicas
    pod = deployment["spec"]["template"]["spec"]
    pod["serviceAccountName"] = f"{RELEASE}-sidecar"
    pod["terminationGracePeriodSeconds"] = 5
    pod.setdefault("volumes", []).append(
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    )
    containers = {c["name"]: c for c in pod["containers"]}
    app, sidecar = containers["app"], containers["mqbalance-sidecar"]
    app["image"] = images.mqbalance
    app["imagePullPolicy"] = "Never"
    app["command"] = pod_app_command(CONSUMER_APP)
    app["ports"] = [{"name": "ready", "containerPort": APP_PORT}]
    app["readinessProbe"] = {
        "httpGet": {"path": "/ready", "port": "ready"},
        "periodSeconds": 1,
        "failureThreshold": 1,
        "successThreshold": 1,
    }
    app["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    sidecar["image"] = images.mqbalance
    sidecar["imagePullPolicy"] = "Never"
    if spread_zones:
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
            }
        ]
    return deployment


def zones_of_pods(node: RealNode, names: set[str], namespace: str = NAMESPACE) -> dict[str, str]:
    """pod name -> the zone of the node it runs on (the node's ``topology.kubernetes.io/zone``)."""
    zones = {
        n["metadata"]["name"]: n["metadata"].get("labels", {}).get("topology.kubernetes.io/zone", "?")
        for n in kubectl_json(node, "get", "nodes")["items"]
    }
    return {
        p["metadata"]["name"]: zones.get(p["spec"].get("nodeName", ""), "?")
        for p in pods(node, namespace=namespace)
        if p["metadata"]["name"] in names
    }


def apply(node: RealNode, *documents: dict[str, Any]) -> None:
    node.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in documents))


def apply_examples(node: RealNode, debounce: float) -> None:
    """examples/topic.yaml and examples/consumergroup.yaml, the group with ``debounce`` seconds."""
    topic = yaml.safe_load((EXAMPLES / "topic.yaml").read_text())
    group = yaml.safe_load((EXAMPLES / "consumergroup.yaml").read_text())
    group["spec"]["debounceSeconds"] = debounce
    for doc in (topic, group):
        doc["metadata"]["namespace"] = NAMESPACE
    apply(node, topic, group)


def apply_example_consumers(
    node: RealNode, images: Images, replicas: int, *, debounce: float, spread_zones: bool = False
) -> None:
    """The example Topic and ConsumerGroup (:func:`apply_examples`) and the consumer Deployment of
    ``replicas`` pods (:func:`consumer_deployment`)."""
    apply_examples(node, debounce)
    apply(node, consumer_deployment(images, replicas, spread_zones=spread_zones))


def assignment(node: RealNode, namespace: str = NAMESPACE, group: str = GROUP) -> AssignmentDocument | None:
    status, cm = node.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{configmap_name(group)}")
    if status != 200:
        return None
    return AssignmentDocument.decode(cm["data"][CONFIGMAP_KEY])


def group_status(node: RealNode, namespace: str = NAMESPACE, group: str = GROUP) -> dict[str, Any]:
    status, body = node.request(
        "GET", f"/apis/mqbalance.io/v1alpha1/namespaces/{namespace}/consumergroups/{group}"
    )
    assert status == 200, body
    result: dict[str, Any] = body.get("status") or {}
    return result


def group_status_for(
    node: RealNode, generation: int, namespace: str = NAMESPACE, group: str = GROUP, timeout: float = 60
) -> dict[str, Any]:
    """The group's status once it describes assignment ``generation``: the operator writes the
    status after the ConfigMap, so a status read at once may describe the generation before."""

    def current() -> dict[str, Any] | None:
        status = group_status(node, namespace, group)
        return status if status.get("assignmentGeneration") == generation else None

    return wait_for(f"the status of generation {generation}", current, timeout, 0.5)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def pods(node: RealNode, selector: str = f"app={GROUP}", namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl_json(node, "get", "pods", "-n", namespace, "-l", selector)["items"]
    return items


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    serving = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return (
        serving
        and pod.get("status", {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    )


def ready_pod_names(node: RealNode) -> set[str]:
    return {p["metadata"]["name"] for p in pods(node) if is_ready(p)}


def wait_members(node: RealNode, count: int, timeout: float | None = None) -> AssignmentDocument:
    """The published assignment once its members are exactly the ``count`` Ready consumer pods
    (by default allowing ``pods_timeout(count)``: 180 s for four)."""

    def settled() -> AssignmentDocument | None:
        ready = ready_pod_names(node)
        doc = assignment(node)
        if doc is not None and len(ready) == count and set(doc.members) == ready:
            return doc
        return None

    allowed = pods_timeout(count) if timeout is None else timeout
    return wait_for(f"{count} Ready consumer pods and an assignment with exactly them", settled, allowed, 0.5)


def sidecar_view(node: RealNode, pod: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """What the pod's own sidecar answers on the pod's loopback, asked from inside the pod."""
    code = (
        "import urllib.request as u; "
        "print(u.urlopen('http://127.0.0.1:8081/v1/queues', timeout=10).read().decode())"
    )
    out = node.kubectl(
        "exec", "-n", namespace, pod, "-c", "app", "--", "python", "-c", code, timeout=60
    ).stdout
    view: dict[str, Any] = json.loads(out)
    return view


def operator_pod(node: RealNode) -> str:
    """The operator pod that holds the Lease (the one acting), else a running one; never one that
    is terminating (after a rollout it may still run for seconds, and it gives the Lease up)."""
    status, lease = node.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/{OPERATOR}"
    )
    holder = (lease.get("spec") or {}).get("holderIdentity") if status == 200 else None
    listed = pods(
        node, f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={RELEASE}", RELEASE_NAMESPACE
    )
    items = [p for p in listed if not p["metadata"].get("deletionTimestamp")]
    names = [p["metadata"]["name"] for p in items]
    if holder in names:
        return str(holder)
    running = [p["metadata"]["name"] for p in items if p.get("status", {}).get("phase") == "Running"]
    assert running, f"no running operator pod: {names}"
    return str(running[0])


def journal(node: RealNode) -> list[JournalRecord]:
    """The operator's rebalance journal: the JSON lines it prints to stdout (kubectl logs)."""
    out = node.kubectl("logs", "-n", RELEASE_NAMESPACE, operator_pod(node), timeout=60).stdout
    records = []
    for line in out.splitlines():
        if line.startswith("{") and f'"{KIND}"' in line:
            records.append(JournalRecord.decode(line))
    return records


def save_journal(node: RealNode, path: Path) -> int:
    """Keep the acting operator's log, journal lines and all, as a user collects it for
    ``mqbalance replay --journal`` (``kubectl logs``); returns how many journal records it holds."""
    out = node.kubectl("logs", "-n", RELEASE_NAMESPACE, operator_pod(node), timeout=60).stdout
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out)
    return sum(1 for line in out.splitlines() if f'"{KIND}"' in line)
