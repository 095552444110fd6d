"""A group through its life: membership, zones, topics, invalid specs, debounce, restart, deletion."""

from __future__ import annotations

import json
import time
from typing import Any, cast

from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.polling import wait_for, work_timeout
from mqbalance.contract import SIDECAR_GROUP_ANNOTATION, read_topic
from tests.integration.invariants import check_document, check_journal
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import (
    apply_group,
    apply_topic,
    condition,
    custom,
    events_of,
    read_document,
    status_for,
    status_of,
    wait_generation,
)

GROUP, VERSION = "mqbalance.io", "v1alpha1"


def _readable(brokers: list[dict[str, Any]], topic: str = "life") -> dict[str, Any]:
    return {topic: read_topic(topic, {"brokers": brokers}).readable_queues()}


def _setup(
    api: client.ApiClient, ns: str, name: str, nodes: list[str], pods: int, debounce: float = 0
) -> list[dict[str, Any]]:
    brokers = [
        {"name": "broker-a", "zone": "zone-a", "readQueueNums": 6, "writeQueueNums": 6},
        {"name": "broker-b", "zone": "zone-b", "readQueueNums": 6, "writeQueueNums": 6},
    ]
    labels = {"app": name}
    kubelet.start_pods(api, ns, name, pods, labels, nodes)
    apply_topic(api, ns, name, brokers, topicName=name)
    apply_group(
        api,
        ns,
        name,
        {
            "topics": [name],
            "selector": {"matchLabels": labels},
            "strategy": {"name": "STICKY", "zoneAffinity": True},
            "debounceSeconds": debounce,
        },
    )
    return brokers


