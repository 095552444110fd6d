"""The replay on Spark on Kubernetes: the operator's journal, read from its pod's log as a user
would, replayed by ``spark-submit --master k8s://... --deploy-mode cluster`` whose driver and two
executors are real pods of the replay image; the summary equals ``--single-process`` on the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.node.cluster import RealNode
from harness.node.workload import CHART, RELEASE, RELEASE_NAMESPACE, helm, operator_pod
from harness.polling import scaled
from harness.spark import k8s as spark_k8s
from mqbalance.journal import KIND

# The driver's JVM and Python, two executors' JVMs, the pods' starts: about 25 CPU-seconds at
# least on an idle node, plus the replay itself (seconds for a session's journal).
SUBMIT_TIMEOUT = 240.0


def test_replay_runs_as_driver_and_two_executor_pods_and_matches_single_process(
    node: RealNode, consumers: None, tmp_path: Path
) -> None:
    image = spark_k8s.replay_image()
    spark_k8s.import_image(node, image)
    # The chart's switch for the driver's ServiceAccount and Role, in the replay's own namespace
    # ("<release namespace>-replay", which the chart creates): its pods never run beside the operator's.
    helm(node, "upgrade", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--reuse-values",
         "--set", "replay.enabled=true", "--wait", "--timeout", f"{scaled(120):.0f}s")  # fmt: skip
    namespace = f"{RELEASE_NAMESPACE}-replay"
    service_account = f"{RELEASE}-replay"

    # The journal as a user collects it: the operator's log (its journal lines among the rest).
    log = node.kubectl("logs", "-n", RELEASE_NAMESPACE, operator_pod(node), timeout=60).stdout
    journal = tmp_path / "operator.log"
    journal.write_text(log)
    records = sum(1 for line in log.splitlines() if f'"{KIND}"' in line)
    assert records >= 1, "the operator journalled nothing"

    try:
        spark_k8s.data_volume(node, namespace, tmp_path / "volume")
        spark_k8s.data_pod(node, namespace, image)
        data = f"{namespace}/{spark_k8s.DATA_POD}"
        node.kubectl("exec", "-n", namespace, spark_k8s.DATA_POD, "--", "mkdir", "-p", "/data/journal")
        node.kubectl("cp", str(journal), f"{data}:/data/journal/operator.log", timeout=60)

        argv = spark_k8s.spark_submit_argv(
            node, image, namespace, service_account, ["--journal", "/data/journal", "--out", "/data/replay"]
        )
        submitted = spark_k8s.spark_submit(node, argv, SUBMIT_TIMEOUT)
        print(f"spark-submit took {submitted.seconds:.1f} s")
        assert submitted.returncode == 0, submitted.output[-4000:]

        (driver,) = spark_k8s.spark_pods(node, namespace, "driver")
        driver_log = node.kubectl("logs", "-n", namespace, spark_k8s.DRIVER_POD, timeout=60).stdout
        assert driver["status"]["phase"] == "Succeeded", (driver["status"], driver_log[-4000:])
        app_id = driver["metadata"]["labels"]["spark-app-selector"]
        executors = spark_k8s.spark_pods(node, namespace, "executor")
        assert len(executors) == 2, [p["metadata"]["name"] for p in executors]
        for pod in executors:
            assert pod["metadata"]["labels"]["spark-app-selector"] == app_id
            name = pod["metadata"]["name"]
            out = node.kubectl("logs", "-n", namespace, name, timeout=60).stdout
            # Each executor registered with this driver and ran tasks of the replay.
            assert "Successfully registered with driver" in out, out[-3000:]
            assert "Finished task" in out, (name, out[-3000:])

        node.kubectl("cp", f"{data}:/data/replay/summary.json", str(tmp_path / "summary.json"), timeout=60)
        node.kubectl("cp", f"{data}:/data/replay/report.html", str(tmp_path / "report.html"), timeout=60)
        single = node.kubectl(
            "exec", "-n", namespace, spark_k8s.DATA_POD, "--", "bash", "-c",
            "mqbalance replay --single-process --journal /data/journal --out /tmp/single >/dev/null 2>&1"
            " && cat /tmp/single/summary.json",
            timeout=scaled(120),
        ).stdout  # fmt: skip
    finally:
        spark_k8s.clean_up(node, namespace)

    on_k8s = json.loads((tmp_path / "summary.json").read_text())
    alone = json.loads(single)
    on_k8s.pop("seconds")
    alone.pop("seconds")
    assert on_k8s == alone
    assert on_k8s["events"] == records, (on_k8s["events"], records)
    report = (tmp_path / "report.html").read_text()
    assert report.startswith("<!DOCTYPE html>"), report[:200]
    assert "<svg" in report
