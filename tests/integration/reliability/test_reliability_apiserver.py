"""API server trouble: restarts of the API server and etcd under the operator and a sidecar, and
conflicting writes to the assignment ConfigMap.

These tests restart the session's control plane; every other test sees it back up and ready
(``LocalCluster.restart_*`` return once the API server answers /readyz).
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness import kubelet
from harness.cluster import LocalCluster
from harness.polling import wait_for
from harness.processes import OperatorProcess, SidecarProcess
from mqbalance.contract import configmap_name
from mqbalance.model import MessageQueue
from tests.integration.operator_support import apply_group
from tests.integration.reliability.reliability_support import (
    Churn,
    GenerationWatcher,
    wait_converged,
)

GROUP = "served"
SPEC = {
    "topics": ["orders", "payments"],
    "strategy": {"name": "STICKY"},
    "debounceSeconds": 0,
    "selector": {"matchLabels": {"app": GROUP}},
}
DISRUPTIONS: dict[str, Callable[[LocalCluster], None]] = {
    "apiserver-restart": lambda c: c.restart_apiserver(),
    "apiserver-kill": lambda c: c.restart_apiserver(kill=True),
    "etcd-restart": lambda c: c.restart_etcd(),
    "etcd-kill": lambda c: c.restart_etcd(kill=True),
}
# Lines a process may log while its API server is away; anything else at ERROR, or a traceback
# outside these, is a failure.
EXPECTED_TROUBLE = re.compile(
    r"connect|Connection|refused|reset|timed? ?out|Timeout|ServerDisconnected|EOF|503|500|504|"
    r"etcdserver|watch|retry|Retry|re-?list|Request attempt|failed with|Gone|410|aborted|closed",
)


@pytest.fixture
def sidecar(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[[str, str], SidecarProcess]]:
    started: list[SidecarProcess] = []

    def start(namespace: str, pod: str) -> SidecarProcess:
        proc = SidecarProcess(
            cluster.kubeconfig,
            tmp_path / f"sidecar-{pod}.log",
            "--pod-name",
            pod,
            "--namespace",
            namespace,
            "--group",
            GROUP,
        )
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        proc.stop()


def unexpected_errors(log: str) -> list[str]:
    """ERROR/CRITICAL lines and traceback heads that an API outage does not explain."""
    bad = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if (" ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")) and not (
            EXPECTED_TROUBLE.search(line) or any(EXPECTED_TROUBLE.search(x) for x in lines[i + 1 : i + 30])
        ):
            bad.append(line)
    return bad


def restart_loop(
    rounds: int,
    cluster: LocalCluster,
    api: client.ApiClient,
    namespace: str,
    nodes: list[str],
    watcher: GenerationWatcher,
    start_operator: Callable[..., OperatorProcess],
    sidecar: Callable[[str, str], SidecarProcess],
) -> dict[str, int]:
    rng = random.Random(7)
    apply_group(api, namespace, GROUP, SPEC)
    churn = Churn(api, namespace, [GROUP], nodes, rng)
    mine = churn.add(GROUP)
    churn.add(GROUP)
    op = start_operator()
    side = sidecar(namespace, mine)
    restarts = changes = 0
    for _ in range(rounds):
        for name, disrupt in DISRUPTIONS.items():
            disrupt(cluster)
            restarts += 1
            # A change right after the API is back must be published and served.
            others = sorted(set(churn.pods[GROUP]) - {mine})
            if len(others) > 2:
                victim = rng.choice(others)
                kubelet.delete_pod(api, namespace, victim, wait=False)
                del churn.pods[GROUP][victim]
            else:
                churn.add(GROUP)
            changes += 1
            doc = wait_converged(api, namespace, GROUP, churn.members(GROUP))
            want = {
                t: sorted([q.queue_id, q.broker_name] for q in qs) for t, qs in doc.queues_of(mine).items()
            }

            def served(generation: int = doc.generation, expected: dict[str, Any] = want) -> bool:
                view = side.client.queues()
                got = {
                    t: sorted([q["queueId"], q["brokerName"]] for q in qs) for t, qs in view["queues"].items()
                }
                return bool(
                    view["generation"] == generation
                    and {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}
                )

            wait_for(f"the sidecar serving generation {doc.generation} after {name}", served)
            assert op.alive, f"the operator died after {name}:\n{op.tail()}"
            assert side.returncode is None, f"the sidecar died after {name}:\n{side.tail()}"
    watcher.assert_clean()
    problems = unexpected_errors(op.log.read_text(errors="replace"))
    problems += unexpected_errors(side.log.read_text(errors="replace"))
    assert not problems, "unexpected errors in the logs:\n" + "\n".join(problems[:20])
    return {"restarts": restarts, "changes_after_restart": changes, "generations_checked": watcher.total()}


def test_api_server_and_etcd_restarts_lose_nothing(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    topics: dict[str, list[MessageQueue]],
    watcher: GenerationWatcher,
    start_operator: Callable[..., OperatorProcess],
    sidecar: Callable[[str, str], SidecarProcess],
) -> None:
    figures = restart_loop(1, cluster, api_client, namespace, nodes, watcher, start_operator, sidecar)
    print("api-restart figures:", " ".join(f"{k}={v}" for k, v in figures.items()))
    assert figures["restarts"] == len(DISRUPTIONS)


@pytest.mark.slow
def test_api_server_and_etcd_restarts_many_times(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    topics: dict[str, list[MessageQueue]],
    watcher: GenerationWatcher,
    start_operator: Callable[..., OperatorProcess],
    sidecar: Callable[[str, str], SidecarProcess],
) -> None:
    figures = restart_loop(5, cluster, api_client, namespace, nodes, watcher, start_operator, sidecar)
    print("api-restart figures:", " ".join(f"{k}={v}" for k, v in figures.items()))
    assert figures["restarts"] == 5 * len(DISRUPTIONS)


def test_conflicting_writes_are_retried(
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    topics: dict[str, list[MessageQueue]],
    watcher: GenerationWatcher,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """Another writer keeps changing the ConfigMap while members change: the operator's stale writes
    get 409 Conflict, it re-reads and converges, keeping the other writer's annotation."""
    rng = random.Random(11)
    apply_group(api_client, namespace, GROUP, SPEC)
    churn = Churn(api_client, namespace, [GROUP], nodes, rng, max_pods=6)
    churn.add(GROUP)
    op = start_operator()
    wait_converged(api_client, namespace, GROUP, churn.members(GROUP))
    core = client.CoreV1Api(api_client)
    stop = threading.Event()
    writes = [0]

    def interfere() -> None:
        while not stop.is_set():
            body = {"metadata": {"annotations": {"example.com/touched": str(writes[0])}}}
            core.patch_namespaced_config_map(configmap_name(GROUP), namespace, body)
            writes[0] += 1

    writer = threading.Thread(target=interfere, daemon=True)
    writer.start()
    try:
        wait_for(
            "the operator to meet a conflict",
            lambda: churn.step() and op.metric("mqbalance_reconcile_errors_total", kind="conflict") > 0,
            interval=0.02,
        )
        for _ in range(5):
            churn.step()
    finally:
        stop.set()
        writer.join()
    conflicts = op.metric("mqbalance_reconcile_errors_total", kind="conflict")
    wait_converged(api_client, namespace, GROUP, churn.members(GROUP))
    cm = core.read_namespaced_config_map(configmap_name(GROUP), namespace)
    assert cm.metadata is not None
    assert cm.metadata.annotations is not None
    assert cm.metadata.annotations["example.com/touched"] == str(writes[0] - 1)
    watcher.assert_clean()
    assert op.alive
    print(f"conflict figures: foreign_writes={writes[0]} conflicts={conflicts:g} changes={churn.actions}")
