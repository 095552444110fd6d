"""The local control plane itself: kubectl, watches, garbage collection, kubelet stand-ins."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

import mqbalance
from harness.kube import kubelet
from harness.kube.api import KubeApi
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for

# Any one step's allowance on an unloaded machine; each use stretches it for the machine's load
# and MQBALANCE_TIMEOUT_SCALE (harness.polling.scaled), as wait_for does.
DEADLINE = 60.0

CRD_GROUP = "example.mqbalance.io"
CRD_MANIFEST = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{CRD_GROUP}
spec:
  group: {CRD_GROUP}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {{status: {{}}}}
      additionalPrinterColumns:
        - {{name: Size, type: integer, jsonPath: .spec.size}}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {{type: integer, minimum: 1}}
            status:
              type: object
              properties:
                seen: {{type: boolean}}
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def node_name(api_client: client.ApiClient) -> Iterator[str]:
    """A unique Node name, deleted after the test (Nodes are cluster-scoped)."""
    name = unique("node")
    yield name
    kubelet.delete_node(api_client, name)


def test_kubectl_applies_crd_custom_object_node_and_pod(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=CRD_MANIFEST)
    cluster.wait_crds_established([f"widgets.{CRD_GROUP}"], DEADLINE)
    node = unique("node")
    manifests = f"""
apiVersion: {CRD_GROUP}/v1
kind: Widget
metadata: {{name: w1, namespace: {namespace}}}
spec: {{size: 3}}
---
apiVersion: v1
kind: Node
metadata:
  name: {node}
  labels: {{topology.kubernetes.io/zone: zone-a}}
---
apiVersion: v1
kind: Pod
metadata: {{name: p1, namespace: {namespace}, labels: {{app: consumer}}}}
spec:
  containers: [{{name: consumer, image: example/consumer}}]
