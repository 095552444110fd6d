"""minReadySeconds on the real API server: a pod that just turned Ready waits, listed as not serving with
why, and joins once it has been Ready long enough, at the reconcile the operator scheduled for it."""

from __future__ import annotations

from harness.kube import kubelet
from harness.polling import wait_for
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import apply_group, apply_topic, read_document, status_of

MIN_READY = 10


def test_a_new_pod_joins_once_ready_for_min_ready_seconds(testbed: Testbed) -> None:
    api, ns, name = testbed.api, testbed.ns, "settle"
    brokers = [{"name": "broker-a", "zone": "zone-a", "readQueueNums": 4, "writeQueueNums": 4}]
    kubelet.start_pods(api, ns, name, 2, {"app": name}, testbed.nodes)
    apply_topic(api, ns, name, brokers, topicName=name)
    spec = {"topics": [name], "selector": {"matchLabels": {"app": name}}, "debounceSeconds": 0}
    apply_group(api, ns, name, {**spec, "minReadySeconds": MIN_READY})
    wait_for("both pods to be members", lambda: _members(testbed, name) == {f"{name}-0", f"{name}-1"})

    kubelet.start_pods(api, ns, f"{name}-new", 1, {"app": name}, testbed.nodes)
    newcomer = f"{name}-new-0"

    def waiting() -> dict[str, str] | None:
        # Listed first as Pending (created, not Ready yet), then as waiting out its time.
        listed = {p["name"]: p for p in status_of(api, ns, name).get("notServingPods") or []}
        entry = listed.get(newcomer)
        assert newcomer not in _members(testbed, name), f"{newcomer} joined before minReadySeconds"
        return entry if entry is not None and entry["reason"] != "Pending" else None

    entry = wait_for(f"{newcomer} listed as waiting out minReadySeconds", waiting)
    assert entry["reason"] == "MinReadySeconds"
    assert f"of the {MIN_READY}s (minReadySeconds) before it is given queues" in entry["message"]
    assert newcomer not in _members(testbed, name)
    wait_for(f"{newcomer} to join", lambda: newcomer in _members(testbed, name), timeout=30)
    doc = read_document(api, ns, name)
    assert doc is not None
    assert doc.reason == "member-joined"
    # The status is written after the document it describes.
    wait_for("the status to list no pod waiting", lambda: not status_of(api, ns, name).get("notServingPods"))


def _members(testbed: Testbed, name: str) -> set[str]:
    doc = read_document(testbed.api, testbed.ns, name)
    return set(doc.members) if doc is not None else set()