def test_membership_zone_and_topic_changes(testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "life"
    nodes = testbed.nodes
    brokers = _setup(api, ns, name, nodes, 3)
    doc = wait_generation(api, ns, name, 1)
    assert set(doc.members) == {"life-0", "life-1", "life-2"}
    check_document(doc, _readable(brokers))

    # scale up: a fourth pod becomes Ready
    kubelet.start_pods(api, ns, "life-up", 1, {"app": name}, nodes[3:4])
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert doc.reason == "member-joined"
    assert "life-up-0" in doc.members
    status = status_for(api, ns, name, doc.generation)
    assert status["members"] == 4
    assert status["lastRebalance"]["reason"] == "member-joined"
    assert condition(status, "Balanced")["status"] == "True"
    wait_for(
        "rebalance metric",
        lambda: testbed.operator.metric("mqbalance_rebalances_total", reason="member-joined"),
    )
    check_document(doc, _readable(brokers))

    # a pod goes unready
    kubelet.set_pod_ready(api, ns, "life-1", False)
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert doc.reason == "member-left"
    assert "life-1" not in doc.members
    assert status_for(api, ns, name, doc.generation)["members"] == 3
    check_document(doc, _readable(brokers))

    # scale down: a pod is deleted
    kubelet.delete_pod(api, ns, "life-up-0")
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert doc.reason == "member-left"
    assert set(doc.members) == {"life-0", "life-2"}

    # a member's node changes zone
    node_of_0 = kubelet.pod_node(kubelet.read_pod(api, ns, "life-0"))
    kubelet.set_node_zone(api, node_of_0, "zone-moved")
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert doc.reason == "zone-changed"
    assert doc.members["life-0"] == "zone-moved"
    assert status_for(api, ns, name, doc.generation)["zones"].get("zone-moved") == 1
    kubelet.set_node_zone(api, node_of_0, testbed.zone_nodes[node_of_0])
    doc = wait_generation(api, ns, name, doc.generation + 1)

    # the topic gains queues
    brokers[0]["readQueueNums"] = 10
    apply_topic(api, ns, name, brokers, topicName=name)
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert doc.reason == "topics-changed"
    assert status_for(api, ns, name, doc.generation)["queues"] == 16
    check_document(doc, _readable(brokers))

    # the topic is deleted: Invalid, and the last good assignment stays
    before = doc
    custom(api).delete_namespaced_custom_object(GROUP, VERSION, ns, "topics", name)
    status = wait_for(
        "Invalid=True",
        lambda: s if condition(s := status_of(api, ns, name), "Invalid").get("status") == "True" else None,
    )
    assert condition(status, "Invalid")["reason"] == "TopicNotFound"
    assert "not found" in condition(status, "Invalid")["message"]
    assert condition(status, "Ready")["status"] == "False"
    assert status["assignmentGeneration"] == before.generation
    wait_for("a TopicNotFound event", lambda: events_of(api, ns, name, "TopicNotFound"))
    wait_for(
        "invalid gauge",
        lambda: testbed.operator.metric("mqbalance_group_invalid", namespace=ns, group=name) == 1,
    )
    # membership changes while invalid publish nothing
    kubelet.set_pod_ready(api, ns, "life-1", True)
    wait_for(
        "the pod is seen",
        lambda: testbed.operator.metric("mqbalance_reconciles_total", result="invalid") >= 2,
    )
    assert read_document(api, ns, name) == before

    # the topic comes back: valid again, a new generation
    apply_topic(api, ns, name, brokers, topicName=name)
    doc = wait_generation(api, ns, name, before.generation + 1)
    status = status_for(api, ns, name, doc.generation)
    assert condition(status, "Invalid")["status"] == "False"
    assert condition(status, "Ready")["status"] == "True"
    assert set(doc.members) == {"life-0", "life-1", "life-2"}
    assert len(events_of(api, ns, name, "Rebalanced")) >= 1
    assert testbed.operator.metric("mqbalance_queues_moved_total") > 0
    assert check_journal(testbed.operator.journal_records()) >= 8


def test_no_members_publishes_an_empty_assignment(testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "empty"
    nodes = testbed.nodes
    _setup(api, ns, name, nodes, 1)
    doc = wait_generation(api, ns, name, 1)
    kubelet.set_pod_ready(api, ns, "empty-0", False)
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert doc.members == {}
    assert all(not a for a in doc.topics.values())
    status = status_for(api, ns, name, doc.generation)
    assert condition(status, "Ready")["reason"] == "NoMembers"
    assert condition(status, "Degraded")["status"] == "True"
    assert status["unassignedQueues"] == 12


def test_idle_members_are_degraded(testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "idle"
    nodes = testbed.nodes
    labels = {"app": name}
    kubelet.start_pods(api, ns, name, 3, labels, nodes)
    apply_topic(api, ns, name, [{"name": "b", "readQueueNums": 2, "writeQueueNums": 2}])
    apply_group(api, ns, name, {"topics": [name], "selector": {"matchLabels": labels}})
    doc = wait_generation(api, ns, name, 1)
    status = status_for(api, ns, name, doc.generation)
    assert condition(status, "Degraded")["reason"] == "IdleMembers"


def test_a_pod_started_without_its_sidecar_holds_no_queues(testbed: Testbed) -> None:
    """A pod that asked for the sidecar (its annotation) but was started without one (not labelled for
    injection, or admitted while the injector was away with failurePolicy Ignore) serves nothing: it is
    Ready, yet no member, so its share stays with the pods that serve, and the status says why."""
    api, ns, name = testbed.api, testbed.ns, "nosidecar"
    nodes = testbed.nodes
    brokers = _setup(api, ns, name, nodes, 2)
    doc = wait_generation(api, ns, name, 1)
    kubelet.create_pod(api, ns, f"{name}-bare", {"app": name}, annotations={SIDECAR_GROUP_ANNOTATION: name})
    kubelet.bind_pod(api, ns, f"{name}-bare", nodes[0])
    kubelet.set_pod_ready(api, ns, f"{name}-bare", True)

    def reported() -> dict[str, Any] | None:
        status = status_of(api, ns, name)
        listed = status.get("notServingPods") or []
        return status if [p["name"] for p in listed] == [f"{name}-bare"] else None

    status = wait_for("the pod without its sidecar in the group's status", reported)
    (bare,) = status["notServingPods"]
    assert bare["reason"] == "SidecarMissing"
    assert "mqbalance.io/sidecar-injection=enabled" in bare["message"]
    now = read_document(api, ns, name)
    assert now is not None
    assert now.generation == doc.generation  # no new generation: it never joined
    assert set(now.members) == {f"{name}-0", f"{name}-1"}
    check_document(now, _readable(brokers, name))


def test_burst_of_pod_changes_in_one_window_is_one_generation(testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "burst"
    nodes = testbed.nodes
    window = 8.0
    # The four pods that will join exist from the start, not Ready yet: the burst is then five
    # readiness changes, a few requests that fit in the window however busy the machine is.
    newcomers = [f"burst-new-{i}" for i in range(4)]
    for i, pod in enumerate(newcomers):
        kubelet.create_pod(api, ns, pod, {"app": name}, nodes[i % len(nodes)])
    _setup(api, ns, name, nodes, 2, debounce=window)
    doc = wait_generation(api, ns, name, 1)
    wait_for(
        "the not-Ready pods listed", lambda: status_of(api, ns, name).get("notServing") == len(newcomers)
    )
    assert read_document(api, ns, name) == doc  # the listing published nothing new
    journal_before = len(testbed.operator.journal_records())
    # A rolling change: four pods join, one leaves, all inside the window.
    began = time.monotonic()
    for pod in newcomers:
        kubelet.set_pod_ready(api, ns, pod, True)
    kubelet.set_pod_ready(api, ns, "burst-0", False)
    took = time.monotonic() - began
    assert took < window, f"the burst took {took:.1f} s, longer than its {window:g} s window"
    doc = wait_generation(api, ns, name, doc.generation + 1)
    assert set(doc.members) == {"burst-1", "burst-new-0", "burst-new-1", "burst-new-2", "burst-new-3"}
    assert doc.reason == "members-changed"
    records = [r for r in testbed.operator.journal_records()[journal_before:] if r.group == name]
    assert [r.generation for r in records] == [doc.generation]


def test_schema_rejects_bad_specs(cluster: Any, crds: None, module_namespace: str) -> None:
    bad = {
        "unknown strategy": {"topics": ["t"], "selector": {}, "strategy": {"name": "RANDOM"}},
        "negative debounce": {"topics": ["t"], "selector": {}, "debounceSeconds": -1},
        "no selector": {"topics": ["t"]},
        "no topics": {"topics": [], "selector": {}},
        "bad operator": {"topics": ["t"], "selector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}},
    }
    for what, spec in bad.items():
        manifest = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ConsumerGroup",
            "metadata": {"name": "bad"},
            "spec": spec,
        }
        result = cluster.kubectl(
            "apply",
            "--validate=false",
            "-n",
            module_namespace,
            "-f",
            "-",
            input=json.dumps(manifest),
            check=False,
        )
        assert result.returncode != 0, what
        assert "is invalid" in result.stderr, (what, result.stderr)
    topic = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Topic",
        "metadata": {"name": "bad"},
        "spec": {"brokers": [{"name": "b", "readQueueNums": -1, "writeQueueNums": 1}]},
    }
    result = cluster.kubectl(
        "apply", "--validate=false", "-n", module_namespace, "-f", "-", input=json.dumps(topic), check=False
    )
    assert result.returncode != 0
    assert "readQueueNums" in result.stderr


def test_spec_the_schema_allows_but_cannot_work_is_invalid(
    module_api: client.ApiClient, module_namespace: str, operator_process: OperatorProcess
) -> None:
    api, ns = module_api, module_namespace
    apply_topic(api, ns, "room", [{"name": "hz@b", "readQueueNums": 2, "writeQueueNums": 2}])
    # No schema or CEL rule relates CONFIG's members to each other (the CRD's rules catch the
    # single-field mistakes on current Kubernetes; the bad-input corpus covers those).
    queue = {"broker": "hz@b", "queueId": 0}
    room = {"topics": ["room"], "selector": {"matchLabels": {"app": "room"}}}
    apply_group(
        api,
        ns,
        "room",
        {**room, "strategy": {"name": "CONFIG", "config": {"room-0": [queue], "room-1": [queue]}}},
    )
    status = wait_for(
        "Invalid=True",
        lambda: (s := status_of(api, ns, "room")) and condition(s, "Invalid").get("status") == "True" and s,
    )
    message = condition(status, "Invalid")["message"]
    assert "hz@b/0 ('room-0', 'room-1') to more than one member" in message
    assert "every queue has one owner" in message
    assert read_document(api, ns, "room") is None
    # fixing the spec publishes
    apply_group(api, ns, "room", {**room, "strategy": {"name": "MACHINE_ROOM", "consumerIdcs": ["hz"]}})
    doc = wait_generation(api, ns, "room", 1)
    assert condition(status_for(api, ns, "room", doc.generation), "Invalid")["status"] == "False"


def test_restart_changes_nothing_and_deletion_collects_the_configmap(testbed: Testbed) -> None:
    api, ns = testbed.api, testbed.ns
    nodes = testbed.nodes
    _setup(api, ns, "keep", nodes, 4)
    wait_generation(api, ns, "keep", 1)
    listed = cast(
        dict[str, Any], custom(api).list_namespaced_custom_object(GROUP, VERSION, ns, "consumergroups")
    )
    groups = listed["items"]
    before = {g["metadata"]["name"]: read_document(api, ns, g["metadata"]["name"]) for g in groups}
    journal_before = len(testbed.operator.journal_records())

    testbed.operator.stop()
    testbed.operator.start()
    wait_for(
        "every group reconciled after the restart",
        lambda: testbed.operator.metric("mqbalance_reconciles_total") >= len(groups),
        work_timeout(60, 0.5, len(groups)),
    )
    after = {name: read_document(api, ns, name) for name in before}
    assert after == before
    assert len(testbed.operator.journal_records()) == journal_before

    # deleting the group garbage-collects its ConfigMap (kube-controller-manager's GC)
    custom(api).delete_namespaced_custom_object(GROUP, VERSION, ns, "consumergroups", "keep")
    wait_for("the ConfigMap to be collected", lambda: read_document(api, ns, "keep") is None)
    wait_for(
        "the group's gauges to go",
        lambda: (
            testbed.operator.metric("mqbalance_group_members", namespace=ns, group="keep") == 0
            and 'group="keep"' not in testbed.operator.metrics_text()
        ),
    )
