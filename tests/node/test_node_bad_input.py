"""Bad input on real pods: a missing image, a crash-looping sidecar, a node that goes NotReady.

In each case the pods that cannot serve leave the group (or never join), no queue is ever
given to two members, and the group's status says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness.node.cluster import RealNode
from harness.node.workload import (
    EXAMPLES,
    GROUP,
    NAMESPACE,
    apply,
    assignment,
    condition,
    group_status,
    group_status_for,
    journal,
    kubectl_json,
    pods,
    ready_pod_names,
    rollout_status,
    wait_members,
)
from harness.polling import wait_for
from tests.integration.invariants import check_document, check_journal
from tests.node.node_support import example_readable


@pytest.fixture
def four_members(node: RealNode, consumers: None) -> Iterator[set[str]]:
    """Four healthy consumers before the test; afterwards every published generation is checked."""
    node.kubectl("scale", "-n", NAMESPACE, f"deploy/{GROUP}", "--replicas=4")
    rollout_status(node, GROUP)
    wait_for("no consumer pod but the four", lambda: len(pods(node)) == 4 or None, 60, 0.5)
    seen = len(journal(node))
    yield set(wait_members(node, 4).members)
    records = [r for r in journal(node)[seen:] if r.group == GROUP]
    check_journal(records)


def wait_reason(node: RealNode, reason: str, timeout: float = 120) -> dict[str, Any]:
    """The group's status once it lists a pod not serving for ``reason``."""

    def listed() -> dict[str, Any] | None:
        status = group_status(node)
        reasons = {p["reason"] for p in status.get("notServingPods", [])}
        return status if reason in reasons else None

    return wait_for(f"status.notServingPods with reason {reason}", listed, timeout, 0.5)


def check_members_are_ready_pods(node: RealNode) -> None:
    doc = assignment(node)
    assert doc is not None
    check_document(doc, example_readable())
    assert set(doc.members) <= ready_pod_names(node) | set(), (
        sorted(doc.members),
        sorted(ready_pod_names(node)),
    )


def test_a_missing_image_stalls_the_rollout_and_the_status_says_why(
    node: RealNode, four_members: set[str]
) -> None:
    node.kubectl(
        "set", "image", "-n", NAMESPACE, f"deploy/{GROUP}", "mqbalance-sidecar=localhost/mqbalance:missing"
    )
    try:
        status = wait_reason(node, "ErrImageNeverPull")
        # maxUnavailable 1: one old pod goes, the new ones never start; three members remain.
        doc = wait_members(node, 3)
        assert set(doc.members) < four_members
        status = group_status_for(node, doc.generation)
        stuck = [p for p in status["notServingPods"] if p["reason"] == "ErrImageNeverPull"]
        assert stuck
        assert "localhost/mqbalance:missing" in stuck[0]["message"]
        assert status["notServing"] >= 1
        assert "ErrImageNeverPull" in condition(status, "Ready")["message"]
        check_members_are_ready_pods(node)
    finally:
        node.kubectl("rollout", "undo", "-n", NAMESPACE, f"deploy/{GROUP}")
    rollout_status(node, GROUP)
    wait_members(node, 4)
    wait_for("notServing back to 0", lambda: group_status(node)["notServing"] == 0 or None, 60, 0.5)


def test_the_example_as_is_fails_its_pull_on_the_machine_and_the_status_says_why(
    node: RealNode, four_members: set[str]
) -> None:
    # examples/consumer-deployment.yaml unchanged but for its name: its app image
    # (registry.example.com/...) is pulled, and every registry host leads to a closed port on
    # 127.0.0.1, so the pull fails here without leaving the machine.
    example = yaml.safe_load((EXAMPLES / "consumer-deployment.yaml").read_text())
    example["metadata"].update(name="as-is", namespace=NAMESPACE)
    example["spec"]["replicas"] = 1
    apply(node, example)
    try:
        status = wait_reason(node, "ImagePullBackOff")
        pulled = next(p for p in status["notServingPods"] if p["reason"] == "ImagePullBackOff")
        assert pulled["name"].startswith("as-is-")
        event = wait_for(
            "the kubelet's pull error",
            lambda: next(
                (
                    e["message"]
                    for e in kubectl_json(node, "get", "events", "-n", NAMESPACE)["items"]
                    if e["involvedObject"]["name"] == pulled["name"]
                    and "registry.example.com" in e["message"]
                    and "127.0.0.1:9" in e["message"]
                ),
                None,
            ),
            60,
            0.5,
        )
        assert "connection refused" in event
        doc = assignment(node)
        assert doc is not None
        assert pulled["name"] not in doc.members
        assert set(doc.members) == four_members
    finally:
        node.kubectl("delete", "deploy", "-n", NAMESPACE, "as-is", "--wait=true", timeout=120)
    wait_for("the as-is pod gone", lambda: len(pods(node)) == 4 or None, 60, 0.5)


def test_a_crash_looping_sidecar_stays_out_and_the_status_says_why(
    node: RealNode, four_members: set[str]
) -> None:
    # A setting the sidecar refuses at start (it exits with status 2): every restart fails.
    node.kubectl(
        "set",
        "env",
        "-n",
        NAMESPACE,
        f"deploy/{GROUP}",
        "-c",
        "mqbalance-sidecar",
        "MQBALANCE_FAULT_TABLE=6x",
    )
    try:
        status = wait_reason(node, "CrashLoopBackOff", timeout=180)
        crashing = next(p for p in status["notServingPods"] if p["reason"] == "CrashLoopBackOff")
        assert "mqbalance-sidecar" in crashing["message"]
        pod = kubectl_json(node, "get", "pod", "-n", NAMESPACE, crashing["name"])
        sidecar = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "mqbalance-sidecar")
        assert sidecar["restartCount"] >= 1
        assert sidecar["lastState"]["terminated"]["exitCode"] == 2
        doc = assignment(node)
        assert doc is not None
        assert crashing["name"] not in doc.members
        wait_members(node, 3)
        check_members_are_ready_pods(node)
    finally:
        node.kubectl("rollout", "undo", "-n", NAMESPACE, f"deploy/{GROUP}")
    rollout_status(node, GROUP)
    wait_members(node, 4)


def test_a_node_that_goes_not_ready_takes_its_members_out(node: RealNode, four_members: set[str]) -> None:
    node.stop_kubelet()
    try:

        def not_ready() -> bool | None:
            got = kubectl_json(node, "get", "node", node.node_name)
            ready = next(c for c in got["status"]["conditions"] if c["type"] == "Ready")
            return True if ready["status"] != "True" else None

        wait_for("the node NotReady after its kubelet stopped", not_ready, 90, 1)
        status = wait_reason(node, "NodeNotReady", timeout=90)

        def emptied() -> dict[str, Any] | None:
            current = group_status(node)
            return current if current["members"] == 0 else None

        status = wait_for("every member gone from the group", emptied, 60, 0.5)
        ready = condition(status, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "NoMembers")
        assert "4 NodeNotReady" in ready["message"]
        gone = {p["name"] for p in status["notServingPods"] if p["reason"] == "NodeNotReady"}
        assert gone == four_members
        doc = assignment(node)
        assert doc is not None
        assert doc.members == {}
        check_document(doc, example_readable())
    finally:
        node.start_kubelet()
    doc = wait_members(node, 4)
    assert set(doc.members) == four_members, "the same pods serve again once their node is back"
