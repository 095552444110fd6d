"""A fleet on fake nodes: kwok nodes and pods in three zones, the real operator publishing, and the
sidecars' watches acted out by thousands of lightweight watchers, in one run.

    python bench/bench_fleet.py [--nodes 100] [--pods 3000] [--groups 300] [--namespaces 3]
        [--watchers 3000] [--fanout 500] [--lost-nodes 10]

kwok (harness/kube/kwok.py, built by hack/build-kwok.sh) plays the kubelets: it turns the fake Nodes
Ready and every pod bound to one Running and Ready. Pods are created with ``spec.nodeName`` set
(there is no scheduler), each group's pods round-robin over the nodes, the nodes round-robin
over the zones. Each group has its own label selector and Topic (brokers in the three zones).
The scenarios, in this order, each timed from the API calls that make it:

1. **cold start**: the operator starts on the whole fleet; until every group's ConfigMap is
   published (through a watch);
2. **sidecar watches**: W watchers, each opening what one sidecar opens (its group's ConfigMap
   listed and watched by field selector, and its namespace's Topics listed and watched), plus
   ``--fanout`` watchers on one 500-member group's ConfigMap; the kube-apiserver's RSS and CPU
   before, while opening and with them open;
3. **node loss**: ``--lost-nodes`` nodes and their pods deleted (what the node lifecycle
   controller's eviction ends in); until every affected group's published members hold none of
   the lost pods; the operator's writes per second and their latency from the API server's own
   metrics (``apiserver_request_total``, ``apiserver_request_duration_seconds``: the mutating
   calls on ConfigMaps, ConsumerGroups, Topics and Events, which only the operator makes here);
4. **rolling restart** of the ``--fanout``-pod group as a Deployment does it (25% surge, new pods
   Ready before old ones go); until the group's published members are exactly the new pods;
5. **fan-out**: one pod of that group turning unready and Ready again (``--fanout-changes``
   times); until every one of its ``--fanout`` watchers saw the new generation;
6. **zone outage**: every node of one zone and its pods deleted; until every affected group is
   published without them.

Everything runs on one machine: the API server, etcd, the controller manager, kwok, the operator,
the watchers and the bench share its cores. Compare the ratios printed beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing
import os
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (
    Watch,
    cpu_seconds,
    create_namespace,
    create_sticky_group,
    ensure,
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
from harness.kube.api import ApiError, KubeApi
from harness.kube.cluster import LocalCluster
from harness.kube.kwok import KWOK_VERSION, Kwok, condition_true, node_body, pod_body, zone_of
from harness.polling import deadline as deadline_after
from harness.polling import wait_for, work_timeout

ZONES = ("zone-a", "zone-b", "zone-c")
CONFIGMAP_KEY = "assignment.json"
OPERATOR_RESOURCES = frozenset({"configmaps", "consumergroups", "topics", "events"})
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
ROLLOUT_GROUP = "rollout"


# -- pure helpers -----------------------------------------------------------------------------------


def group_name(index: int) -> str:
    return f"g{index:05d}"


def namespace_of(index: int, namespaces: int) -> str:
    """Groups go round-robin over ``namespaces`` namespaces ``fleet-0..``."""
    return f"fleet-{index % namespaces}"


def place_pods(groups: int, pods: int, nodes: int) -> list[tuple[int, int, int]]:
    """(group index, member index, node index) for ``pods`` pods over ``groups`` groups, members of a
    group on consecutive nodes (so across the zones), the groups' first members spread evenly."""
    per, extra = divmod(pods, groups)
    placed: list[tuple[int, int, int]] = []
    start = 0
    for g in range(groups):
        count = per + (1 if g < extra else 0)
        first = (g * nodes) // groups
        placed.extend((g, k, (first + k) % nodes) for k in range(count))
        start += count
    return placed


def parse_labels(text: str) -> dict[str, str]:
    """``a="x",b="y"`` (a Prometheus sample's labels) as a dict."""
    labels: dict[str, str] = {}
    rest = text
    while rest:
        key, _, rest = rest.partition('="')
        value, _, rest = rest.partition('"')
        labels[key.strip(", ")] = value
        rest = rest.lstrip(",")
    return labels


