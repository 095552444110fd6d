"""All parts together on the real API server: operator -> ConfigMap -> sidecar, then the journal -> replay.

Membership, zone and topic changes drive the operator; a sidecar of one pod must serve every
generation the operator publishes (its long-poll wakes on each), every journalled generation
must satisfy the clustering invariant, and ``mqbalance replay`` of the operator's own journal
must give the same figures on Spark as in a single process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.apps.sidecar import SidecarProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument, read_topic
from tests.integration.invariants import check_document, check_journal
from tests.integration.operator.conftest import Testbed
from tests.integration.operator_support import (
    REPO,
    apply_group,
    apply_topic,
    read_document,
)

GROUP = "e2e"
LABELS = {"app": "e2e"}


def brokers(queues: int) -> list[dict[str, Any]]:
    return [
        {"name": f"broker-{zone[-1]}", "zone": zone, "readQueueNums": queues, "writeQueueNums": queues}
        for zone in ("zone-a", "zone-b", "zone-c")
    ]


def sidecar_view(doc: AssignmentDocument, pod: str) -> dict[str, list[dict[str, Any]]]:
    """What the sidecar should serve for ``pod``, in the sidecar's JSON shape."""
    return {
        topic: [{"brokerName": mq.broker_name, "queueId": mq.queue_id} for mq in queues]
        for topic, queues in doc.queues_of(pod).items()
    }


def test_operator_sidecar_and_replay_agree(
    cluster: LocalCluster,
    testbed: Testbed,
    tmp_path: Path,
) -> None:
    ns, api = testbed.ns, testbed.api
    zoned = sorted(testbed.nodes)
    apply_topic(api, ns, "orders", brokers(4))
    apply_group(
        api,
        ns,
        GROUP,
        {
            "topics": ["orders"],
            "selector": {"matchLabels": LABELS},
            "strategy": {"name": "STICKY", "zoneAffinity": True},
            "debounceSeconds": 0,
        },
    )
    kubelet.start_pods(api, ns, "e2e", 3, LABELS, zoned)
    pod = "e2e-0"

    def published(members: int, after: int = 0) -> AssignmentDocument:
        def probe() -> AssignmentDocument | None:
            doc = read_document(api, ns, GROUP)
            return doc if doc and doc.generation > after and len(doc.members) == members else None

        return wait_for(f"a generation after {after} with {members} members", probe)

    def newer_than(generation: int) -> Callable[[], dict[str, Any] | None]:
        def probe() -> dict[str, Any] | None:
            view = sidecar.client.wait_for_change(generation, 10)
            return view if view["generation"] > generation else None

        return probe

    doc = published(3)
    sidecar = SidecarProcess(
        cluster.kubeconfig, tmp_path / "sidecar.log", "--namespace", ns, "--pod-name", pod, "--group", GROUP
    )
    sidecar.start()
    try:
        served = wait_for("the sidecar's first assignment", lambda: sidecar.client.wait_for_change(-1, 10))
        assert served["generation"] == doc.generation
        assert served["queues"] == sidecar_view(doc, pod)

        # (what, the change, members after it, read queues per broker after it)
        changes = [
            ("scale up", lambda: kubelet.start_pods(api, ns, "e2e-more", 2, LABELS, zoned), 5, 4),
            ("node changes zone", lambda: kubelet.set_node_zone(api, zoned[0], "zone-c"), 5, 4),
            ("topic gains queues", lambda: apply_topic(api, ns, "orders", brokers(6)), 5, 6),
            ("pod deleted", lambda: kubelet.delete_pod(api, ns, "e2e-1"), 4, 6),
            ("pod unready", lambda: kubelet.set_pod_ready(api, ns, "e2e-2", ready=False), 3, 6),
        ]
        for what, change, members, per_broker in changes:
            before = doc.generation
            change()
            doc = published(members, after=before)
            readable = {"orders": read_topic("orders", {"brokers": brokers(per_broker)}).readable_queues()}
            check_document(doc, readable)
            # The sidecar's long-poll wakes for the new generation (possibly a later one, if any follow).
            wait_for(f"the sidecar to serve the generation after {what}", newer_than(before))

            def lined_up() -> tuple[dict[str, Any], AssignmentDocument] | None:
                current = read_document(api, ns, GROUP)
                view = sidecar.client.queues()
                return (
                    (view, current)
                    if current is not None and view["generation"] == current.generation
                    else None
                )

            # Once the sidecar serves the generation in force, it serves exactly this pod's share of it.
            served, current = wait_for(
                f"the sidecar and the ConfigMap on one generation after {what}", lined_up
            )
            check_document(current, readable)
            assert served["queues"] == sidecar_view(current, pod), what
        assert sidecar.returncode is None, sidecar.tail()
    finally:
        sidecar.stop()

    records = [r for r in testbed.operator.journal_records() if r.group == GROUP]
    assert len(records) >= 1 + len(changes)
    assert check_journal(records) == len(records)
    assert [r.generation for r in records] == sorted({r.generation for r in records})

    # The operator's own journal through the replay, on Spark and in one process: same figures.
    journal = tmp_path / "journal.jsonl"
    journal.write_text("".join(r.encode() + "\n" for r in records))
    spark_out, single_out = tmp_path / "spark", tmp_path / "single"
    replay = [sys.executable, "-m", "mqbalance", "replay", "--journal", str(journal)]
    for argv in (
        [*replay, "--master", "local[2]", "--out", str(spark_out)],
        [
            *replay,
            "--single-process",
            "--out",
            str(single_out),
        ],
    ):
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=scaled(600))
        assert result.returncode == 0, result.stderr[-3000:]

    def figures(out: Path) -> pd.DataFrame:
        frame = pd.read_parquet(out / "figures")
        return frame.sort_values(sorted(frame.columns)).reset_index(drop=True)

    spark_figures, single_figures = figures(spark_out), figures(single_out)
    assert len(spark_figures) > 0
    pd.testing.assert_frame_equal(spark_figures, single_figures, check_like=True)
    # Plain STICKY never moves more than the minimum, replayed from the real operator's history too
    # (with zone affinity it may move more, to put queues back in their zone).
    sticky = spark_figures[spark_figures["strategy"] == "STICKY"]
    assert (sticky["moved"] == sticky["minimum_moves"]).all()
    summary = json.loads((spark_out / "summary.json").read_text())
    assert summary["groups"] == 1
    assert summary["events"] == len(records)
    groups = pd.read_parquet(spark_out / "groups")
    assert list(groups["group"]) == [GROUP]
    assert groups["recommended"].iloc[0] in set(spark_figures["strategy"])
    assert (spark_out / "report.html").stat().st_size > 0


pytestmark = pytest.mark.spark
