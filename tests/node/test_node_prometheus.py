"""The chart's alerts on a real Prometheus scraping the real operator and sidecars: the operator
gone fires MqbalanceOperatorAbsent, a group with queues and no member fires MqbalanceGroupDegraded,
and both resolve. The rules are the chart's file with each alert's ``for`` cut to a few seconds
(harness.node.prometheus.rules_with_short_waits); the expressions are the ones shipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.node.cluster import RealNode
from harness.node.prometheus import Prometheus, rules_with_short_waits
from harness.node.workload import NAMESPACE, OPERATOR, RELEASE_NAMESPACE, apply, rollout_status
from harness.polling import wait_for

PROBE_GROUP = "nobody-home"


def test_operator_absent_and_group_degraded_fire_and_resolve(
    node: RealNode, consumers: None, tmp_path: Path
) -> None:
    def list_pods() -> list[dict[str, Any]]:
        status, body = node.request("GET", "/api/v1/pods")
        assert status == 200, body
        items: list[dict[str, Any]] = body["items"]
        return items

    with Prometheus(tmp_path / "prometheus", list_pods, rules_with_short_waits(5)) as prometheus:
        try:
            wait_for(
                "Prometheus to scrape the operator and the sidecars",
                lambda: prometheus.targets_up(OPERATOR) and prometheus.targets_up("orders-consumer-"),
                120,
            )
            wait_for(
                "the operator's series of the example group",
                lambda: prometheus.query(f'mqbalance_group_members{{namespace="{NAMESPACE}"}} > 0'),
                60,
            )
            # (pending before the first scrape: absent until then)
            wait_for(
                "MqbalanceOperatorAbsent quiet while the operator is scraped",
                lambda: (
                    not prometheus.alerts("MqbalanceOperatorAbsent")
                    and not prometheus.alerts("MqbalanceOperatorAbsent", "pending")
                ),
                60,
            )

            # The operator is gone: nothing else can say so, since it exports the group series.
            node.kubectl("scale", "-n", RELEASE_NAMESPACE, f"deploy/{OPERATOR}", "--replicas=0")
            try:
                wait_for(
                    "MqbalanceOperatorAbsent to fire",
                    lambda: prometheus.alerts("MqbalanceOperatorAbsent"),
                    120,
                )
            finally:
                node.kubectl("scale", "-n", RELEASE_NAMESPACE, f"deploy/{OPERATOR}", "--replicas=1")
                rollout_status(node, OPERATOR, RELEASE_NAMESPACE)
            wait_for(
                "MqbalanceOperatorAbsent to resolve",
                lambda: (
                    not prometheus.alerts("MqbalanceOperatorAbsent")
                    and not prometheus.alerts("MqbalanceOperatorAbsent", "pending")
                ),
                120,
            )

            # A group whose selector matches no pod: its topic's queues have no member.
            apply(
                node,
                {
                    "apiVersion": "mqbalance.io/v1alpha1",
                    "kind": "ConsumerGroup",
                    "metadata": {"name": PROBE_GROUP, "namespace": NAMESPACE},
                    "spec": {"topics": ["orders"], "selector": {"matchLabels": {"app": PROBE_GROUP}}},
                },
            )
            firing = wait_for(
                "MqbalanceGroupDegraded to fire for the group without members",
                lambda: [
                    a
                    for a in prometheus.alerts("MqbalanceGroupDegraded")
                    if a["labels"]["group"] == PROBE_GROUP
                ],
                120,
            )
            # The group's namespace, not the operator's: the ServiceMonitor honours the operator's labels.
            assert firing[0]["labels"]["namespace"] == NAMESPACE
            node.kubectl("delete", "consumergroup", "-n", NAMESPACE, PROBE_GROUP, "--wait=true")
            wait_for(
                "MqbalanceGroupDegraded to resolve",
                lambda: (
                    not [
                        a
                        for state in ("firing", "pending")
                        for a in prometheus.alerts("MqbalanceGroupDegraded", state)
                        if a["labels"]["group"] == PROBE_GROUP
                    ]
                ),
                120,
            )
        except BaseException:
            print(prometheus.tail())
            raise
