"""Tenants kept apart by the API server: the chart installed into a real one, then every write a consumer
pod's sidecar or the operator could try against what is not theirs, each with the credentials the pod
would hold (a token of its ServiceAccount bound to the pod, as the kubelet mounts it). The chart's RBAC
lets a sidecar create and update Leases and patch its groups' releases ConfigMaps, and the operator
create and replace ConfigMaps wherever it serves groups; its ValidatingAdmissionPolicies narrow both
to their own objects (docs/deploy.md, "Tenants").

From Kubernetes 1.30 every probe must be refused; on older servers (1.20) the chart installs no
policy and the probes that only the policies refuse are allowed, which the test asserts too, so the
gap docs/deploy.md states stays exactly that gap.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.kube.api import KubeApi
from harness.kube.cluster import LocalCluster
from harness.kube.kubelet import create_pod
from harness.polling import wait_for
from mqbalance.contract import MANAGED_BY, member_lease_name, releases_configmap_name
from tests.integration.deploy.deploy_support import GROUP, installed, service_account_kubeconfig

POLICIES_FROM_MINOR = 30
"""ValidatingAdmissionPolicy is served (admissionregistration.k8s.io/v1) from Kubernetes 1.30."""
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
CONFIGMAPS = "/api/v1/namespaces/{namespace}/configmaps"


@dataclass
class Probes:
    """Writes tried, each expected refused (by RBAC or by a policy) or allowed."""

    admin: KubeApi
    policies: bool
    """Whether the chart's policies are installed (the server serves them)."""
    tried: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    """Refused only by a policy, and allowed here because the server has none."""

    def refuse(
        self, what: str, api: KubeApi, method: str, path: str, body: Any = None, *, by_policy: bool = True
    ) -> None:
        """The call must be refused (403); by a policy (``by_policy``) only where policies exist."""
        self.tried.append(what)
        status, answer = self.call(api, method, path, body)
        if by_policy and not self.policies:
            assert 200 <= status < 300, f"{what}: {status} {answer}"
            self.gaps.append(what)
            return
        assert status == 403, f"{what} was not refused: {status} {answer}"
        if by_policy:
            assert "ValidatingAdmissionPolicy" in json.dumps(answer), f"{what}: {answer}"
        self.refused.append(what)

    def call(self, api: KubeApi, method: str, path: str, body: Any) -> tuple[int, Any]:
        """One call; a PUT sends the object as it is with ``body`` merged in, a replace with the
        resourceVersion read, as the sidecars renew their Leases and the operator its ConfigMaps."""
        if method == "PUT":
            body = merged(self.admin.request("GET", path), body)
        return api.call(method, path, body)

    def allow(self, what: str, api: KubeApi, method: str, path: str, body: Any = None) -> None:
        """What the component does itself: it must succeed."""
        status, answer = self.call(api, method, path, body)
        assert 200 <= status < 300, f"{what} was refused: {status} {answer}"
        self.allowed.append(what)


def lease(name: str, holder: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 20},
    }


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``change`` merged in (a JSON merge patch: None removes a key)."""
    out = dict(base)
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def pod_owner(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}


@dataclass
class Tenants:
    cluster: LocalCluster
    release: str
    namespace: str
    """The release namespace; also a consumer namespace, as by default."""
    other: str
    """A second consumer namespace: another team's."""
    tmp: Path

    @property
    def sidecar_account(self) -> str:
        return f"{self.release}-mqbalance-sidecar"

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return create_pod(
            self.cluster.api, namespace, name, {"app": "orders"}, service_account=self.sidecar_account
        )

    def as_pod(self, pod: dict[str, Any]) -> KubeApi:
        """The API as the pod's sidecar: its ServiceAccount's token bound to it."""
        meta = pod["metadata"]
        path = self.tmp / f"{meta['namespace']}-{meta['name']}.kubeconfig"
        config = service_account_kubeconfig(
            self.cluster, meta["namespace"], self.sidecar_account, path, pod=(meta["name"], meta["uid"])
        )
        return KubeApi.from_kubeconfig(config)

    def as_account(self, namespace: str, account: str) -> KubeApi:
        """The API with a token of the account bound to no pod (as a token Secret's would be)."""
        path = self.tmp / f"{namespace}-{account}-{uuid.uuid4().hex[:4]}.kubeconfig"
        return KubeApi.from_kubeconfig(service_account_kubeconfig(self.cluster, namespace, account, path))

    def wait_for_policies(self) -> None:
        """Until the API server enforces the chart's policies (it learns of new ones from a watch): a
        dry run of what each refuses, by an account each confines, is refused."""
        if self.cluster.minor < POLICIES_FROM_MINOR:
            return
        probes = [
            (self.as_account(self.namespace, self.sidecar_account), LEASES.format(namespace=self.namespace)),
            (
                self.as_account(self.namespace, f"{self.release}-mqbalance-operator"),
                CONFIGMAPS.format(namespace="kube-system"),
            ),
        ]
        body = {"metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}"}}

        def enforced() -> bool:
            return all(
                "ValidatingAdmissionPolicy" in json.dumps(api.call("POST", f"{path}?dryRun=All", body)[1])
                for api, path in probes
            )

        wait_for("the API server to enforce the chart's admission policies", enforced, 60, 0.2)


