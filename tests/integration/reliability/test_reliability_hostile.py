"""Hostile input: one team's Topics name a NameServer on 127.0.0.1 that answers every route request with
a fault (harness/faults/hostile_nameserver.py: garbage, nesting deeper than a parser's stack, a billion
queues, an oversized or truncated frame, silence...), while another team's canary group scales in a namespace
of its own. The shared operator must go on serving the canary (each change published within its
debounce plus 5 s), stay inside the chart's memory limit, keep answering /healthz, and report each
hostile Topic's fault in its status.

More hostile Topics than the operator has workers: one worker lost per fault would stop every group.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.faults.hostile_nameserver import FAULTS, HostileNameServer, hostile_nameserver
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from tests.integration.operator_support import apply_group, apply_topic, condition, custom, read_document

CHART_MEMORY_LIMIT = 256 * 1024 * 1024
"""The chart's default limit of the operator container (operator.resources.limits.memory: 256Mi)."""
WORKERS = 8
"""The operator's default number of workers (--workers)."""
DEBOUNCE = 1.0
PUBLISH_WITHIN = DEBOUNCE + 5.0
"""How soon the canary's change must be published, hostile Topics or not."""
NAMESERVER_TIMEOUT = 1.0
"""The operator's --name-server-timeout here: a silent NameServer holds a read this long."""

EXPECTED_REASONS = {
    "RequestFailed": (
        "not-utf8",
        "deep-list",
        "deep-object",
        "overflowing-number",
        "wrong-types",
        "error-code",
    ),
    "RouteTooLarge": ("billion-queues", "many-brokers"),
    "NameServerUnreachable": ("oversized-frame", "cut-short", "header-past-frame", "silence", "wrong-opaque"),
}
"""The reason of each fault's RouteAvailable=False condition: an unreadable answer, a route over the
operator's bounds, or no usable answer at all."""
REASON_OF = {fault: reason for reason, faults in EXPECTED_REASONS.items() for fault in faults}


@dataclass
class Figures:
    hostile_topics: int = 0
    route_requests: int = 0
    topics_reported: int = 0
    canary_changes: int = 0
    slowest_publish_seconds: float = 0.0
    peak_rss_mib: float = 0.0

    def line(self) -> str:
        return "hostile figures: " + " ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in vars(self).items()
        )


