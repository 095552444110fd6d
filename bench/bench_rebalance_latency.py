"""End-to-end rebalance latency beside the floor of one ConfigMap write seen by a watch.

    python bench/bench_rebalance_latency.py [--changes 200] [--slow-changes 40]

Starts the local control plane, the operator and one sidecar per group, then acts out
membership changes (a pod turning unready, turning Ready, being deleted, a new pod
turning Ready) and times each from the API call that makes it to

- the ConfigMap carrying the new generation, seen by a watch (like any client's), and
- the sidecar of a pod that stays in the group answering a long-poll
  (``GET /v1/queues?after=N``) with the new generation.

Two groups run side by side: one with ``debounceSeconds: 0`` and one with the default
window (2 s; fewer changes, each takes the window). Between changes the bench times the
floor on the same server: replacing a ConfigMap and seeing the change through the same
kind of watch (one write, one watch event). Floor samples are interleaved with the
changes, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (
    Arrivals,
    Watch,
    bench_sidecar,
    create_group,
    create_namespace,
    create_node,
    create_pod,
    create_topic,
    delete_pod,
    generation_of,
    kube_api,
    local_cluster,
    machine,
    percentile,
    set_ready,
    table,
)
from harness.apps.operator import OperatorProcess
from harness.apps.sidecar import SidecarProcess
from harness.kube.api import KubeApi
from mqbalance.sidecar.client import SidecarError

NS = "latency"
ZONES = ("zone-a", "zone-b", "zone-c")
PODS = 8
CHANGING = 3
"""Pods 0..CHANGING-1 come and go; the others stay (the last one's sidecar is watched)."""
FLOOR = "floor"


def follow_sidecar(sidecar: SidecarProcess, arrivals: Arrivals, name: str, after: int) -> None:
    """Keep one long-poll outstanding; record when each new generation is answered."""
    while True:
        try:
            generation = sidecar.long_poll(after, timeout=60)
        except SidecarError as e:
            if e.status == 0:
                return  # the sidecar was stopped
            raise
        arrivals.add(name, time.perf_counter(), generation)
        after = generation


def change_cycle(api: KubeApi, pod: str) -> list[tuple[str, Callable[[], None]]]:
    """The four timed membership changes of one cycle on ``pod``, with untimed preparation."""
    return [
        ("Ready -> unready", lambda: set_ready(api, NS, pod, False)),
        ("unready -> Ready", lambda: set_ready(api, NS, pod, True)),
        ("deleted", lambda: delete_pod(api, NS, pod)),
        ("new pod Ready", lambda: set_ready(api, NS, pod, True)),
    ]


def prepare(kind: str, api: KubeApi, pod: str, labels: dict[str, str], node: str) -> None:
    if kind == "new pod Ready":
        create_pod(api, NS, pod, labels, node)  # Pending: not a member yet, nothing to publish


def measure_group(
    api: KubeApi,
    group: str,
    changes: int,
    arrivals: Arrivals,
    floor: Callable[[], float] | None,
) -> tuple[dict[str, list[float]], list[float]]:
    """Latencies (seconds) per target, keyed "configmap" and "sidecar" and by change kind; floors."""
    out: dict[str, list[float]] = {"configmap": [], "sidecar": []}
    floors: list[float] = []
    labels = {"app": group}
    done = 0
    cycle = 0
    while done < changes:
        i = cycle % CHANGING
        pod, node = f"{group}-{i}", f"node-{ZONES[i % len(ZONES)]}"
        for kind, action in change_cycle(api, pod):
            if done >= changes:
                break
            prepare(kind, api, pod, labels, node)
            time.sleep(0.15)  # let the operator settle (status patch, untimed events)
            generation = arrivals.latest(group)
            started = time.perf_counter()
            action()
            at_cm, got = arrivals.wait(group, generation + 1)
            at_sc, _ = arrivals.wait(f"sidecar/{group}", got)
            out["configmap"].append(at_cm - started)
            out["sidecar"].append(at_sc - started)
            out.setdefault(kind, []).append(at_sc - started)
            if floor is not None:
                floors.append(floor())
            done += 1
        cycle += 1
    return out, floors


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--changes", type=int, default=200, help="membership changes at debounce 0")
    p.add_argument("--slow-changes", type=int, default=40, help="membership changes at the default debounce")
    args = p.parse_args()

    with local_cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        api = kube_api(cluster)
        create_namespace(api, NS)
        for zone in ZONES:
            create_node(api, f"node-{zone}", zone)
        brokers = [
            {"name": f"broker-{z[-1]}", "readQueueNums": 16, "writeQueueNums": 16, "zone": z}
            for z in ZONES[:2]
        ]
        create_topic(api, NS, "orders", brokers)
        groups = {"fast": {"debounceSeconds": 0}, "slow": {}}
        for group, extra in groups.items():
            for i in range(PODS):
                create_pod(api, NS, f"{group}-{i}", {"app": group}, f"node-{ZONES[i % len(ZONES)]}")
                set_ready(api, NS, f"{group}-{i}", True)
            spec = {"topics": ["orders"], "selector": {"matchLabels": {"app": group}}, **extra}
            create_group(api, NS, group, {**spec, "strategy": {"name": "STICKY"}})
        api.request(
            "POST", f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": FLOOR}, "data": {"n": "0"}}
        )

        arrivals = Arrivals()

        def on_configmap(at: float, kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if name == FLOOR:
                arrivals.add(FLOOR, at, int(obj["data"]["n"]))
            elif name.endswith("-assignment") and kind != "DELETED":
                arrivals.add(name.removesuffix("-assignment"), at, generation_of(obj))

        watch = Watch(cluster, f"/api/v1/namespaces/{NS}/configmaps", on_configmap)
        watch.start()
        operator = OperatorProcess(cluster, [NS], workdir, "--log-level", "WARNING")
        sidecars = [bench_sidecar(cluster, workdir, NS, f"{group}-{PODS - 1}", group) for group in groups]
        operator.start()
        try:
            for group in groups:
                arrivals.wait(group, 1)
            for sidecar, group in zip(sidecars, groups, strict=True):
                sidecar.start()
                first = sidecar.long_poll(-1)
                arrivals.add(f"sidecar/{group}", time.perf_counter(), first)
                threading.Thread(
                    target=follow_sidecar, args=(sidecar, arrivals, f"sidecar/{group}", first), daemon=True
                ).start()
            floor_n = [0]

            def floor() -> float:
                floor_n[0] += 1
                body = {"metadata": {"name": FLOOR}, "data": {"n": str(floor_n[0])}}
                started = time.perf_counter()
                api.request("PUT", f"/api/v1/namespaces/{NS}/configmaps/{FLOOR}", body)
                return arrivals.wait(FLOOR, floor_n[0])[0] - started

            time.sleep(1)
            load = machine()
            fast, floors = measure_group(api, "fast", args.changes, arrivals, floor)
            slow, _ = measure_group(api, "slow", args.slow_changes, arrivals, None)
            operator.check()
        finally:
            for sidecar in sidecars:
                sidecar.stop(timeout=3)  # it would wait for the bench's open long-polls
            operator.stop()
            api.close()
        if watch.error is not None:
            raise SystemExit(f"the ConfigMap watch failed: {watch.error!r}")

    def ms(values: list[float], p: float) -> str:
        return f"{percentile(values, p) * 1e3:.1f}"

    floor_p = {q: percentile(floors, q) for q in (50, 95, 99)}
    rows = []
    for label, debounce, data in (("0", 0.0, fast), ("2 s (default)", 2.0, slow)):
        for target in ("configmap", "sidecar"):
            values = data[target]
            p50, p99 = percentile(values, 50), percentile(values, 99)
            rows.append(
                [
                    label,
                    "ConfigMap (watch)" if target == "configmap" else "sidecar long-poll",
                    len(values),
                    ms(values, 50),
                    ms(values, 95),
                    ms(values, 99),
                    f"{(p50 - debounce) / floor_p[50]:.2f}x",
                    f"{(p99 - debounce) / floor_p[99]:.2f}x",
                ]
            )
    rows.append(
        [
            "floor",
            "1 ConfigMap write + 1 watch event",
            len(floors),
            *(f"{floor_p[q] * 1e3:.1f}" for q in (50, 95, 99)),
            "1.00x",
            "1.00x",
        ]
    )
    print(f"machine: {load}")
    print(
        f"{args.changes} changes at debounce 0, {args.slow_changes} at the default; "
        "floor samples interleaved with the first."
    )
    print(
        table(
            [
                "debounce",
                "until",
                "changes",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "p50 - debounce, / floor p50",
                "p99 - debounce, / floor p99",
            ],
            rows,
        )
    )
    print()
    kinds = [k for k in fast if k not in ("configmap", "sidecar")]
    print("Debounce 0, until the sidecar serves it, by kind of change:")
    print(
        table(
            ["change", "count", "p50 ms", "p99 ms", "mean ms"],
            [
                [k, len(fast[k]), ms(fast[k], 50), ms(fast[k], 99), f"{statistics.mean(fast[k]) * 1e3:.1f}"]
                for k in kinds
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
