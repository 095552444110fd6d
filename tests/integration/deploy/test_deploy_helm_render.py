"""The chart lints strictly and renders what the docs promise (helm only, no cluster)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from mqbalance.operator.main import parse_args
from tests.integration.deploy.deploy_support import (
    CHART,
    REPO,
    assert_values_refused,
    by_kind,
    documents,
    render,
    run_helm,
    template_refused,
)

ALL_ON = [
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.podMonitor.enabled=true",
    "--set", "metrics.prometheusRule.enabled=true",
]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ALL_ON,
        ["--set", "operator.watchNamespaces={a,b}", "--set", "sidecar.groups={g}"],
        ["--set", "operator.replicas=2"],
        ["--set", "operator.leaderElection.enabled=false"],
        ["--set", "operator.replicas=3", "--set", "operator.leaderElection.shards=4"],
        ["--set", "operator.nameServer.addresses={ns-0:9876,ns-1:9876}"],
        ["--set", "networkPolicy.enabled=true", "--set", "networkPolicy.sidecars.enabled=true"],
        ["--set", "networkPolicy.enabled=true", "--set", "networkPolicy.metricsFrom=null"],
    ],
)
def test_helm_lint_strict(helm: Path, extra: list[str]) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *extra)
    assert "0 chart(s) failed" in result.stdout


def test_template_includes_the_crds_unchanged(helm: Path) -> None:
    docs = render(helm, "--include-crds")
    rendered = {doc["metadata"]["name"]: doc for doc in by_kind(docs, "CustomResourceDefinition")}
    source = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        source[crd["metadata"]["name"]] = crd
    assert rendered == source


def test_every_object_carries_the_standard_labels(helm: Path) -> None:
    docs = render(helm, *ALL_ON)
    assert len(docs) >= 10
    for doc in docs:
        labels = doc["metadata"]["labels"]
        where = f"{doc['kind']} {doc['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "mqbalance", where
        assert labels["app.kubernetes.io/instance"] == "mq", where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/version"] == "0.2.0", where
        assert labels["helm.sh/chart"] == "mqbalance-0.2.0", where


def test_operator_deployment_is_locked_down(helm: Path) -> None:
    (deployment,) = by_kind(render(helm), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert container["args"][0] == "operator"
    assert "--all-namespaces" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert pod["serviceAccountName"] == "mq-mqbalance-operator"


def _operator_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _operator_flags(docs: list[dict[str, Any]], prefix: str) -> list[str]:
    """The operator container's arguments that start with ``prefix``."""
    return [a for a in _operator_container(docs)[1]["args"] if a.startswith(prefix)]


def test_leader_election_is_on_by_default_with_a_lease_in_the_release_namespace(helm: Path) -> None:
    docs = render(helm, "--set", "operator.replicas=2", "--set", "operator.watchNamespaces={team-a}")
    deployment, container = _operator_container(docs)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    args = container["args"]
    assert "--leader-election=mq-mqbalance-operator" in args
    assert "--lease-duration=15" in args
    # The kubelet expands $(POD_NAMESPACE) from the container's downward-API variable.
    assert "--lease-namespace=$(POD_NAMESPACE)" in args
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the candidate's identity

    name = "mq-mqbalance-operator-leader-election"
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == name]
    assert role["metadata"]["namespace"] == "mq-system"  # the release namespace, not a watched one
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["mq-mqbalance-operator"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "list"]},
    ]
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == name]
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mq-mqbalance-operator", "namespace": "mq-system"}
    ]
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert all("leases" not in rule["resources"] for rule in cluster_role["rules"])


def test_shards_pass_the_flag_and_grant_the_lease_verbs_the_operator_calls(helm: Path) -> None:
    docs = render(helm, "--set", "operator.replicas=3", "--set", "operator.leaderElection.shards=4")
    deployment, container = _operator_container(docs)
    assert deployment["spec"]["replicas"] == 3
    # Same-count upgrades roll: a new pod joins as a member, each shard moves once its holder drained it.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert _operator_flags(docs, "--shards") == ["--shards=4"]
    assert "--leader-election=mq-mqbalance-operator" in container["args"]
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "mq-system"
    # What shards.py and kube/lease.py call: list by label selector, get, create, replace (update) and
    # delete (member Leases); no watch, no patch. Member Leases are named after pods: no resourceNames.
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "create", "update", "delete"],
        }
    ]
    # One shard is plain leader election: no flag, the one Lease by name.
    assert not _operator_flags(render(helm, "--set", "operator.leaderElection.shards=1"), "--shards")