@pytest.fixture
def tenants(cluster: LocalCluster, helm: Path, namespace: str, tmp_path: Path) -> Iterator[Tenants]:
    other = f"{namespace[:50]}-other"
    cluster.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": other}})
    try:
        with installed(
            cluster, helm, namespace, f"sidecar.namespaces={{{namespace},{other}}}", cluster_wide=True
        ) as release:
            tenants = Tenants(cluster, release, namespace, other, tmp_path)
            tenants.wait_for_policies()
            yield tenants
    finally:
        cluster.api.call("DELETE", f"/api/v1/namespaces/{other}")


def test_a_sidecar_writes_only_its_own_pods_lease_and_acknowledgement(tenants: Tenants) -> None:
    t = tenants
    ns, other = t.namespace, t.other
    admin = t.cluster.api
    probes = Probes(admin, policies=t.cluster.minor >= POLICIES_FROM_MINOR)
    a, b, c = t.pod(ns, "orders-a"), t.pod(ns, "orders-b"), t.pod(other, "orders-c")
    as_a, as_b = t.as_pod(a), t.as_pod(b)
    leases, other_leases = LEASES.format(namespace=ns), LEASES.format(namespace=other)
    own, b_lease = member_lease_name("orders-a"), member_lease_name("orders-b")

    # What the sidecars do: each creates and renews its own member Lease, owned by its pod.
    probes.allow("create its own member Lease", as_a, "POST", leases, lease(own, "orders-a", pod_owner(a)))
    probes.allow(
        "renew its own member Lease", as_a, "PUT", f"{leases}/{own}", {"spec": {"leaseDurationSeconds": 21}}
    )
    probes.allow(
        "B creates its own member Lease", as_b, "POST", leases, lease(b_lease, "orders-b", pod_owner(b))
    )
    # ...and acknowledges releases under its own key (the operator creates the ConfigMap).
    releases = f"{CONFIGMAPS.format(namespace=ns)}/{releases_configmap_name(GROUP)}"
    admin.request("POST", CONFIGMAPS.format(namespace=ns), {
        "metadata": {"name": releases_configmap_name(GROUP), "labels": dict([MANAGED_BY])},
        "data": {"orders-b": '{"generation": 3}'},
    })  # fmt: skip
    probes.allow(
        "acknowledge under its own key", as_a, "PATCH", releases, {"data": {"orders-a": '{"generation": 3}'}}
    )

    # Another pod's member Lease: taken, kept alive for a departed pod, or renamed into.
    probes.refuse(
        "create another pod's member Lease",
        as_a,
        "POST",
        leases,
        lease(member_lease_name("orders-gone"), "orders-gone"),
    )
    probes.refuse(
        "renew another pod's member Lease",
        as_a,
        "PUT",
        f"{leases}/{b_lease}",
        {"spec": {"leaseDurationSeconds": 3600}},
    )
    probes.refuse(
        "take another pod's member Lease",
        as_a,
        "PUT",
        f"{leases}/{b_lease}",
        {"spec": {"holderIdentity": "orders-a"}},
    )
    probes.refuse("delete another pod's member Lease", as_a, "DELETE", f"{leases}/{b_lease}", by_policy=False)
    probes.refuse(
        "hold its own Lease for another pod",
        as_a,
        "PUT",
        f"{leases}/{own}",
        {"spec": {"holderIdentity": "orders-b"}},
    )
    probes.refuse(
        "own its Lease by another pod",
        as_a,
        "PUT",
        f"{leases}/{own}",
        {"metadata": {"ownerReferences": [pod_owner(b)]}},
    )

    # The operator's leader and shard Leases, in the release namespace (a consumer namespace too).
    leader = f"{t.release}-mqbalance-operator"
    admin.request("POST", leases, lease(leader, "operator-0"))
    admin.request("POST", leases, lease(f"{leader}-0", "operator-0"))
    probes.refuse(
        "take the operator's leader Lease",
        as_a,
        "PUT",
        f"{leases}/{leader}",
        {"spec": {"holderIdentity": "orders-a", "leaseDurationSeconds": 86400}},
    )
    probes.refuse(
        "take a shard Lease", as_a, "PUT", f"{leases}/{leader}-0", {"spec": {"holderIdentity": "orders-a"}}
    )
    probes.refuse("create a shard Lease", as_a, "POST", leases, lease(f"{leader}-1", "orders-a"))
    probes.refuse(
        "create another software's Lease", as_a, "POST", leases, lease("payments-leader", "orders-a")
    )

    # Another pod's acknowledgement: written, changed to release everything, or removed.
    probes.refuse(
        "acknowledge for another pod",
        as_a,
        "PATCH",
        releases,
        {"data": {"orders-b": '{"generation": 4, "all": true}'}},
    )
    probes.refuse(
        "acknowledge for a pod to come",
        as_a,
        "PATCH",
        releases,
        {"data": {"orders-z": '{"generation": 4, "all": true}'}},
    )
    probes.refuse(
        "remove another pod's acknowledgement", as_a, "PATCH", releases, {"data": {"orders-b": None}}
    )
    probes.refuse(
        "relabel the releases ConfigMap",
        as_a,
        "PATCH",
        releases,
        {"metadata": {"labels": {MANAGED_BY[0]: "me"}}},
    )
    probes.refuse(
        "replace the releases ConfigMap", as_a, "PUT", releases, {"data": {"orders-a": "{}"}}, by_policy=False
    )
    probes.refuse("delete the releases ConfigMap", as_a, "DELETE", releases, by_policy=False)

    # Another team's namespace: its pods' Leases and acknowledgements.
    other_releases = f"{CONFIGMAPS.format(namespace=other)}/{releases_configmap_name(GROUP)}"
    admin.request(
        "POST",
        CONFIGMAPS.format(namespace=other),
        {"metadata": {"name": releases_configmap_name(GROUP)}, "data": {}},
    )
    probes.refuse(
        "create a Lease in another namespace",
        as_a,
        "POST",
        other_leases,
        lease(own, "orders-a"),
        by_policy=False,
    )
    probes.refuse(
        "create another namespace's member Lease",
        as_a,
        "POST",
        other_leases,
        lease(member_lease_name("orders-c"), "orders-c"),
        by_policy=False,
    )
    probes.refuse(
        "acknowledge in another namespace",
        as_a,
        "PATCH",
        other_releases,
        {"data": {"orders-c": '{"generation": 1, "all": true}'}},
        by_policy=False,
    )
    as_c = t.as_pod(c)
    probes.allow(
        "C creates its own member Lease",
        as_c,
        "POST",
        other_leases,
        lease(member_lease_name("orders-c"), "orders-c", pod_owner(c)),
    )
    probes.refuse(
        "C acknowledges for A across namespaces",
        as_c,
        "PATCH",
        releases,
        {"data": {"orders-a": '{"generation": 9, "all": true}'}},
        by_policy=False,
    )

    # A token of the sidecar account bound to no pod (what a token Secret holds) may write nothing.
    unbound = t.as_account(ns, t.sidecar_account)
    probes.refuse(
        "create a member Lease without a pod-bound token",
        unbound,
        "POST",
        leases,
        lease(member_lease_name("orders-x"), "orders-x"),
    )
    probes.refuse(
        "renew a Lease without a pod-bound token",
        unbound,
        "PUT",
        f"{leases}/{own}",
        {"spec": {"leaseDurationSeconds": 30}},
    )
    probes.refuse(
        "acknowledge without a pod-bound token", unbound, "PATCH", releases, {"data": {"orders-b": "{}"}}
    )

    # What stood the probes: B's Lease and acknowledgement as B left them, the leader's as it was.
    b_now = admin.request("GET", f"{leases}/{b_lease}")["spec"]
    data = admin.request("GET", releases)["data"]
    if probes.policies:
        assert (b_now["holderIdentity"], b_now["leaseDurationSeconds"]) == ("orders-b", 20)
        assert data == {"orders-a": '{"generation": 3}', "orders-b": '{"generation": 3}'}
        assert admin.request("GET", f"{leases}/{leader}")["spec"]["holderIdentity"] == "operator-0"
    print(
        f"tenant figures: sidecar probes={len(probes.tried)} refused={len(probes.refused)} "
        f"allowed_own={len(probes.allowed)} gaps_without_policies={len(probes.gaps)}"
    )
    assert len(probes.refused) + len(probes.gaps) == len(probes.tried) == 23


