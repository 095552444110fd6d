"""helm install into the local control plane, then the operator and a sidecar run as local processes
with the tokens of the chart's ServiceAccounts: they work with exactly the RBAC the chart grants.

No kubelet runs the operator pod the chart creates (it stays Pending); the operator runs here,
authenticated as the operator ServiceAccount, which is what the pod would do.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps.argv import mqbalance_argv
from harness.kube.cluster import LocalCluster
from harness.kube.kubelet import create_node, start_pods
from harness.polling import wait_for
from harness.processes.managed import ManagedProcess
from harness.processes.net import free_port
from mqbalance.contract import AssignmentDocument, configmap_name
from mqbalance.journal import JournalRecord
from mqbalance.operator.shards import ROLE_LABEL, SHARD_SET_LABEL, member_lease_name, shard_of
from tests.integration.deploy.deploy_support import (
    CHART,
    GROUP,
    REPO,
    assert_no_denials,
    by_kind,
    can_i,
    documents,
    installed,
    permitted,
    run_helm,
    service_account_kubeconfig,
)
from tests.integration.operator_support import apply_group, read_document

TIMEOUT = 60.0


@pytest.fixture
def release(cluster: LocalCluster, helm: Path, namespace: str) -> Iterator[str]:
    with installed(cluster, helm, namespace) as name:
        yield name


def test_install_creates_the_objects(cluster: LocalCluster, release: str, namespace: str) -> None:
    for kind, name in [
        ("deployment", f"{release}-mqbalance-operator"),
        ("serviceaccount", f"{release}-mqbalance-operator"),
        ("serviceaccount", f"{release}-mqbalance-sidecar"),
        ("role", f"{release}-mqbalance-operator"),
        ("rolebinding", f"{release}-mqbalance-operator"),
        ("role", f"{release}-mqbalance-operator-leader-election"),
        ("rolebinding", f"{release}-mqbalance-operator-leader-election"),
        ("role", f"{release}-mqbalance-sidecar"),
        ("rolebinding", f"{release}-mqbalance-sidecar"),
        ("service", f"{release}-mqbalance-metrics"),
        ("configmap", f"{release}-mqbalance-dashboard"),
    ]:
        cluster.kubectl("get", "-n", namespace, kind, name)
    cluster.kubectl("get", "clusterrole", f"{release}-mqbalance-operator")
    cluster.kubectl("get", "clusterrolebinding", f"{release}-mqbalance-operator")
    cluster.kubectl("get", "crd", "topics.mqbalance.io", "consumergroups.mqbalance.io")


def test_operator_has_what_it_needs_and_no_more(cluster: LocalCluster, release: str, namespace: str) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-operator"
    needed = [
        ("list", "topics.mqbalance.io"),
        ("watch", "topics.mqbalance.io"),
        ("list", "consumergroups.mqbalance.io"),
        ("watch", "consumergroups.mqbalance.io"),
        ("patch", "consumergroups.mqbalance.io"),
        ("list", "pods"),
        ("watch", "pods"),
        ("get", "configmaps"),
        ("create", "configmaps"),
        ("update", "configmaps"),
        ("watch", "configmaps"),
        ("create", "events"),
        ("list", "leases.coordination.k8s.io"),  # the sidecars' member Leases
        ("watch", "leases.coordination.k8s.io"),
    ]
    for verb, resource in needed:
        assert can_i(cluster, sa, verb, resource, namespace), f"operator cannot {verb} {resource}"
    for resource in ("topics.mqbalance.io", "consumergroups.mqbalance.io"):
        assert can_i(cluster, sa, "patch", resource, namespace, "status"), (
            f"operator cannot patch {resource} status"
        )
        assert not can_i(cluster, sa, "update", resource, namespace, "status")
    assert can_i(cluster, sa, "update", "consumergroups.mqbalance.io", namespace, "finalizers")
    for verb, resource in [("list", "nodes"), ("watch", "nodes")]:
        assert can_i(cluster, sa, verb, resource, None), f"operator cannot {verb} {resource}"
    for verb, resource in [("list", "namespaces"), ("list", "customresourcedefinitions")]:
        assert not can_i(cluster, sa, verb, resource, None), f"operator may {verb} {resource}: not needed"
    forbidden = [
        ("delete", "configmaps", namespace),
        ("get", "secrets", namespace),
        ("create", "pods", namespace),
        ("delete", "pods", namespace),
        ("update", "topics.mqbalance.io", namespace),
        ("delete", "consumergroups.mqbalance.io", namespace),
        ("list", "pods", "default"),  # it watches only its namespace
        ("create", "configmaps", "default"),
        ("patch", "nodes", None),
    ]
    assert permitted(cluster, sa, forbidden) == []


def test_operator_may_hold_its_lease_and_no_other(
    cluster: LocalCluster, release: str, namespace: str
) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-operator"
    lease = f"leases.coordination.k8s.io/{release}-mqbalance-operator"
    for verb in ("get", "update"):
        assert can_i(cluster, sa, verb, lease, namespace), f"operator cannot {verb} its Lease"
    # create cannot be narrowed to a name by RBAC: allowed for Leases of the release namespace only;
    # list: the look for sharded replicas under the same name.
    assert can_i(cluster, sa, "create", "leases.coordination.k8s.io", namespace)
    assert can_i(cluster, sa, "list", "leases.coordination.k8s.io", namespace)
    other = "leases.coordination.k8s.io/someone-else"
    forbidden = [
        ("get", other, namespace),
        ("update", other, namespace),
        ("patch", lease, namespace),
        ("delete", lease, namespace),
        ("list", "leases.coordination.k8s.io", "default"),
        ("watch", "leases.coordination.k8s.io", "default"),  # member Leases: where it serves groups only
        ("create", "leases.coordination.k8s.io", "default"),
        ("get", lease, "default"),
        ("update", "leases.coordination.k8s.io/kube-controller-manager", "kube-system"),
    ]
    assert permitted(cluster, sa, forbidden) == []


def test_sidecar_can_read_its_assignment_and_topics_only(
    cluster: LocalCluster, release: str, namespace: str
) -> None:
    sa = f"system:serviceaccount:{namespace}:{release}-mqbalance-sidecar"
    own = f"configmaps/{configmap_name(GROUP)}"
    for verb in ("get", "list", "watch"):
        assert can_i(cluster, sa, verb, own, namespace), f"sidecar cannot {verb} {own}"
        assert can_i(cluster, sa, verb, "topics.mqbalance.io", namespace), f"sidecar cannot {verb} topics"
    forbidden = [
        ("list", "pods"),
        ("get", "pods"),
        ("update", own),
        ("patch", own),
        ("delete", own),
        ("create", "configmaps"),
        ("get", "configmaps/other-assignment"),
        ("list", "configmaps"),  # only with a fieldSelector naming its own ConfigMap
        ("get", "secrets"),
        ("patch", "topics.mqbalance.io"),
        ("get", "consumergroups.mqbalance.io"),
    ]
    assert permitted(cluster, sa, [(verb, resource, namespace) for verb, resource in forbidden]) == []
    assert not can_i(cluster, sa, "list", "topics.mqbalance.io", "default")
    # Its member Lease (time-bounded ownership), in its namespace only, and no more than renewing it.
    leases = "leases.coordination.k8s.io"
    for verb in ("get", "create", "update"):
        assert can_i(cluster, sa, verb, leases, namespace), f"sidecar cannot {verb} leases"
    for verb, ns in (("delete", namespace), ("list", namespace), ("create", "default")):
        assert not can_i(cluster, sa, verb, leases, ns), f"sidecar may {verb} leases in {ns}"


def test_operator_and_sidecar_work_as_the_chart_service_accounts(
    cluster: LocalCluster, release: str, namespace: str, api_client: client.ApiClient, tmp_path: Path
) -> None:
    operator_config = service_account_kubeconfig(
        cluster, namespace, f"{release}-mqbalance-operator", tmp_path / "operator.kubeconfig"
    )
    sidecar_config = service_account_kubeconfig(
        cluster, namespace, f"{release}-mqbalance-sidecar", tmp_path / "sidecar.kubeconfig"
    )
    for name in ("topic.yaml", "consumergroup.yaml"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / name))
    node = f"node-{namespace}"
    create_node(api_client, node, "zone-a")
    pods = start_pods(api_client, namespace, GROUP, 2, {"app": "orders-consumer"}, [node])
    members = {f"{GROUP}-0", f"{GROUP}-1"}
    assert len(pods) == len(members)

    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    # With the chart's leader-election arguments: the Lease is taken with the chart's RBAC too.
    lease = f"{release}-mqbalance-operator"
    operator = ManagedProcess(
        "operator",
        mqbalance_argv(
            "operator", "--namespace", namespace, "--kubeconfig", str(operator_config),
            "--metrics-port", str(free_port()), f"--leader-election={lease}", "--lease-duration=15",
        ),
        {**env, "POD_NAMESPACE": namespace, "POD_NAME": f"{release}-operator-0"},
        tmp_path / "operator.log",
    )  # fmt: skip
    sidecar_port = free_port()
    sidecar = ManagedProcess(
        "sidecar",
        mqbalance_argv(
            "sidecar", "--kubeconfig", str(sidecar_config), "--port", str(sidecar_port),
            "--metrics-host", "127.0.0.1", "--metrics-port", str(free_port()),
        ),
        {**env, "POD_NAME": f"{GROUP}-0", "POD_NAMESPACE": namespace, "MQBALANCE_GROUP": GROUP},
        tmp_path / "sidecar.log",
    )  # fmt: skip
    operator.spawn()
    sidecar.spawn()
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    try:

        def published() -> AssignmentDocument | None:
            operator.check()
            doc = read_document(api_client, namespace, GROUP)
            return doc if doc is not None and set(doc.members) == members else None

        doc = wait_for("the operator to publish the assignment", published)

        def status() -> dict[str, Any] | None:
            body: Any = custom.get_namespaced_custom_object(
                "mqbalance.io", "v1alpha1", namespace, "consumergroups", GROUP
            )
            found: dict[str, Any] = body.get("status") or {}
            return found if found.get("assignmentGeneration") == doc.generation else None

        assert wait_for("the ConsumerGroup status", status)["members"] == 2

        def served() -> dict[str, Any] | None:
            sidecar.check()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{sidecar_port}/v1/queues", timeout=5) as resp:
                    body: dict[str, Any] = json.loads(resp.read())
            except OSError:
                return None
            return body if body.get("generation") == doc.generation else None

        view = wait_for("the sidecar to serve the assignment", served)
        assert view["queueCount"] == 6  # 12 queues over 2 members
        held = client.CoordinationV1Api(api_client).read_namespaced_lease(lease, namespace)
        assert held.spec is not None
        assert held.spec.holder_identity == f"{release}-operator-0"
    finally:
        sidecar.stop()
        operator.stop()
        core.delete_node(node)
    assert_no_denials((tmp_path / "operator.log").read_text() + (tmp_path / "sidecar.log").read_text())


SHARDS = 2
SHARDED = (
    "operator.replicas=2",
    f"operator.leaderElection.shards={SHARDS}",
    # Replicas step every third of the Lease: a short one keeps the test short.
    "operator.leaderElection.leaseDuration=6",
)


def upgrade(
    cluster: LocalCluster, helm: Path, release: str, namespace: str, *values: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return run_helm(
        helm, "upgrade", release, str(CHART),
        "--kubeconfig", str(cluster.kubeconfig),
        "--namespace", namespace,
        "--reuse-values",
        *(arg for value in values for arg in ("--set", value)),
        check=check,
    )  # fmt: skip


def test_upgrade_refuses_to_change_how_running_operators_coordinate(
    cluster: LocalCluster, helm: Path, release: str, namespace: str, api_client: client.ApiClient
) -> None:
    lease = f"{release}-mqbalance-operator"
    for value, after in [
        (f"operator.leaderElection.shards={SHARDS}", f'Lease "{lease}" with {SHARDS} shard(s)'),
        ("operator.leaderElection.leaseName=renamed", 'Lease "renamed" with 1 shard(s)'),
    ]:
        refused = upgrade(cluster, helm, release, namespace, value, check=False)
        assert refused.returncode != 0, value
        assert f'coordinate through Lease "{lease}" with 1 shard(s), these values through {after}' in (
            refused.stderr
        ), refused.stderr
        assert "Scale the operator to 0 first" in refused.stderr
    upgrade(cluster, helm, release, namespace, "operator.logLevel=DEBUG")  # the same coordination rolls

    apps = client.AppsV1Api(api_client)

    def gone() -> bool:
        status = apps.read_namespaced_deployment(lease, namespace).status
        return status is not None and not status.replicas

    upgrade(cluster, helm, release, namespace, "operator.replicas=0")
    wait_for("the operator's pods to go", gone)
    upgrade(cluster, helm, release, namespace, *SHARDED)
    spec = apps.read_namespaced_deployment(lease, namespace).spec
    assert spec is not None
    assert spec.template.spec is not None
    args = spec.template.spec.containers[0].args or []
    assert f"--shards={SHARDS}" in args
    assert "--log-level=DEBUG" in args  # the values reused


def health(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            body: dict[str, Any] = json.loads(resp.read())
    except OSError:
        return {}
    return body


def test_sharded_replicas_work_as_the_chart_service_account(
    cluster: LocalCluster, helm: Path, namespace: str, api_client: client.ApiClient, tmp_path: Path
) -> None:
    with installed(cluster, helm, namespace, *SHARDED) as release:
        name = f"{release}-mqbalance-operator"
        sa = f"system:serviceaccount:{namespace}:{name}"
        leases = "leases.coordination.k8s.io"
        for verb in ("get", "list", "create", "update", "delete"):
            assert can_i(cluster, sa, verb, leases, namespace), f"operator cannot {verb} leases"
        for verb, ns in [("watch", "default"), ("patch", namespace), ("deletecollection", namespace)]:
            assert not can_i(cluster, sa, verb, leases, ns), f"operator may {verb} leases in {ns}"
        for verb in ("get", "create", "delete"):
            assert not can_i(cluster, sa, verb, leases, "default"), f"operator may {verb} leases in default"
        notes = run_helm(
            helm, "get", "notes", release, "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace
        ).stdout
        assert f'split into {SHARDS} shards, Leases "{name}-0" to "{name}-1"' in notes, notes
        assert f"kubectl -n {namespace} get leases -l mqbalance.io/shard-set={name}" in notes, notes
        run_sharded_replicas(cluster, release, namespace, api_client, tmp_path)


def run_sharded_replicas(
    cluster: LocalCluster, release: str, namespace: str, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """Two replicas with the chart's own arguments and RBAC share the groups, then one leaves."""
    name = lease = f"{release}-mqbalance-operator"
    spec = client.AppsV1Api(api_client).read_namespaced_deployment(name, namespace).spec
    assert spec is not None
    assert spec.template.spec is not None
    command, *chart_args = spec.template.spec.containers[0].args or []
    assert command == "operator"
    assert f"--shards={SHARDS}" in chart_args, chart_args
    chart_args = [arg.replace("$(POD_NAMESPACE)", namespace) for arg in chart_args]

    # Two groups in each shard (the shard hashes the namespace, which is new every run).
    by_shard: dict[int, list[str]] = {shard: [] for shard in range(SHARDS)}
    for i in itertools.count():
        bucket = by_shard[shard_of(namespace, f"orders-{i}", SHARDS)]
        if len(bucket) < 2:
            bucket.append(f"orders-{i}")
        if all(len(groups) == 2 for groups in by_shard.values()):
            break
    cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "topic.yaml"))
    node = f"node-{namespace}"
    create_node(api_client, node, "zone-a")
    for group in (g for groups in by_shard.values() for g in groups):
        selector = {"matchLabels": {"app": group}}
        group_spec = {"groupName": group, "topics": ["orders"], "selector": selector, "debounceSeconds": 0}
        apply_group(api_client, namespace, group, {**group_spec, "strategy": {"name": "AVG"}})
        start_pods(api_client, namespace, group, 2, {"app": group}, [node])

    kubeconfig = service_account_kubeconfig(cluster, namespace, name, tmp_path / "operator.kubeconfig")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    identities = [f"{release}-operator-{i}" for i in range(2)]  # sorted: shard i goes to replica i
    ports = [free_port() for _ in identities]
    replicas = []
    for i, identity in enumerate(identities):
        argv = mqbalance_argv(
            "operator", *chart_args, "--kubeconfig", str(kubeconfig), "--metrics-host", "127.0.0.1",
            f"--metrics-port={ports[i]}", "--journal", str(tmp_path / f"journal-{i}.jsonl"),
        )  # fmt: skip
        env_i = {**env, "POD_NAMESPACE": namespace, "POD_NAME": identity}
        replicas.append(ManagedProcess(f"operator {i}", argv, env_i, tmp_path / f"operator-{i}.log"))
    core = client.CoreV1Api(api_client)
    coordination = client.CoordinationV1Api(api_client)

    def held(i: int) -> list[int]:
        replicas[i].check()
        shards: list[int] = health(ports[i]).get("shards") or []
        return shards

    def published(group: str, members: int) -> AssignmentDocument | None:
        for replica in replicas:
            replica.check()
        doc = read_document(api_client, namespace, group)
        return doc if doc is not None and len(doc.members) == members else None

    def journaled(i: int, group: str, generation: int) -> bool:
        path = tmp_path / f"journal-{i}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return any((r.group, r.generation) == (group, generation) for r in map(JournalRecord.decode, lines))

    def rebalanced_by(i: int, group: str, members: int, pod: str) -> None:
        """Add ``pod`` to ``group``; only replica ``i`` publishes the new generation."""
        start_pods(api_client, namespace, pod, 1, {"app": group}, [node])
        doc = wait_for(f"{group} with {members} members", lambda: published(group, members))
        wait_for(f"replica {i}'s journal line", lambda: journaled(i, group, doc.generation))
        others = [j for j in range(len(replicas)) if j != i and replicas[j].alive]
        assert not [j for j in others if journaled(j, group, doc.generation)], f"{group} had two writers"

    for replica in replicas:
        replica.spawn()
    try:
        wait_for("each replica to hold its shard", lambda: [held(0), held(1)] == [[0], [1]], timeout=TIMEOUT)
        for group in (g for groups in by_shard.values() for g in groups):
            wait_for(f"{group} to be published", functools.partial(published, group, 2), timeout=TIMEOUT)
        found = coordination.list_namespaced_lease(
            namespace, label_selector=f"{SHARD_SET_LABEL}={lease}"
        ).items
        holders = {
            (item.metadata.name, (item.metadata.labels or {}).get(ROLE_LABEL)): item.spec.holder_identity
            for item in found
            if item.metadata is not None and item.spec is not None
        }
        assert holders == {
            (f"{lease}-0", "shard"): identities[0],
            (f"{lease}-1", "shard"): identities[1],
            (member_lease_name(lease, identities[0]), "member"): identities[0],
            (member_lease_name(lease, identities[1]), "member"): identities[1],
        }
        for shard, groups in by_shard.items():
            rebalanced_by(shard, groups[0], 3, f"{groups[0]}-extra")

        # SIGTERM: replica 1 releases its shard and deletes its member Lease; replica 0 takes over.
        replicas[1].stop()
        with pytest.raises(client.exceptions.ApiException) as missing:
            coordination.read_namespaced_lease(member_lease_name(lease, identities[1]), namespace)
        assert missing.value.status == 404
        wait_for("replica 0 to hold both shards", lambda: held(0) == [0, 1], timeout=TIMEOUT)
        rebalanced_by(0, by_shard[1][0], 4, f"{by_shard[1][0]}-late")
    finally:
        for replica in replicas:
            replica.stop()
        core.delete_node(node)
    assert_no_denials("".join((tmp_path / f"operator-{i}.log").read_text() for i in range(len(replicas))))