@dataclass
class RequestFigures:
    """API server request counters for the operator's mutating calls, summed: calls and the
    cumulative latency histogram (bucket upper bound -> count), as read from /metrics."""

    calls: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)
    all_mutating: float = 0.0

    def minus(self, earlier: RequestFigures) -> RequestFigures:
        return RequestFigures(
            self.calls - earlier.calls,
            {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.all_mutating - earlier.all_mutating,
        )

    def quantile(self, q: float) -> float:
        """The ``q`` (0..1) quantile in seconds, interpolated in its bucket as histogram_quantile
        does; NaN without observations."""
        return histogram_quantile(self.buckets, q)


def histogram_quantile(buckets: Mapping[float, float], q: float) -> float:
    """Prometheus's histogram_quantile over cumulative ``buckets`` (upper bound -> count, +Inf
    included): linear within the bucket holding the rank; NaN when empty."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def operator_requests(metrics_text: str) -> RequestFigures:
    """The mutating calls on the resources only the operator writes in this bench (ConfigMaps,
    ConsumerGroups and their status, Topics' status, Events), from kube-apiserver's /metrics."""
    figures = RequestFigures()
    for line in metrics_text.splitlines():
        if line.startswith("apiserver_request_total{"):
            head, _, value = line.rpartition(" ")
            labels = parse_labels(head[len("apiserver_request_total{") : -1])
            if labels.get("verb") not in MUTATING:
                continue
            figures.all_mutating += float(value)
            if labels.get("resource") in OPERATOR_RESOURCES:
                figures.calls += float(value)
        elif line.startswith("apiserver_request_duration_seconds_bucket{"):
            head, _, value = line.rpartition(" ")
            labels = parse_labels(head[len("apiserver_request_duration_seconds_bucket{") : -1])
            if labels.get("verb") in MUTATING and labels.get("resource") in OPERATOR_RESOURCES:
                le = float(labels["le"])
                figures.buckets[le] = figures.buckets.get(le, 0.0) + float(value)
    return figures


@dataclass(frozen=True)
class FleetModel:
    """What mqbalance and RocketMQ's own clients ask of their servers for one fleet: the inputs
    measured by this bench (per watch, per published group), the rest arithmetic."""

    nodes: int
    pods: int
    groups: int
    zones: int = 3
    watches_per_pod: int = 2
    """A sidecar's ConfigMap watch and its namespace's Topic watch."""
    writes_per_publish: float = 3.0
    """ConfigMap replace, status patch, Event."""
    pod_changes_per_pod_per_day: float = 2.0
    """Restarts, rollouts and reschedules that change a group's membership."""
    brokers: int = 3
    topics_per_client: int = 2
    """Its topic and its group's retry topic (``%RETRY%<group>``), both routed and rebalanced."""
    route_interval: float = 30.0
    heartbeat_interval: float = 30.0
    rebalance_interval: float = 20.0

    @property
    def pods_per_node(self) -> float:
        return self.pods / self.nodes

    @property
    def members_per_group(self) -> float:
        return self.pods / self.groups

    def watches(self) -> int:
        return self.pods * self.watches_per_pod

    def steady_changes_per_second(self) -> float:
        return self.pods * self.pod_changes_per_pod_per_day / 86_400

    def steady_writes_per_second(self) -> float:
        """Each membership change publishes its group once (a debounce window gathers more)."""
        return self.steady_changes_per_second() * self.writes_per_publish

    def steady_events_per_second(self) -> float:
        """Watch events sent: each publish to every member's sidecar."""
        return self.steady_changes_per_second() * self.members_per_group

    def groups_hit_by_node_loss(self) -> float:
        """At most one group per pod of the node (members of a group on different nodes)."""
        return min(self.groups, self.pods_per_node)

    def groups_hit_by_zone_loss(self) -> float:
        """Every group with a member in the zone: all of them when groups span the zones."""
        return float(self.groups) if self.members_per_group >= self.zones else self.groups / self.zones

    def burst_writes(self, groups_hit: float) -> float:
        return groups_hit * self.writes_per_publish

    def burst_events(self, groups_hit: float, lost_share: float = 0.0) -> float:
        """Watch events of one publish of each group hit: one per surviving member's sidecar."""
        return groups_hit * self.members_per_group * (1 - lost_share)

    def rocketmq_nameserver_per_second(self) -> float:
        """Route queries: every client, every topic it uses, every 30 s."""
        return self.pods * self.topics_per_client / self.route_interval

    def rocketmq_broker_per_second(self) -> float:
        """Heartbeats to every broker every 30 s, and each 20 s rebalance's consumer-id list read per
        topic (the part mqbalance takes over is this second one)."""
        return self.pods * self.brokers / self.heartbeat_interval + self.rocketmq_rebalance_per_second()

    def rocketmq_rebalance_per_second(self) -> float:
        return self.pods * self.topics_per_client / self.rebalance_interval


# -- the fleet's state, from watches ------------------------------------------------------------------


class Relisting(Watch):
    """A watch that lists again and resumes when the server ends it: the API server closes a watch
    whose reader falls behind (the bench's interpreter is busy making thousands of calls), and a
    watch that silently stopped would leave a wait hanging. The objects of each listing are passed
    on as ADDED at the listing's arrival; ``restarts`` counts the relists."""

    def __init__(
        self,
        cluster: LocalCluster,
        path: str,
        on_event: Callable[[float, str, dict[str, Any]], None],
        **params: str,
    ) -> None:
        super().__init__(cluster, path, on_event, **params)
        self.restarts = 0
        self._stopped = False

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self._stopped = True

    def _list(self) -> str:
        params = {**self.params, "limit": "1000"}
        while True:
            page = json.loads(self._get(params, 120).read())
            at = time.perf_counter()
            for item in page.get("items") or []:
                self.on_event(at, "ADDED", item)
            token = page["metadata"].get("continue")
            if not token:
                return str(page["metadata"]["resourceVersion"])
            params = {**params, "continue": token}

    def _loop(self) -> None:
        while not self._stopped:
            try:
                rv = self._list()
                params = {**self.params, "watch": "1", "resourceVersion": rv, "timeoutSeconds": "3600"}
                response = self._get(params, None)
                while line := response.readline():
                    at = time.perf_counter()
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        break  # 410 Gone and the like: list again
                    self.on_event(at, event["type"], event["object"])
            except Exception as e:  # the server went away for a moment: list again
                self.error = e
                time.sleep(0.5)  # a retry backoff
            self.restarts += 1


class Assignments:
    """Every assignment ConfigMap's published members, with the arrival time of each generation."""

    def __init__(self) -> None:
        self.history: dict[tuple[str, str], list[tuple[float, int, frozenset[str]]]] = {}
        self._cond = threading.Condition()

    def on_event(self, at: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if kind == "DELETED" or not meta["name"].endswith("-assignment"):
            return
        generation = generation_of(obj)
        if generation < 1:
            return
        try:
            doc = json.loads((obj.get("data") or {}).get(CONFIGMAP_KEY) or "{}")
        except ValueError:
            return
        members = frozenset((doc.get("members") or {}).keys())
        key = (meta["namespace"], meta["name"].removesuffix("-assignment"))
        with self._cond:
            self.history.setdefault(key, []).append((at, generation, members))
            self._cond.notify_all()

    def reached(self, target: int, check: Callable[[], None]) -> bool:
        check()
        count = self.published()
        progress(f"published {count} of {target} groups", every=10)
        return count >= target

    def published(self) -> int:
        with self._cond:
            return len(self.history)

    def generation(self, key: tuple[str, str]) -> int:
        with self._cond:
            seen = self.history.get(key)
            return seen[-1][1] if seen else 0

    def first_after(
        self, key: tuple[str, str], since: float, accept: Callable[[frozenset[str]], bool]
    ) -> float | None:
        """The arrival of the first generation after ``since`` whose members ``accept`` holds."""
        with self._cond:
            for at, _, members in self.history.get(key, []):
                if at >= since and accept(members):
                    return at
        return None

    def count(self, key: tuple[str, str]) -> int:
        with self._cond:
            return len(self.history.get(key, []))

    def wait_all(
        self,
        what: str,
        keys: Iterable[tuple[str, str]],
        since: float,
        accept: Callable[[tuple[str, str], frozenset[str]], bool],
        timeout: float,
    ) -> dict[tuple[str, str], float]:
        """Each key's first arrival after ``since`` that ``accept`` holds, waiting for them all."""
        pending = set(keys)
        done: dict[tuple[str, str], float] = {}
        deadline = deadline_after(timeout)
        last_report = time.monotonic()
        while pending:
            for key in list(pending):
                at = self.first_after(key, since, functools.partial(accept, key))
                if at is not None:
                    done[key] = at
                    pending.discard(key)
            if not pending:
                break
            now = time.monotonic()
            if now > deadline:
                raise SystemExit(f"timed out waiting for {what}: {len(pending)} groups left")
            if now - last_report > 10:
                progress(f"{what}: {len(done)} of {len(done) + len(pending)} groups")
                last_report = now
            with self._cond:
                self._cond.wait(0.2)
        return done


class ReadyPods:
    """Ready pods by (namespace, name), from a watch on every pod."""

    def __init__(self) -> None:
        self.ready: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def on_event(self, at: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock:
            if kind != "DELETED" and condition_true(obj) and not meta.get("deletionTimestamp"):
                self.ready.add(key)
            else:
                self.ready.discard(key)

    def reached(self, target: int) -> bool:
        count = self.count()
        progress(f"pods Ready: {count} of {target}", every=10)
        return count >= target

    def all_ready(self, keys: Sequence[tuple[str, str]]) -> bool:
        return self.count(keys) == len(keys)

    def count(self, keys: Iterable[tuple[str, str]] | None = None) -> int:
        with self._lock:
            if keys is None:
                return len(self.ready)
            return sum(1 for k in keys if k in self.ready)


# -- sidecar-like watchers ------------------------------------------------------------------------------


class Watchers:
    """Thousands of watches like the sidecars', on one asyncio loop in a thread of its own.

    Each watcher lists and then watches its group's ConfigMap by field selector, and lists and
    watches its namespace's Topics (:meth:`open` one kind at a time), each over its own HTTP/1.1
    connection, as the sidecar's aiohttp informers do. Arrivals of ConfigMap generations are
    recorded per watcher."""

    def __init__(self, server: str, token: str, ca_file: str) -> None:
        self.server = server
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.ssl = ssl.create_default_context(cafile=ca_file)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.errors: list[str] = []
        self.restarts = 0
        self.seen: dict[int, list[tuple[float, int]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._session: Any = None
        self._lock = threading.Lock()

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _session_get(self) -> Any:
        import aiohttp

        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=self.ssl, force_close=False)
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def _watch(self, index: int, path: str, selector: str | None, opened: asyncio.Event) -> None:
        """List, then watch from the listing; list again when the server ends the watch (it closes
        watchers that fall behind), as the sidecar's informer does."""
        session = await self._session_get()
        base = {"fieldSelector": selector} if selector else {}
        while True:
            try:
                async with session.get(self.server + path, params=base) as listing:
                    body = await listing.json()
                if selector is not None:
                    for item in body.get("items") or []:
                        self._record(index, generation_of(item))
                rv = body["metadata"]["resourceVersion"]
                params = {**base, "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
                params["timeoutSeconds"] = "3600"
                async with session.get(self.server + path, params=params) as response:
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}")
                    opened.set()
                    async for line in response.content:
                        if selector is None:
                            continue  # Topics: received, not needed
                        event = json.loads(line)
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._record(index, generation_of(event["object"]))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # counted and reported by the bench; the informer retries
                self.errors.append(f"watcher {index} {path}: {e!r}")
                await asyncio.sleep(1.0)  # a retry backoff
            self.restarts += 1

    def _record(self, index: int, generation: int) -> None:
        with self._lock:
            self.seen.setdefault(index, []).append((time.perf_counter(), generation))

    async def _open(self, specs: Sequence[tuple[int, str, str]], kind: str, at_once: int) -> None:
        slots = asyncio.Semaphore(at_once)
        done = [0]

        async def one(index: int, namespace: str, group: str) -> None:
            async with slots:
                opened = asyncio.Event()
                if kind == "configmap":
                    path = f"/api/v1/namespaces/{namespace}/configmaps"
                    watch = self._watch(index, path, f"metadata.name={group}-assignment", opened)
                else:
                    path = f"/apis/mqbalance.io/v1alpha1/namespaces/{namespace}/topics"
                    watch = self._watch(index, path, None, opened)
                self._tasks.append(asyncio.create_task(watch))
                await opened.wait()
                done[0] += 1
                progress(f"watches open: {done[0]} of {len(specs)}", every=10)

        await asyncio.gather(*(one(i, ns, g) for i, ns, g in specs))

    def open(
        self, specs: Sequence[tuple[int, str, str]], kind: str, at_once: int = 64, timeout: float = 1800
    ) -> float:
        """Open one watch of ``kind`` (``configmap``: the group's ConfigMap by field selector;
        ``topics``: the namespace's Topics) per (index, namespace, group); seconds until all are
        established."""
        started = time.perf_counter()
        self._run(self._open(specs, kind, at_once), timeout)
        return time.perf_counter() - started

    def all_past(self, indexes: Iterable[int], generation: int) -> bool:
        return all(self.latest(i) > generation for i in indexes)

    def latest(self, index: int) -> int:
        with self._lock:
            seen = self.seen.get(index)
            return seen[-1][1] if seen else 0

    def error_list(self) -> list[str]:
        return list(self.errors)

    def restart_count(self) -> int:
        return self.restarts

    def arrivals(self, indexes: Iterable[int], generation: int) -> list[float | None]:
        return [self.arrival(i, generation) for i in indexes]

    def arrival(self, index: int, generation: int) -> float | None:
        with self._lock:
            for at, g in self.seen.get(index, []):
                if g >= generation:
                    return at
        return None

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def close(self) -> None:
        self._run(self._close(), 120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _watchers_main(conn: Connection, server: str, token: str, ca_file: str) -> None:
    """A child process serving one :class:`Watchers` over ``conn``: (method, args) -> result."""
    watchers = Watchers(server, token, ca_file)
    while True:
        method, call_args = conn.recv()
        try:
            conn.send((True, getattr(watchers, method)(*call_args)))
        except Exception as e:
            conn.send((False, repr(e)))
        if method == "close":
            return


class WatcherProcess:
    """:class:`Watchers` in a process of its own, so that thousands of watches do not share the
    bench's interpreter (its GIL) with the API calls it times; arrival times are
    ``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for both processes)."""

    def __init__(self, cluster: LocalCluster) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        args = (child, cluster.server, cluster.token, str(cluster.ca_file))
        self.process = context.Process(target=_watchers_main, args=args, daemon=True)
        self.process.start()

    def _call(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        ok, result = self._conn.recv()
        if not ok:
            raise RuntimeError(f"watchers.{method}: {result}")
        return result

    def open(self, specs: Sequence[tuple[int, str, str]], kind: str) -> float:
        return float(self._call("open", list(specs), kind))

    @property
    def errors(self) -> list[str]:
        return list(self._call("error_list"))

    @property
    def restarts(self) -> int:
        return int(self._call("restart_count"))

    def all_past(self, indexes: Sequence[int], generation: int) -> bool:
        return bool(self._call("all_past", list(indexes), generation))

    def arrivals(self, indexes: Sequence[int], generation: int) -> list[float | None]:
        return list(self._call("arrivals", list(indexes), generation))

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def close(self) -> None:
        if self.process.is_alive():
            self._call("close")
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


# -- the bench ------------------------------------------------------------------------------------------

_last_progress = [0.0]


def progress(message: str, every: float = 0.0) -> None:
    now = time.monotonic()
    if every and now - _last_progress[0] < every:
        return
    _last_progress[0] = now
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def apiserver_figures(cluster: LocalCluster) -> RequestFigures:
    status, text = cluster.request("GET", "/metrics", timeout=60)
    if status != 200 or not isinstance(text, str):
        raise SystemExit(f"kube-apiserver /metrics: HTTP {status}")
    return operator_requests(text)


@dataclass
class Window:
    """CPU of the processes that matter and the API server's counters over one scenario."""

    cluster: LocalCluster
    pids: dict[str, int]
    started: float = 0.0
    cpu0: dict[str, float] = field(default_factory=dict)
    api0: RequestFigures = field(default_factory=RequestFigures)

    def start(self) -> Window:
        self.api0 = apiserver_figures(self.cluster)
        self.cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.started = time.perf_counter()
        return self

    def close(self) -> tuple[float, dict[str, float], RequestFigures]:
        seconds = time.perf_counter() - self.started
        cpu = {name: cpu_seconds(pid) - self.cpu0[name] for name, pid in self.pids.items()}
        return seconds, cpu, apiserver_figures(self.cluster).minus(self.api0)


def apiserver_memory(cluster: LocalCluster, pid: int) -> tuple[float, float]:
    """kube-apiserver's RSS and its Go heap in use (``go_memstats_heap_inuse_bytes``), MiB."""
    status, text = cluster.request("GET", "/metrics", timeout=60)
    heap = 0.0
    if status == 200 and isinstance(text, str):
        for line in text.splitlines():
            if line.startswith("go_memstats_heap_inuse_bytes "):
                heap = float(line.split()[1]) / 1024 / 1024
    return rss_mib(pid), heap


def idle_load(pid: int, seconds: float) -> float:
    """The share of a core ``pid`` uses over ``seconds`` (a measurement window: it sleeps)."""
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu0) / (time.perf_counter() - t0)


def quiet(pid: int, label: str, threshold: float = 0.1, window: float = 2.0, timeout: float = 600) -> float:
    """Wait until ``pid`` uses under ``threshold`` of a core over ``window`` seconds; seconds waited."""
    started = time.perf_counter()
    last = [cpu_seconds(pid), time.perf_counter()]

    def calm() -> bool:
        now = time.perf_counter()
        if now - last[1] < window:
            return False
        used = cpu_seconds(pid)
        busy = (used - last[0]) / (now - last[1])
        last[:] = [used, now]
        return busy < threshold

    wait_for(f"{label} to go quiet", calm, timeout, interval=0.25)
    return time.perf_counter() - started


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.0f}"


def spread(values: Sequence[float]) -> list[str]:
    return [f"{percentile(values, 50):.2f}", f"{percentile(values, 99):.2f}", f"{max(values):.2f}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=3000, help="consumer pods over the groups")
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--namespaces", type=int, default=3)
    parser.add_argument("--queues", type=int, default=8, help="queues per broker (3 brokers, one a zone)")
    parser.add_argument("--debounce", type=float, default=2.0, help="the groups' debounceSeconds")
    parser.add_argument("--watchers", type=int, default=3000, help="sidecar-like watchers on the groups")
    parser.add_argument("--no-topic-watch", action="store_true", help="watchers watch their ConfigMap only")
    parser.add_argument("--fanout", type=int, default=500, help="pods (and watchers) of the rollout group")
    parser.add_argument("--fanout-changes", type=int, default=5)
    parser.add_argument("--lost-nodes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=16, help="threads making the setup's API calls")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of each idle CPU window")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.pods < args.groups or args.nodes < 3 * 2:
        parser.error("need pods >= groups >= 1 and at least 6 nodes")
    load_at_start = os.getloadavg()
    rows: dict[str, list[list[Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, local_cluster() as cluster:
        workdir = Path(tmp)
        api = kube_api(cluster, pool=args.workers)
        try:
            with Kwok(cluster) as kwok:
                run(args, cluster, api, kwok, workdir, rows)
        finally:
            api.close()
            report(args, load_at_start, rows)
    return 0


def report(
    args: argparse.Namespace, load_at_start: tuple[float, float, float], rows: dict[str, list[list[Any]]]
) -> None:
    """The tables measured (all of them, or those before a failure)."""
    print(f"machine: {machine()}")
    print(f"load average at the start: {' / '.join(f'{x:.2f}' for x in load_at_start)} (1, 5, 15 min)")
    print(
        f"{args.nodes} kwok nodes in {len(ZONES)} zones, {args.pods} pods in {args.groups} groups "
        f"(+ the {args.fanout}-pod group '{ROLLOUT_GROUP}') in {args.namespaces} namespaces, "
        f"debounce {args.debounce:g} s; kwok {KWOK_VERSION}; the API server, etcd, the controller manager, "
        "kwok, the operator, the watchers and the bench share the machine"
    )
    for title, body in rows.items():
        print()
        print(f"### {title}")
        print()
        print(table(body[0], body[1:]))


def run(
    args: argparse.Namespace,
    cluster: LocalCluster,
    api: KubeApi,
    kwok: Kwok,
    workdir: Path,
    rows: dict[str, list[list[Any]]],
) -> None:
    apiserver = cluster.pids["kube-apiserver"]
    etcd = cluster.pids["etcd"]
    namespaces = sorted({namespace_of(i, args.namespaces) for i in range(args.groups)})
    nodes = [f"kwok-{zone_of(i, ZONES)}-{i:04d}" for i in range(args.nodes)]
    placed = place_pods(args.groups, args.pods, args.nodes)
    pods_of_node: dict[str, list[tuple[str, str]]] = {n: [] for n in nodes}
    group_of_pod: dict[tuple[str, str], tuple[str, str]] = {}
    for g, k, n in placed:
        ns, group = namespace_of(g, args.namespaces), group_name(g)
        pods_of_node[nodes[n]].append((ns, f"{group}-{k}"))
        group_of_pod[(ns, f"{group}-{k}")] = (ns, group)
    rollout_ns = namespaces[0]
    setup_rows: list[list[object]] = [["setup step", "seconds", "API calls", "calls/s"]]

    def step(what: str, calls: list[Callable[[], object]]) -> None:
        progress(f"setup: {what} ({len(calls)} calls)")
        seconds = run_parallel(calls, args.workers)
        setup_rows.append([what, f"{seconds:.1f}", len(calls), f"{len(calls) / seconds:,.0f}"])

    # -- setup: nodes Ready through kwok, Topics and groups, pods Ready through kwok.
    for ns in namespaces:
        create_namespace(api, ns)
    create_node = functools.partial(ensure, api, "POST", "/api/v1/nodes")
    step(
        "fake nodes",
        [functools.partial(create_node, node_body(n, zone_of(i, ZONES))) for i, n in enumerate(nodes)],
    )

    def ready_nodes(target: int) -> bool:
        items = api.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok").get("items") or []
        return sum(1 for node in items if condition_true(node)) >= target

    started = time.perf_counter()
    wait_for(
        f"kwok to turn {args.nodes} nodes Ready",
        functools.partial(ready_nodes, args.nodes),
        work_timeout(60, 0.1, args.nodes),
        interval=0.5,
    )
    setup_rows.append(["kwok: every node Ready", f"{time.perf_counter() - started:.1f}", "", ""])

    group_objects = functools.partial(create_sticky_group, api, brokers=zone_brokers(ZONES, args.queues))
    calls: list[Callable[[], object]] = [
        functools.partial(
            group_objects, namespace_of(g, args.namespaces), group_name(g), debounce=args.debounce
        )
        for g in range(args.groups)
    ]
    calls.append(functools.partial(group_objects, rollout_ns, ROLLOUT_GROUP, debounce=0))
    step("Topics and ConsumerGroups", calls)

    ready = ReadyPods()
    pod_watch = Relisting(cluster, "/api/v1/pods", ready.on_event)
    pod_watch.start()

    def make_pod(ns: str, name: str, labels: dict[str, str], node: str) -> None:
        ensure(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod_body(name, labels, node))

    pod_calls: list[Callable[[], object]] = []
    for g, k, n in placed:
        ns, group = namespace_of(g, args.namespaces), group_name(g)
        pod_calls.append(functools.partial(make_pod, ns, f"{group}-{k}", {"app": group}, nodes[n]))
    rollout_pods = [f"{ROLLOUT_GROUP}-v1-{k}" for k in range(args.fanout)]
    v1 = {"app": ROLLOUT_GROUP, "pod-template-hash": "v1"}
    for k, name in enumerate(rollout_pods):
        pod_calls.append(functools.partial(make_pod, rollout_ns, name, v1, nodes[k % len(nodes)]))
    started = time.perf_counter()
    step("pods (bound to their node)", pod_calls)
    total_pods = len(pod_calls)
    wait_for(
        f"kwok to turn {total_pods} pods Ready",
        functools.partial(ready.reached, total_pods),
        work_timeout(120, 0.02, total_pods),
        interval=0.5,
    )
    setup_rows.append(["  until kwok turned every pod Ready", f"{time.perf_counter() - started:.1f}", "", ""])
    rows["Setup"] = setup_rows
    base_rss = {"kube-apiserver": rss_mib(apiserver), "etcd": rss_mib(etcd)}

    # -- 1. cold start.
    assignments = Assignments()
    cm_watch = Relisting(
        cluster,
        "/api/v1/configmaps",
        assignments.on_event,
        labelSelector="app.kubernetes.io/managed-by=mqbalance",
    )
    cm_watch.start()
    operator = OperatorProcess(cluster, [], workdir, "--all-namespaces", "--log-level", "WARNING")
    all_groups = [(namespace_of(g, args.namespaces), group_name(g)) for g in range(args.groups)]
    all_groups.append((rollout_ns, ROLLOUT_GROUP))
    try:
        pids = {"kube-apiserver": apiserver, "etcd": etcd, "kwok": kwok.pid}
        window = Window(cluster, pids).start()
        operator.spawn()
        pids["operator"] = operator.pid
        window.cpu0["operator"] = 0.0
        progress(f"cold start: the operator on {len(all_groups)} groups")
        wait_for(
            f"all {len(all_groups)} groups published",
            functools.partial(assignments.reached, len(all_groups), operator.check),
            work_timeout(600, 0.3, len(all_groups)),
            interval=0.2,
        )
        cold = time.perf_counter() - operator.started_at
        seconds, cpu, api_figs = window.close()
        cold_rss = rss_mib(operator.pid)
        quiet_s = quiet(operator.pid, "the operator")
        rows["Cold start"] = [
            ["measure", "value", "note"],
            [
                f"operator start -> all {len(all_groups)} groups published",
                f"{cold:.1f} s",
                f"{len(all_groups) / cold:.0f} groups/s",
            ],
            [
                "operator CPU / RSS",
                f"{cpu['operator']:.1f} s / {cold_rss:.0f} MiB",
                f"{cold_rss * 1024 / len(all_groups):.1f} KiB of RSS per group",
            ],
            [
                "operator's mutating calls (ConfigMaps, groups, Topics, Events)",
                f"{api_figs.calls:.0f}",
                f"{api_figs.calls / seconds:.0f}/s; {api_figs.calls / len(all_groups):.1f} per group",
            ],
            [
                "  their latency at the API server p50 / p99",
                f"{ms(api_figs.quantile(0.5))} / {ms(api_figs.quantile(0.99))} ms",
                "",
            ],
            [
                "kube-apiserver / etcd / kwok CPU",
                " / ".join(f"{cpu[k]:.1f}" for k in ("kube-apiserver", "etcd", "kwok")) + " s",
                f"over {seconds:.1f} s",
            ],
            [
                "then until the operator was quiet (<10% of a core)",
                f"{quiet_s:.1f} s",
                "Events trickle at 20/s",
            ],
        ]

        # -- 2. the sidecars' watches: first every watcher's ConfigMap watch, then its Topic watch.
        watchers = WatcherProcess(cluster)
        member_pods = list(group_of_pod)[: args.watchers]
        specs = [(i, ns, group_of_pod[(ns, p)][1]) for i, (ns, p) in enumerate(member_pods)]
        fan_first = len(specs)
        specs += [(fan_first + k, rollout_ns, ROLLOUT_GROUP) for k in range(args.fanout)]
        kinds = [("ConfigMap by field selector", "configmap")]
        if not args.no_topic_watch:
            kinds.append(("namespace's Topics", "topics"))
        watch_rows: list[list[Any]] = [
            [
                "kube-apiserver, per watch",
                "watches",
                "open s",
                "CPU ms",
                "RSS KiB",
                "Go heap KiB",
                "idle CPU µs/s",
            ]
        ]
        before = apiserver_memory(cluster, apiserver)
        idle_cpu = idle_load(apiserver, args.idle)
        base_idle = idle_cpu
        watch_memory = 0.0
        for label, kind in kinds:
            progress(f"sidecar watches: opening {len(specs)} {label} watches")
            cpu0 = cpu_seconds(apiserver)
            open_s = watchers.open(specs, kind)
            open_cpu = cpu_seconds(apiserver) - cpu0
            errors = watchers.errors
            if len(errors) > len(specs) // 100:
                raise SystemExit(f"{len(errors)} watches failed, first: {errors[0]}")
            with_cpu = idle_load(apiserver, args.idle)  # also lets the Go heap settle before reading it
            after = apiserver_memory(cluster, apiserver)
            n = len(specs)
            rss_kib = (after[0] - before[0]) * 1024 / n
            heap_kib = (after[1] - before[1]) * 1024 / n
            watch_memory += max(rss_kib, heap_kib)
            watch_rows.append(
                [
                    f"+ {label} (list, then watch)",
                    n,
                    f"{open_s:.1f}",
                    f"{open_cpu / n * 1e3:.2f}",
                    f"{rss_kib:.1f}",
                    f"{heap_kib:.1f}",
                    f"{(with_cpu - idle_cpu) / n * 1e6:.2f}",
                ]
            )
            before, idle_cpu = after, with_cpu
        watch_rows.append(
            [
                "kube-apiserver RSS / Go heap in use at the end; idle CPU",
                len(specs) * len(kinds),
                "",
                "",
                f"{before[0]:.0f} MiB",
                f"{before[1]:.0f} MiB",
                f"{base_idle:.1%} -> {idle_cpu:.1%} of a core",
            ]
        )
        rows[f"Sidecar watches: {len(specs)} watchers, {len(kinds)} watches each"] = watch_rows
        watch_memory /= len(kinds)

        # -- 3. node loss.
        lost = spread_nodes(nodes, args.lost_nodes)
        lost_pods = {p for n in lost for p in pods_of_node[n] if p in group_of_pod}
        affected = {group_of_pod[p] for p in lost_pods}
        lost_names = {p[1] for p in lost_pods}
        if lost:
            progress(f"node loss: {len(lost)} nodes, {len(lost_pods)} pods, {len(affected)} groups")
            scenario(
                "Node loss",
                f"lost: {len(lost)} nodes ({len(lost_pods)} pods of {len(affected)} groups) deleted",
                cluster, api, pids, assignments, affected,
                lambda: delete_nodes(api, lost, [p for n in lost for p in pods_of_node[n]], args.workers),
                lambda key, members: not (members & lost_names),
                rows,
            )  # fmt: skip
        # -- 4. rolling restart of the rollout group, 25% surge, new pods Ready before old go.
        surge = max(1, args.fanout // 4)
        progress(f"rolling restart: {args.fanout} pods in steps of {surge}")
        live_nodes = [n for n in nodes if n not in lost]
        new_pods = [f"{ROLLOUT_GROUP}-v2-{k}" for k in range(args.fanout)]
        generations_before = assignments.count((rollout_ns, ROLLOUT_GROUP))

        v2 = {"app": ROLLOUT_GROUP, "pod-template-hash": "v2"}

        def roll() -> None:
            for start in range(0, args.fanout, surge):
                batch = range(start, min(start + surge, args.fanout))
                create = functools.partial(make_pod, rollout_ns)
                node_of = live_nodes.__getitem__
                run_parallel(
                    [functools.partial(create, new_pods[k], v2, node_of(k % len(live_nodes))) for k in batch],
                    args.workers,
                )
                keys = [(rollout_ns, new_pods[k]) for k in batch]
                wait_for(
                    "a surge batch Ready",
                    functools.partial(ready.all_ready, keys),
                    work_timeout(60, 0.05, len(keys)),
                    interval=0.05,
                )
                run_parallel(
                    [functools.partial(delete, api, rollout_ns, rollout_pods[k]) for k in batch], args.workers
                )

        wanted = frozenset(new_pods)
        scenario(
            "Rolling restart",
            f"the {args.fanout}-pod group '{ROLLOUT_GROUP}' (debounce 0), {surge} at a time",
            cluster, api, pids, assignments, {(rollout_ns, ROLLOUT_GROUP)},
            roll, lambda key, members: members == wanted, rows,
        )  # fmt: skip
        rows["Rolling restart"].append(
            [
                "generations published during it",
                str(assignments.count((rollout_ns, ROLLOUT_GROUP)) - generations_before),
                "",
            ]
        )

        # -- 5. fan-out of one change to the rollout group's watchers.
        progress(f"fan-out: {args.fanout_changes} changes to {args.fanout} watchers")
        key = (rollout_ns, ROLLOUT_GROUP)
        first_s, last_s, spread_s = [], [], []
        missed = 0
        fan = range(fan_first, fan_first + args.fanout)
        cpu0 = cpu_seconds(apiserver)
        for n in range(args.fanout_changes):
            generation = assignments.generation(key)
            t0 = time.perf_counter()
            set_ready(api, rollout_ns, new_pods[0], n % 2 == 1)
            try:
                wait_for(
                    f"{args.fanout} watchers to see generation {generation + 1}",
                    functools.partial(watchers.all_past, fan, generation),
                    work_timeout(60, 0.01, args.fanout),
                    interval=0.02,
                )
            except AssertionError as e:
                progress(f"fan-out: {e}")
            seen = [at for at in watchers.arrivals(fan, generation + 1) if at is not None]
            missed += args.fanout - len(seen)
            arrivals = seen or [math.nan]
            first_s.append(min(arrivals) - t0)
            last_s.append(max(arrivals) - t0)
            spread_s.append(max(arrivals) - min(arrivals))
        fan_cpu = cpu_seconds(apiserver) - cpu0
        rows["Fan-out of one change"] = [
            ["pod readiness change -> watchers of its group", "changes", "p50 ms", "max ms"],
            ["first of the watchers saw it", len(first_s), ms(percentile(first_s, 50)), ms(max(first_s))],
            [f"all {args.fanout} watchers saw it", len(last_s), ms(percentile(last_s, 50)), ms(max(last_s))],
            ["spread (last - first)", len(spread_s), ms(percentile(spread_s, 50)), ms(max(spread_s))],
            [
                "kube-apiserver CPU for all the changes",
                "",
                f"{fan_cpu * 1e3 / max(1, args.fanout_changes):.0f} ms a change",
                "",
            ],
            ["watches ended by the server and opened again (listed) so far", watchers.restarts, "", ""],
            ["watchers that had not seen a change when the wait gave up", missed, "", ""],
            ["watch errors (retried after 1 s)", len(watchers.errors), "", ""],
        ]

        # -- 6. zone outage.
        zone = ZONES[-1]
        zone_nodes = [n for i, n in enumerate(nodes) if zone_of(i, ZONES) == zone and n not in lost]
        zone_pods = [p for n in zone_nodes for p in pods_of_node[n]]
        zone_pods += [
            (rollout_ns, p) for k, p in enumerate(new_pods) if live_nodes[k % len(live_nodes)] in zone_nodes
        ]
        gone = {p[1] for p in zone_pods}
        hit = {group_of_pod.get(p, key) for p in zone_pods}
        progress(f"zone outage: {zone}, {len(zone_nodes)} nodes, {len(zone_pods)} pods, {len(hit)} groups")
        scenario(
            "Zone outage",
            f"{zone}: {len(zone_nodes)} nodes ({len(zone_pods)} pods of {len(hit)} groups) deleted",
            cluster, api, pids, assignments, hit,
            lambda: delete_nodes(api, zone_nodes, zone_pods, args.workers),
            lambda key, members: not (members & gone), rows,
        )  # fmt: skip
        operator.check()
        watchers.close()
        final_rss = {
            "kube-apiserver": rss_mib(apiserver),
            "etcd": rss_mib(etcd),
            "operator": rss_mib(operator.pid),
        }
        rows["Memory"] = [
            ["process", "after setup MiB", "at the end MiB"],
            *[
                [name, f"{base_rss[name]:.0f}" if name in base_rss else "-", f"{final_rss[name]:.0f}"]
                for name in final_rss
            ],
        ]
        model_rows(rows, watch_memory, api_figs.calls / len(all_groups))
    except BaseException:
        print(f"operator log tail:\n{operator.tail(40)}\nkwok log tail:\n{kwok.tail(20)}", file=sys.stderr)
        raise
    finally:
        operator.stop()
    for w in (pod_watch, cm_watch):
        w.stop()
        if w.restarts:
            progress(f"the bench's watch of {w.path} was listed again {w.restarts} times (last: {w.error!r})")


def spread_nodes(nodes: Sequence[str], count: int) -> list[str]:
    """``count`` nodes evenly spread over ``nodes`` (so over the zones and over many groups)."""
    if count <= 0:
        return []
    return [nodes[(i * len(nodes)) // count] for i in range(min(count, len(nodes)))]


def delete(api: KubeApi, namespace: str, name: str) -> None:
    """A pod deleted at once (grace period 0), as after its kubelet confirmed the containers stopped."""
    try:
        api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0})
    except ApiError as e:
        if e.status != 404:
            raise


def delete_nodes(api: KubeApi, nodes: Sequence[str], pods: Sequence[tuple[str, str]], workers: int) -> None:
    """Nodes lost: each Node deleted and its pods with it, one delete-collection per node and
    namespace (the node lifecycle controller's eviction and the pod garbage collector's work,
    without their waits)."""
    calls: list[Callable[[], object]] = [
        functools.partial(api.request, "DELETE", f"/api/v1/nodes/{n}") for n in nodes
    ]
    body = {"gracePeriodSeconds": 0}
    for ns in sorted({ns for ns, _ in pods}):
        path = f"/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3D"
        calls += [functools.partial(api.request, "DELETE", path + n, body) for n in nodes]
    run_parallel(calls, workers)


def scenario(
    title: str,
    what: str,
    cluster: LocalCluster,
    api: KubeApi,
    pids: dict[str, int],
    assignments: Assignments,
    groups: set[tuple[str, str]],
    act: Callable[[], None],
    accept: Callable[[tuple[str, str], frozenset[str]], bool],
    rows: dict[str, list[list[Any]]],
) -> None:
    window = Window(cluster, pids).start()
    t0 = time.perf_counter()
    act()
    acted = time.perf_counter() - t0
    done = assignments.wait_all(title.lower(), groups, t0, accept, work_timeout(300, 0.1, len(groups)))
    seconds, cpu, figs = window.close()
    times = sorted(at - t0 for at in done.values())
    rows[title] = [
        ["measure", "value", "note"],
        [what, f"{len(groups)} groups", f"the API calls took {acted:.1f} s"],
        [
            "-> every affected group published anew: p50 / p99 / last",
            " / ".join(spread(times)) + " s",
            f"{len(times) / max(times[-1], 1e-9):.0f} groups/s to the last",
        ],
        ["  the last one after the last API call", f"{times[-1] - acted:.2f} s", ""],
        [
            "operator's mutating calls / per second",
            f"{figs.calls:.0f} / {figs.calls / seconds:.0f}",
            f"{figs.calls / max(1, len(groups)):.1f} per group; all mutating calls {figs.all_mutating:.0f}",
        ],
        [
            "  their latency at the API server p50 / p99",
            f"{ms(figs.quantile(0.5))} / {ms(figs.quantile(0.99))} ms",
            "mutating calls within 1 s at p99: the SLO",
        ],
        [
            "CPU: operator / kube-apiserver / etcd / kwok",
            " / ".join(f"{cpu[k]:.1f}" for k in ("operator", "kube-apiserver", "etcd", "kwok")) + " s",
            f"over {seconds:.1f} s",
        ],
    ]


def model_rows(rows: dict[str, list[list[Any]]], watch_kib: float, writes_per_group: float) -> None:
    """The first model at Kubernetes' published limits, from this run's per-watch memory."""
    model = FleetModel(nodes=5000, pods=150_000, groups=20_000)
    node_hit = model.groups_hit_by_node_loss()
    zone_hit = model.groups_hit_by_zone_loss()
    held = model.watches()
    gib = held * watch_kib / 1024 / 1024

    def burst(hit: float, lost_share: float) -> str:
        events = model.burst_events(hit, lost_share)
        return f"{hit:,.0f}: {model.burst_writes(hit):,.0f} writes, {events:,.0f} events"

    steady = (
        f"{model.steady_writes_per_second():.1f} writes, {model.steady_events_per_second():.0f} watch events"
    )
    rocketmq = f"{model.rocketmq_nameserver_per_second():,.0f} / {model.rocketmq_broker_per_second():,.0f}"
    rows["Model: 5,000 nodes, 150,000 pods, 20,000 groups (from this run's figures)"] = [
        ["what", "mqbalance at the API server", "RocketMQ clients at NameServers / brokers"],
        ["watches held", f"{held:,} ({gib:.1f} GiB at {watch_kib:.1f} KiB each)", "-"],
        ["steady requests/s", steady, rocketmq],
        [
            "node loss (groups hit)",
            burst(node_hit, 1 / model.members_per_group),
            "unchanged: heartbeats notice it after 120 s",
        ],
        ["zone loss (groups hit)", burst(zone_hit, 1 / model.zones), "unchanged"],
        ["writes per published group measured here", f"{writes_per_group:.1f}", ""],
    ]


if __name__ == "__main__":
    sys.exit(main())
