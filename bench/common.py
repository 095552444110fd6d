"""Shared helpers of the benchmarks that run against the local control plane.

A bench starts a :class:`~harness.kube.cluster.LocalCluster`, runs the operator
(and sidecars) as subprocesses the way they run in pods, and watches ConfigMaps with
a raw HTTP watch (no model classes: the observer should cost the two shared cores as
little as possible). Tables are printed as Markdown so they paste into
docs/benchmarks.md unchanged.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import platform
import ssl
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from harness import polling
from harness.apps.sidecar import SidecarProcess
from harness.e2e import Score, Step, failover_waits, run, world
from harness.kube.api import ApiError, KubeApi
from harness.kube.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION = "mqbalance.io", "v1alpha1"
GENERATION_ANNOTATION = "mqbalance.io/generation"
ZONE_LABEL = "topology.kubernetes.io/zone"


# -- figures and tables -----------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; numbers right-aligned."""
    body = [[str(c) for c in row] for row in rows]
    align = ["---:" if body and _numeric(body[0][i]) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] in "-.") and not text.startswith("--")


def machine() -> str:
    """One line naming the machine a result came from."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs ({model}), {mem_gb:.0f} GiB RAM, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


# -- process figures from /proc ---------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the cluster ------------------------------------------------------------------------------


@contextmanager
def local_cluster() -> Iterator[LocalCluster]:
    """A started LocalCluster with the CRDs installed and established."""
    with LocalCluster() as cluster:
        cluster.apply_crds(REPO / "crds", ("topics.mqbalance.io", "consumergroups.mqbalance.io"))
        yield cluster


def kube_api(cluster: LocalCluster, pool: int = 8) -> KubeApi:
    """The operator's own API client (sync kubernetes client, JSON dicts), ``pool`` connections."""
    return KubeApi.from_kubeconfig(cluster.kubeconfig, pool)


def ensure(
    api: KubeApi, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> Any:
    """One request; a 409 on create counts as done (reruns against a kept cluster)."""
    try:
        return api.request(method, path, body, content_type)
    except ApiError as e:
        if e.status == 409 and method == "POST":
            return None
        raise


def create_namespace(api: KubeApi, name: str) -> None:
    ensure(
        api,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )


def create_node(api: KubeApi, name: str, zone: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {ZONE_LABEL: zone, "kubernetes.io/hostname": name}},
    }
    ensure(api, "POST", "/api/v1/nodes", body)


def create_topic(api: KubeApi, ns: str, name: str, brokers: list[dict[str, Any]]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": {"brokers": brokers},
    }
    ensure(api, "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/topics", body)


def create_group(api: KubeApi, ns: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ConsumerGroup",
        "metadata": {"name": name},
        "spec": spec,
    }
    ensure(api, "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/consumergroups", body)


def zone_brokers(zones: Sequence[str], queues: int) -> list[dict[str, Any]]:
    """A broker ``broker-<last letter of the zone>`` with ``queues`` read and write queues per zone."""
    return [
        {"name": f"broker-{z[-1]}", "readQueueNums": queues, "writeQueueNums": queues, "zone": z}
        for z in zones
    ]


def create_sticky_group(
    api: KubeApi, ns: str, name: str, brokers: list[dict[str, Any]], debounce: float = 0
) -> None:
    """A bench group: Topic ``name`` on ``brokers`` and a STICKY group with zone affinity of the same
    name, selecting the pods labelled ``app=<name>``."""
    create_topic(api, ns, name, brokers)
    spec = {
        "topics": [name],
        "selector": {"matchLabels": {"app": name}},
        "strategy": {"name": "STICKY", "zoneAffinity": True},
        "debounceSeconds": debounce,
    }
    create_group(api, ns, name, spec)


def pod_status(ready: bool) -> dict[str, Any]:
    """What a kubelet writes for a running container, Ready or not."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    flag = "True" if ready else "False"
    return {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                {"type": "Ready", "status": flag, "lastTransitionTime": now},
            ],
        }
    }


def create_pod(api: KubeApi, ns: str, name: str, labels: dict[str, str], node: str) -> None:
    """Create a pod already on ``node`` (as a DaemonSet would be) and no status yet: Pending."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "consumer", "image": "example/consumer"}]},
    }
    ensure(api, "POST", f"/api/v1/namespaces/{ns}/pods", body)


