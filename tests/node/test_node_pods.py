"""The product on real pods: helm install, the operator's Lease, consumers scaling, the sidecars,
readiness probes and a rolling restart, on a kubelet + containerd node (see docs/real-node.md)."""

from __future__ import annotations

import itertools
import json
import time

from harness.kube.profile import SERVICE_IP
from harness.node.cluster import RealNode
from harness.node.specs import NODE_IP
from harness.node.workload import (
    GROUP,
    NAMESPACE,
    OPERATOR,
    RELEASE_NAMESPACE,
    assignment,
    condition,
    group_status,
    journal,
    kubectl_json,
    operator_pod,
    pods,
    ready_pod_names,
    rollout_status,
    wait_members,
)
from harness.polling import wait_for
from tests.integration.invariants import check_document, check_journal
from tests.node.node_support import check_each_sidecar, example_readable

# Reads the pod's service-account token and CA and asks the API server for its version
# through the `kubernetes` Service, as the in-cluster Kubernetes client does.
IN_CLUSTER_CALL = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(sa + "/token").read()
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
host = os.environ["KUBERNETES_SERVICE_HOST"]
req = urllib.request.Request(f"https://{host}:{os.environ['KUBERNETES_SERVICE_PORT']}/version")
req.add_header("Authorization", "Bearer " + token)
print(json.dumps({"host": host, "version": json.load(urllib.request.urlopen(req, context=ctx, timeout=10))}))
"""


def scale(node: RealNode, replicas: int) -> None:
    node.kubectl("scale", "-n", NAMESPACE, f"deploy/{GROUP}", f"--replicas={replicas}")
    rollout_status(node, GROUP, timeout=240)


def test_operator_deployment_is_ready_and_holds_the_lease(node: RealNode, release: None) -> None:
    rollout_status(node, OPERATOR, RELEASE_NAMESPACE, timeout=120)
    deployment = kubectl_json(node, "get", "deploy", "-n", RELEASE_NAMESPACE, OPERATOR)
    assert deployment["status"].get("readyReplicas") == 1
    pod = operator_pod(node)

    def holder() -> str | None:
        lease = kubectl_json(node, "get", "lease", "-n", RELEASE_NAMESPACE, OPERATOR)
        identity: str | None = lease["spec"].get("holderIdentity")
        return identity if identity == pod else None

    def seen() -> str:
        lease = kubectl_json(node, "get", "lease", "-n", RELEASE_NAMESPACE, OPERATOR)
        listed = node.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "wide").stdout
        return f"the Lease: {lease['spec']}\n{listed}"

    wait_for(f"the Lease held by {pod}", holder, 60, 0.5, details=seen)
    # The image's user, and the chart's read-only root filesystem, for real.
    uid = node.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "id", "-u").stdout.strip()
    assert uid == "10001"
    denied = node.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "touch", "/opt/x", check=False)
    assert denied.returncode != 0
    assert "Read-only file system" in denied.stderr


def test_pods_reach_the_api_through_the_kubernetes_service_with_their_token(
    node: RealNode, release: None
) -> None:
    pod = operator_pod(node)
    out = node.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "python", "-c", IN_CLUSTER_CALL).stdout
    answer = json.loads(out)
    assert answer["host"] == SERVICE_IP
    assert answer["version"]["gitVersion"] == node.version
    endpoints = kubectl_json(node, "get", "endpoints", "-n", "default", "kubernetes")
    assert endpoints["subsets"][0]["addresses"][0]["ip"] == NODE_IP


def test_pods_have_no_route_off_the_machine(node: RealNode, release: None) -> None:
    routes = node.kubectl("exec", "-n", RELEASE_NAMESPACE, operator_pod(node), "--", "cat", "/proc/net/route")
    destinations = [line.split()[1] for line in routes.stdout.splitlines()[1:] if line.strip()]
    assert destinations, routes.stdout
    assert "00000000" not in destinations, "a pod has a default route"


def test_consumers_scale_3_5_4_and_each_sidecar_serves_its_own_pod(node: RealNode, consumers: None) -> None:
    for replicas in (3, 5, 4):
        scale(node, replicas)
        doc = wait_members(node, replicas)
        check_document(doc, example_readable())
        check_each_sidecar(node, doc)

    # The scaled-down pod leaves at once; it shows as Terminating until the kubelet is done with it.
    # (The status is written after the ConfigMap: only the status of the last generation counts.)
    def settled() -> dict[str, object] | None:
        status = group_status(node)
        current = status.get("assignmentGeneration") == doc.generation
        return status if current and status["notServing"] == 0 else None

    status = wait_for("no pod left not serving", settled, 60, 0.5)
    assert status["members"] == 4
    assert condition(status, "Ready")["status"] == "True"


def test_a_failing_readiness_probe_takes_the_pod_out_until_it_passes(node: RealNode, consumers: None) -> None:
    scale(node, 4)
    before = wait_members(node, 4)
    victim = sorted(before.members)[0]
    node.kubectl("exec", "-n", NAMESPACE, victim, "-c", "app", "--", "touch", "/tmp/unready")

    def left() -> dict[str, object] | None:
        doc = assignment(node)
        status = group_status(node)
        listed = {p["name"]: p["reason"] for p in status.get("notServingPods", [])}
        if not doc or victim in doc.members or status.get("assignmentGeneration") != doc.generation:
            return None
        return status if listed.get(victim) == "NotReady" else None

    status = wait_for(f"{victim} out of the group after its readiness probe failed", left, 60, 0.5)
    assert status["members"] == 3
    assert "1 NotReady" in condition(status, "Ready")["message"]
    # It is the kubelet's probe that turned the pod unready, with the container still running.
    pod = kubectl_json(node, "get", "pod", "-n", NAMESPACE, victim)
    app = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "app")
    assert app["ready"] is False
    assert "running" in app["state"]
    node.kubectl("exec", "-n", NAMESPACE, victim, "-c", "app", "--", "rm", "/tmp/unready")
    doc = wait_members(node, 4)
    assert victim in doc.members
    check_each_sidecar(node, doc)


def test_rollout_restart_rebalances_once_per_debounce_window(node: RealNode, consumers: None) -> None:
    debounce = 3.0
    node.kubectl(
        "patch", "consumergroup", GROUP, "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"debounceSeconds": debounce}}),
    )  # fmt: skip
    try:
        scale(node, 4)
        before = wait_members(node, 4)
        old = set(before.members)
        seen = len(journal(node))
        started = time.time()
        node.kubectl("rollout", "restart", "-n", NAMESPACE, f"deploy/{GROUP}")
        rollout_status(node, GROUP, timeout=300)
        after = wait_members(node, 4)
        took = time.time() - started
    finally:
        node.kubectl(
            "patch", "consumergroup", GROUP, "-n", NAMESPACE, "--type=merge",
            "-p", json.dumps({"spec": {"debounceSeconds": 0}}),
        )  # fmt: skip
    new = set(after.members)
    assert not old & new, "a pod of the old ReplicaSet is still a member"
    records = [r for r in journal(node)[seen:] if r.group == GROUP and r.namespace == NAMESPACE]
    assert records, "the restart published nothing"
    assert records[-1].generation == after.generation
    assert set(records[-1].members) == new
    check_journal(records)
    # Eight membership changes (four pods leave, four join) in fewer generations, and every
    # generation after the first waited out a whole window.
    assert len(records) < 2 * len(old), [(r.generation, r.reason, sorted(r.members)) for r in records]
    gaps = [b.time - a.time for a, b in itertools.pairwise(records)]
    assert all(gap >= debounce - 0.05 for gap in gaps), gaps
    assert len(records) <= took / debounce + 1
    # Every member of every generation was a pod of the Deployment, old or new.
    names = old | new | {p["metadata"]["name"] for p in pods(node)}
    for record in records:
        assert set(record.members) <= names, record.members
    check_each_sidecar(node, after)
    assert ready_pod_names(node) == new