def test_replicas_sharding_by_namespace_watch_the_cluster_as_the_chart_service_account(
    cluster: LocalCluster, helm: Path, namespace: str, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """Cluster-wide with shardBy=namespace: the ClusterRole lets a replica list and watch the
    Namespaces (it watches those of its shards), and one replica with the chart's arguments
    watches this namespace and publishes its group."""
    values = (*SHARDED, "operator.leaderElection.shardBy=namespace")
    with installed(cluster, helm, namespace, *values, cluster_wide=True) as release:
        name = f"{release}-mqbalance-operator"
        sa = f"system:serviceaccount:{namespace}:{name}"
        for verb in ("list", "watch"):
            assert can_i(cluster, sa, verb, "namespaces", None), f"operator cannot {verb} namespaces"
        for verb in ("get", "create", "delete"):
            assert not can_i(cluster, sa, verb, "namespaces", None), f"operator may {verb} namespaces"
        notes = run_helm(
            helm, "get", "notes", release, "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace
        ).stdout
        assert f"split into {SHARDS} shards by namespace" in notes, notes
        assert "the namespaces it watches" in notes, notes
        spec = client.AppsV1Api(api_client).read_namespaced_deployment(name, namespace).spec
        assert spec is not None
        assert spec.template.spec is not None
        _, *chart_args = spec.template.spec.containers[0].args or []
        assert "--shard-by=namespace" in chart_args, chart_args
        assert not [a for a in chart_args if a.startswith("--namespace")], chart_args

        cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "topic.yaml"))
        node = f"node-{namespace}"
        create_node(api_client, node, "zone-a")
        group_spec = {"topics": ["orders"], "selector": {"matchLabels": {"app": GROUP}}, "debounceSeconds": 0}
        apply_group(api_client, namespace, GROUP, {**group_spec, "strategy": {"name": "AVG"}})
        start_pods(api_client, namespace, GROUP, 2, {"app": GROUP}, [node])
        kubeconfig = service_account_kubeconfig(cluster, namespace, name, tmp_path / "operator.kubeconfig")
        port = free_port()
        argv = mqbalance_argv(
            "operator", *(a.replace("$(POD_NAMESPACE)", namespace) for a in chart_args),
            "--kubeconfig", str(kubeconfig), "--metrics-host", "127.0.0.1", f"--metrics-port={port}",
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env |= {"POD_NAMESPACE": namespace, "POD_NAME": f"{release}-operator-0"}
        replica = ManagedProcess("operator", argv, env, tmp_path / "operator.log")
        core = client.CoreV1Api(api_client)

        def published() -> AssignmentDocument | None:
            replica.check()
            doc = read_document(api_client, namespace, GROUP)
            return doc if doc is not None and len(doc.members) == 2 else None

        replica.spawn()
        try:
            wait_for(
                "the replica to watch this namespace",
                lambda: namespace in (health(port).get("namespaces") or []),
                timeout=TIMEOUT,
            )
            wait_for(f"{GROUP} to be published", published, timeout=TIMEOUT)
        finally:
            replica.stop()
            core.delete_node(node)
        assert_no_denials((tmp_path / "operator.log").read_text())


def test_the_api_server_admits_the_network_policies(
    helm: Path, cluster: LocalCluster, namespace: str
) -> None:
    docs = documents(
        run_helm(
            helm, "template", "mq", str(CHART), "--namespace", namespace,
            "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.sidecars.enabled=true",
            "--set", "injector.enabled=true", "--set", "operator.externalMetrics.enabled=true",
            "--set-json", 'networkPolicy.sidecars.extraIngress=[{"ports": [{"port": "http"}]}]',
        ).stdout
    )  # fmt: skip
    policies = by_kind(docs, "NetworkPolicy")
    assert len(policies) == 3
    for policy in policies:
        path = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies?dryRun=All"
        status, body = cluster.request("POST", path, policy)
        assert status == 201, body
