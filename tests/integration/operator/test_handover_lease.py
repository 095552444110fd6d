"""Time-bounded ownership on the real API server: a member whose sidecar is cut off from the API
server (its kubeconfig points at a loopback proxy the test closes) fences itself once leaseSeconds
pass without a renewal, and the operator hands its revoked queues on no sooner than leaseSeconds +
leaseMarginSeconds after the revocation, though releaseTimeoutSeconds is 1.

The operator reads the member Leases: a member cut off from the API server whose pod stays Ready
is revoked about leaseSeconds after its last renewal (not when its pod turns NotReady); a pod
deleted with grace period 0 whose sidecar still renews is not handed on while it renews, and is
once its renewals have stopped for leaseSeconds + leaseMarginSeconds."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps.sidecar import SidecarProcess
from harness.faults.tcp_proxy import TcpProxy, proxied_kubeconfig, server_address
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument, member_lease_name
from mqbalance.model import MessageQueue
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import apply_group, apply_topic, read_document, status_for

BROKERS = [{"name": "broker-a", "zone": "zone-a", "readQueueNums": 8, "writeQueueNums": 8}]
LEASE, RENEW, MARGIN = 4.0, 1.0, 2.0


def test_a_member_cut_off_from_the_api_server_fences_itself_before_its_queues_move(
    cluster: LocalCluster,
    testbed: Testbed,
    tmp_path: Path,
) -> None:
    ns, api, group = testbed.ns, testbed.api, "lease"
    labels = lease_group(api, ns, group)
    kubelet.start_pods(api, ns, group, 2, labels, sorted(testbed.nodes))
    cut, other = f"{group}-0", f"{group}-1"

    proxy = TcpProxy(*server_address(cluster.kubeconfig))
    proxy.start()
    sidecars: dict[str, SidecarProcess] = {}
    try:
        sidecars = start_sidecars(cluster, tmp_path, ns, group, cut, other, proxy)
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


# -- the operator reads the member Leases ------------------------------------------------------------


def lease_group(api: client.ApiClient, ns: str, group: str) -> dict[str, str]:
    """A Release group of two pods (created here), with the short lease of this module; its labels."""
    labels = {"app": f"handover-{group}", "group": group}
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
    return labels


def last_renewal(api: client.ApiClient, ns: str, pod: str) -> float:
    """The renewTime of the pod's member Lease, unix seconds (written by the sidecar on this machine)."""
    lease: Any = client.CoordinationV1Api(api).read_namespaced_lease(member_lease_name(pod), ns)
    return float(lease.spec.renew_time.timestamp())


def start_sidecars(
    cluster: LocalCluster, tmp_path: Path, ns: str, group: str, proxied: str, direct: str, proxy: TcpProxy
) -> dict[str, SidecarProcess]:
    sidecars: dict[str, SidecarProcess] = {}
    for pod, kubeconfig in (
        (proxied, proxied_kubeconfig(cluster.kubeconfig, tmp_path / f"{proxied}-proxy.kubeconfig", proxy)),
        (direct, cluster.kubeconfig),
    ):
        sidecars[pod] = SidecarProcess(
            kubeconfig, tmp_path / f"sidecar-{pod}.log",
            "--pod-name", pod, "--namespace", ns, "--group", group, "--no-topics",
        )  # fmt: skip
        sidecars[pod].start()
    return sidecars


def documents(api: client.ApiClient, ns: str, group: str) -> Callable[[Any, str], AssignmentDocument]:
    def document(test: Any, what: str) -> AssignmentDocument:
        def probe() -> AssignmentDocument | None:
            doc = read_document(api, ns, group)
            return doc if doc is not None and test(doc) else None

        return wait_for(what, probe, LEASE + 30)

    return document


@dataclass(frozen=True)
class LeasedPair:
    """Two members of a leased group, settled: the subject's sidecar reaches the API server through
    ``proxy`` (closing it cuts the subject off), the other's directly."""

    ns: str
    api: client.ApiClient
    group: str
    document: Callable[[Any, str], AssignmentDocument]
    proxy: TcpProxy
    sidecars: dict[str, SidecarProcess]
    subject: str
    """The member the test acts on (cuts off, deletes)."""
    topic: str
    held: set[MessageQueue]
    """The subject's queues once both are members."""

    def others_hold(self, doc: AssignmentDocument) -> set[MessageQueue]:
        """Which of the subject's queues ``doc`` gives to another member."""
        return {mq for m, qs in doc.topics[self.topic].items() if m != self.subject for mq in qs} & self.held


@contextlib.contextmanager
def leased_pair(cluster: LocalCluster, testbed: Testbed, tmp_path: Path, group: str) -> Iterator[LeasedPair]:
    ns, api = testbed.ns, testbed.api
    labels = lease_group(api, ns, group)
    kubelet.start_pods(api, ns, group, 2, labels, sorted(testbed.nodes))
    subject, other = f"{group}-0", f"{group}-1"
    topic = f"t-{group}"
    document = documents(api, ns, group)
    proxy = TcpProxy(*server_address(cluster.kubeconfig))
    proxy.start()
    sidecars: dict[str, SidecarProcess] = {}
    try:
        sidecars = start_sidecars(cluster, tmp_path, ns, group, subject, other, proxy)
        both = document(
            lambda d: set(d.members) == {subject, other} and not d.releasing, "two members, settled"
        )
        held = set(both.queues_of(subject)[topic])
        assert held, "the member the test acts on holds queues"
        yield LeasedPair(ns, api, group, document, proxy, sidecars, subject, topic, held)
    finally:
        proxy.close()
        for sidecar in sidecars.values():
            sidecar.stop()
        for pod in (subject, other):
            kubelet.delete_pod(api, ns, pod)  # a pod already gone is no error


