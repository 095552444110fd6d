"""The operator's own journal through the replay: on the session's local Spark and on a standalone cluster.

One operator serves this module's namespace. Two groups go through their first assignment, joins,
a leave by deletion, a leave by readiness and a zone change (``operator_journal``); the journal file
the operator wrote is then replayed:

- on the test session's local[2] Spark session (``tests/spark_support.check_journal``): Spark's
  figures, totals and group summaries equal the single-process replay's row for row, and Spark
  replayed every generation the test caused (and every record of the file);
- on a standalone Spark cluster (``harness.spark.cluster``: a master and two one-core workers on
  127.0.0.1): ``mqbalance replay --master spark://...`` on small synthetic churn and on that journal
  writes the ``summary.json`` that ``--single-process`` writes (timings aside), tasks of the
  synthetic run ran on both workers, and no process of the cluster or the driver listened or
  connected outside loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.versions import K8S_VERSION_ENV
from harness.polling import wait_for
from mqbalance.contract import AssignmentDocument
from mqbalance.pipeline import main as replay_main
from tests.integration.operator_support import apply_group, apply_topic, read_document, status_of

pytest.importorskip("pyspark", reason="the replay tests need the 'replay' extra")

from pyspark.sql import SparkSession

from harness.spark.cluster import SparkCluster
from tests.spark_support import check_journal

pytestmark = pytest.mark.spark

TOPIC = "journal"
ZONES = ("zone-a", "zone-b", "zone-c")  # zone_nodes' zones
BROKERS = [
    {"name": f"broker-{zone[-1]}", "zone": zone, "readQueueNums": 4, "writeQueueNums": 4} for zone in ZONES
]


@dataclass(frozen=True)
class OperatorJournal:
    path: Path
    """A copy of the operator's journal file, taken after the last change."""
    caused: int
    """Generations the test waited for, over both groups."""
    records: int
    """Records in the file."""


