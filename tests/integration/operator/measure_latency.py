"""Measure pod Ready -> new assignment ConfigMap generation, with debounce 0 (not a test).

    python tests/integration/operator/measure_latency.py [changes]

Starts a local control plane and the operator, then flips pods Ready/unready and times,
through a watch on the ConfigMap, how long each change takes to appear as a new
generation. Beside it, the floor: one ConfigMap replace observed through the same watch.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from queue import Queue

from kubernetes import client, config, watch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from operator_support import OperatorProcess, apply_group, apply_topic, wait_generation

from mqbalance.document import CONFIGMAP_KEY, configmap_name
from mqbalance.testing import kubelet
from mqbalance.testing.cluster import LocalCluster


def watch_generations(api: client.ApiClient, ns: str, name: str, out: Queue[tuple[float, int]]) -> None:
    core = client.CoreV1Api(api)
    for event in watch.Watch().stream(
        core.list_namespaced_config_map, ns, field_selector=f"metadata.name={name}"
    ):
        data = event["object"].data or {}
        if CONFIGMAP_KEY in data:
            out.put((time.perf_counter(), json.loads(data[CONFIGMAP_KEY])["generation"]))
        elif "n" in data:
            out.put((time.perf_counter(), int(data["n"])))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main(changes: int = 20) -> None:
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parents[3] / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "crd/consumergroups.mqbalance.io")
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        ns = "latency"
        cluster.kubectl("create", "namespace", ns)
        for zone in ("a", "b", "c"):
            kubelet.create_node(api, f"node-{zone}", f"zone-{zone}")
        kubelet.start_pods(api, ns, "c", 6, {"app": "c"}, ["node-a", "node-b", "node-c"])
        apply_topic(api, ns, "t", [{"name": "b", "readQueueNums": 64, "writeQueueNums": 64}])
        apply_group(
            api, ns, "g", {"topics": ["t"], "selector": {"matchLabels": {"app": "c"}}, "debounceSeconds": 0}
        )
        op = OperatorProcess(cluster, [ns], Path(tmp))
        op.start()
        try:
            doc = wait_generation(api, ns, "g", 1)
            seen: Queue[tuple[float, int]] = Queue()
            threading.Thread(
                target=watch_generations, args=(api, ns, configmap_name("g"), seen), daemon=True
            ).start()
            time.sleep(1)
            while not seen.empty():
                seen.get()
            latencies = []
            generation = doc.generation
            for i in range(changes):
                started = time.perf_counter()
                kubelet.set_pod_ready(api, ns, "c-0", ready=i % 2 == 1)
                generation += 1
                while True:
                    at, gen = seen.get(timeout=30)
                    if gen >= generation:
                        break
                latencies.append(at - started)
            # The floor: one ConfigMap write observed through the same kind of watch.
            core = client.CoreV1Api(api)
            core.create_namespaced_config_map(ns, {"metadata": {"name": "floor"}, "data": {"n": "0"}})
            floor_seen: Queue[tuple[float, int]] = Queue()
            threading.Thread(
                target=watch_generations, args=(api, ns, "floor", floor_seen), daemon=True
            ).start()
            time.sleep(1)
            while not floor_seen.empty():
                floor_seen.get()
            floors = []
            for i in range(1, changes + 1):
                started = time.perf_counter()
                core.replace_namespaced_config_map(
                    "floor", ns, {"metadata": {"name": "floor"}, "data": {"n": str(i)}}
                )
                while floor_seen.get(timeout=30)[1] < i:
                    pass
                floors.append(time.perf_counter() - started)
        finally:
            op.stop()
        ms = [x * 1000 for x in latencies]
        fl = [x * 1000 for x in floors]
        print(f"pod Ready -> new generation over {changes} changes (debounce 0):")
        print(f"  p50 {statistics.median(ms):.1f} ms  p99 {percentile(ms, 99):.1f} ms  max {max(ms):.1f} ms")
        floor = f"p50 {statistics.median(fl):.1f} ms  p99 {percentile(fl, 99):.1f} ms"
        print(f"floor, one ConfigMap write seen through a watch: {floor}")
        print(f"ratio p99: {percentile(ms, 99) / percentile(fl, 99):.1f}x of one write+watch")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
