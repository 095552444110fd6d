"""kubectl mqbalance as a user runs it: the real kubectl finds the plugin on the PATH and it reads
the group the operator reconciles on the real API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import (
    apply_group,
    apply_topic,
    condition,
    read_document,
    status_for,
    wait_generation,
)

PLUGIN_BIN = Path(sys.executable).parent
"""Where the wheel installed ``kubectl-mqbalance`` (the environment's scripts)."""


def kubectl_mqbalance(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{PLUGIN_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "mqbalance", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def test_status_what_if_and_errors_through_kubectl(cluster: LocalCluster, testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "plugin"
    brokers = [
        {"name": "broker-a", "zone": "zone-a", "readQueueNums": 4, "writeQueueNums": 4},
        {"name": "broker-b", "zone": "zone-b", "readQueueNums": 4, "writeQueueNums": 4},
    ]
    kubelet.start_pods(api, ns, name, 3, {"app": name}, testbed.nodes)
    apply_topic(api, ns, name, brokers, topicName=name)
    apply_group(
        api,
        ns,
        name,
        {"topics": [name], "selector": {"matchLabels": {"app": name}}, "strategy": {"name": "STICKY"}},
    )
    doc = wait_generation(api, ns, name, 1)
    status_for(api, ns, name, doc.generation)

    shown = kubectl_mqbalance(cluster, "status", name, "-n", ns, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    held = {m: sum(len(a.get(m, ())) for a in doc.topics.values()) for m in doc.members}
    assert {m["name"]: m["queues"] for m in view["members"]} == held
    assert view["generation"] == doc.generation
    assert view["queues"] == 8

    table = kubectl_mqbalance(cluster, "status", name, "-n", ns)
    assert table.returncode == 0, table.stderr
    assert f"ConsumerGroup {ns}/{name}" in table.stdout
    assert all(any(line.split()[:1] == [m] for line in table.stdout.splitlines()) for m in doc.members)

    fewer = kubectl_mqbalance(cluster, "what-if", name, "-n", ns, "--members", "2", "-o", "json")
    assert fewer.returncode == 0, fewer.stderr
    figures = json.loads(fewer.stdout)["figures"]
    assert figures["moved"] == figures["minimumMoves"] > 0  # STICKY moves only the leaver's queues
    assert read_generation(cluster, ns, name) == doc.generation  # a what-if changes nothing

    paused = kubectl_mqbalance(cluster, "pause", name, "-n", ns)
    assert paused.returncode == 0, paused.stderr
    assert f"consumergroup {ns}/{name} paused" in paused.stdout
    doc = wait_for("the pause to assign nobody anything", lambda: _paused(api, ns, name))
    status = status_for(api, ns, name, doc.generation)
    assert condition(status, "Paused")["status"] == "True"
    shown = kubectl_mqbalance(cluster, "status", name, "-n", ns)
    assert "Paused:      by spec.paused; 0 queues still held" in shown.stdout
    resumed = kubectl_mqbalance(cluster, "resume", name, "-n", ns)
    assert resumed.returncode == 0, resumed.stderr
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert sum(len(q) for a in doc.topics.values() for q in a.values()) == 8
    status_for(api, ns, name, doc.generation)
    history = kubectl_mqbalance(cluster, "history", name, "-n", ns, "-o", "json")
    assert [e["reason"] for e in json.loads(history.stdout)][:2] == ["resumed", "paused"]

    missing = kubectl_mqbalance(cluster, "status", "nobody", "-n", ns)
    assert missing.returncode == 1
    assert "consumergroup 'nobody'" in missing.stderr
    assert "not found" in missing.stderr
    usage = kubectl_mqbalance(cluster, "what-if", name, "-n", ns)
    assert usage.returncode == 1
    assert "--strategy NAME and/or --members N" in usage.stderr


def _paused(api: Any, ns: str, name: str) -> AssignmentDocument | None:
    doc = read_document(api, ns, name)
    return (
        doc
        if doc is not None
        and doc.reason == "paused"
        and not any(q for a in doc.topics.values() for q in a.values())
        else None
    )


def read_generation(cluster: LocalCluster, ns: str, name: str) -> int:
    out = cluster.kubectl(
        "get", "consumergroup", name, "-n", ns, "-o", "jsonpath={.status.assignmentGeneration}"
    )
    return int(out.stdout)