@pytest.fixture(scope="module")
def operator_journal(
    module_api: client.ApiClient,
    module_namespace: str,
    zone_nodes: dict[str, str],
    operator_process: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> OperatorJournal:
    """Membership and zone changes of two groups, each waited for until the operator published it."""
    api, ns = module_api, module_namespace
    by_zone: dict[str, list[str]] = {}
    for node, zone in sorted(zone_nodes.items()):
        if zone:
            by_zone.setdefault(zone, []).append(node)
    # Each group on its own nodes (one per zone), so a node's zone change concerns one group only.
    nodes = {"orders": [by_zone[z][0] for z in ZONES], "billing": [by_zone[z][1] for z in ZONES]}
    apply_topic(api, ns, TOPIC, BROKERS)
    generation = {"orders": 0, "billing": 0}
    caused = 0

    def published(group: str, members: dict[str, str], reason: str | None) -> AssignmentDocument:
        """The group's first generation after the last one seen with exactly ``members`` (pod -> zone)."""
        nonlocal caused
        after = generation[group]

        def probe() -> AssignmentDocument | None:
            doc = read_document(api, ns, group)
            if doc is None or doc.generation <= after or dict(doc.members) != members:
                return None
            status = status_of(api, ns, group)
            return doc if status.get("assignmentGeneration") == doc.generation else None

        doc = wait_for(f"{ns}/{group}: a generation after {after} with {sorted(members)}", probe)
        if reason is not None:
            assert doc.reason == reason, doc
        generation[group] = doc.generation
        caused += 1
        return doc

    def start(group: str, prefix: str, count: int) -> None:
        kubelet.start_pods(api, ns, prefix, count, {"app": group}, nodes[group])

    def create(group: str, strategy: dict[str, Any]) -> None:
        apply_group(
            api,
            ns,
            group,
            {
                "topics": [TOPIC],
                "selector": {"matchLabels": {"app": group}},
                "strategy": strategy,
                "debounceSeconds": 0,
            },
        )

    zone_of = {node: zone for node, zone in zone_nodes.items()}
    a, b, c = (zone_of[n] for n in nodes["orders"])
    start("orders", "orders", 2)
    create("orders", {"name": "STICKY", "zoneAffinity": True})
    published("orders", {"orders-0": a, "orders-1": b}, None)
    start("billing", "billing", 3)
    create("billing", {"name": "AVG"})
    published("billing", {"billing-0": a, "billing-1": b, "billing-2": c}, None)

    start("orders", "orders-more", 1)
    published("orders", {"orders-0": a, "orders-1": b, "orders-more-0": a}, "member-joined")
    start("billing", "billing-more", 1)
    published(
        "billing", {"billing-0": a, "billing-1": b, "billing-2": c, "billing-more-0": a}, "member-joined"
    )

    kubelet.delete_pod(api, ns, "orders-1")
    published("orders", {"orders-0": a, "orders-more-0": a}, "member-left")
    # billing-0 and billing-more-0 run on billing's zone-a node: it moves to zone-c.
    kubelet.set_node_zone(api, nodes["billing"][0], c)
    published(
        "billing", {"billing-0": c, "billing-1": b, "billing-2": c, "billing-more-0": c}, "zone-changed"
    )
    kubelet.set_pod_ready(api, ns, "billing-1", False)
    published("billing", {"billing-0": c, "billing-2": c, "billing-more-0": c}, "member-left")

    path = tmp_path_factory.mktemp("journal") / "operator-journal.jsonl"
    shutil.copyfile(operator_process.journal, path)
    records = sum(1 for line in path.read_text().splitlines() if line.strip())
    return OperatorJournal(path, caused, records)


def test_operator_journal_replays_on_spark_as_in_one_process(
    spark: SparkSession, operator_journal: OperatorJournal
) -> None:
    replayed = check_journal(spark, [str(operator_journal.path)])
    assert operator_journal.caused == 7
    assert replayed >= operator_journal.caused
    assert replayed == operator_journal.records


def _summary(report_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((report_dir / "summary.json").read_text())
    summary.pop("seconds")
    return summary


@pytest.mark.skipif(
    os.environ.get(K8S_VERSION_ENV, "current") not in ("", "current"),
    reason="Spark on a standalone cluster runs with the current Kubernetes release only (make test)",
)
def test_standalone_spark_cluster_replays_as_one_process(
    operator_journal: OperatorJournal, tmp_path: Path
) -> None:
    inputs = {
        "synthetic": ["--synthetic", "--groups", "40", "--events-per-group", "10"],
        "journal": ["--journal", str(operator_journal.path)],
    }
    with SparkCluster(tmp_path / "spark", workers=2) as cluster:
        assert len(cluster.state()["workers"]) == 2
        for name, source in inputs.items():
            out = tmp_path / name
            argv = [sys.executable, "-m", "mqbalance", "replay", *source, "--master", cluster.master_url]
            run = cluster.run_driver([*argv, "--out", str(out / "spark")], tmp_path / f"driver-{name}.log")
            driver_log = (tmp_path / f"driver-{name}.log").read_text(errors="replace")
            assert run.returncode == 0, f"{driver_log[-3000:]}\n{cluster.logs()}"
            assert replay_main.main([*source, "--single-process", "--out", str(out / "single")]) == 0
            assert _summary(out / "spark") == _summary(out / "single"), name

            assert run.app_id, f"the master registered no application for the {name} run"
            tasks = cluster.finished_tasks(run.app_id)
            print(f"{name}: {run.seconds:.1f} s on the cluster, tasks per worker {tasks}")
            assert sum(tasks.values()) > 0, cluster.logs()
            if name == "synthetic":  # 8 partitions, both executors registered before the first job
                assert all(tasks.values()), tasks

            outside = [s for s in run.sockets if not s.loopback_only]
            assert not outside, outside
            listening = {s.local for s in run.sockets if s.state == "LISTEN"}
            assert len(listening) >= 3, run.sockets  # the sampling saw the master and the workers
