"""Least privilege beyond the chart's own ``kubectl auth can-i`` tests
(tests/integration/deploy/test_deploy_helm_install.py) and Dockerfile tests
(tests/unit/test_deploy_dockerfile.py): no wildcard in any rendered RBAC rule, and the
sidecar's API listens on the pod's loopback interface unless told otherwise."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.apps.sidecar import SidecarProcess
from harness.kube.binaries import ensure_binaries
from harness.polling import scaled

REPO = Path(__file__).resolve().parents[3]
POWERFUL_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}
SECRET_RESOURCES = {"secrets", "serviceaccounts/token", "*"}


def rendered_rules(*values: str) -> list[tuple[str, dict[str, Any]]]:
    helm = ensure_binaries() / "helm"
    argv = [str(helm), "template", "mq", str(REPO / "charts" / "mqbalance"), "--namespace", "mq"]
    for value in values:
        argv += ["--set", value]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=scaled(120)).stdout
    rules = []
    for doc in yaml.safe_load_all(out):
        if doc and doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc.get("rules") or []:
                rules.append((f"{doc['kind']}/{doc['metadata']['name']}", rule))
    return rules


@pytest.mark.parametrize(
    "values",
    [
        (),
        ("operator.watchNamespaces={shop,billing}",),
        ("sidecar.namespaces={shop}", "sidecar.groups={orders}"),
        ("operator.replicas=3", "operator.leaderElection.shards=8"),
        (
            "operator.replicas=3",
            "operator.leaderElection.shards=8",
            "operator.leaderElection.shardBy=namespace",
        ),
    ],
    ids=["cluster-wide", "namespaced", "sidecar-groups", "sharded", "sharded-by-namespace"],
)
def test_no_rbac_rule_uses_a_wildcard_or_a_powerful_verb(values: tuple[str, ...]) -> None:
    rules = rendered_rules(*values)
    assert rules, "the chart rendered no RBAC rules"
    for where, rule in rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in (rule.get(key) or []), f"{where}: wildcard in {key}: {rule}"
        assert not POWERFUL_VERBS & set(rule.get("verbs") or []), f"{where}: {rule}"
        assert not SECRET_RESOURCES & set(rule.get("resources") or []), f"{where}: {rule}"
        assert "nonResourceURLs" not in rule, f"{where}: {rule}"


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket in LISTEN on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":
                if len(address) == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1]))
                else:
                    raw = bytes.fromhex(address)
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_sidecar_api_binds_to_loopback_by_default(tmp_path: Path) -> None:
    assignment = tmp_path / "assignment.json"
    assignment.write_text("{}")
    side = SidecarProcess(
        tmp_path / "no-kubeconfig",
        tmp_path / "sidecar.log",
        "--pod-name=pod-a",
        "--namespace=shop",
        "--group=orders",
        f"--assignment-file=orders={assignment}",
        "--no-topics",
    )
    try:
        side.start()
        assert listening_addresses(side.port) == {"127.0.0.1"}
    finally:
        side.stop()
