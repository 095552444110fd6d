"""The sidecar process against the real API server.

The ConfigMap is written as the operator publishes it (``AssignmentDocument``), so
this tests the sidecar alone; the operator's own tests cover the other half.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.apps.metrics import parse_metric
from harness.apps.sidecar import SidecarProcess
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument
from mqbalance.sidecar.client import SidecarError
from mqbalance.sidecar.config import DEFAULT_MAX_WAIT
from tests.integration.sidecar.sidecar_process import configmap_body
from tests.unit.sidecar.sidecar_support import document

POD = "orders-5d8f-abcde"
OTHER = "orders-5d8f-fghij"
GROUP = "orders"

StartSidecar = Callable[..., SidecarProcess]


def doc(generation: int, mine: list[int], theirs: list[int]) -> AssignmentDocument:
    held = {POD: [("broker-a", i) for i in mine], OTHER: [("broker-a", i) for i in theirs]}
    return document(generation, {"orders": held}, zones={POD: "zone-a", OTHER: "zone-b"})


def api(
    cluster: LocalCluster, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)
) -> Any:
    """One API call with the admin token; fails naming the call unless the status is in ``ok``."""
    status, answer = cluster.request(method, path, body)
    assert status in ok, f"{method} {path}: {status} {answer}"
    return answer


def publish(cluster: LocalCluster, namespace: str, document: AssignmentDocument) -> None:
    """Create or replace the ConfigMap, as the operator does."""
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    body = configmap_body(GROUP, document)
    status, _ = cluster.request("PUT", f"{base}/{GROUP}-assignment", body)
    if status == 404:
        api(cluster, "POST", base, body)
    else:
        assert status == 200, f"replacing the ConfigMap: {status}"


def queue_ids(view: dict[str, Any]) -> list[int]:
    return [q["queueId"] for q in view["queues"]["orders"]]


class Poll(threading.Thread):
    """A long-poll in the background (the client blocks)."""

    def __init__(self, sidecar: SidecarProcess, after: int, timeout: float) -> None:
        super().__init__(daemon=True)
        self.sidecar, self.after, self.timeout = sidecar, after, timeout
        self.result: dict[str, Any] | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.result = self.sidecar.client.wait_for_change(self.after, self.timeout)
        except Exception as e:
            self.error = e

    def parked(self) -> bool | None:
        """True once the sidecar counts this long-poll as waiting."""
        waiting = self.sidecar.metric("mqbalance_sidecar_long_polls", group=GROUP)
        return True if waiting and waiting >= 1 else None

    def outcome(self) -> dict[str, Any]:
        self.join(self.timeout + 15)
        if self.error is not None:
            raise self.error
        assert self.result is not None, "the long-poll did not return"
        return self.result


def test_sidecar_serves_follows_rebalances_and_survives_an_api_restart(
    cluster: LocalCluster,
    namespace: str,
    crds: None,
    start_sidecar: StartSidecar,
) -> None:
    api(
        cluster,
        "POST",
        f"/apis/mqbalance.io/v1alpha1/namespaces/{namespace}/topics",
        {
            "apiVersion": "mqbalance.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "orders-topic"},
            "spec": {
                "topicName": "orders",
                "brokers": [{"name": "broker-a", "readQueueNums": 4, "writeQueueNums": 4}],
            },
        },
    )
    publish(cluster, namespace, doc(1, [0, 1], [2, 3]))
    sidecar = start_sidecar("--pod-name", POD, "--namespace", namespace, "--group", GROUP)

    view = sidecar.client.wait_for_change(-1, timeout=scaled(30, at_most=DEFAULT_MAX_WAIT))
    assert view["generation"] == 1
    assert queue_ids(view) == [0, 1]
    assert sidecar.client.ready()

    # routes come from the Topic resource
    route = wait_for("the Topic's route", lambda: _route(sidecar))
    assert route["writableQueues"] == 4
    assert sidecar.client.select_queue("orders")["broker"] == "broker-a"

    # a rebalance wakes a waiting long-poll
    poll = Poll(sidecar, after=1, timeout=scaled(30, at_most=DEFAULT_MAX_WAIT))
    poll.start()
    wait_for("the long-poll to wait in the sidecar", poll.parked)
    publish(cluster, namespace, doc(2, [0], [1, 2, 3]))
    view = poll.outcome()
    assert view["generation"] == 2
    assert queue_ids(view) == [0]

    # the API server goes away and comes back; the watch resumes on its own
    poll = Poll(sidecar, after=2, timeout=scaled(60, at_most=DEFAULT_MAX_WAIT))
    poll.start()
    wait_for("the long-poll to wait in the sidecar", poll.parked)
    cluster.restart_apiserver()
    publish(cluster, namespace, doc(3, [0, 1, 2], [3]))
    view = poll.outcome()
    assert view["generation"] == 3
    assert queue_ids(view) == [0, 1, 2]
    assert sidecar.returncode is None
    assert sidecar.metric("mqbalance_sidecar_rebalances_total", group=GROUP) == 3


def _route(sidecar: SidecarProcess) -> dict[str, Any] | None:
    try:
        return sidecar.client.route("orders")
    except SidecarError as e:
        if e.status == 404:
            return None
        raise


def test_a_role_narrowed_to_the_one_configmap_is_enough(
    cluster: LocalCluster,
    namespace: str,
    start_sidecar: StartSidecar,
    tmp_path: Path,
) -> None:
    ns = f"/api/v1/namespaces/{namespace}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    api(cluster, "POST", f"{ns}/serviceaccounts", {"metadata": {"name": "sidecar"}})
    api(
        cluster,
        "POST",
        f"{rbac}/roles",
        {
            "metadata": {"name": "sidecar"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [f"{GROUP}-assignment"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
    )
    api(
        cluster,
        "POST",
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "sidecar"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sidecar"},
            "subjects": [{"kind": "ServiceAccount", "name": "sidecar", "namespace": namespace}],
        },
    )
    token = cluster.service_account_token(namespace, "sidecar")
    kubeconfig = json.loads(cluster.kubeconfig.read_text())
    for user in kubeconfig["users"]:
        user["user"] = {"token": token}
    narrowed = tmp_path / "sidecar-kubeconfig"
    narrowed.write_text(json.dumps(kubeconfig))

    publish(cluster, namespace, doc(4, [3], [0, 1, 2]))
    api(cluster, "POST", f"{ns}/configmaps", {"metadata": {"name": "unrelated"}, "data": {"x": "y"}})
    sidecar = start_sidecar(
        "--pod-name",
        POD,
        "--namespace",
        namespace,
        "--group",
        GROUP,
        "--no-topics",
        "--kubeconfig",
        str(narrowed),
    )
    view = sidecar.client.wait_for_change(-1, timeout=scaled(30, at_most=DEFAULT_MAX_WAIT))
    assert view["generation"] == 4
    assert queue_ids(view) == [3]
    # The narrowed credentials never made the ConfigMap watch fail: its restart count is exported
    # (its sample exists from the start, so a wrong name or label fails here) and is 0.
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    sample = 'mqbalance_sidecar_watch_restarts_total{resource="configmap"} '
    assert any(line.startswith(sample) for line in text.splitlines()), "no configmap watch restart sample"
    assert parse_metric(text, "mqbalance_sidecar_watch_restarts_total", {"resource": "configmap"}) == 0.0
