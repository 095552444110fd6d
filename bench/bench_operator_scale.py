"""Operator scale: a cold start publishing N groups, beside the writes the contract needs (each group's
ConfigMap and status) made with the operator's own client, in one run.

    python bench/bench_operator_scale.py [--groups 1000] [--namespaces 1] [--profile]
        [--replicas 3 [--shard-by namespace]]

Creates N Topics (32 queues each, brokers in two of three zones), N ConsumerGroups
(STICKY with zone affinity) and 8 Ready pods per group spread over nodes in three
zones (the setup is timed on its own), then

1. starts the operator cold and times it until every group's ConfigMap is seen
   (through a watch) with a generation; CPU seconds and memory of the operator process
   at that point; then waits until the operator is quiet (under 5% of a core: the start's
   status patches and their echoes done, while its Events may still trickle out at the
   operator's 20 a second) and measures its CPU and memory while idle for ``--idle`` seconds;
2. times one group's rebalance (a pod turning unready / Ready) while the others idle,
   beside one ConfigMap write seen by the same watch;
3. restarts the operator and times it until every group has reconciled once (from its
   /metrics): the restart of an operator whose groups are all published, with nothing
   to write;
4. with ``--replicas R`` (R > 1), deletes every assignment ConfigMap and starts R replicas
   sharding the groups (``--leader-election --shards``, ``--shard-by``), and times them until every
   group is published again: the same cold start split over replicas, with each replica's CPU,
   memory and the groups it published;
5. stops the operators and makes, for N groups of a fresh namespace, the writes the contract
   needs on a first publish (a ConfigMap create and a status patch per group), with the
   operator's own client (``mqbalance.kube.KubeClient``) and concurrency (8 at once): the floor.

Memory per group is the operator's RSS after the cold start over N, and the same beside an
operator started on an empty namespace (its baseline: the interpreter and libraries).

``--profile`` samples the operator with py-spy during the cold start and the restart
and prints where its CPU went. The API server, etcd and the controller manager share the machine's
cores with the operator and the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (
    Arrivals,
    CpuLimit,
    Watch,
    cpu_seconds,
    create_group,
    create_namespace,
    create_node,
    create_pod,
    create_sticky_group,
    generation_of,
    kube_api,
    local_cluster,
    machine,
    percentile,
    rss_mib,
    run_parallel,
    set_ready,
    table,
    zone_brokers,
)
from harness.apps.operator import OperatorProcess
from harness.kube.api import KubeApi
from harness.polling import deadline as deadline_after
from harness.polling import wait_for, work_timeout
from mqbalance.contract import custom_path
from mqbalance.kube import KubeClient
from mqbalance.operator.settings import OperatorConfig

ZONES = ("zone-a", "zone-b", "zone-c")
NODES_PER_ZONE = 2
MANAGED = "app.kubernetes.io/managed-by=mqbalance"
PER_GROUP = 0.3
"""Seconds a cold start may take per group (plus 600 s) before the bench gives up: an hour for
10,000 groups, stretched for the machine's load (harness.polling)."""


async def floor_writes(
    kubeconfig: Path,
    namespace: str,
    groups: list[str],
    bodies: list[dict[str, Any]],
    status: dict[str, Any],
    workers: int,
    clients: int = 1,
) -> float:
    """Seconds to create each group's ConfigMap and patch its status, ``workers`` groups at once
    per client; ``clients`` clients (as many replicas would have) share the groups out."""
    connected = [await KubeClient.connect(kubeconfig, requests=32) for _ in range(clients)]

    async def one(client: KubeClient, slots: asyncio.Semaphore, group: str, body: dict[str, Any]) -> None:
        async with slots:
            await client.create(f"/api/v1/namespaces/{namespace}/configmaps", body)
            await client.merge_patch(
                custom_path("consumergroups", namespace, group) + "/status", {"status": status}
            )

    slots = [asyncio.Semaphore(workers) for _ in connected]
    started = time.perf_counter()
    await asyncio.gather(
        *(
            one(connected[i % clients], slots[i % clients], g, b)
            for i, (g, b) in enumerate(zip(groups, bodies, strict=True))
        )
    )
    elapsed = time.perf_counter() - started
    for client in connected:
        await client.close()
    return elapsed