def test_sharding_by_namespace_passes_the_flag_and_lists_namespaces_only_cluster_wide(helm: Path) -> None:
    sharded = ("--set", "operator.replicas=3", "--set", "operator.leaderElection.shards=4")
    by_namespace = (*sharded, "--set", "operator.leaderElection.shardBy=namespace")

    def namespace_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            rule
            for role in by_kind(docs, "ClusterRole")
            for rule in role["rules"]
            if "namespaces" in rule["resources"]
        ]

    docs = render(helm, *by_namespace)
    assert _operator_flags(docs, "--shard") == ["--shards=4", "--shard-by=namespace"]
    # A replica watches the namespaces of its shards, so it must learn of every namespace: no more.
    assert namespace_rules(docs) == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    ]
    # Listed namespaces are known from the flags; sharded by group, no replica needs them.
    assert not namespace_rules(
        render(helm, *by_namespace, "--set", "operator.watchNamespaces={shop,billing}")
    )
    docs = render(helm, *sharded)
    assert not namespace_rules(docs)
    assert not _operator_flags(docs, "--shard-by")


def test_shards_need_leader_election(helm: Path) -> None:
    complaint = template_refused(
        helm, "--set", "operator.leaderElection.enabled=false", "--set", "operator.leaderElection.shards=2"
    )
    # The schema names both ways out: one shard, or leader election on.
    assert "operator.leaderElection.shards: Must be less than or equal to 1" in complaint, complaint
    assert (
        "operator.leaderElection.enabled: operator.leaderElection.enabled does not match: true" in complaint
    )


def test_name_servers_render_one_flag_joined_with_semicolons(helm: Path) -> None:
    assert not _operator_flags(render(helm), "--name-server")
    values = [
        "--set", "operator.nameServer.addresses={rocketmq-namesrv-0.rocketmq:9876,10.0.0.5:9876}",
        "--set-json", "operator.nameServer.timeoutSeconds=1.5",
    ]  # fmt: skip
    assert _operator_flags(render(helm, *values), "--name-server") == [
        "--name-server=rocketmq-namesrv-0.rocketmq:9876;10.0.0.5:9876",
        "--name-server-timeout=1.5",
    ]


def test_lag_settings_render_the_operator_flags_it_accepts(helm: Path) -> None:
    assert not _operator_flags(render(helm), "--lag")
    values = [
        "--set-json", "operator.lag.intervalSeconds=10",
        "--set-json", "operator.lag.timeoutSeconds=1.5",
        "--set-json", "operator.lag.requestsPerSecond=20",
        "--set", "operator.lag.queueMetrics=true",
    ]  # fmt: skip
    docs = render(helm, *values)
    assert _operator_flags(docs, "--lag") == [
        "--lag-interval=10",
        "--lag-timeout=1.5",
        "--lag-requests-per-second=20",
        "--lag-queue-metrics",
    ]
    _, *args = _operator_container(docs)[1]["args"]
    config = parse_args([a.replace("$(POD_NAMESPACE)", "mq-system") for a in args])
    assert (config.lag_interval, config.lag_timeout, config.lag_rate, config.lag_queue_metrics) == (
        10,
        1.5,
        20,
        True,
    )


def test_the_operator_accepts_the_rendered_arguments(helm: Path) -> None:
    docs = render(
        helm,
        "--set", "operator.replicas=2",
        "--set", "operator.leaderElection.shards=3",
        "--set", "operator.nameServer.addresses={ns-0:9876,ns-1:9876}",
        "--set", "operator.nameServer.timeoutSeconds=5",
    )  # fmt: skip
    _, container = _operator_container(docs)
    command, *args = container["args"]
    assert command == "operator"
    # The kubelet expands $(POD_NAMESPACE); the operator's own parser then checks every flag.
    config = parse_args([a.replace("$(POD_NAMESPACE)", "mq-system") for a in args])
    # Metrics and /healthz on the pod's IP and loopback only; $(POD_IP) comes from the downward API.
    assert config.metrics_host == "$(POD_IP),127.0.0.1"
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert config.leader_election == "mq-mqbalance-operator"
    assert config.lease_namespace == "mq-system"
    assert config.shards == 3
    assert config.name_server == "ns-0:9876;ns-1:9876"
    assert config.name_server_timeout == 5


