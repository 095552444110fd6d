"""Why a matching pod is not a member: read from Pod objects as a kubelet and controllers write them,
and reported in the group's status (count, the pods with their reasons, the Ready condition's message)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from mqbalance.contract import SIDECAR_CONTAINER, SIDECAR_GROUP_ANNOTATION
from mqbalance.operator.membership import MAX_MESSAGE, PodInfo, not_serving, pod_info
from mqbalance.operator.reconcile import Observed, reconcile
from mqbalance.operator.spec import parse_selector
from mqbalance.operator.status import MAX_NOT_SERVING_LISTED, not_serving_summary

TOPIC = {"topicName": "T", "brokers": [{"name": "b1", "zone": "z1", "readQueueNums": 4, "writeQueueNums": 4}]}


def container(
    name: str, *, ready: bool = True, waiting: str | None = None, message: str = ""
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    if waiting is not None:
        state = {"waiting": {"reason": waiting, **({"message": message} if message else {})}}
    return {"name": name, "ready": ready, "restartCount": 0, "state": state}


def body(
    *,
    phase: str = "Running",
    ready: bool = True,
    containers: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    gates: list[str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "labels": {"app": "a"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conds = [{"type": "Ready", "status": "True" if ready else "False"}, *(conditions or [])]
    spec: dict[str, Any] = {"nodeName": "n1"}
    if gates:
        spec["readinessGates"] = [{"conditionType": g} for g in gates]
    status = {"phase": phase, "conditions": conds, "containerStatuses": containers or [container("app")]}
    return {"metadata": meta, "spec": spec, "status": status}


def pending(waiting: str, message: str = "") -> dict[str, Any]:
    """A Pending pod whose one container waits for ``waiting``."""
    return body(
        phase="Pending",
        ready=False,
        containers=[container("app", ready=False, waiting=waiting, message=message)],
    )


def test_a_serving_pod_has_no_reason() -> None:
    info = pod_info(body())
    assert info.serving
    assert (info.reason, info.message) == ("", "")


@pytest.mark.parametrize(
    ("pod", "reason", "in_message"),
    [
        (
            body(
                ready=False,
                containers=[
                    container("app"),
                    container(
                        "sidecar",
                        ready=False,
                        waiting="CrashLoopBackOff",
                        message="back-off 20s restarting failed container",
                    ),
                ],
            ),
            "CrashLoopBackOff",
            "container sidecar: back-off 20s",
        ),
        (
            pending("ErrImageNeverPull", 'Container image "x:1" is not present with pull policy of Never'),
            "ErrImageNeverPull",
            'image "x:1" is not present',
        ),
        (pending("ImagePullBackOff"), "ImagePullBackOff", "container app: ImagePullBackOff"),
        (
            body(ready=False, containers=[container("app", ready=False), container("sidecar")]),
            "NotReady",
            "app",
        ),
        (
            body(
                ready=False
            ),  # every container ready, yet Ready=False: marked by the node lifecycle controller
            "NodeNotReady",
            "node n1",
        ),
        (
            body(ready=False, gates=["example.com/warm"]),
            "ReadinessGatesNotReady",
            "example.com/warm",
        ),
        (pending("ContainerCreating"), "Pending", "phase Pending"),
        (
            body(
                phase="Pending",
                ready=False,
                containers=[],
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes",
                    }
                ],
            ),
            "Unschedulable",
            "0/1 nodes",
        ),
        (body(deleting=True), "Terminating", "being deleted"),
        (
            body(phase="Failed", ready=False, containers=[container("app", ready=False)]),
            "Failed",
            "phase Failed",
        ),
    ],
)
def test_why_a_pod_is_not_serving(pod: dict[str, Any], reason: str, in_message: str) -> None:
    info = pod_info(pod)
    assert not info.serving
    assert info.reason == reason
    assert in_message in info.message


def test_a_pod_that_asked_for_a_sidecar_and_runs_none_is_no_member() -> None:
    """Not injected (no opt-in label, or admitted while the injector was away with failurePolicy
    Ignore): nothing in it would serve queues, so it gets none, and the status says what to fix."""
    asked = body()
    asked["metadata"]["annotations"] = {SIDECAR_GROUP_ANNOTATION: "orders"}
    asked["spec"]["containers"] = [{"name": "app", "image": "example/orders:1"}]
    info = pod_info(asked)
    assert not info.serving
    assert info.reason == "SidecarMissing"
    assert "mqbalance.io/sidecar-injection=enabled" in info.message
    assert len(info.message) < MAX_MESSAGE
    # With its sidecar (a container, or a native sidecar among the init containers), a member.
    for where in ("containers", "initContainers"):
        injected = json.loads(json.dumps(asked))
        injected["spec"].setdefault(where, []).append({"name": SIDECAR_CONTAINER, "image": "mqbalance/x"})
        assert pod_info(injected).serving, where
    # A pod that never asked (a sidecar added by hand, or none at all): judged as before.
    assert pod_info(body()).serving


def test_long_kubelet_messages_are_cut() -> None:
    long = "x" * 5000
    info = pod_info(
        body(ready=False, containers=[container("app", ready=False, waiting="ErrImagePull", message=long)])
    )
    assert info.reason == "ErrImagePull"
    assert len(info.message) == MAX_MESSAGE


def test_not_serving_lists_only_matching_pods_by_name() -> None:
    selector = parse_selector({"matchLabels": {"app": "a"}})
    pods = [
        PodInfo("b", {"app": "a"}, reason="NotReady"),
        PodInfo("a", {"app": "a"}, reason="CrashLoopBackOff"),
        PodInfo("c", {"app": "other"}, reason="NotReady"),
        PodInfo("d", {"app": "a"}, running=True, ready=True),
    ]
    assert [p.name for p in not_serving(pods, selector)] == ["a", "b"]


def test_summary_groups_reasons_most_common_first() -> None:
    pods = [PodInfo(f"p{i}", reason="CrashLoopBackOff") for i in range(4)] + [
        PodInfo("q", reason="NodeNotReady")
    ]
    assert not_serving_summary(pods) == (
        "5 matching pods not serving: 4 CrashLoopBackOff (p0, p1, p2, ...), 1 NodeNotReady (q)"
    )
    assert not_serving_summary([]) == ""


def observe(pods: list[PodInfo]) -> Observed:
    spec = {"topics": ["t"], "selector": {"matchLabels": {"app": "a"}}, "strategy": {"name": "AVG"}}
    return Observed(
        namespace="ns",
        name="g",
        spec=spec,
        topics={"t": TOPIC},
        pods=pods,
        node_labels={"n1": {"topology.kubernetes.io/zone": "z1"}},
        previous=None,
        now=1_800_000_000.0,
        generation=1,
    )


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_status_counts_and_names_pods_that_do_not_serve() -> None:
    serving = PodInfo("ok", {"app": "a"}, "n1", running=True, ready=True)
    crashing = PodInfo(
        "crash", {"app": "a"}, "n1", running=True, reason="CrashLoopBackOff", message="container s"
    )
    out = reconcile(observe([serving, crashing]))
    assert out.status["members"] == 1
    assert out.status["notServing"] == 1
    assert out.status["notServingPods"] == [
        {"name": "crash", "reason": "CrashLoopBackOff", "message": "container s"}
    ]
    ready = ready_condition(out.status)
    assert ready["status"] == "True"
    assert (
        ready["message"]
        == "generation 1 serves 1 members; 1 matching pod not serving: 1 CrashLoopBackOff (crash)"
    )


def test_no_members_says_why_in_the_ready_condition() -> None:
    pods = [PodInfo(f"p{i}", {"app": "a"}, "n1", running=True, reason="NodeNotReady") for i in range(2)]
    out = reconcile(observe(pods))
    ready = ready_condition(out.status)
    assert (ready["status"], ready["reason"]) == ("False", "NoMembers")
    assert ready["message"].endswith("2 matching pods not serving: 2 NodeNotReady (p0, p1)")
    assert out.status["notServing"] == 2


def test_the_list_is_capped_but_the_count_is_not() -> None:
    pods = [PodInfo(f"p{i:02}", {"app": "a"}, reason="NotReady") for i in range(MAX_NOT_SERVING_LISTED + 5)]
    out = reconcile(observe([*pods, PodInfo("ok", {"app": "a"}, running=True, ready=True)]))
    assert out.status["notServing"] == MAX_NOT_SERVING_LISTED + 5
    assert len(out.status["notServingPods"]) == MAX_NOT_SERVING_LISTED


def test_a_pod_recovering_clears_the_report() -> None:
    crashing = PodInfo("p", {"app": "a"}, "n1", running=True, reason="CrashLoopBackOff")
    first = reconcile(observe([crashing]))
    recovered = replace(crashing, ready=True, reason="", message="")
    second = reconcile(replace(observe([recovered]), status=first.status))
    assert second.status["notServing"] == 0
    assert second.status["notServingPods"] == []
    assert "not serving" not in ready_condition(second.status)["message"]