def set_ready(api: KubeApi, ns: str, name: str, ready: bool) -> None:
    path = f"/api/v1/namespaces/{ns}/pods/{quote(name)}/status"
    api.request("PATCH", path, pod_status(ready), "application/merge-patch+json")


def delete_pod(api: KubeApi, ns: str, name: str) -> None:
    """Delete at once (grace period 0): there is no kubelet to finish a graceful deletion."""
    api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{quote(name)}", {"gracePeriodSeconds": 0})


def run_parallel(calls: Sequence[Callable[[], object]], workers: int) -> float:
    """Run ``calls`` on ``workers`` threads; seconds taken. The first error is raised."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(c) for c in calls]:
            future.result()
    return time.perf_counter() - started


# -- processes --------------------------------------------------------------------------------


class Arrivals:
    """(time, generation) arrivals per object name, for a bench thread to wait on."""

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[float, int]]] = {}
        self._cond = threading.Condition()

    def add(self, name: str, at: float, generation: int) -> None:
        with self._cond:
            self._seen.setdefault(name, []).append((at, generation))
            self._cond.notify_all()

    def latest(self, name: str) -> int:
        with self._cond:
            seen = self._seen.get(name)
            return seen[-1][1] if seen else 0

    def wait(self, name: str, at_least: int, timeout: float = 60) -> tuple[float, int]:
        """The first arrival of ``name`` with generation ``at_least`` or more."""
        deadline = polling.deadline(timeout)
        with self._cond:
            while True:
                for at, generation in self._seen.get(name, []):
                    if generation >= at_least:
                        return at, generation
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SystemExit(f"timed out waiting for {name} generation {at_least}")
                self._cond.wait(remaining)

    def count(self, predicate: Callable[[str, int], bool]) -> int:
        with self._cond:
            return sum(1 for name, seen in self._seen.items() if predicate(name, seen[-1][1]))


# -- raw watches ------------------------------------------------------------------------------


class Watch:
    """A watch on one resource collection over its own HTTPS connection, in a daemon thread.

    ``on_event(arrived_perf_counter, event_type, object)`` runs in the watch thread.
    The watch starts from ``resourceVersion`` of a list, so only changes after
    :meth:`start` returns are seen.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        path: str,
        on_event: Callable[[float, str, dict[str, Any]], None],
        **params: str,
    ) -> None:
        self.cluster, self.path, self.on_event, self.params = cluster, path, on_event, params
        host, port = cluster.server.removeprefix("https://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.context = ssl.create_default_context(cafile=str(cluster.ca_file))
        self.headers = {"Authorization": f"Bearer {cluster.token}", "Accept": "application/json"}
        self.error: BaseException | None = None

    def _get(self, params: dict[str, str], timeout: float | None) -> http.client.HTTPResponse:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)
        conn.request("GET", f"{self.path}?{urlencode(params)}", headers=self.headers)
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"GET {self.path}: HTTP {response.status} {response.read()[:300]!r}")
        return response

    def start(self) -> None:
        listing = json.loads(self._get({**self.params, "limit": "1"}, 30).read())
        rv = listing["metadata"]["resourceVersion"]
        params = {**self.params, "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "false"}
        params["timeoutSeconds"] = "3600"
        response = self._get(params, None)
        threading.Thread(target=self._run, args=(response,), daemon=True).start()

    def _run(self, response: http.client.HTTPResponse) -> None:
        try:
            while line := response.readline():
                at = time.perf_counter()
                event = json.loads(line)
                self.on_event(at, event["type"], event["object"])
        except BaseException as e:  # reported by the bench that reads .error
            self.error = e


def generation_of(obj: dict[str, Any]) -> int:
    """The generation an assignment ConfigMap carries (its annotation; 0 if none)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return int(annotations.get(GENERATION_ANNOTATION, 0))


def bench_sidecar(
    cluster: LocalCluster, workdir: Path, namespace: str, pod: str, group: str
) -> SidecarProcess:
    """A quiet sidecar for ``pod`` of ``group``: no topic watch, no metrics listener."""
    return SidecarProcess(
        cluster.kubeconfig,
        workdir / f"sidecar-{pod}.log",
        "--pod-name", pod, "--namespace", namespace, "--group", group, "--no-topics",
        metrics=False,
        env={"MQBALANCE_LOG_LEVEL": "WARNING"},
    )  # fmt: skip


# -- CPU limits -----------------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


class CpuLimit:
    """A cgroup that caps the processes put in it at ``cores`` of CPU, as a container's
    ``resources.limits.cpu`` does (the CFS quota; cgroup v2's cpu.max, or v1's cpu controller).

    Needs write access to the cgroup tree (root, outside a container that hides it)."""

    def __init__(self, name: str, cores: float) -> None:
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        self.path = (CGROUP_ROOT if v2 else CGROUP_ROOT / "cpu") / name
        try:
            self.path.mkdir()
            quota = str(max(1000, round(cores * CPU_PERIOD_US)))
            if v2:
                (self.path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(quota)
        except OSError as e:
            raise SystemExit(f"cannot make a CPU-limited cgroup at {self.path} ({e}): run as root") from e

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Delete the cgroup once its processes have ended."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def messages_parser(doc: str | None, *, rate: int, seconds: float = 60.0) -> argparse.ArgumentParser:
    """The arguments of the benchmarks that run harness.e2e: how long and how fast the producer
    sends, how many rounds in one world, where to keep the logs."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=seconds, help="how long the producer sends")
    parser.add_argument("--rate", type=int, default=rate, help="messages a second")
    parser.add_argument("--rounds", type=int, default=1, help="runs in the same world, one after the other")
    parser.add_argument("--workdir", type=Path, default=None, help="keep every log and record here")
    return parser


def failover_rounds(
    args: argparse.Namespace,
    variants: Sequence[str],
    base: str,
    action: str,
    extra: Sequence[tuple[str, Callable[[Score], object]]] = (),
) -> int:
    """The failover benches' rounds: in one world, per round, every variant's member 1 consumes, then
    ``action`` (``kill`` or ``crash``) strikes it in every group at once; per variant a table row
    with the seconds from the SIGKILL to the next consumption elsewhere of each queue it had
    consumed (their median against ``base``'s), what was lost, and the ``extra`` columns (a header
    and a figure of the variant's score). Exit status 1 when a round lost a message."""
    member, who = 1, {"kill": "killed", "crash": "crashed"}[action]
    print(machine())
    lost = False
    with world(args.workdir) as w:
        for n in range(1, args.rounds + 1):
            load = os.getloadavg()[0]
            tag = f"{action}{n}"
            script = (Step(0.25, "consuming", member), Step(0.3, action, member))
            scores = run(w, variants, seconds=args.seconds, rate=args.rate, keys=16, script=script, tag=tag)
            lost = lost or any(s.lost for s in scores)
            waits: dict[str, list[float]] = {}
            for s in scores:
                dead, killed_at = next(iter(s.killed_at.items()))
                group = f"e2e-{tag}-{s.variant}"
                waits[s.variant] = sorted(failover_waits(w.workdir, group, dead, killed_at).values())
            medians = {v: statistics.median(ws) if ws else math.nan for v, ws in waits.items()}
            print(f"\nround {n}: load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
            headers = [
                "variant",
                f"queues of the {who} member",
                "kill to next consumption elsewhere, median s",
                "max s",
                f"median vs {base}",
                "lost",
                *(header for header, _ in extra),
            ]
            rows = [
                (
                    s.variant,
                    len(waits[s.variant]),
                    f"{medians[s.variant]:.2f}",
                    f"{max(waits[s.variant]):.2f}" if waits[s.variant] else "-",
                    f"{medians[s.variant] / medians[base]:.2f}x",
                    s.lost,
                    *(figure(s) for _, figure in extra),
                )
                for s in scores
            ]
            print(table(headers, rows))
            sys.stdout.flush()
    return 1 if lost else 0