def test_leader_election_can_be_renamed_or_turned_off(helm: Path) -> None:
    docs = render(
        helm,
        "--set", "operator.leaderElection.leaseName=mq-leader",
        "--set", "operator.leaderElection.leaseDuration=30",
    )  # fmt: skip
    _, container = _operator_container(docs)
    assert "--leader-election=mq-leader" in container["args"]
    assert "--lease-duration=30" in container["args"]
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["rules"][0]["resourceNames"] == ["mq-leader"]

    docs = render(helm, "--set", "operator.leaderElection.enabled=false")
    deployment, container = _operator_container(docs)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in container["args"] if a.startswith(("--leader-election", "--lease-"))]
    assert not [d for d in docs if "leader-election" in d["metadata"]["name"]]


def test_watching_namespaces_uses_roles_there_and_no_cluster_wide_namespaced_rights(helm: Path) -> None:
    docs = render(helm, "--set", "operator.watchNamespaces={team-a,team-b}")
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-operator")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    (cluster_role,) = by_kind(docs, "ClusterRole")
    cluster_resources = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    assert cluster_resources == {"nodes"}
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args
    assert "--namespace=team-b" in args
    assert "--all-namespaces" not in args


def test_sidecar_role_reads_its_groups_and_writes_only_their_releases(helm: Path) -> None:
    docs = render(helm, "--set", "sidecar.groups={orders,billing}", "--set", "sidecar.namespaces={shop}")
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-sidecar")]
    assert role["metadata"]["namespace"] == "shop"
    rules = {
        (tuple(r["resources"]), tuple(r.get("resourceNames", ()))): set(r["verbs"]) for r in role["rules"]
    }
    assert rules[("configmaps",), ("orders-assignment", "billing-assignment")] == {"get", "list", "watch"}
    # Its one write: release acknowledgements, in its groups' releases ConfigMaps only.
    assert rules[("configmaps",), ("orders-releases", "billing-releases")] == {"patch"}
    # And its member Lease (time-bounded ownership): Lease names follow pod names, unknown in advance.
    (lease,) = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert (lease["apiGroups"], set(lease["verbs"])) == (["coordination.k8s.io"], {"get", "create", "update"})
    writes = {verb for verbs in rules.values() for verb in verbs} - {"get", "list", "watch"}
    assert writes == {"patch", "create", "update"}
    # Without the groups named, nothing can be narrowed: reads only, no patch at all.
    docs = render(helm, "--set", "sidecar.namespaces={shop}")
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-sidecar")]
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}
    (account,) = by_kind(docs, "ServiceAccount")[1:]
    assert account["metadata"] == {**account["metadata"], "name": "mq-mqbalance-sidecar", "namespace": "shop"}


def test_values_schema_rejects_bad_values(helm: Path) -> None:
    long_name = "a" * 230
    assert_values_refused(
        helm,
        [
            ("operator.replicas=2,operator.leaderElection.enabled=false", "operator.replicas"),
            ("operator.replicas=-1", "operator.replicas"),
            ("operator.leaderElection.leaseDuration=2", "operator.leaderElection.leaseDuration"),
            ("operator.leaderElection.leaseName=Not_A_Name", "operator.leaderElection.leaseName"),
            ("sidecar.faultTable=6x", "sidecar.faultTable"),
            ("operator.leaderElection.shards=0", "operator.leaderElection.shards"),
            ("operator.leaderElection.shards=1025", "operator.leaderElection.shards"),
            (
                f"operator.leaderElection.shards=2,operator.leaderElection.leaseName={long_name}",
                "operator.leaderElection.leaseName",
            ),
            # One address per item: the chart renders RocketMQ's "a:9876;b:9876" form but does not take it.
            ("operator.nameServer.addresses={a:9876;b:9876}", "operator.nameServer.addresses.0"),
            ("operator.nameServer.addresses={ns-0:9876,rocketmq}", "operator.nameServer.addresses.1"),
            ("operator.nameServer.addresses={ns-0:0}", "operator.nameServer.addresses.0"),
            ("operator.nameServer.addresses={ns-0:65536}", "operator.nameServer.addresses.0"),
            ("operator.nameServer.addresses={ns-0:9876,ns-0:9876}", "operator.nameServer.addresses"),
            ("operator.nameServer.timeoutSeconds=0", "operator.nameServer.timeoutSeconds"),
            ("operator.nameServer.timeoutSeconds=61", "operator.nameServer.timeoutSeconds"),
            ("operator.replica=1", "replica"),
        ],
    )


MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def _policies(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    policies = by_kind(docs, "NetworkPolicy")
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"] for d in policies}


def test_network_policies_are_opt_in_and_open_only_the_listeners_ports(helm: Path) -> None:
    on = ["--set", "injector.enabled=true", "--set", "operator.externalMetrics.enabled=true"]
    assert _policies(render(helm, *on)) == {}
    policies = _policies(render(helm, *on, "--set", "networkPolicy.enabled=true"))
    assert sorted(name for _, name in policies) == ["mq-mqbalance-injector", "mq-mqbalance-operator"]
    operator = policies[("mq-system", "mq-mqbalance-operator")]
    assert operator["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert operator["policyTypes"] == ["Ingress"]
    assert operator["ingress"] == [
        {"from": MONITORING, "ports": [{"port": 8080, "protocol": "TCP"}]},
        # The API server's aggregation layer: from anywhere, to that port only.
        {"ports": [{"port": 6443, "protocol": "TCP"}]},
    ]
    injector = policies[("mq-system", "mq-mqbalance-injector")]
    assert injector["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "injector"
    assert injector["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]
    # No metrics peers: the metrics rule goes, rather than a rule without `from`, which would admit anyone.
    closed = _policies(
        render(helm, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.metricsFrom=null")
    )
    assert closed[("mq-system", "mq-mqbalance-operator")]["ingress"] == []


def test_the_consumer_pods_policy_is_a_separate_opt_in_per_sidecar_namespace(helm: Path) -> None:
    spaces = ["--set", "sidecar.namespaces={shop,pay}", "--set", "networkPolicy.enabled=true"]
    assert [key for key in _policies(render(helm, *spaces)) if key[1].endswith("-sidecars")] == []
    app_port = {"from": [{"podSelector": {}}], "ports": [{"port": 8080}]}
    docs = render(
        helm, *spaces,
        "--set", "networkPolicy.sidecars.enabled=true",
        "--set-json", f"networkPolicy.sidecars.extraIngress=[{json.dumps(app_port)}]",
    )  # fmt: skip
    policies = _policies(docs)
    for namespace in ("shop", "pay"):
        policy = policies[(namespace, "mq-mqbalance-sidecars")]
        assert policy["podSelector"] == {"matchLabels": {"mqbalance.io/sidecar": "true"}}
        metrics = {"from": MONITORING, "ports": [{"port": 9091, "protocol": "TCP"}]}
        assert policy["ingress"] == [metrics, app_port]


def test_values_schema_rejects_bad_network_policy_values(helm: Path) -> None:
    assert_values_refused(
        helm,
        [
            ("networkPolicy.enabled=yes", "networkPolicy.enabled"),
            ("networkPolicy.metricsFrom[0].namespace=monitoring", "networkPolicy.metricsFrom.0"),
            ("networkPolicy.sidecars.extraIngress[0].to=x", "networkPolicy.sidecars.extraIngress.0"),
        ],
    )


def test_the_replay_driver_account_is_off_by_default_and_holds_what_spark_asks(helm: Path) -> None:
    assert not [d for d in render(helm) if d["metadata"]["name"].endswith("-replay")]
    docs = render(helm, "--set", "replay.enabled=true", "--set", "replay.namespace=analytics")
    replay = {d["kind"]: d for d in docs if d["metadata"]["name"] == "mq-mqbalance-replay"}
    assert sorted(replay) == ["Role", "RoleBinding", "ServiceAccount"]
    assert {d["metadata"]["namespace"] for d in replay.values()} == {"analytics"}
    (rule,) = replay["Role"]["rules"]
    # Spark's RBAC documentation: the driver creates, watches and deletes these, nothing else.
    assert (rule["apiGroups"], set(rule["resources"])) == (
        [""],
        {"pods", "services", "configmaps", "persistentvolumeclaims"},
    )
    assert {"create", "get", "list", "watch", "delete"} <= set(rule["verbs"])
    (subject,) = replay["RoleBinding"]["subjects"]
    assert (subject["name"], subject["namespace"]) == ("mq-mqbalance-replay", "analytics")
    # A namespace of its own by default, made by the chart with Pod Security "baseline": the driver
    # creates pods, which in the release namespace could run as the operator or mount the injector's keys.
    named = render(helm, "--set", "replay.enabled=true", "--set", "replay.serviceAccountName=spark")
    (account,) = [d for d in by_kind(named, "ServiceAccount") if d["metadata"]["name"] == "spark"]
    assert account["metadata"]["namespace"] == "mq-system-replay"
    (made,) = by_kind(named, "Namespace")
    assert made["metadata"]["name"] == "mq-system-replay"
    assert made["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert not by_kind(render(helm, "--set", "replay.enabled=true,replay.createNamespace=false"), "Namespace")
    said = template_refused(
        helm, "--namespace", "mq-system", "--set", "replay.enabled=true,replay.namespace=mq-system"
    )
    assert "namespace of its own" in said


def test_monitoring_objects_are_off_by_default_and_read_the_chart_files(helm: Path) -> None:
    kinds = {doc["kind"] for doc in render(helm)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    docs = render(helm, *ALL_ON)
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    (dashboard,) = by_kind(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    assert json.loads(text) == json.loads((CHART / "files" / "grafana-dashboard.json").read_text())


def test_runbook_links_point_at_the_configured_document(helm: Path) -> None:
    url = "https://wiki.example.com/mqbalance/runbooks.md"
    docs = render(helm, *ALL_ON, "--set", f"metrics.prometheusRule.runbookUrl={url}")
    (rule,) = by_kind(docs, "PrometheusRule")
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{url}#{alert['alert'].lower()}"
    # Only the links change: Prometheus's own templates stay for Prometheus.
    source = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    for group in source["groups"]:
        for r in group["rules"]:
            r.get("annotations", {}).pop("runbook_url", None)
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            r.get("annotations", {}).pop("runbook_url", None)
    assert rule["spec"] == source
    assert "metrics.prometheusRule.runbookUrl" in template_refused(
        helm, "--set", "metrics.prometheusRule.runbookUrl=x#y"
    )


def test_sidecar_helper_template_adds_a_complete_container(helm: Path, tmp_path: Path) -> None:
    # A consumer's own chart that depends on mqbalance and includes the helper in its Deployment.
    parent = tmp_path / "consumer"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: consumer\nversion: 1.0.0\n")
    shutil.copytree(CHART, parent / "charts" / "mqbalance")
    (parent / "templates" / "deployment.yaml").write_text(
        """apiVersion: apps/v1
kind: Deployment
metadata:
  name: orders
spec:
  selector:
    matchLabels: {app: orders}
  template:
    metadata:
      labels: {app: orders, mqbalance.io/sidecar: "true"}
    spec:
      serviceAccountName: {{ include "mqbalance.sidecar.serviceAccountName" .Subcharts.mqbalance }}
      containers:
        - name: app
          image: example/orders:1
        {{- $sidecar := dict "root" .Subcharts.mqbalance "group" "orders" "zone" "zone-a" }}
        {{- include "mqbalance.sidecar.container" $sidecar | nindent 8 }}
"""
    )
    docs = documents(
        run_helm(helm, "template", "shop", str(parent), "--show-only", "templates/deployment.yaml").stdout
    )
    (deployment,) = docs
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "shop-mqbalance-sidecar"
    _app, sidecar = pod["containers"]
    assert sidecar["args"] == ["sidecar"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}
    assert env["MQBALANCE_GROUP"] == "orders"
    assert env["MQBALANCE_ZONE"] == "zone-a"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    ctx = sidecar["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert sidecar["ports"] == [{"name": "mqb-metrics", "containerPort": 9091, "protocol": "TCP"}]