def peak_rss(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.fixture
def canary_namespace(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    name = f"canary-{uuid.uuid4().hex[:8]}"
    cluster.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    cluster.api.call("DELETE", f"/api/v1/namespaces/{name}")


def hostile_round(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    hostile: str,
    canary: str,
    tmp_path: Path,
    copies: int,
    steps: int,
) -> Figures:
    figures = Figures()
    with hostile_nameserver() as server:
        operator = OperatorProcess(
            cluster, [hostile, canary], tmp_path, f"--name-server-timeout={NAMESERVER_TIMEOUT:g}"
        )
        operator.start()
        try:
            topics = create_hostile_topics(api_client, hostile, server, copies)
            figures.hostile_topics = len(topics)
            node = f"node-{canary}"
            kubelet.create_node(api_client, node, "zone-a")
            try:
                scale_canary(api_client, canary, node, operator, steps, figures)
            finally:
                kubelet.delete_node(api_client, node)
            figures.topics_reported = wait_reported(api_client, hostile, topics, operator)
            figures.route_requests = sum(server.requests.values())
            assert operator.healthy(), "the operator's /healthz failed"
            figures.peak_rss_mib = peak_rss(operator.pid) / 2**20
        finally:
            operator.stop()
    print(figures.line())
    assert figures.peak_rss_mib * 2**20 < CHART_MEMORY_LIMIT, figures.line()
    return figures


def create_hostile_topics(
    api: client.ApiClient, namespace: str, server: HostileNameServer, copies: int
) -> dict[str, str]:
    """``copies`` Topics per fault, each naming the hostile NameServer; resource name -> fault."""
    topics = {}
    for fault in FAULTS:
        for i in range(copies):
            name = f"{fault}-{i}"
            apply_topic(
                api, namespace, name, None, topicName=fault, nameServer={"addresses": [server.address]}
            )
            topics[name] = fault
    assert len(topics) > WORKERS, "fewer hostile Topics than workers prove nothing about lost workers"
    return topics


def scale_canary(
    api: client.ApiClient, namespace: str, node: str, operator: OperatorProcess, steps: int, figures: Figures
) -> None:
    """The canary group goes 2 -> 3 -> 4 -> 3 -> ...: each change published within PUBLISH_WITHIN."""
    labels = {"app": "canary"}
    brokers = [{"name": "broker-a", "zone": "zone-a", "readQueueNums": 8, "writeQueueNums": 8}]
    apply_topic(api, namespace, "canary", brokers)
    kubelet.start_pods(api, namespace, "canary", 2, labels, [node])
    apply_group(
        api,
        namespace,
        "canary",
        {"topics": ["canary"], "selector": {"matchLabels": labels}, "debounceSeconds": DEBOUNCE},
    )
    members = {"canary-0", "canary-1"}
    wait_members(api, namespace, members, operator, 60.0)
    joined = len(members)
    for step in range(steps):
        if step % 3 != 2:  # two pods join, then one leaves
            kubelet.start_pods(api, namespace, "canary", 1, labels, [node], first=joined)
            members.add(f"canary-{joined}")
            joined += 1
        else:
            leaving = sorted(members)[0]
            kubelet.set_pod_ready(api, namespace, leaving, False)
            members.discard(leaving)
        began = time.monotonic()
        wait_members(api, namespace, members, operator, PUBLISH_WITHIN)
        figures.slowest_publish_seconds = max(figures.slowest_publish_seconds, time.monotonic() - began)
        figures.canary_changes += 1


def wait_members(
    api: client.ApiClient, namespace: str, members: set[str], operator: OperatorProcess, timeout: float
) -> None:
    def published() -> bool:
        operator.check()
        doc = read_document(api, namespace, "canary")
        return doc is not None and set(doc.members) == members

    wait_for(f"the canary published with members {sorted(members)}", published, timeout, 0.05)


def wait_reported(
    api: client.ApiClient, namespace: str, topics: dict[str, str], operator: OperatorProcess
) -> int:
    """Until every hostile Topic's status names its fault; how many do. A read the busy machine
    timed out reads as unreachable until the next attempt (failed reads are retried with backoff)."""
    seen: dict[str, str] = {}

    def reasons() -> dict[str, str]:
        operator.check()
        for name in topics:
            body: Any = custom(api).get_namespaced_custom_object(
                "mqbalance.io", "v1alpha1", namespace, "topics", name
            )
            available = condition(body.get("status") or {}, "RouteAvailable")
            seen[name] = f"{available.get('status')}/{available.get('reason')}"
        return seen

    def reported() -> bool:
        return all(reason == f"False/{REASON_OF[topics[name]]}" for name, reason in reasons().items())

    def mismatches() -> str:
        wrong = {n: (topics[n], r) for n, r in seen.items() if r != f"False/{REASON_OF[topics[n]]}"}
        return f"Topics not (yet) reporting their fault's reason (fault, status/reason): {wrong}"

    wait_for("every hostile Topic's fault in its status", reported, 120, 0.5, details=mismatches)
    return len(seen)


def test_hostile_nameserver_answers_stop_no_other_group(
    cluster: LocalCluster, crds: None, api_client: client.ApiClient, namespace: str, canary_namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    figures = hostile_round(cluster, api_client, namespace, canary_namespace, tmp_path, copies=1, steps=3)
    assert figures.hostile_topics == len(FAULTS) == figures.topics_reported
    assert figures.canary_changes == 3


@pytest.mark.slow
def test_hostile_nameserver_answers_at_scale(
    cluster: LocalCluster, crds: None, api_client: client.ApiClient, namespace: str, canary_namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    figures = hostile_round(cluster, api_client, namespace, canary_namespace, tmp_path, copies=8, steps=12)
    assert figures.hostile_topics == 8 * len(FAULTS) == figures.topics_reported
    assert figures.canary_changes == 12