def get_status(api: KubeApi, namespace: str, group: str) -> dict[str, Any]:
    path = custom_path("consumergroups", namespace, group)
    status: dict[str, Any] = api.request("GET", path).get("status") or {}
    return status


def namespace_of(index: int, groups: int, namespaces: int) -> str:
    per = -(-groups // namespaces)
    return f"scale-{index // per}"


def setup(
    api: KubeApi, groups: int, namespaces: int, pods: int, queues: int, workers: int
) -> list[tuple[str, float, int]]:
    """Create everything; (what, seconds, API calls) per step."""
    steps = []
    names = sorted({namespace_of(i, groups, namespaces) for i in range(groups)})
    nodes = [f"node-{z}-{n}" for z in ZONES for n in range(NODES_PER_ZONE)]
    started = time.perf_counter()
    for ns in names:
        create_namespace(api, ns)
    for node in nodes:
        create_node(api, node, node.rsplit("-", 1)[0].removeprefix("node-"))
    steps.append(("namespaces and nodes", time.perf_counter() - started, len(names) + len(nodes)))
    brokers = zone_brokers(ZONES[:2], queues // 2)

    def group_objects(i: int) -> None:
        create_sticky_group(api, namespace_of(i, groups, namespaces), f"g{i:05d}", brokers)

    seconds = run_parallel([lambda i=i: group_objects(i) for i in range(groups)], workers)  # type: ignore[misc]
    steps.append(("Topics and ConsumerGroups", seconds, 2 * groups))

    def pod(i: int, k: int) -> None:
        ns, name = namespace_of(i, groups, namespaces), f"g{i:05d}"
        create_pod(api, ns, f"{name}-{k}", {"app": name}, nodes[(i + k) % len(nodes)])
        set_ready(api, ns, f"{name}-{k}", True)

    calls = [lambda i=i, k=k: pod(i, k) for i in range(groups) for k in range(pods)]
    seconds = run_parallel(calls, workers)
    steps.append((f"pods (create + Ready), {workers} threads", seconds, 2 * len(calls)))
    return steps


class Published:
    """Counts assignment ConfigMaps that carry a generation, from a watch."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.names: set[tuple[str, str]] = set()
        self.all_at = 0.0
        self.done = threading.Event()
        self.data: dict[tuple[str, str], dict[str, str]] = {}

    def on_event(self, at: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind != "DELETED" and generation_of(obj) >= 1 and key not in self.names:
            self.names.add(key)
            self.data[key] = obj.get("data") or {}
            if len(self.names) == self.target:
                self.all_at = at
                self.done.set()


def top_frames(raw: Path, count: int = 12) -> tuple[list[list[object]], list[list[object]], int]:
    """(self-time rows, inclusive rows, samples) from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        samples = int(n)
        total += samples
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples

    def rows(counter: collections.Counter[str]) -> list[list[object]]:
        return [[name, f"{100 * n / total:.1f}%"] for name, n in counter.most_common(count)]

    # The event loop's and threads' own frames are in every sample: they say nothing.
    skip = {
        "<module>",
        "run_forever",
        "_run_once",
        "_run",
        "run",
        "main",
        "_bootstrap",
        "_bootstrap_inner",
        "spawn_main",
        "_run_module",
        "_run_code",
        "run_until_complete",
        "_worker",
    }
    inclusive_rows = rows(
        collections.Counter(
            {k: v for k, v in inclusive.items() if k.split(" (")[0].rsplit(".", 1)[-1] not in skip}
        )
    )
    return rows(own), inclusive_rows, total


def any_managed(api: KubeApi, namespaces: list[str]) -> bool:
    """Whether any assignment ConfigMap is left in ``namespaces``."""
    path = "/api/v1/namespaces/{}/configmaps?labelSelector=" + MANAGED + "&limit=1"
    return any(api.request("GET", path.format(ns))["items"] for ns in namespaces)


class Progress:
    """Says on stderr what the benchmark is doing, and how far a wait has got every 10 s."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.said = 0.0

    def __call__(self, message: str, *, every: float = 0.0) -> None:
        now = time.monotonic()
        if every and now - self.said < every:
            return
        self.said = now
        print(f"[{now - self.started:7.1f} s] {message}", file=sys.stderr, flush=True)


def settle(pid: int, quiet: float = 0.05, limit: float = 600.0) -> float:
    """When the process first spent under ``quiet`` of a core for two seconds running (perf_counter)."""
    deadline = deadline_after(limit)
    calm = 0
    before = cpu_seconds(pid)
    while calm < 2 and time.monotonic() < deadline:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        calm = calm + 1 if now - before < quiet else 0
        before = now
    return time.perf_counter() - 2.0


def start_profiler(py_spy: str, pid: int, raw: Path) -> subprocess.Popen[bytes]:
    argv = [py_spy, "record", "--pid", str(pid), "--format", "raw", "-o", str(raw), "-r", "50"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(profiler: subprocess.Popen[bytes] | None) -> None:
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)
        profiler.wait(timeout=120)


def _frame(text: str) -> str:
    # "function (path/to/module.py:123)" -> "function (module.py)"
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


def published_groups(operator: OperatorProcess) -> set[tuple[str, str]]:
    """(namespace, group) of every group ``operator`` published, from its journal."""
    return {(r.namespace, r.group) for r in operator.journal_records()}


def counted_reconciles(operator: OperatorProcess) -> int:
    """The operator's reconcile count, asked until it answers: a CPU-capped replica still busy
    with Events after its cold start can take longer than one scrape's timeout."""
    count = wait_for(
        "the operator's reconcile count",
        lambda: (int(operator.metric("mqbalance_reconciles_total")),),
        120,
        retry_on=(OSError,),
    )
    return count[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=1000)
    p.add_argument("--namespaces", type=int, default=1, help="spread the groups over this many namespaces")
    p.add_argument("--pods", type=int, default=8, help="pods per group")
    p.add_argument("--queues", type=int, default=32, help="queues per group (two brokers)")
    p.add_argument("--workers", type=int, default=16, help="threads creating the objects")
    p.add_argument("--idle", type=float, default=20.0, help="seconds of steady state measured")
    p.add_argument("--changes", type=int, default=40, help="rebalances of one group while the others idle")
    p.add_argument(
        "--replicas", type=int, default=1, help="also time a cold start by this many sharding replicas"
    )
    p.add_argument("--shards", type=int, default=12, help="shards of the sharded cold start")
    p.add_argument(
        "--shard-by", choices=["group", "namespace"], default="group", help="the replicas' --shard-by"
    )
    p.add_argument(
        "--lease-duration",
        type=float,
        default=OperatorConfig.lease_duration,
        help="the replicas' --lease-duration (default: the operator's); a CPU-capped replica whose loop "
        "stalls longer than this loses its shards to the others",
    )
    p.add_argument(
        "--operator-cpu",
        type=float,
        metavar="CORES",
        help="limit each operator process to this much CPU, as a pod's limits.cpu would (a cgroup: root)",
    )
    p.add_argument("--profile", action="store_true", help="sample the operator's cold start with py-spy")
    p.add_argument("--profile-raw", type=Path, help="also keep py-spy's collapsed stacks in this file")
    args = p.parse_args()
    py_spy = shutil.which("py-spy")
    if args.profile and py_spy is None:
        print("--profile needs py-spy on PATH (pip install py-spy)", file=sys.stderr)
        return 2

    progress = Progress()
    progress("starting a control plane")
    with local_cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        api = kube_api(cluster, pool=args.workers)
        started = time.perf_counter()
        progress(f"creating {args.groups} groups, their Topics and {args.groups * args.pods} pods")
        steps = setup(api, args.groups, args.namespaces, args.pods, args.queues, args.workers)
        setup_seconds = time.perf_counter() - started
        namespaces = sorted({namespace_of(i, args.groups, args.namespaces) for i in range(args.groups)})

        published = Published(args.groups)
        arrivals = Arrivals()

        def on_configmap(at: float, kind: str, obj: dict[str, Any]) -> None:
            published.on_event(at, kind, obj)
            name = obj["metadata"]["name"]
            if name == "floor":
                arrivals.add("floor", at, int(obj["data"]["n"]))
            elif kind != "DELETED" and obj["metadata"]["namespace"] == namespaces[0]:
                arrivals.add(name, at, generation_of(obj))

        # The operator with nothing to do: the interpreter and libraries, to tell per-group memory apart.
        create_namespace(api, "scale-empty")
        empty = OperatorProcess(cluster, ["scale-empty"], workdir, "--log-level", "WARNING")
        empty.start()
        settle(empty.pid, limit=60)  # its imports and first list done: calm for two seconds
        baseline_rss = rss_mib(empty.pid)
        empty.stop()

        republished = Published(args.groups)
        watch_phase = ["cold"]

        def on_any_configmap(at: float, kind: str, obj: dict[str, Any]) -> None:
            if watch_phase[0] == "replicas":
                republished.on_event(at, kind, obj)
            else:
                on_configmap(at, kind, obj)

        limits: list[CpuLimit] = []

        def limit(process: OperatorProcess) -> None:
            """Each operator process in a cgroup of its own, as each pod would have its limit."""
            if args.operator_cpu:
                limits.append(CpuLimit(f"mqbalance-bench-{process.pid}", args.operator_cpu))
                limits[-1].add(process.pid)

        watch = Watch(cluster, "/api/v1/configmaps", on_any_configmap)
        watch.start()
        scope = ["--all-namespaces"] if len(namespaces) > 1 else []
        operator = OperatorProcess(
            cluster, [] if scope else namespaces, workdir, "--log-level", "WARNING", *scope
        )
        profiler: subprocess.Popen[bytes] | None = None
        raw = workdir / "profile.txt"
        raw_restart = workdir / "profile-restart.txt"
        try:
            operator.spawn()
            limit(operator)
            spawned = operator.started_at
            if args.profile:
                assert py_spy is not None
                profiler = start_profiler(py_spy, operator.pid, raw)
            healthy_at = 0.0
            allowed = work_timeout(600, PER_GROUP, args.groups)
            deadline = deadline_after(allowed)
            progress(f"cold start: one operator, {args.groups} groups")
            while not published.done.wait(0.1):
                progress(f"cold start: {len(published.names)} of {args.groups} groups published", every=10)
                if not healthy_at and operator.healthy():
                    healthy_at = time.perf_counter()
                operator.check()
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"only {len(published.names)} of {args.groups} groups published in {allowed:.0f} s"
                        " (scaled for load)"
                    )
            healthy_at = healthy_at or published.all_at
            cold_cpu = cpu_seconds(operator.pid)
            cold_rss = rss_mib(operator.pid)
            cold_reconciles = counted_reconciles(operator)
            stop_profiler(profiler)
            profiler = None
            cold = published.all_at - spawned

            # The start's status patches, Events and their echoes finish after the last ConfigMap.
            settled = settle(operator.pid) - spawned
            cpu_before = cpu_seconds(operator.pid)
            time.sleep(args.idle)
            idle_cpu = (cpu_seconds(operator.pid) - cpu_before) / args.idle
            idle_rss = rss_mib(operator.pid)

            # One group's rebalance while the others idle, beside the write + watch floor.
            ns = namespaces[0]
            api.request(
                "POST",
                f"/api/v1/namespaces/{ns}/configmaps",
                {"metadata": {"name": "floor"}, "data": {"n": "0"}},
            )
            group = "g00000"
            cm = f"{group}-assignment"
            rebalance, floors = [], []
            for n in range(1, args.changes + 1):
                time.sleep(0.15)
                generation = arrivals.latest(cm) or 1
                t0 = time.perf_counter()
                set_ready(api, ns, f"{group}-0", n % 2 == 0)
                rebalance.append(arrivals.wait(cm, generation + 1)[0] - t0)
                body = {"metadata": {"name": "floor"}, "data": {"n": str(n)}}
                t0 = time.perf_counter()
                api.request("PUT", f"/api/v1/namespaces/{ns}/configmaps/floor", body)
                floors.append(arrivals.wait("floor", n)[0] - t0)
            operator.check()

            # A restart: every group is published, so each reconcile finds nothing to write.
            progress("restart: every group already published")
            operator.stop()
            restarted = OperatorProcess(
                cluster, [] if scope else namespaces, workdir, "--log-level", "WARNING", *scope
            )
            restarted.spawn()
            limit(restarted)
            operator = restarted
            if args.profile:
                assert py_spy is not None
                profiler = start_profiler(py_spy, operator.pid, raw_restart)
            deadline = deadline_after(allowed)
            while operator.reconciles() < args.groups:
                operator.check()
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"the restarted operator did not reconcile every group in {allowed:.0f} s"
                        " (scaled for load)"
                    )
                # reconciles() scrapes one counter (name[]), not every group's gauges.
                time.sleep(0.25)
            restart = time.perf_counter() - operator.started_at
            restart_cpu = cpu_seconds(operator.pid)
            stop_profiler(profiler)
            profiler = None
            status_sample = get_status(api, namespaces[0], "g00000")

            sharded = 0.0
            sharded_cpu: list[float] = []
            sharded_rss: list[float] = []
            sharded_groups: list[int] = []
            sharded_reconciles: list[int] = []
            if args.replicas > 1:
                # The same cold start split over replicas: every ConfigMap goes, R replicas publish again.
                operator.stop()
                watch_phase[0] = "replicas"
                for ns in namespaces:
                    api.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps?labelSelector={MANAGED}")
                # Gone from a fresh list too, before any replica starts.
                wait_for("the deleted ConfigMaps to go", lambda: not any_managed(api, namespaces), 120)
                lease = ["--leader-election", "scale", "--lease-namespace", namespaces[0]]
                lease += ["--shards", str(args.shards), "--shard-by", args.shard_by]
                lease += ["--lease-duration", str(args.lease_duration)]
                lease += scope
                replicas = []
                for r in range(args.replicas):
                    replica_dir = workdir / f"replica-{r}"
                    replica_dir.mkdir()
                    replicas.append(
                        OperatorProcess(
                            cluster,
                            [] if scope else namespaces,
                            replica_dir,
                            "--log-level",
                            "INFO",
                            *lease,
                        )
                    )
                for replica in replicas:
                    replica.spawn()
                    limit(replica)
                try:
                    deadline = deadline_after(allowed)
                    progress(f"cold start: {args.replicas} replicas, {args.shards} shards")
                    while not republished.done.wait(0.2):
                        progress(f"sharded: {len(republished.names)} of {args.groups} groups", every=10)
                        for replica in replicas:
                            replica.check()
                        if time.monotonic() > deadline:
                            raise SystemExit(
                                f"the replicas published {len(republished.names)} groups in {allowed:.0f} s"
                            )
                    sharded = republished.all_at - replicas[0].started_at
                    # The work split: each replica's CPU for the cold start, beside the single one's.
                    sharded_cpu = [cpu_seconds(replica.pid) for replica in replicas]
                    sharded_rss = [rss_mib(replica.pid) for replica in replicas]
                    sharded_reconciles = [counted_reconciles(replica) for replica in replicas]
                finally:
                    for replica in replicas:
                        replica.stop()
                # From the journals once the replicas stopped: a journal line follows its write.
                sharded_groups = [len(published_groups(replica)) for replica in replicas]
        except BaseException:
            print(f"operator log tail:\n{operator.tail(60)}", file=sys.stderr)
            raise
        finally:
            if profiler is not None and profiler.poll() is None:
                profiler.kill()
            operator.stop()
            for cgroup in limits:
                cgroup.remove()

        # The floor: what a first publish must write per group (its ConfigMap, its status), with the
        # operator's own client and concurrency, for the same number of groups in a fresh namespace.
        floor_ns = "scale-floor"
        create_namespace(api, floor_ns)
        floor_groups = [f"f{i:05d}" for i in range(args.groups)]
        spec = {"topics": ["none"], "selector": {"matchLabels": {"app": "none"}}, "debounceSeconds": 0}
        run_parallel([lambda g=g: create_group(api, floor_ns, g, spec) for g in floor_groups], args.workers)  # type: ignore[misc]
        bodies = [
            {"metadata": {"name": f"{g}-assignment", "labels": {"bench": "floor"}}, "data": data}
            for g, (_, data) in zip(floor_groups, sorted(published.data.items()), strict=True)
        ]
        floor_seconds = asyncio.run(
            floor_writes(cluster.kubeconfig, floor_ns, floor_groups, bodies, status_sample, workers=8)
        )
        # The same writes by as many clients as replicas, 8 at once each: what the API server
        # takes when R replicas write together, so what no sharded cold start can beat here.
        floor_sharded = 0.0
        if args.replicas > 1:
            together = f"{floor_ns}-{args.replicas}"
            create_namespace(api, together)
            make = [lambda g=g: create_group(api, together, g, spec) for g in floor_groups]
            run_parallel(make, args.workers)
            floor_sharded = asyncio.run(
                floor_writes(
                    cluster.kubeconfig, together, floor_groups, bodies, status_sample, 8, args.replicas
                )
            )
        api.close()
        if watch.error is not None:
            raise SystemExit(f"the ConfigMap watch failed: {watch.error!r}")
        log_tail = operator.tail(5)
        profile = top_frames(raw) if args.profile and raw.exists() else None
        restart_profile = top_frames(raw_restart) if args.profile and raw_restart.exists() else None
        if profile is not None and args.profile_raw is not None:
            shutil.copyfile(raw, args.profile_raw)

    pods = args.groups * args.pods
    print(f"machine: {machine()}")
    print(
        f"{args.groups} ConsumerGroups x {args.queues} queues x {args.pods} pods ({pods} pods) in "
        f"{len(namespaces)} namespace(s), {len(ZONES) * NODES_PER_ZONE} nodes in {len(ZONES)} zones; "
        "API server, etcd, controller manager, operator and bench share the machine"
    )
    if args.operator_cpu:
        print(f"each operator process limited to {args.operator_cpu:g} of a core (a cgroup's CFS quota)")
    print()
    print(
        table(
            ["setup step", "seconds", "API calls", "calls/s"],
            [[w, f"{s:.1f}", c, f"{c / s:,.0f}"] for w, s, c in steps],
        )
    )
    print(f"setup total {setup_seconds:.1f} s")
    print()
    rows = [
        ["operator start -> /healthz", f"{healthy_at - spawned:.1f} s", ""],
        [
            f"operator start -> all {args.groups} groups published",
            f"{cold:.1f} s",
            f"{cold / floor_seconds:.2f}x",
        ],
        [
            f"floor: {len(bodies)} x (ConfigMap create + status patch), the operator's client, 8 at once",
            f"{floor_seconds:.1f} s",
            "1.00x",
        ],
        [
            "operator start -> quiet (under 5% of a core; Events may still trickle at 20/s)",
            f"{settled:.1f} s",
            "",
        ],
        [
            f"operator restart -> all {args.groups} groups reconciled (nothing to write)",
            f"{restart:.1f} s",
            f"{restart / floor_seconds:.2f}x",
        ],
        [
            "operator CPU during the restart",
            f"{restart_cpu:.1f} s",
            f"{restart_cpu / restart:.0%} of one core",
        ],
        ["operator CPU during the cold start", f"{cold_cpu:.1f} s", f"{cold_cpu / cold:.0%} of one core"],
        [
            "group reconciles during the cold start",
            str(cold_reconciles),
            f"{cold_reconciles / args.groups:.2f} per group",
        ],
        ["operator memory (RSS) after the cold start", f"{cold_rss:.0f} MiB", ""],
        [
            "  per group (RSS / groups; beside an idle operator's RSS)",
            f"{cold_rss * 1024 / args.groups:.1f} KiB",
            f"{(cold_rss - baseline_rss) * 1024 / args.groups:.1f} KiB above {baseline_rss:.0f} MiB",
        ],
        [f"operator CPU idle ({args.idle:g} s)", f"{idle_cpu * 100:.1f}% of one core", ""],
        ["operator memory (RSS) idle", f"{idle_rss:.0f} MiB", ""],
    ]
    if sharded:
        rows.insert(
            2,
            [
                f"{args.replicas} replicas, {args.shards} shards by {args.shard_by}: start -> {args.groups} "
                "groups published",
                f"{sharded:.1f} s",
                f"{sharded / floor_seconds:.2f}x ({sharded / cold:.2f} of one replica's)",
            ],
        )
        rows.insert(
            3,
            [
                f"  floor for {args.replicas} replicas: the same writes, {args.replicas} clients x 8 at once",
                f"{floor_sharded:.1f} s",
                f"{floor_sharded / floor_seconds:.2f}x ({sharded / floor_sharded:.2f}x of it sharded)",
            ],
        )
        rows.insert(
            4,
            [
                "  CPU of each replica for it",
                " / ".join(f"{c:.1f}" for c in sharded_cpu) + " s",
                f"{max(sharded_cpu) / cold_cpu:.2f} of the single operator's {cold_cpu:.1f} s at most",
            ],
        )
        rows.insert(
            5,
            [
                "  memory (RSS) of each replica after it",
                " / ".join(f"{m:.0f}" for m in sharded_rss) + " MiB",
                f"{max(sharded_rss) / cold_rss:.2f} of the single operator's {cold_rss:.0f} MiB at most",
            ],
        )
        rows.insert(
            6,
            [
                "  groups each replica published",
                " / ".join(str(n) for n in sharded_groups),
                f"{max(sharded_groups) / args.groups:.2f} of them at most",
            ],
        )
        rows.insert(
            7,
            [
                "  group reconciles each replica ran",
                " / ".join(str(n) for n in sharded_reconciles),
                f"{sum(sharded_reconciles) / args.groups:.2f} per group",
            ],
        )
    print(table(["measure", "value", "vs floor"], rows))
    print()
    ms = lambda v, q: f"{percentile(v, q) * 1e3:.1f}"  # noqa: E731
    print(
        table(
            ["one group's rebalance, others idle", "count", "p50 ms", "p95 ms", "p99 ms", "p99 / floor p99"],
            [
                [
                    "pod Ready/unready -> ConfigMap (watch)",
                    len(rebalance),
                    ms(rebalance, 50),
                    ms(rebalance, 95),
                    ms(rebalance, 99),
                    f"{percentile(rebalance, 99) / percentile(floors, 99):.2f}x",
                ],
                [
                    "floor: 1 ConfigMap write + 1 watch event",
                    len(floors),
                    ms(floors, 50),
                    ms(floors, 95),
                    ms(floors, 99),
                    "1.00x",
                ],
            ],
        )
    )
    if args.profile and profile is None:
        print("\npy-spy wrote no profile (is ptrace allowed?)")
    for what, found in (("cold start", profile), ("restart", restart_profile)):
        if found is None:
            continue
        own, inclusive, total = found
        print()
        print(f"py-spy, operator {what}, {total} samples at 50 Hz (active threads only):")
        print(table(["function (self time)", "share"], own))
        print()
        print(table(["function (inclusive)", "share"], inclusive))
    if "Traceback" in log_tail:
        print("\noperator log tail:\n" + log_tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
