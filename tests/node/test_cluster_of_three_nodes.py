"""Three real nodes in zones a, b and c, each in a network namespace of its own, and the faults of
harness/faults/netfault.py: a node cut off from the API server goes NotReady while its pods keep running
and serving, and comes back when healed; a killed kubelet, a paused container; teardown leaves
nothing behind.

Runs before the session's single node (this file sorts first): one cluster runs per machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.faults.netfault import Faults
from harness.node import host
from harness.node.cluster import RealNode
from harness.node.images import Images
from harness.node.requirements import unavailable
from harness.node.specs import NODE_IP, containerd_roots
from harness.node.workload import (
    GROUP,
    apply,
    apply_examples,
    assignment,
    consumer_deployment,
    install_chart,
    kubectl_json,
    operator_pod,
    pods,
    wait_members,
)
from harness.node.workload import NAMESPACE as SHOP
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument
from mqbalance.model import MessageQueue
from tests.node.node_support import keep_journal

NAMESPACE = "default"
APP = "spread"
ZONES = {"mqbalance-node-a": "zone-a", "mqbalance-node-b": "zone-b", "mqbalance-node-c": "zone-c"}
HTTP_GET = "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=3).status)"


@pytest.fixture(scope="module")
def cluster(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    reason = unavailable(need_built=False, nodes=3)
    if reason is not None:
        pytest.fail(f"three real nodes cannot run here: {reason}")
    real = RealNode(tmp_path_factory.mktemp("three-nodes"), images=images, nodes=3)
    began = time.monotonic()
    with real:
        print(f"three nodes Ready in {time.monotonic() - began:.1f} s: {real.timings}")
        yield real
    left = host.leftovers(NODE_IP, containerd_roots())
    assert left == [], f"the cluster left these behind: {left}"


@pytest.fixture(scope="module")
def faults(cluster: RealNode) -> Faults:
    return Faults(cluster)


@pytest.fixture(scope="module")
def spread(cluster: RealNode, images: Images) -> dict[str, dict[str, Any]]:
    """One web server pod per zone, placed by kube-scheduler (topology spread over the zone label):
    node name -> pod."""
    labels = {"app": APP}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "web",
                            "image": images.mqbalance,
                            "imagePullPolicy": "Never",
                            "command": ["python", "-m", "http.server", "8000"],
                            "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }
    apply(cluster, deployment)

    def placed() -> dict[str, dict[str, Any]] | None:
        items = kubectl_json(cluster, "get", "pods", "-n", NAMESPACE, "-l", f"app={APP}")["items"]
        ready = [p for p in items if _ready(p)]
        by_node = {p["spec"]["nodeName"]: p for p in ready}
        return by_node if len(ready) == 3 and len(by_node) == 3 else None

    return wait_for("three Ready pods, one on each node", placed, 120, 0.5)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _node(cluster: RealNode, name: str) -> dict[str, Any]:
    status, body = cluster.request("GET", f"/api/v1/nodes/{name}")
    assert status == 200, body
    node: dict[str, Any] = body
    return node


def _ready_condition(cluster: RealNode, name: str) -> str:
    conditions = _node(cluster, name).get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "missing")


def _get(cluster: RealNode, pod: dict[str, Any], url: str) -> str:
    """The HTTP status of a GET of ``url`` from inside ``pod`` (kubectl exec); "" when it failed."""
    name = pod["metadata"]["name"]
    argv = ("exec", "-n", NAMESPACE, name, "--", "python", "-c", HTTP_GET, url)
    result = cluster.kubectl(*argv, check=False, timeout=60)
    return result.stdout.strip() if result.returncode == 0 else ""


def _url(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:8000/"


def _lease_renewed(cluster: RealNode, name: str) -> str:
    status, lease = cluster.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    )
    assert status == 200, lease
    return str(lease["spec"]["renewTime"])


def test_three_nodes_are_ready_in_their_zones(cluster: RealNode) -> None:
    assert cluster.node_names == list(ZONES)
    for spec in cluster.specs:
        node = _node(cluster, spec.name)
        assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == ZONES[spec.name]
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == spec.ip
        assert cluster.node_ready(spec.name), node["status"]
        assert spec.netns in host.node_netns()
    assert len({s.pod_subnet for s in cluster.specs}) == 3


def test_the_scheduler_puts_a_pod_on_each_node_in_its_range(
    cluster: RealNode, spread: dict[str, dict[str, Any]]
) -> None:
    assert set(spread) == set(ZONES)
    for name, pod in spread.items():
        prefix = cluster.spec(name).pod_subnet.rsplit(".", 1)[0] + "."
        assert pod["status"]["podIP"].startswith(prefix), (name, pod["status"]["podIP"])


def test_a_pod_reaches_pods_on_the_other_nodes_and_the_api(
    cluster: RealNode, spread: dict[str, dict[str, Any]]
) -> None:
    a, b, c = (spread[n] for n in ZONES)
    assert _get(cluster, a, _url(b)) == "200"
    assert _get(cluster, a, _url(c)) == "200"
    assert _get(cluster, c, _url(a)) == "200"
    # The API server through the kubernetes Service (kube-proxy of node b), with the pod's token.
    env = json.loads(
        cluster.kubectl(
            "exec", "-n", NAMESPACE, b["metadata"]["name"], "--", "python", "-c",
            "import json, os; print(json.dumps(dict(os.environ)))",
        ).stdout
    )  # fmt: skip
    url = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}/version"
    code = (
        "import ssl, sys, urllib.request as u\n"
        "ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
        "req = u.Request(sys.argv[1])\n"
        "token = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()\n"
        "req.add_header('Authorization', 'Bearer ' + token)\n"
        "print(u.urlopen(req, timeout=5, context=ctx).status)\n"
    )
    out = cluster.kubectl("exec", "-n", NAMESPACE, b["metadata"]["name"], "--", "python", "-c", code, url)
    assert out.stdout.strip() == "200"


def test_a_node_cut_off_from_the_api_goes_not_ready_its_pods_keep_serving_and_heal_brings_it_back(
    cluster: RealNode, faults: Faults, spread: dict[str, dict[str, Any]]
) -> None:
    b = "mqbalance-node-b"
    pod_b = spread[b]
    before = _lease_renewed(cluster, b)
    faults.partition(b, api=True)
    assert any(f"-d {NODE_IP}/32" in r for r in faults.rules(b)), faults.rules(b)
    wait_for(f"{b} not Ready", lambda: _ready_condition(cluster, b) != "True" or None, 60, 0.5)
    renewed = _lease_renewed(cluster, b)
    assert _ready_condition(cluster, b) == "Unknown"  # the node lifecycle controller: no status posted
    # Its pods keep running, and serve other nodes' pods: only the API server is cut off.
    tasks = cluster.node_ctr(b).tasks()
    assert tasks, "no container runs on the partitioned node"
    assert _get(cluster, spread["mqbalance-node-a"], _url(pod_b)) == "200"
    assert _ready_condition(cluster, "mqbalance-node-a") == "True"
    faults.heal()
    assert faults.rules(b) == []
    wait_for(f"{b} Ready again", lambda: cluster.node_ready(b) or None, 60, 0.5)
    assert before <= renewed
    wait_for(f"{b}'s Lease renewed again", lambda: _lease_renewed(cluster, b) > renewed or None, 30, 0.5)
    assert set(cluster.node_ctr(b).tasks()) >= set(tasks)  # the same containers, never restarted


def test_a_killed_kubelet_and_a_paused_container_are_undone_by_heal(
    cluster: RealNode, faults: Faults, spread: dict[str, dict[str, Any]]
) -> None:
    c = "mqbalance-node-c"
    pod_c = spread[c]
    tasks = cluster.node_ctr(c).tasks()
    faults.kill_kubelet(c)
    assert not cluster.kubelet_running_on(c)
    assert set(cluster.node_ctr(c).tasks()) == set(tasks)  # pods outlive their kubelet
    pids = faults.pause(NAMESPACE, pod_c["metadata"]["name"], "web")
    assert pids
    # The signal is delivered asynchronously: each process stops at its next return to user space.
    wait_for("the container's processes stopped", lambda: all(_state(p) == "T" for p in pids), 10, 0.1)
    a = spread["mqbalance-node-a"]
    assert _get(cluster, a, _url(pod_c)) == ""  # a stopped server does not answer
    faults.heal()
    assert cluster.kubelet_running_on(c)
    assert cluster.node_ready(c)
    wait_for("the container's processes running", lambda: all(_state(p) != "T" for p in pids), 10, 0.1)
    wait_for("the paused server answering again", lambda: _get(cluster, a, _url(pod_c)) == "200", 30, 0.5)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


LEASE, RENEW, MARGIN = 4.0, 1.0, 2.0
SIDECAR_VIEW = (
    "import urllib.request as u\n"
    "print(u.urlopen('http://127.0.0.1:8081/v1/queues', timeout=3).read().decode())\n"
)


def _sidecar_view_from_the_machine(faults: Faults, pod: str) -> dict[str, Any] | None:
    """What ``pod``'s sidecar serves, asked in the pod's network namespace from the machine: kubectl
    exec goes through the API server, which a partitioned node cannot reach."""
    pid = faults.container_pids(SHOP, pod, "mqbalance-sidecar")[0]
    argv = ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", SIDECAR_VIEW]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(30), check=False)
    view: dict[str, Any] | None = json.loads(result.stdout) if result.returncode == 0 else None
    return view


def _fenced(faults: Faults, pod: str, fenced: bool) -> dict[str, Any] | None:
    view = _sidecar_view_from_the_machine(faults, pod)
    return view if view is not None and view.get("fenced") is fenced else None


def _document(
    cluster: RealNode, test: Callable[[AssignmentDocument], bool], what: str, timeout: float
) -> AssignmentDocument:
    def probe() -> AssignmentDocument | None:
        doc = assignment(cluster)
        return doc if doc is not None and test(doc) else None

    return wait_for(what, probe, timeout, 0.2)


@pytest.fixture
def journal(cluster: RealNode, request: pytest.FixtureRequest) -> Iterator[None]:
    """The test's operator journal kept after it (also when it failed) with MQBALANCE_KEEP_JOURNAL."""
    yield
    keep_journal(cluster, request.node.name)


