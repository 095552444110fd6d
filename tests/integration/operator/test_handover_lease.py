"""Time-bounded ownership on the real API server: a member whose sidecar is cut off from the API
server (its kubeconfig points at a loopback proxy the test closes) fences itself once leaseSeconds
pass without a renewal, and the operator hands its revoked queues on no sooner than leaseSeconds +
leaseMarginSeconds after the revocation, though releaseTimeoutSeconds is 1."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client

from harness import kubelet
from harness.cluster import LocalCluster
from harness.polling import scaled, wait_for
from harness.processes import SidecarProcess
from harness.tcp_proxy import TcpProxy, proxied_kubeconfig, server_address
from mqbalance.contract import AssignmentDocument
from mqbalance.model import MessageQueue
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import apply_group, apply_topic, read_document

BROKERS = [{"name": "broker-a", "zone": "zone-a", "readQueueNums": 8, "writeQueueNums": 8}]
LEASE, RENEW, MARGIN = 4.0, 1.0, 2.0


def test_a_member_cut_off_from_the_api_server_fences_itself_before_its_queues_move(
    cluster: LocalCluster,
    testbed: Testbed,
    tmp_path: Path,
) -> None:
    ns, api, group = testbed.ns, testbed.api, "lease"
    nodes = sorted(testbed.nodes)
    labels = {"app": "handover-lease", "group": group}
    apply_topic(api, ns, f"t-{group}", BROKERS)
    handover = {
        "mode": "Release",
        "releaseTimeoutSeconds": 1,
        "leaseSeconds": LEASE,
        "renewSeconds": RENEW,
        "leaseMarginSeconds": MARGIN,
    }
    spec = {
        "topics": [f"t-{group}"],
        "selector": {"matchLabels": labels},
        "strategy": {"name": "STICKY"},
        "debounceSeconds": 0,
        "handover": handover,
    }
    apply_group(api, ns, group, spec)
    kubelet.start_pods(api, ns, group, 2, labels, nodes)
    cut, other = f"{group}-0", f"{group}-1"

    proxy = TcpProxy(*server_address(cluster.kubeconfig))
    proxy.start()
    sidecars: dict[str, SidecarProcess] = {}
    try:
        for pod, kubeconfig in (
            (cut, proxied_kubeconfig(cluster.kubeconfig, tmp_path / "through-proxy.kubeconfig", proxy)),
            (other, cluster.kubeconfig),
        ):
            sidecars[pod] = SidecarProcess(
                kubeconfig, tmp_path / f"sidecar-{pod}.log",
                "--pod-name", pod, "--namespace", ns, "--group", group, "--no-topics",
            )  # fmt: skip
            sidecars[pod].start()
        run(api, ns, group, proxy, sidecars[cut], sidecars[other], cut, other)
    finally:
        proxy.close()
        for sidecar in sidecars.values():
            sidecar.stop()


def run(
    api: client.ApiClient,
    ns: str,
    group: str,
    proxy: TcpProxy,
    cut_sidecar: SidecarProcess,
    other_sidecar: SidecarProcess,
    cut: str,
    other: str,
) -> None:
    def document(test: Any, what: str) -> AssignmentDocument:
        def probe() -> AssignmentDocument | None:
            doc = read_document(api, ns, group)
            return doc if doc is not None and test(doc) else None

        return wait_for(what, probe, 60)

    def view_of(sidecar: SidecarProcess, fenced: bool, generation: int = 0) -> dict[str, Any] | None:
        view = sidecar.client.queues()
        return view if view.get("fenced") is fenced and view["generation"] >= generation else None

    both = document(lambda d: set(d.members) == {cut, other} and not d.releasing, "two members, settled")
    assert both.lease is not None
    assert (both.lease.seconds, both.lease.renew_seconds) == (LEASE, RENEW)
    held = set(both.queues_of(cut)[f"t-{group}"])
    assert held, "the member to cut off holds queues"

    def serving(sidecar: SidecarProcess) -> dict[str, Any] | None:
        return view_of(sidecar, False, both.generation)

    view = wait_for(f"{cut}'s sidecar to serve with a grant", lambda: serving(cut_sidecar), 60)
    assert 0 < view["grant"]["validForMs"] <= LEASE * 1000
    assert view["queueCount"] == len(held)
    assert cut_sidecar.metric("mqbalance_sidecar_fenced", group=group) == 0.0
    assert wait_for(f"{other}'s sidecar to serve", lambda: serving(other_sidecar), 60)

    # Cut off: the proxy closes, and the pod stops being a member (terminating): its queues are revoked,
    # and it never acknowledges, since its sidecar cannot reach the API server.
    proxy.close()
    cut_at = time.monotonic()
    kubelet.mark_terminating(api, ns, cut)
    revoked = document(lambda d: cut not in d.members and d.releasing, "the revocation")
    (release,) = [r for r in revoked.releasing if r.owner == cut]
    assert set(release.queues) == held
    revoked_at = release.since  # the operator's clock (unix seconds)

    # The sidecar fences itself once leaseSeconds pass without a renewal: no queues, and says so.
    fenced = wait_for(
        f"{cut}'s sidecar to fence itself",
        lambda: view_of(cut_sidecar, True),
        scaled(LEASE + 30),
    )
    fenced_after = time.monotonic() - cut_at
    assert fenced["queueCount"] == 0
    assert not any(fenced["queues"].values())
    assert fenced["grant"] == {"validForMs": 0}
    assert fenced_after >= LEASE - RENEW - 0.5, f"fenced {fenced_after:.1f}s after the cut: too early"
    assert cut_sidecar.metric("mqbalance_sidecar_fenced", group=group) == 1.0

    # Nothing moves before leaseSeconds + leaseMarginSeconds after the revocation (releaseTimeoutSeconds
    # is 1): hold for that window, reading every version the poll sees, then it goes to the other member.
    bound = revoked_at + LEASE + MARGIN

    def others_hold(doc: AssignmentDocument) -> set[MessageQueue]:
        return {mq for member, qs in doc.topics[f"t-{group}"].items() if member != cut for mq in qs} & held

    while time.time() < bound - 0.2:
        doc = read_document(api, ns, group)
        assert doc is not None
        early = others_hold(doc)
        assert not early or doc.computed_at >= bound, (
            f"{early} handed on {bound - doc.computed_at:.1f}s early"
        )
        time.sleep(0.05)
    moved = document(lambda d: others_hold(d) == held and not d.releasing, "the hand-on after the lease")
    assert moved.computed_at >= bound, f"handed on {moved.computed_at - revoked_at:.2f}s after the revocation"
    assert set(moved.queues_of(other)[f"t-{group}"]) >= held
    print(
        f"cut-off member fenced {fenced_after:.1f}s after the cut; queues handed on "
        f"{moved.computed_at - revoked_at:.1f}s after the revocation (lease {LEASE:g} + margin {MARGIN:g})"
    )

    # The path comes back: a renewal succeeds and the sidecar serves the current document again.
    proxy.start()
    back = wait_for(
        f"{cut}'s sidecar to serve again",
        lambda: view_of(cut_sidecar, False, moved.generation),
        scaled(60),
    )
    assert back["queueCount"] == 0  # it is no member any more
    assert cut_sidecar.metric("mqbalance_sidecar_fenced", group=group) == 0.0
    kubelet.delete_pod(api, ns, cut)
