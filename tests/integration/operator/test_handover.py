"""The handover on the real API server: the operator revokes, each pod's sidecar records its
application's release in the releases ConfigMap, and only then do the queues go to their new
owners; an owner that never releases is overridden at the timeout; a terminating pod that
releases everything hands over at once and its sidecar drains."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from harness.kube import kubelet
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument, read_topic
from mqbalance.model import MessageQueue
from mqbalance.sidecar.config import DEFAULT_MAX_WAIT
from tests.integration.invariants import check_document
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import (
    apply_group,
    apply_topic,
    events_of,
    read_document,
    status_for,
    status_of,
)

LABELS = {"app": "handover"}
BROKERS = [{"name": "broker-a", "zone": "zone-a", "readQueueNums": 8, "writeQueueNums": 8}]


def readable(group: str) -> dict[str, list[MessageQueue]]:
    """The readable queues of the group's Topic ``t-<group>`` (:func:`two_pods_with_release`)."""
    return {f"t-{group}": read_topic(f"t-{group}", {"brokers": BROKERS}).readable_queues()}


def published(api: client.ApiClient, ns: str, group: str, test: Any, what: str) -> AssignmentDocument:
    def probe() -> AssignmentDocument | None:
        doc = read_document(api, ns, group)
        if doc is not None:
            check_document(doc, readable(group))
        return doc if doc is not None and test(doc) else None

    return wait_for(what, probe, timeout=60)


def two_pods_with_release(
    api: client.ApiClient,
    ns: str,
    group: str,
    zone_nodes: dict[str, str],
    release_timeout: int,
    pods: int = 2,
) -> tuple[dict[str, str], list[str]]:
    """Topic ``t-<group>``, a STICKY group with the Release handover and ``pods`` Ready pods
    ``<group>-0``, ``<group>-1``…; the group's pod labels and the zoned nodes, for more pods."""
    nodes = sorted(n for n, z in zone_nodes.items() if z)
    apply_topic(api, ns, f"t-{group}", BROKERS)
    labels = {**LABELS, "group": group}
    apply_group(
        api,
        ns,
        group,
        {
            "topics": [f"t-{group}"],
            "selector": {"matchLabels": labels},
            "strategy": {"name": "STICKY"},
            "debounceSeconds": 0,
            "handover": {"mode": "Release", "releaseTimeoutSeconds": release_timeout},
        },
    )
    kubelet.start_pods(api, ns, group, pods, labels, nodes)
    return labels, nodes