@pytest.mark.chaos
def test_a_consumer_on_a_node_cut_off_from_the_api_is_fenced_and_its_queues_move_after_the_lease(
    cluster: RealNode, faults: Faults, images: Images, journal: None
) -> None:
    """The chart, the example group with Release handover and a lease, one consumer pod per zone;
    the node of one consumer (not the operator's) is cut off from the API server: that pod's
    sidecar fences itself within the lease, and the operator hands its queues on no sooner than
    leaseSeconds + leaseMarginSeconds after revoking them."""
    cluster.kubectl("create", "namespace", SHOP)
    install_chart(cluster, images, groups=[GROUP])  # the sidecars' rights to renew member Leases
    apply_examples(cluster, debounce=0)
    group = kubectl_json(cluster, "get", "consumergroup", "-n", SHOP, GROUP)
    group["spec"]["handover"] = {
        "mode": "Release",
        "releaseTimeoutSeconds": 1,
        "leaseSeconds": LEASE,
        "renewSeconds": RENEW,
        "leaseMarginSeconds": MARGIN,
    }
    apply(cluster, group)
    apply(cluster, consumer_deployment(images, replicas=3, spread_zones=True))
    wait_members(cluster, 3)
    settled = _document(
        cluster, lambda d: len(d.members) == 3 and not d.releasing, "three members, settled", 60
    )
    where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(cluster)}
    assert len(set(where.values())) == 3, where
    operator_node = next(
        p["spec"]["nodeName"]
        for p in pods(cluster, "app.kubernetes.io/component=operator", "mqbalance")
        if p["metadata"]["name"] == operator_pod(cluster)
    )
    cut = next(pod for pod, node in sorted(where.items()) if node != operator_node)
    node = where[cut]
    topic = next(iter(settled.topics))
    held: set[MessageQueue] = set(settled.queues_of(cut)[topic])
    assert held
    wait_for(f"{cut}'s sidecar serving", lambda: _fenced(faults, cut, False), 30, 0.5)

    faults.partition(node, api=True)
    cut_at, cut_wall = time.monotonic(), time.time()
    fenced = wait_for(f"{cut}'s sidecar to fence itself", lambda: _fenced(faults, cut, True), LEASE + 30, 0.3)
    fenced_after = time.monotonic() - cut_at
    assert fenced["queueCount"] == 0
    assert fenced_after >= LEASE - RENEW - 0.5, f"fenced {fenced_after:.1f}s after the cut: too early"

    # The node goes NotReady (16 s grace), its pods unready: the operator revokes the cut pod's queues.
    revoked = _document(cluster, lambda d: cut not in d.members and bool(d.releasing), "the revocation", 90)
    (release,) = [r for r in revoked.releasing if r.owner == cut]
    bound = release.since + LEASE + MARGIN

    def others_hold(doc: AssignmentDocument) -> set[MessageQueue]:
        return {mq for member, qs in doc.topics[topic].items() if member != cut for mq in qs} & held

    while time.time() < bound - 0.2:  # every version seen before the bound leaves the queues alone
        doc = assignment(cluster)
        assert doc is not None
        early = others_hold(doc)
        assert not early or doc.computed_at >= bound, (
            f"{early} handed on {bound - doc.computed_at:.1f}s early"
        )
        time.sleep(0.1)
    moved = _document(cluster, lambda d: others_hold(d) == held and not d.releasing, "the hand-on", 60)
    assert moved.computed_at >= bound
    print(
        f"real pods: {cut} on {node} fenced {fenced_after:.1f}s after the cut; revoked "
        f"{release.since - cut_wall:.1f}s after the cut; queues handed on "
        f"{moved.computed_at - release.since:.1f}s after the revocation (lease {LEASE:g} + margin {MARGIN:g})"
    )
    faults.heal()
    wait_for(f"{node} Ready again", lambda: cluster.node_ready(node) or None, 60, 0.5)
    back = wait_for(f"{cut}'s sidecar serving again", lambda: _fenced(faults, cut, False), 60, 0.5)
    assert int(back["generation"]) >= moved.generation


def test_teardown_removes_namespaces_links_and_rules_also_with_faults_in_place(
    cluster: RealNode, faults: Faults, spread: dict[str, dict[str, Any]]
) -> None:
    # A partition from a test host (not the API server: the teardown deletes pods through the kubelets).
    faults.partition("mqbalance-node-a", api=False, hosts=["198.18.0.9"])
    assert faults.rules("mqbalance-node-a")
    faults.pause(NAMESPACE, spread["mqbalance-node-c"]["metadata"]["name"], "web")
    cluster.stop()
    assert host.node_netns() == []
    assert host.node_links() == []
    host_rules = host.run(["iptables-save"]).stdout
    assert "MQBALANCE" not in host_rules
    assert "KUBE-" not in host_rules
    assert host.leftovers(NODE_IP, containerd_roots()) == []
