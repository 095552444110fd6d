"""Rebalance latency on real pods, beside the floor of one ConfigMap write seen by a watch.

    python bench/bench_real_pods.py [--changes 60] [--starts 6]     # as root; see docs/real-node.md

Starts a real node (kubelet, containerd, kube-proxy: harness.node.cluster.RealNode), installs the Helm
chart with the locally built image and runs the example consumer Deployment (4 pods, each an
app container beside the mqbalance sidecar; the group with ``debounceSeconds: 0``). Then it
flips consumer pods' readiness through their real readiness probe (``kubectl exec ... touch
/tmp/unready``, and ``rm``) and times each change from the moment a pod watch sees the pod's
Ready condition change to

- the assignment ConfigMap carrying the new generation, seen by a ConfigMap watch, and
- the consumer app of *another* pod receiving that generation from its own sidecar (the
  app's long-poll answer; the app stamps it with the node's clock and prints it).

The floor, measured between changes on the same API server: replacing a ConfigMap and seeing
the change through the same kind of watch (one write, one watch event), as in
bench/bench_rebalance_latency.py. Ratios are p50 to floor p50 and p99 to floor p99.

It also reports what the docs quote for the node: start-up milestones, a pod's start
(Deployment scaled up by one -> the new pod Ready) and the resident memory of every process
the node runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import Arrivals, Watch, generation_of, machine, percentile, rss_mib, table
from harness.node import host
from harness.node.cluster import RealNode
from harness.node.images import ensure_images
from harness.node.workload import (
    GROUP,
    NAMESPACE,
    apply,
    apply_examples,
    consumer_deployment,
    install_chart,
    pods,
    pods_timeout,
    ready_pod_names,
    rollout_status,
    wait_members,
)
from harness.polling import wait_for

PODS = 4
FLOOR = "floor"
READY = "pod-ready"


def wall_offset() -> float:
    """time.time() - time.perf_counter(): puts the watches' clock and the pods' on one axis."""
    return time.time() - time.perf_counter()


class AppLog:
    """Follows one consumer app's log (kubectl logs -f); records when each generation reached it."""

    def __init__(self, node: RealNode, pod: str, arrivals: Arrivals, offset: float) -> None:
        argv = [str(node.bin_dir / "kubectl"), "--kubeconfig", str(node.kubeconfig), "logs", "-f"]
        argv += ["-n", NAMESPACE, pod, "-c", "app", "--tail=1"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.arrivals, self.offset = arrivals, offset
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if "generation" in data and "at" in data:
                self.arrivals.add("app", float(data["at"]) - self.offset, int(data["generation"]))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def set_unready(node: RealNode, pod: str, unready: bool) -> None:
    command = ["touch", "/tmp/unready"] if unready else ["rm", "-f", "/tmp/unready"]
    node.kubectl("exec", "-n", NAMESPACE, pod, "-c", "app", "--", *command)


def ready_of(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def new_ready(node: RealNode, before: set[str]) -> bool:
    """A consumer pod is Ready that was not among ``before``."""
    return len(ready_pod_names(node) - before) >= 1


def node_rss(node: RealNode) -> dict[str, float]:
    """Resident MiB of each node component, and of the pods' processes by kind (summed)."""
    out = {name: rss_mib(pid) for name, pid in node.pids.items()}
    shims = host.shim_pids()
    kinds: dict[str, list[float]] = {"containerd shims": [rss_mib(pid) for pid in shims]}
    for pid in host.pod_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if words[:1] == ["/pause"]:
            kind = "pause"
        elif "operator" in words[1:3]:
            kind = "operator containers"
        elif "sidecar" in words[1:3]:
            kind = "sidecar containers"
        else:
            kind = "consumer app containers"
        kinds.setdefault(kind, []).append(rss_mib(pid))
    for kind, values in kinds.items():
        out[f"{kind} ({len(values)})"] = sum(values)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--changes", type=int, default=60, help="readiness flips to time (half leave, half join)")
    p.add_argument("--starts", type=int, default=6, help="pod starts to time (scale up by one, then back)")
    p.add_argument("--version", default=None, help="Kubernetes version of the node (default: harness.node's)")
    args = p.parse_args()

    started = time.monotonic()
    images = ensure_images()
    build_seconds = time.monotonic() - started
    with RealNode(version=args.version, images=images) as node:
        version = node.version
        timings = dict(node.timings)
        node.kubectl("create", "namespace", NAMESPACE)
        install_chart(node, images)
        apply_examples(node, debounce=0)
        apply(node, consumer_deployment(images, replicas=PODS))
        rollout_status(node, GROUP, timeout=pods_timeout(PODS) + 60)
        first = wait_members(node, PODS)
        observer, *flippers = sorted(first.members)

        offset = wall_offset()
        arrivals = Arrivals()
        arrivals.add("configmap", time.perf_counter(), first.generation)

        def on_configmap(at: float, kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if name == FLOOR:
                arrivals.add(FLOOR, at, int(obj["data"]["n"]))
            elif name == f"{GROUP}-assignment" and kind != "DELETED":
                arrivals.add("configmap", at, generation_of(obj))

        flips = [0]

        def on_pod(at: float, kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if name in flippers and kind == "MODIFIED":
                ready = ready_of(obj)
                if ready != pod_ready.get(name):
                    pod_ready[name] = ready
                    flips[0] += 1
                    arrivals.add(READY, at, flips[0])

        pod_ready = {name: True for name in flippers}
        node.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/configmaps",
            {"metadata": {"name": FLOOR}, "data": {"n": "0"}},
        )
        cm_watch = Watch(node.control_plane, f"/api/v1/namespaces/{NAMESPACE}/configmaps", on_configmap)
        pod_watch = Watch(
            node.control_plane, f"/api/v1/namespaces/{NAMESPACE}/pods", on_pod, labelSelector=f"app={GROUP}"
        )
        cm_watch.start()
        pod_watch.start()
        app = AppLog(node, observer, arrivals, offset)
        arrivals.wait("app", first.generation, timeout=60)

        floor_n = [0]

        def floor() -> float:
            floor_n[0] += 1
            body = {"metadata": {"name": FLOOR}, "data": {"n": str(floor_n[0])}}
            began = time.perf_counter()
            node.request("PUT", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{FLOOR}", body)
            return arrivals.wait(FLOOR, floor_n[0])[0] - began

        load = machine()
        to_cm: list[float] = []
        to_app: list[float] = []
        kinds: dict[str, list[float]] = {"Ready -> unready (leaves)": [], "unready -> Ready (joins)": []}
        floors: list[float] = []
        try:
            for i in range(args.changes):
                pod = flippers[(i // 2) % len(flippers)]
                leave = i % 2 == 0
                generation = arrivals.latest("configmap")
                set_unready(node, pod, leave)
                at_ready, _ = arrivals.wait(READY, i + 1, timeout=60)
                at_cm, got = arrivals.wait("configmap", generation + 1)
                at_app, _ = arrivals.wait("app", got)
                to_cm.append(at_cm - at_ready)
                to_app.append(at_app - at_ready)
                kinds["Ready -> unready (leaves)" if leave else "unready -> Ready (joins)"].append(
                    at_app - at_ready
                )
                floors.append(floor())
                time.sleep(0.3)

            starts: list[float] = []
            for _ in range(args.starts):
                before = ready_pod_names(node)
                began = time.monotonic()
                node.kubectl("scale", "-n", NAMESPACE, f"deploy/{GROUP}", f"--replicas={PODS + 1}")
                started_one = functools.partial(new_ready, node, before)
                wait_for("a new pod Ready", started_one, pods_timeout(1), 0.1)
                starts.append(time.monotonic() - began)
                node.kubectl("scale", "-n", NAMESPACE, f"deploy/{GROUP}", f"--replicas={PODS}")
                rollout_status(node, GROUP, timeout=120)
                wait_for("the extra pod gone", lambda: len(pods(node)) <= PODS, 120, 0.2)
            memory = node_rss(node)
        finally:
            app.stop()
        for watch in (cm_watch, pod_watch):
            if watch.error is not None:
                raise SystemExit(f"a watch failed: {watch.error!r}")

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1e3:.1f}"

    floor_p = {q: percentile(floors, q) for q in (50, 95, 99)}
    rows = []
    for label, values in (
        ("ConfigMap (watch)", to_cm),
        ("app in another pod (its sidecar's long-poll)", to_app),
    ):
        rows.append(
            [
                label,
                len(values),
                ms(values, 50),
                ms(values, 95),
                ms(values, 99),
                f"{percentile(values, 50) / floor_p[50]:.2f}x",
                f"{percentile(values, 99) / floor_p[99]:.2f}x",
            ]
        )
    rows.append(
        [
            "floor: 1 ConfigMap write + 1 watch event",
            len(floors),
            *(ms(floors, q) for q in (50, 95, 99)),
            "1.00x",
            "1.00x",
        ]
    )
    print(f"machine: {load}")
    print(f"Kubernetes {version} real node; images ready in {build_seconds:.1f} s (cached when unchanged)")
    print("node start: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    print(f"{args.changes} readiness flips (debounce 0), floor samples interleaved.")
    print("From a pod's Ready condition changing (seen by a pod watch) until:")
    print(
        table(["until", "changes", "p50 ms", "p95 ms", "p99 ms", "p50 / floor p50", "p99 / floor p99"], rows)
    )
    print()
    print(
        table(
            ["change", "count", "p50 ms", "p99 ms"],
            [[k, len(v), ms(v, 50), ms(v, 99)] for k, v in kinds.items()],
        )
    )
    print()
    print(
        f"Pod start (scaled up by one -> the new pod Ready), {len(starts)} starts: "
        f"p50 {percentile(starts, 50):.1f} s, max {max(starts):.1f} s"
    )
    print()
    print("Resident memory with the operator and 4 consumer pods running:")
    total = sum(memory.values())
    print(
        table(
            ["process", "RSS MiB"],
            [[k, f"{v:.0f}"] for k, v in memory.items()] + [["whole node", f"{total:.0f}"]],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