def test_queues_move_only_after_their_owner_released_them(
    testbed: Testbed,
    sidecars: Any,
) -> None:
    ns, api, group = testbed.ns, testbed.api, "release"
    labels, nodes = two_pods_with_release(api, ns, group, testbed.zone_nodes, 600)
    apps = {pod: sidecars(pod, group) for pod in (f"{group}-0", f"{group}-1")}
    first = published(api, ns, group, lambda d: len(d.members) == 2, "two members")
    for sidecar in apps.values():  # each application starts: it holds nothing yet
        sidecar.client.release(first.generation)

    # A third pod joins: what moves to it is revoked first, and stays with nobody.
    kubelet.start_pods(api, ns, f"{group}-new", 1, labels, nodes)
    joined = f"{group}-new-0"
    revoked = published(api, ns, group, lambda d: joined in d.members, "the revocation")
    assert revoked.releasing, "moving queues must be revoked first"
    assert not any(revoked.queues_of(joined).values())
    moving = {mq for r in revoked.releasing for mq in r.queues}
    assert len(moving) == 2  # 8 queues: 3, 3, 2
    owners = {r.owner for r in revoked.releasing}
    assert owners == set(apps), f"4 + 4 become 3 + 3 + 2: one queue revoked from each owner, not {owners}"
    owner = apps[sorted(owners)[0]].client
    # The sidecar follows the ConfigMap through its own watch: wait until it serves the revocation.
    view = wait_for(
        f"{sorted(owners)[0]}'s sidecar to serve generation {revoked.generation}",
        lambda: (v := owner.queues())["generation"] >= revoked.generation and v,
    )
    assert view["handover"] == "Release"
    assert view["releasing"], "the sidecar tells the old owner what to release"
    status = status_for(api, ns, group, revoked.generation)["handover"]
    assert status["releasingQueues"] == 2
    assert sorted(status["waitingFor"]) == sorted(owners)

    # Nothing moves while its owner has not released it. Checked once the operator has demonstrably
    # acted on the first owner's release: the status of the generation in force waits for the
    # second owner only. From then until the second owner releases, the second owner's revoked
    # queue must still be releasing and held by nobody.
    first_owner, second_owner = sorted(owners)
    kept = {mq for r in revoked.releasing if r.owner == second_owner for mq in r.queues}
    apps[first_owner].client.release(revoked.generation)

    def acted() -> AssignmentDocument | None:
        doc = read_document(api, ns, group)
        status = status_of(api, ns, group)
        waiting = (status.get("handover") or {}).get("waitingFor")
        current = doc is not None and status.get("assignmentGeneration") == doc.generation
        # Acted on: no longer waiting for the first owner (a broken operator may wait for nobody).
        return doc if current and waiting is not None and first_owner not in waiting else None

    current = wait_for(f"the operator to act on {first_owner}'s release", acted)
    check_document(current, readable(group))
    still = {mq for r in current.releasing if r.owner == second_owner for mq in r.queues}
    assert still == kept, f"{second_owner}'s revoked queue moved before it released: {current.releasing}"
    held = {mq for member in current.members for qs in current.queues_of(member).values() for mq in qs}
    assert not held & kept, "assigned before its owner released"
    second = apps[second_owner].client
    wait_for(
        f"{second_owner} to read the revocation", lambda: second.queues()["generation"] >= revoked.generation
    )
    second.release(revoked.generation, applied_ms=5, committed_ms=12.5)
    assigned = published(
        api, ns, group, lambda d: not d.releasing and d.generation > revoked.generation, "the assignment"
    )
    assert {mq for qs in assigned.queues_of(joined).values() for mq in qs} == moving
    assert sorted(len(sum(assigned.queues_of(m).values(), ())) for m in assigned.members) == [2, 3, 3]
    assert events_of(api, ns, group, "QueuesRevoked")
    assert events_of(api, ns, group, "QueuesReleased")

    # The move's trace: the operator timed the revocation from the pod's change and the assignment
    # from the last release; each old owner's sidecar timed its steps, the reported ones included.
    latency = "mqbalance_generation_latency_seconds_count"
    for reason in {revoked.reason, assigned.reason}:
        assert testbed.operator.metric(latency, reason=reason) >= 1, reason
    timed = {
        r.generation: r.since_change_seconds for r in testbed.operator.journal_records() if r.group == group
    }
    assert all(timed.get(g) is not None for g in (revoked.generation, assigned.generation)), timed
    steps = "mqbalance_sidecar_move_step_seconds_count"
    for pod, expected in (
        (first_owner, ("read", "released", "recorded")),
        (second_owner, ("applied", "committed")),
    ):
        counted = {step: apps[pod].metric(steps, group=group, step=step) for step in expected}
        assert all(counted.values()), f"{pod}: {counted}"


def test_an_owner_that_never_releases_is_overridden_and_a_leaving_pod_drains(
    testbed: Testbed,
    sidecars: Any,
) -> None:
    ns, api, group = testbed.ns, testbed.api, "override"
    labels, nodes = two_pods_with_release(api, ns, group, testbed.zone_nodes, 2, pods=1)
    leaving, staying = f"{group}-0", f"{group}-1"
    # The second pod joins once the first holds every queue, so that its arrival is a handover
    # (two pods created together may enter in one step, and then nothing is revoked).
    published(api, ns, group, lambda d: list(d.members) == [leaving], "the first member")
    kubelet.start_pods(api, ns, group, 1, labels, nodes, first=1)
    apps = {pod: sidecars(pod, group) for pod in (leaving, staying)}
    two = published(api, ns, group, lambda d: len(d.members) == 2 and not d.releasing, "two members")
    # (nobody here releases anything: the first pod's 4 revoked queues were overridden)
    status = status_for(api, ns, group, two.generation)
    overridden = status["handover"]["overriddenQueues"]
    assert overridden == 4
    assert two.generation >= 2

    # A new pod joins and nobody releases: at the timeout the operator assigns anyway, and says so.
    kubelet.start_pods(api, ns, f"{group}-new", 1, labels, nodes)
    joined = f"{group}-new-0"
    done = published(
        api,
        ns,
        group,
        lambda d: joined in d.members and not d.releasing and any(d.queues_of(joined).values()),
        "the override",
    )
    assert status_for(api, ns, group, done.generation)["handover"]["overriddenQueues"] == overridden + 2
    assert events_of(api, ns, group, "ReleaseOverridden")

    # A pod is deleted; its application releases everything as it shuts down, so its queues go
    # to the others at once, and its sidecar's preStop (drain) returns.
    kubelet.mark_terminating(api, ns, leaving)
    apps[leaving].client.release(done.generation, all=True)
    after = published(api, ns, group, lambda d: leaving not in d.members and not d.releasing, "the hand-over")
    assert not any(after.queues_of(leaving).values())
    assert apps[leaving].client.drain(timeout=scaled(20, at_most=DEFAULT_MAX_WAIT))["drained"] is True
    kubelet.delete_pod(api, ns, leaving)
