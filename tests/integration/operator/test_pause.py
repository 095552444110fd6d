"""Pausing a group on the real API server: every member's queues are revoked, released by its
sidecar and then assigned to nobody; resumed, the group is assigned again, and its status history
tells both."""

from __future__ import annotations

from typing import Any

from harness.apps.sidecar import SidecarProcess
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from mqbalance.contract import AssignmentDocument
from tests.integration.invariants import check_document
from tests.integration.operator.conftest import Testbed
from tests.integration.operator.test_handover import readable, two_pods_with_release
from tests.integration.operator_support import GROUP, VERSION, condition, custom, read_document, status_for


def held(doc: AssignmentDocument) -> int:
    """Queues the document gives a member or leaves with one until released."""
    assigned = sum(len(qs) for member in doc.members for qs in doc.queues_of(member).values())
    return assigned + sum(len(r.queues) for r in doc.releasing)


def published(testbed: Testbed, group: str, test: Any, what: str) -> AssignmentDocument:
    """The first document that passes ``test``; no queue has two owners in any seen on the way
    (while paused, nobody owning a queue is what is asked for)."""

    def probe() -> AssignmentDocument | None:
        doc = read_document(testbed.api, testbed.ns, group)
        if doc is not None:
            check_document(doc, {})
        return doc if doc is not None and test(doc) else None

    return wait_for(what, probe, timeout=60)


def serving(pod: str, sidecar: SidecarProcess, generation: int) -> dict[str, Any]:
    """The sidecar's view once it serves ``generation`` (it follows the ConfigMap by its own watch)."""

    def probe() -> dict[str, Any] | None:
        view = sidecar.client.queues()
        return view if view["generation"] >= generation else None

    return wait_for(f"{pod}'s sidecar to serve generation {generation}", probe)


def set_paused(testbed: Testbed, group: str, paused: bool) -> None:
    body = {"spec": {"paused": paused}}
    custom(testbed.api).patch_namespaced_custom_object(
        GROUP, VERSION, testbed.ns, "consumergroups", group, body
    )


def test_a_paused_group_releases_every_queue_and_a_resumed_one_is_assigned_again(
    testbed: Testbed, sidecars: Any, cluster: LocalCluster
) -> None:
    ns, api, group = testbed.ns, testbed.api, "paused"
    two_pods_with_release(api, ns, group, testbed.zone_nodes, 600)
    apps = {pod: sidecars(pod, group) for pod in (f"{group}-0", f"{group}-1")}
    first = published(testbed, group, lambda d: len(d.members) == 2 and held(d) == 8, "two members")
    for sidecar in apps.values():  # each application starts: it holds nothing yet
        sidecar.client.release(first.generation)

    set_paused(testbed, group, True)
    revoked = published(testbed, group, lambda d: d.reason == "paused", "the pause's revocation")
    assert {r.owner for r in revoked.releasing} == set(apps)
    assert not any(qs for member in revoked.members for qs in revoked.queues_of(member).values())
    status = status_for(api, ns, group, revoked.generation)
    assert status["pausedBy"] == ["spec.paused"]
    assert status["heldQueues"] == 8
    assert (condition(status, "Paused")["status"], condition(status, "Paused")["reason"]) == (
        "False",
        "Pausing",
    )
    assert condition(status, "Ready")["status"] == "False"

    for pod, sidecar in apps.items():  # each application commits its offsets and lets go
        serving(pod, sidecar, revoked.generation)
        sidecar.client.release(revoked.generation)
    quiet = published(
        testbed, group, lambda d: d.generation > revoked.generation and not d.releasing, "nothing held"
    )
    assert held(quiet) == 0
    assert sorted(quiet.members) == sorted(apps)
    status = status_for(api, ns, group, quiet.generation)
    assert status["heldQueues"] == 0
    assert (condition(status, "Paused")["status"], condition(status, "Paused")["reason"]) == (
        "True",
        "Paused",
    )
    for pod, sidecar in apps.items():  # what each application is told: hold nothing
        view = serving(pod, sidecar, quiet.generation)
        assert (view["isMember"], view["queueCount"], view["releasing"]) == (True, 0, [])
    table = cluster.kubectl("get", "consumergroups", group, "-n", ns).stdout
    header, row = table.splitlines()
    assert row.split()[header.split().index("PAUSED")] == "true"

    set_paused(testbed, group, False)
    resumed = published(testbed, group, lambda d: d.reason == "resumed", "the resumed assignment")
    check_document(resumed, readable(group))
    assert held(resumed) == 8
    assert all(sum(len(qs) for qs in resumed.queues_of(m).values()) == 4 for m in resumed.members)
    status = status_for(api, ns, group, resumed.generation)
    assert "pausedBy" not in status
    assert "heldQueues" not in status
    assert (condition(status, "Paused")["status"], condition(status, "Paused")["reason"]) == (
        "False",
        "Resumed",
    )
    assert condition(status, "Ready")["status"] == "True"
    history = {e["generation"]: e for e in status["history"]}
    assert status["history"][0]["generation"] == resumed.generation
    assert history[revoked.generation]["reason"] == "paused"
    # Each sidecar's release let the operator hand its queues to nobody: one generation or two.
    releases = [history[g] for g in range(revoked.generation + 1, resumed.generation)]
    assert [e["reason"] for e in releases] in (["released"], ["released", "released"])
    assert all(e["handoverSeconds"] >= 0 for e in releases)
    assert [e["generation"] for e in status["history"]] == sorted(history, reverse=True)
