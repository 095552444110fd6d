"""What the API server makes of the project's CRDs: CEL rules and field selectors on the current
release, and how 1.20 (which has neither) treats the same files.

The bad-input corpus (reliability/test_reliability_bad_input.py) checks every rule's rejection on
create; this file checks the CRDs as stored, rules on update, and field selectors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.kube.cluster import LocalCluster
from tests.integration.reliability.corpus import MACHINE_ROOM_NEEDS_IDCS, VALUES_NEEDED

GROUP, VERSION = "mqbalance.io", "v1alpha1"
CRDS = Path(__file__).resolve().parents[2] / "crds"
CG_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/consumergroups"
TOPIC_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/topics"

pytestmark = pytest.mark.usefixtures("crds")


def stored_crd(cluster: LocalCluster, name: str) -> dict[str, Any]:
    crd: dict[str, Any] = json.loads(cluster.kubectl("get", "crd", name, "-o", "json").stdout)
    return crd


def rules(schema: Any) -> list[str]:
    """Every CEL rule in a schema, depth first."""
    found: list[str] = []
    if isinstance(schema, dict):
        found += [r["rule"] for r in schema.get("x-kubernetes-validations", [])]
        for value in schema.values():
            found += rules(value)
    elif isinstance(schema, list):
        for value in schema:
            found += rules(value)
    return found


def group(name: str, strategy: dict[str, Any], group_name: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "topics": ["orders"],
        "selector": {"matchLabels": {"app": name}},
        "strategy": strategy,
    }
    if group_name:
        spec["groupName"] = group_name
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ConsumerGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def names(answer: Any) -> list[str]:
    return sorted(item["metadata"]["name"] for item in answer["items"])


def test_the_stored_crds_keep_their_rules_and_selectable_fields_where_the_server_knows_them(
    cluster: LocalCluster,
) -> None:
    groups = stored_crd(cluster, "consumergroups.mqbalance.io")["spec"]["versions"][0]
    topics = stored_crd(cluster, "topics.mqbalance.io")["spec"]["versions"][0]
    if cluster.legacy:
        # 1.20 knows neither field and drops both; nothing else about the CRD changes.
        assert rules(groups["schema"]) == []
        assert rules(topics["schema"]) == []
        assert "selectableFields" not in groups
        assert "selectableFields" not in topics
        assert groups["schema"]["openAPIV3Schema"]["properties"]["spec"]["required"] == ["topics", "selector"]
        return
    source = yaml.safe_load((CRDS / "mqbalance.io_consumergroups.yaml").read_text())["spec"]["versions"][0]
    # The object name, the handover lease, two selector rules, three strategy rules.
    assert len(rules(source["schema"])) == 7
    assert sorted(rules(groups["schema"])) == sorted(rules(source["schema"]))
    topic_source = yaml.safe_load((CRDS / "mqbalance.io_topics.yaml").read_text())["spec"]["versions"][0]
    # The queue counts without a NameServer, the read and write queues per topic (docs/operator.md, Bounds).
    assert len(rules(topic_source["schema"])) == 3
    assert sorted(rules(topics["schema"])) == sorted(rules(topic_source["schema"]))
    assert [f["jsonPath"] for f in groups["selectableFields"]] == [
        ".spec.groupName",
        ".spec.strategy.name",
        ".spec.messageModel",
    ]
    assert [f["jsonPath"] for f in topics["selectableFields"]] == [".spec.topicName"]


def test_rules_also_hold_on_update(cluster: LocalCluster, namespace: str) -> None:
    path = CG_PATH.format(ns=namespace)
    status, created = cluster.request("POST", path, group("rooms", {"name": "AVG"}))
    assert status == 201, created
    patch = {"spec": {"strategy": {"name": "MACHINE_ROOM"}}}
    status, answer = cluster.request("PATCH", f"{path}/rooms", patch)
    if cluster.legacy:
        assert status == 200, answer  # no rules: the operator reports it Invalid instead
        return
    assert status == 422, answer
    assert MACHINE_ROOM_NEEDS_IDCS in answer["message"]
    assert "spec.strategy.consumerIdcs" in answer["message"]
    selector = {"spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "NotIn"}]}}}
    status, answer = cluster.request("PATCH", f"{path}/rooms", selector)
    assert status == 422, answer
    assert VALUES_NEEDED in answer["message"]
    # A valid change still goes through, and the object is unchanged by the refused ones.
    status, answer = cluster.request("PATCH", f"{path}/rooms", {"spec": {"strategy": {"name": "STICKY"}}})
    assert status == 200, answer
    assert answer["spec"]["strategy"]["name"] == "STICKY"
    assert answer["spec"]["selector"] == {"matchLabels": {"app": "rooms"}}


def test_field_selectors_pick_groups_and_topics(cluster: LocalCluster, namespace: str) -> None:
    cg = CG_PATH.format(ns=namespace)
    for body in (
        group("a", {"name": "STICKY"}, group_name="GID_orders"),
        group("b", {"name": "STICKY"}),
        group("c", {"name": "CONSISTENT_HASH"}, group_name="GID_orders"),
    ):
        status, answer = cluster.request("POST", cg, body)
        assert status == 201, answer
    topics = TOPIC_PATH.format(ns=namespace)
    for name, topic_name in (("t1", "orders"), ("t2", "payments")):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Topic",
            "metadata": {"name": name},
            "spec": {
                "topicName": topic_name,
                "brokers": [{"name": "b", "readQueueNums": 1, "writeQueueNums": 1}],
            },
        }
        status, answer = cluster.request("POST", topics, body)
        assert status == 201, answer

    status, sticky = cluster.request("GET", f"{cg}?fieldSelector=spec.strategy.name%3DSTICKY")
    if cluster.legacy:
        assert status == 400, sticky
        assert "field label not supported: spec.strategy.name" in sticky["message"]
        return
    assert status == 200, sticky
    assert names(sticky) == ["a", "b"]
    _, orders = cluster.request("GET", f"{cg}?fieldSelector=spec.groupName%3DGID_orders")
    assert names(orders) == ["a", "c"]
    _, both = cluster.request(
        "GET", f"{cg}?fieldSelector=spec.groupName%3DGID_orders,spec.strategy.name%3DSTICKY"
    )
    assert names(both) == ["a"]
    _, clustering = cluster.request("GET", f"{cg}?fieldSelector=spec.messageModel%3DCLUSTERING")
    assert names(clustering) == ["a", "b", "c"]  # the schema default is stored
    _, payments = cluster.request("GET", f"{topics}?fieldSelector=spec.topicName%3Dpayments")
    assert names(payments) == ["t2"]
    out = cluster.kubectl(
        "get",
        "consumergroups",
        "-n",
        namespace,
        "--field-selector",
        "spec.strategy.name!=STICKY",
        "-o",
        "name",
    )
    assert out.stdout.split() == ["consumergroup.mqbalance.io/c"]
    status, answer = cluster.request("GET", f"{cg}?fieldSelector=spec.zoneLabel%3Dx")
    assert status == 400, answer
    assert "spec.zoneLabel" in answer["message"]


@pytest.mark.parametrize("example", ["topic.yaml", "topic-nameserver.yaml", "consumergroup.yaml"])
def test_the_examples_are_accepted(cluster: LocalCluster, namespace: str, example: str) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / example
    validate = ["--validate=false"] if cluster.legacy else []
    out = cluster.kubectl("apply", *validate, "--dry-run=server", "-n", namespace, "-f", str(path))
    assert "(server dry run)" in out.stdout