def test_the_operator_writes_only_the_configmaps_and_leases_it_owns(tenants: Tenants) -> None:
    t = tenants
    ns = t.namespace
    admin = t.cluster.api
    probes = Probes(admin, policies=t.cluster.minor >= POLICIES_FROM_MINOR)
    operator = t.as_account(ns, f"{t.release}-mqbalance-operator")
    configmaps = CONFIGMAPS.format(namespace=ns)
    owner = admin.request(
        "POST",
        f"/apis/mqbalance.io/v1alpha1/namespaces/{ns}/consumergroups",
        {
            "apiVersion": "mqbalance.io/v1alpha1",
            "kind": "ConsumerGroup",
            "metadata": {"name": GROUP},
            "spec": {
                "groupName": GROUP,
                "topics": ["orders"],
                "selector": {"matchLabels": {"app": "orders"}},
            },
        },
    )
    reference = {
        "apiVersion": "mqbalance.io/v1alpha1",
        "kind": "ConsumerGroup",
        "name": GROUP,
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }

    def configmap(name: str, labels: dict[str, str], owners: list[dict[str, Any]]) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": labels, "ownerReferences": owners}, "data": {"x": "1"}}

    ours = dict([MANAGED_BY])
    probes.allow(
        "publish its group's assignment",
        operator,
        "POST",
        configmaps,
        configmap(f"{GROUP}-assignment", ours, [reference]),
    )
    probes.allow(
        "replace its group's assignment",
        operator,
        "PUT",
        f"{configmaps}/{GROUP}-assignment",
        {"data": {"x": "2"}},
    )
    probes.allow(
        "create its group's releases",
        operator,
        "POST",
        configmaps,
        configmap(releases_configmap_name(GROUP), ours, [reference]),
    )

    # The cluster's own ConfigMaps, another software's, one squatting on an assignment's name.
    system = CONFIGMAPS.format(namespace="kube-system")
    probes.refuse(
        "create a ConfigMap in kube-system",
        operator,
        "POST",
        system,
        configmap("kube-proxy", ours, [reference]),
    )
    probes.refuse(
        "publish an assignment in kube-system",
        operator,
        "POST",
        system,
        configmap(f"{GROUP}-assignment", ours, [reference]),
    )
    admin.request("POST", configmaps, configmap("payments-config", {}, []))
    probes.refuse(
        "replace another software's ConfigMap",
        operator,
        "PUT",
        f"{configmaps}/payments-config",
        {"data": {"x": "2"}},
    )
    probes.refuse(
        "adopt another software's ConfigMap",
        operator,
        "PUT",
        f"{configmaps}/payments-config",
        {"metadata": {"labels": ours, "ownerReferences": [reference]}},
    )
    admin.request("POST", configmaps, configmap("billing-assignment", {}, []))
    probes.refuse(
        "take over a ConfigMap named like an assignment",
        operator,
        "PUT",
        f"{configmaps}/billing-assignment",
        {"data": {"x": "2"}},
    )
    probes.refuse(
        "create an assignment no group owns",
        operator,
        "POST",
        configmaps,
        configmap("ghost-assignment", ours, []),
    )
    probes.refuse(
        "create a ConfigMap of another name",
        operator,
        "POST",
        configmaps,
        configmap("orders-consumer-config", ours, [reference]),
    )
    probes.refuse(
        "disown its assignment",
        operator,
        "PUT",
        f"{configmaps}/{GROUP}-assignment",
        {"metadata": {"labels": {MANAGED_BY[0]: None}}},
    )

    # Leases: its own in the release namespace; nobody else's.
    leases = LEASES.format(namespace=ns)
    leader = f"{t.release}-mqbalance-operator"
    probes.allow("take its leader Lease", operator, "POST", leases, lease(leader, "operator-0"))
    probes.refuse(
        "create another software's Lease", operator, "POST", leases, lease("payments-leader", "operator-0")
    )
    pod = t.pod(ns, "orders-a")
    admin.request("POST", leases, lease(member_lease_name("orders-a"), "orders-a", pod_owner(pod)))
    probes.refuse(
        "renew a sidecar's member Lease",
        operator,
        "PATCH",
        f"{leases}/{member_lease_name('orders-a')}",
        {"spec": {"leaseDurationSeconds": 3600}},
        by_policy=False,
    )

    print(
        f"tenant figures: operator probes={len(probes.tried)} refused={len(probes.refused)} "
        f"allowed_own={len(probes.allowed)} gaps_without_policies={len(probes.gaps)}"
    )
    assert len(probes.refused) + len(probes.gaps) == len(probes.tried) == 10