LeasedPairs = Callable[[str], contextlib.AbstractContextManager[LeasedPair]]
"""``leased_pair`` for the group of the given name, in the test's cluster, namespace and directory."""


@pytest.fixture
def leased(cluster: LocalCluster, testbed: Testbed, tmp_path: Path) -> LeasedPairs:
    return functools.partial(leased_pair, cluster, testbed, tmp_path)


def test_a_member_that_stops_renewing_is_revoked_after_the_lease_though_its_pod_stays_ready(
    leased: LeasedPairs,
) -> None:
    with leased("silent") as pair:
        ns, api, document, held, cut = pair.ns, pair.api, pair.document, pair.held, pair.subject
        wait_for(
            f"{cut}'s sidecar to serve with a grant",
            lambda: pair.sidecars[cut].client.queues().get("queueCount") == len(held) or None,
            scaled(60),
        )

        # Cut off from the API server; its pod stays Running and Ready (no node lifecycle here, and
        # on a real node it would take the node's grace period, 16-50 s, to turn NotReady).
        pair.proxy.close()
        revoked = document(
            lambda d: cut not in d.members and d.releasing, "the revocation of the silent member"
        )
        renewed = last_renewal(api, ns, cut)  # the last renewal that got through
        (release,) = [r for r in revoked.releasing if r.owner == cut]
        assert set(release.queues) == held
        after = release.since - renewed
        pod: Any = client.CoreV1Api(api).read_namespaced_pod(cut, ns)
        assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions), "still Ready"
        assert pod.metadata.deletion_timestamp is None
        assert after >= LEASE - 0.1, f"revoked {after:.2f}s after its last renewal: before its lease ran out"
        assert after <= LEASE + scaled(3), f"revoked {after:.2f}s after its last renewal"
        status = status_for(api, ns, pair.group, revoked.generation)
        assert [p["reason"] for p in status["notServingPods"]] == ["MemberLeaseExpired"]

        # The usual floor: nothing handed on before leaseSeconds + leaseMarginSeconds after the revocation.
        bound = release.since + LEASE + MARGIN
        while time.time() < bound - 0.2:
            doc = read_document(api, ns, pair.group)
            assert doc is not None
            assert not pair.others_hold(doc) or doc.computed_at >= bound, "handed on before the floor"
            time.sleep(0.05)
        moved = document(
            lambda d: pair.others_hold(d) == held and not d.releasing, "the hand-on after the floor"
        )
        assert moved.computed_at >= bound
        print(
            f"silent member revoked {after:.2f}s after its last renewal (lease {LEASE:g}), its pod Ready; "
            f"queues handed on {moved.computed_at - release.since:.2f}s after the revocation"
        )

        # Renewing again, it is a member again.
        pair.proxy.start()
        back = document(lambda d: cut in d.members, "the member back once it renews")
        print(f"member again {back.computed_at - moved.computed_at:.2f}s after the hand-on")


def test_a_force_deleted_pod_whose_sidecar_still_renews_is_not_handed_on_until_it_stops(
    testbed: Testbed, leased: LeasedPairs
) -> None:
    with leased("departed") as pair:
        ns, api, document, held, gone = pair.ns, pair.api, pair.document, pair.held, pair.subject

        # The pod object goes at once (grace period 0, as --force does); its sidecar keeps running
        # and renewing, as on a node the API server can no longer reach the kubelet of.
        kubelet.delete_pod(api, ns, gone)
        revoked = document(lambda d: gone not in d.members and d.releasing, "the revocation")
        (release,) = [r for r in revoked.releasing if r.owner == gone]
        assert set(release.queues) == held
        # Held well past the floor (lease + margin after the revocation) while it renews.
        hold_until = release.since + LEASE + MARGIN + 3.0
        reconciles = testbed.operator.metric("mqbalance_reconciles_total", result="unchanged")
        renewals = set()
        while time.time() < hold_until:
            doc = read_document(api, ns, pair.group)
            assert doc is not None
            early = doc.computed_at - release.since
            assert not pair.others_hold(doc), f"handed on {early:.1f}s after the revocation while it renews"
            renewals.add(last_renewal(api, ns, gone))
            assert pair.sidecars[gone].client.queues().get("fenced") is False, "it renews: not fenced"
            time.sleep(0.1)
        assert len(renewals) >= 3, f"its sidecar renewed {len(renewals)} times while held"
        # Reconciled again only when a Lease could lapse (about every lease - renew seconds), not in a loop.
        waited = testbed.operator.metric("mqbalance_reconciles_total", result="unchanged") - reconciles
        assert waited <= 2 * (hold_until - release.since), f"{waited:g} reconciles while it was held"

        # Its renewals stop (cut off from the API server): handed on once its Lease has been silent
        # for lease + margin on the operator's clock, not sooner.
        pair.proxy.close()
        moved = document(
            lambda d: pair.others_hold(d) == held and not d.releasing, "the hand-on after its renewals stop"
        )
        silent_for = moved.computed_at - last_renewal(api, ns, gone)
        assert silent_for >= LEASE + MARGIN - 0.1, f"handed on {silent_for:.2f}s after its last renewal"
        assert silent_for <= LEASE + MARGIN + scaled(3), f"handed on {silent_for:.2f}s after its last renewal"
        print(
            f"departed member held {hold_until - release.since:.1f}s past its revocation while renewing; "
            f"handed on {silent_for:.2f}s after its last renewal (lease {LEASE:g} + margin {MARGIN:g})"
        )