"""
    try:
        # A freshly established CRD can take a moment to be served by every handler.
        wait_for(
            "the Widget to apply",
            lambda: cluster.kubectl("apply", "-f", "-", input=manifests, check=False).returncode == 0,
        )
        widget = json.loads(cluster.kubectl("get", "widgets", "w1", "-n", namespace, "-o", "json").stdout)
        assert widget["spec"] == {"size": 3}
        table = cluster.kubectl("get", "widgets", "-n", namespace).stdout
        assert re.search(r"^NAME\s+SIZE\s*$", table, re.MULTILINE), table
        assert re.search(r"^w1\s+3\s*$", table, re.MULTILINE), table
        got_node = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)
        assert got_node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-a"
        pod = json.loads(cluster.kubectl("get", "pod", "p1", "-n", namespace, "-o", "json").stdout)
        assert pod["status"]["phase"] == "Pending"

        # Structural schema validation is enforced by the server.
        invalid = (
            f"apiVersion: {CRD_GROUP}/v1\nkind: Widget\nmetadata: {{name: w2, namespace: {namespace}}}\n"
        )
        bad = cluster.kubectl("apply", "-f", "-", check=False, input=invalid + "spec: {size: 0}\n")
        assert bad.returncode != 0
        assert "spec.size" in bad.stderr
    finally:
        cluster.kubectl("delete", "node", node, "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "crd", f"widgets.{CRD_GROUP}", "--ignore-not-found", "--wait=false", check=False
        )


def test_watch_sees_added_modified_deleted(api_client: client.ApiClient, namespace: str) -> None:
    core: Any = client.CoreV1Api(api_client)
    start_rv = core.list_namespaced_config_map(namespace).metadata.resource_version
    events: list[tuple[str, str]] = []
    done = threading.Event()
    deadline = scaled(DEADLINE)

    def consume() -> None:
        w = watch.Watch()
        try:
            for event in w.stream(
                core.list_namespaced_config_map,
                namespace,
                resource_version=start_rv,
                timeout_seconds=int(deadline),
            ):
                obj = event["object"]
                if obj.metadata.name != "watched":
                    continue
                events.append((event["type"], (obj.data or {}).get("k", "")))
                if event["type"] == "DELETED":
                    w.stop()
        finally:
            done.set()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="watched"), data={"k": "1"})
    )
    core.patch_namespaced_config_map("watched", namespace, {"data": {"k": "2"}})
    core.delete_namespaced_config_map("watched", namespace)
    assert done.wait(deadline + 10)
    assert events == [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]


def test_garbage_collector_deletes_dependents_of_deleted_owner(
    api_client: client.ApiClient, namespace: str
) -> None:
    core: Any = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref]))
    )
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="bystander"))
    )

    core.delete_namespaced_config_map("owner", namespace)

    dependent = f"/api/v1/namespaces/{namespace}/configmaps/dependent"
    wait_for("garbage collection of the dependent ConfigMap", lambda: KubeApi(api_client).absent(dependent))
    assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_kubelet_helpers_run_a_ready_pod_on_a_zoned_node(
    api_client: client.ApiClient, namespace: str, node_name: str
) -> None:
    core: Any = client.CoreV1Api(api_client)
    node = kubelet.create_node(api_client, node_name, "zone-b")
    assert node["metadata"]["labels"][kubelet.ZONE_LABEL] == "zone-b"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    pods = kubelet.start_pods(api_client, namespace, "consumer", 2, {"app": "consumer"}, [node_name])
    assert [p["metadata"]["name"] for p in pods] == ["consumer-0", "consumer-1"]
    listed = core.list_namespaced_pod(namespace, label_selector="app=consumer").items
    assert len(listed) == 2
    for pod in listed:
        assert pod.spec.node_name == node_name
        assert pod.status.phase == "Running"
        assert _ready(pod)
        assert pod.status.pod_ip

    not_ready = kubelet.set_pod_ready(api_client, namespace, "consumer-1", ready=False)
    assert not_ready["status"]["phase"] == "Running"
    assert not any(c["type"] == "Ready" and c["status"] == "True" for c in not_ready["status"]["conditions"])

    moved = kubelet.set_node_zone(api_client, node_name, "zone-c")
    assert moved["metadata"]["labels"][kubelet.ZONE_LABEL] == "zone-c"
    unzoned = kubelet.set_node_zone(api_client, node_name, None)
    assert kubelet.ZONE_LABEL not in (unzoned["metadata"].get("labels") or {})


def test_kubelet_helpers_terminate_and_delete(
    api_client: client.ApiClient, namespace: str, node_name: str
) -> None:
    core: Any = client.CoreV1Api(api_client)
    kubelet.create_node(api_client, node_name, "zone-a")
    kubelet.start_pods(api_client, namespace, "held", 1, {"app": "held"}, [node_name], hold=True)

    terminating = kubelet.mark_terminating(api_client, namespace, "held-0")
    assert terminating["metadata"].get("deletionTimestamp") is not None
    assert kubelet.HOLD_FINALIZER in terminating["metadata"]["finalizers"]
    # Still listed, still Running: that is what a terminating pod looks like.
    assert core.read_namespaced_pod("held-0", namespace).status.phase == "Running"

    kubelet.delete_pod(api_client, namespace, "held-0")
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("held-0", namespace)
    assert missing.value.status == 404

    # Without a kubelet, a bound pod deleted with a grace period never finishes terminating...
    kubelet.create_pod(api_client, namespace, "bound", {"app": "x"}, node=node_name)
    core.delete_namespaced_pod("bound", namespace, grace_period_seconds=30)
    assert core.read_namespaced_pod("bound", namespace).metadata.deletion_timestamp is not None
    # ...which grace period 0 does.
    kubelet.delete_pod(api_client, namespace, "bound")
    # An unbound pod goes at once whatever the grace period.
    kubelet.create_pod(api_client, namespace, "unbound", {"app": "x"})
    core.delete_namespaced_pod("unbound", namespace, grace_period_seconds=30)
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("unbound", namespace)
    assert gone.value.status == 404
    # Deleting what is not there is fine.
    kubelet.delete_pod(api_client, namespace, "never-existed")


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def test_second_cluster_runs_alongside_and_survives_restarts(cluster: LocalCluster) -> None:
    with LocalCluster(version=cluster.version) as second:
        assert second.server != cluster.server
        assert second.kubeconfig != cluster.kubeconfig
        pids = list(second.pids.values())
        assert len(pids) == 3

        second.kubectl("create", "configmap", "marker", "--from-literal=k=v")
        assert "marker" not in cluster.kubectl("get", "configmaps", "-o", "name").stdout

        second.restart_apiserver()
        second.restart_etcd(kill=True)
        second.restart_apiserver(kill=True)
        got = json.loads(second.kubectl("get", "configmap", "marker", "-o", "json").stdout)
        assert got["data"] == {"k": "v"}
        pids = list(second.pids.values())
        workdir = second.workdir

    wait_for("the second cluster's processes to exit", lambda: not _pids_alive(pids))
    assert not workdir.exists()
    # The session cluster is untouched.
    status, _ = cluster.request("GET", "/readyz")
    assert status == 200


def test_python_client_reads_generated_kubeconfig(cluster: LocalCluster) -> None:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        version: Any = client.VersionApi(api).get_code()
        assert version.git_version == cluster.version
        assert f"v{version.major}.{version.minor}" == cluster.version.rsplit(".", 1)[0]
    finally:
        api.close()


def test_cli_up_prints_kubeconfig_and_stops_on_ctrl_c(cluster: LocalCluster, tmp_path: Path) -> None:
    workdir = tmp_path / "up"
    # Works from a source checkout whether or not the package is installed.
    root = str(Path(mqbalance.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    stderr_path = tmp_path / "up.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.kube.cluster",
                "up",
                "--dir",
                str(workdir),
                "--k8s",
                cluster.version,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the cluster is ready
        assert line.startswith("export KUBECONFIG="), (line, stderr_path.read_text())
        kubeconfig = line.strip().split("=", 1)[1]
        assert Path(kubeconfig) == workdir / "kubeconfig"
        out = subprocess.run(
            [
                str(cluster.bin_dir / "kubectl"),
                "--kubeconfig",
                kubeconfig,
                "get",
                "namespace",
                "default",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=scaled(DEADLINE),
        )
        assert out.stdout.strip() == "namespace/default"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(scaled(DEADLINE)) == 0
        assert f"control plane {cluster.version} ready" in stderr_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # --dir is kept (kubeconfig and logs), and nothing still serves it.
    assert (workdir / "logs" / "kube-apiserver.log").exists()
    port = re.search(r":(\d+)", json.loads(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"])
    assert port is not None
    wait_for("the CLI cluster's apiserver to stop listening", lambda: not _listening(int(port.group(1))))


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_namespace_deletion_completes(api_client: client.ApiClient, node_name: str) -> None:
    core: Any = client.CoreV1Api(api_client)
    ns = unique("doomed")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x")))
    kubelet.create_node(api_client, node_name, None)
    kubelet.start_pods(api_client, ns, "p", 1, {"app": "p"}, [node_name])
    # A bound pod only goes with grace period 0 (no kubelet to finish a graceful delete).
    kubelet.delete_pod(api_client, ns, "p-0")
    core.delete_namespace(ns)

    what = "the namespace controller to remove the namespace"
    wait_for(what, lambda: KubeApi(api_client).absent(f"/api/v1/namespaces/{ns}"))
