"""The nemesis suite on real pods (``make test-chaos``): one fault at a time on three real nodes, each
after a seeded random delay, scored from what the consumer apps say they processed.

The chart, the example group with handover ``Release`` and a short lease, one consumer pod per
zone. Each pod's app (harness/consumer_app.py) processes its queues only under a valid grant and
records the intervals; a scraper thread reads every app's record through the pod's own loopback
(entered from the machine: a partitioned node's pods cannot be reached through the API server),
and a watcher keeps every published generation. Per fault, ``harness.nemesis`` scores the round:
overlapping owners, the longest time a queue went unprocessed, how long the operator took to
revoke the victim's queues, and the part of the gap after that against
``leaseSeconds + leaseMarginSeconds + 2 x the one-step latency``. The one-step latency is measured
in the first round, a plain readiness flip with no fault: from a generation's ``computedAt`` to the
apps that got it.

``MQBALANCE_NEMESIS_SEED`` (default 21) and ``MQBALANCE_NEMESIS_ROUNDS`` (rounds per fault,
default 1) vary the run; the seed and every delay are printed. ``MQBALANCE_NEMESIS_FAULTS`` picks
faults by key (comma-separated: partition, sigstop, kubelet, force-delete, api-restart,
operator-partition, sigkill). ``MQBALANCE_NEMESIS_APP_IGNORES_GRANT=1`` runs apps that ignore the
grant (harness/consumer_app.py): the test must then fail with two owners.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from harness import nemesis, node_host
from harness.netfault import FaultError, Faults
from harness.node import NODE_IP, Images, RealNode, containerd_roots, unavailable
from harness.node_workload import (
    GROUP,
    NAMESPACE,
    apply,
    apply_examples,
    assignment,
    consumer_deployment,
    install_chart,
    journal,
    kubectl_json,
    operator_pod,
    pods,
    wait_members,
)
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument
from tests.node.node_support import example_readable

LEASE, RENEW, MARGIN, RELEASE_TIMEOUT = 4.0, 1.0, 2.0, 1.0
NODE_GRACE = 16.0
"""The controller manager's --node-monitor-grace-period on a RealNode: a cut-off node's pods turn
NotReady (and their queues are revoked) only after it."""
SCRAPE = 0.5
"""Seconds between two reads of every app's record: the most a dead app's last interval is
overestimated by."""
MAX_DELAY = 2.0
"""The random delay before each fault: up to two renewals, so faults land anywhere in a renewal's cycle."""
SEED = int(os.environ.get("MQBALANCE_NEMESIS_SEED", "21"))
ROUNDS = int(os.environ.get("MQBALANCE_NEMESIS_ROUNDS", "1"))
FAULTS = os.environ.get("MQBALANCE_NEMESIS_FAULTS", "")
IGNORE_GRANT = os.environ.get("MQBALANCE_NEMESIS_APP_IGNORES_GRANT") == "1"
QUEUES = sorted(f"{t}/{q.broker_name}:{q.queue_id}" for t, qs in example_readable().items() for q in qs)
INTERVALS = "http://127.0.0.1:8080/intervals"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3D{GROUP}"


@pytest.fixture(scope="module")
def cluster(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    reason = unavailable(need_built=False, nodes=3)
    if reason is not None:
        pytest.fail(f"three real nodes cannot run here: {reason}")
    with RealNode(tmp_path_factory.mktemp("nemesis"), images=images, nodes=3) as real:
        yield real
    left = node_host.leftovers(NODE_IP, containerd_roots())
    assert left == [], f"the cluster left these behind: {left}"


class Scraper:
    """Reads every consumer app's record every ``SCRAPE`` seconds, from inside its pod's network
    namespace (``nsenter`` on the app's process): no API server needed, so a partitioned node's
    apps and a force-deleted pod's still running container are read too."""

    def __init__(self, cluster: RealNode, faults: Faults) -> None:
        self.cluster, self.faults = cluster, faults
        self.snapshots: dict[str, nemesis.Snapshots] = {}
        self.pids: dict[str, int] = {}
        self.reads = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis-scraper", daemon=True)
        self._pool = ThreadPoolExecutor(max_workers=4)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.read_all()
            self._stop.wait(max(0.0, SCRAPE - (time.monotonic() - began)))

    def read_all(self) -> set[str]:
        """Read every known app once; returns the pods that answered."""
        names: set[str] = set(self.snapshots)
        try:
            status, body = self.cluster.request("GET", PODS, timeout=5)
        except OSError:  # the API server restarting: read the apps already known
            status, body = 0, {}
        if status == 200:
            names |= {p["metadata"]["name"] for p in body["items"]}
        answered = [n for n, ok in zip(names, self._pool.map(self._read, names), strict=True) if ok]
        return set(answered)

    def _read(self, name: str) -> bool:
        pid = self.pids.get(name)
        if pid is None or not os.path.exists(f"/proc/{pid}"):
            try:
                pid = self.faults.container_pids(NAMESPACE, name, "app")[0]
            except Exception:  # gone, not started yet, or the API server away
                pid = None
            if pid is None:
                self._failed(name)
                return False
            self.pids[name] = pid
        argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "curl", "-sf", "-m", "1", INTERVALS]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(10), check=False)
        at = time.time()
        if result.returncode != 0:
            self.pids.pop(name, None)  # restarted: its next process is looked up again
            self._failed(name, at)
            return False
        record = json.loads(result.stdout)
        with self.lock:
            self.snapshots.setdefault(name, nemesis.Snapshots(name)).add(record, at)
            self.reads += 1
        return True

    def _failed(self, name: str, at: float | None = None) -> None:
        with self.lock:
            if name in self.snapshots:
                self.snapshots[name].failed(time.time() if at is None else at)

    def intervals(self, alive: set[str]) -> list[nemesis.Interval]:
        with self.lock:
            snaps = list(self.snapshots.values())
            return nemesis.intervals(snaps, {s.member: s.member in alive for s in snaps})

    def processing(self, fresh: float = 2.0) -> dict[str, set[str]]:
        """queue -> the pods whose latest record (read within ``fresh`` seconds) has it open."""
        now = time.time()
        result: dict[str, set[str]] = {}
        with self.lock:
            for snap in self.snapshots.values():
                if not snap.records:
                    continue
                boot = max(snap.records)
                if now - snap.read_at[boot] > fresh:
                    continue
                for item in snap.records[boot]["intervals"]:
                    if item.get("open"):
                        result.setdefault(item["queue"], set()).add(snap.member)
        return result

    def started_since(self, queue: str, since: float, other_than: str) -> bool:
        with self.lock:
            return any(
                item.get("open") and item["queue"] == queue and float(item["start"]) > since
                for snap in self.snapshots.values()
                if snap.member != other_than and snap.records
                for item in snap.records[max(snap.records)]["intervals"]
            )


@dataclass
class Documents:
    """Every generation published, polled from the ConfigMap by a thread."""

    cluster: RealNode
    by_generation: dict[int, AssignmentDocument] = field(default_factory=dict)
    revocations: set[tuple[str, float]] = field(default_factory=set)
    """(owner, since) of every revocation seen, polled or read from the operator's journal."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="nemesis-documents", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                doc = assignment(self.cluster)
            except Exception:  # the API server restarting
                doc = None
            if doc is not None:
                self.by_generation.setdefault(doc.generation, doc)
                self.revocations |= {(r.owner, r.since) for r in doc.releasing}
            self._stop.wait(0.2)

    def read_journal(self) -> None:
        """Add the revocations of the operator's journal: a revoking generation the owner
        acknowledges at once may live shorter than one poll."""
        with contextlib.suppress(Exception):  # the operator restarting: its next round's read has them
            for record in journal(self.cluster):
                self.revocations |= {(r.owner, r.since) for r in record.releasing}

    def revoked_after(self, at: float, owner: str | None) -> float | None:
        """The earliest revocation (``since``) after ``at`` of ``owner``'s queues (anyone's: None)."""
        times = [since for who, since in set(self.revocations) if since >= at and owner in (None, who)]
        return min(times) if times else None


@dataclass
class Round:
    fault: str
    victim: str | None
    delay: float
    fault_at: float = 0.0


class Nemesis:
    def __init__(self, cluster: RealNode, faults: Faults, rng: random.Random) -> None:
        self.cluster, self.faults, self.rng = cluster, faults, rng
        self.scraper = Scraper(cluster, faults)
        self.documents = Documents(cluster)
        self.scores: list[nemesis.FaultScore] = []
        self.step = 0.0

    # -- the state between faults --------------------------------------------------------------

    def settle(self) -> AssignmentDocument:
        """Three Ready members published, nothing being handed over, every queue processed by one pod."""
        wait_members(self.cluster, 3)

        def settled() -> AssignmentDocument | None:
            doc = assignment(self.cluster)
            if doc is None or doc.releasing or len(doc.members) != 3:
                return None
            processing = self.scraper.processing()
            whole = all(len(processing.get(q, ())) == 1 for q in QUEUES)
            return doc if whole else None

        return wait_for("three members, nothing released, every queue processed once", settled, 120, 0.25)

    def where(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(self.cluster)}

    def operator_node(self) -> str:
        name = operator_pod(self.cluster)
        items = pods(self.cluster, "app.kubernetes.io/component=operator", "mqbalance")
        return str(next(p["spec"]["nodeName"] for p in items if p["metadata"]["name"] == name))

    def handed_on(self, doc: AssignmentDocument, victim: str, since: float, timeout: float) -> None:
        """Wait until other pods process every queue ``victim`` held in ``doc``, begun after ``since``."""
        held = sorted(
            f"{t}/{q.broker_name}:{q.queue_id}" for t, qs in doc.queues_of(victim).items() for q in qs
        )
        assert held, f"{victim} holds nothing in generation {doc.generation}"

        def moved() -> bool:
            return all(self.scraper.started_since(q, since, victim) for q in held)

        wait_for(f"{victim}'s queues {held} processed by another pod", moved, timeout, 0.25)

    # -- one round -----------------------------------------------------------------------------

    def run(
        self, fault: str, act: Callable[[Round, AssignmentDocument], float], victim_on_other_node: bool
    ) -> None:
        doc = self.settle()
        where = self.where()
        operator_node = self.operator_node()
        candidates = sorted(p for p, n in where.items() if p in doc.members)
        if victim_on_other_node:
            candidates = [p for p in candidates if where[p] != operator_node]
        victim = self.rng.choice(candidates) if candidates else None
        one = Round(fault, victim, round(self.rng.uniform(0, MAX_DELAY), 2))
        started = time.time()
        time.sleep(one.delay)  # the random timing itself: where in a renewal's cycle the fault lands
        one.fault_at = time.time()
        healed = act(one, doc)
        self.faults.heal()
        self.settle()
        ended = time.time()
        step = max(self.step, self.measure_step(started, ended, other_than=victim) or 0.0)
        alive = self.scraper.read_all()
        found = self.scraper.intervals(alive)
        self.documents.read_journal()
        in_round = [i for i in found if i.end > started and i.start < ended]
        overlaps = nemesis.overlaps(found, since=started)
        longest = nemesis.gaps(found, QUEUES, one.fault_at, ended)[0]
        revoked = self.documents.revoked_after(one.fault_at, victim)
        score = nemesis.FaultScore(
            fault,
            one.delay,
            one.fault_at,
            len(in_round),
            overlaps,
            longest,
            None if revoked is None else revoked - one.fault_at,
            healed - one.fault_at,
            step,
            LEASE,
            MARGIN,
        )
        self.scores.append(score)
        print(
            f"nemesis {fault}: victim={victim} delay={one.delay:.2f}s intervals={len(in_round)} "
            f"overlaps={len(overlaps)} longest={longest.seconds:.1f}s ({longest.queue}) "
            f"revoked_after={score.detected_after} after_revocation={score.after_detection:.1f}s "
            f"held={score.held:.1f}s step={step:.2f}s bound={score.bound:.1f}s round={ended - started:.0f}s",
            flush=True,
        )
        for pair in overlaps:
            print(
                f"  overlap on {pair.queue}: {pair.first} and {pair.second} ({pair.seconds:.2f}s)", flush=True
            )
        assert in_round, f"{fault}: no processing interval seen in the round"

    # -- the faults ----------------------------------------------------------------------------

    def unready(self, one: Round, doc: AssignmentDocument) -> float:
        """The control: the victim's readiness probe fails, its queues move by release, it comes back."""
        assert one.victim is not None
        exec_ = ("exec", "-n", NAMESPACE, one.victim, "-c", "app", "--")
        self.cluster.kubectl(*exec_, "touch", "/tmp/unready")
        self.handed_on(doc, one.victim, one.fault_at, 60)
        self.cluster.kubectl(*exec_, "rm", "/tmp/unready")
        return time.time()

    def partition_api(self, one: Round, doc: AssignmentDocument) -> float:
        assert one.victim is not None
        node = self.where()[one.victim]
        self.faults.partition(node, api=True)
        self.handed_on(doc, one.victim, one.fault_at, NODE_GRACE + LEASE + MARGIN + 60)
        self.faults.heal()
        healed = time.time()
        wait_for(f"{node} Ready again", lambda: self.cluster.node_ready(node) or None, 60, 0.5)
        return healed

    def sigstop(self, one: Round, doc: AssignmentDocument) -> float:
        assert one.victim is not None
        self.faults.pause(NAMESPACE, one.victim, "app")
        time.sleep(2 * LEASE)  # the fault's own length: stopped for twice the lease
        self.faults.resume(NAMESPACE, one.victim, "app")
        return time.time()

    def kubelet_kill(self, one: Round, doc: AssignmentDocument) -> float:
        assert one.victim is not None
        node = self.where()[one.victim]
        self.faults.kill_kubelet(node)
        self.handed_on(doc, one.victim, one.fault_at, NODE_GRACE + 60)
        self.faults.restart_kubelet(node)
        return time.time()

    def force_delete(self, one: Round, doc: AssignmentDocument) -> float:
        """The kubelet killed first, so the force-deleted pod's containers keep running."""
        assert one.victim is not None
        node = self.where()[one.victim]
        self.faults.kill_kubelet(node)
        self.cluster.kubectl(
            "delete", "pod", "-n", NAMESPACE, one.victim, "--grace-period=0", "--force", "--wait=false"
        )
        self.handed_on(doc, one.victim, one.fault_at, LEASE + MARGIN + 60)
        self.faults.restart_kubelet(node)
        return time.time()

    def api_restart(self, one: Round, doc: AssignmentDocument) -> float:
        self.cluster.restart_apiserver()  # returns once it is ready again
        return time.time()

    def operator_partition(self, one: Round, doc: AssignmentDocument) -> float:
        """The operator's node cut off from the API server for twice the member lease."""
        node = self.operator_node()
        self.faults.partition(node, api=True)
        time.sleep(2 * LEASE)  # the fault's own length
        self.faults.heal()
        healed = time.time()
        wait_for(f"{node} Ready again", lambda: self.cluster.node_ready(node) or None, 60, 0.5)
        return healed

    def sigkill(self, one: Round, doc: AssignmentDocument) -> float:
        assert one.victim is not None
        pids = self.faults.container_pids(NAMESPACE, one.victim, "app")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

        def restarted() -> bool:
            try:
                return bool(self.faults.container_pids(NAMESPACE, one.victim or "", "app")) and not any(
                    os.path.exists(f"/proc/{p}") for p in pids
                )
            except FaultError:
                return False

        wait_for(f"{one.victim}'s app restarted", restarted, 60, 0.25)
        return time.time()

    def measure_step(self, since: float, until: float, other_than: str | None = None) -> float | None:
        """The one-step latency of the generations computed between ``since`` and ``until``: until
        an app began processing under them (a fault's victim left out: its delay is the fault's);
        None when no app began a queue under one of them."""
        computed = {
            g: d.computed_at
            for g, d in self.documents.by_generation.items()
            if since <= d.computed_at <= until
        }
        found = [i for i in self.scraper.intervals(self.scraper.read_all()) if i.member != other_than]
        try:
            return nemesis.step_latency(found, computed)
        except ValueError:
            return None


@pytest.mark.chaos
def test_one_owner_per_queue_and_a_bounded_gap_under_each_fault(cluster: RealNode, images: Images) -> None:
    began = time.time()
    rng = random.Random(SEED)
    print(
        f"nemesis seed={SEED} rounds={ROUNDS} faults={FAULTS or 'all'} app_ignores_grant={IGNORE_GRANT}",
        flush=True,
    )
    faults = Faults(cluster)
    cluster.kubectl("create", "namespace", NAMESPACE)
    install_chart(cluster, images, groups=[GROUP])
    apply_examples(cluster, debounce=0)
    group = kubectl_json(cluster, "get", "consumergroup", "-n", NAMESPACE, GROUP)
    group["spec"]["handover"] = {
        "mode": "Release",
        "releaseTimeoutSeconds": RELEASE_TIMEOUT,
        "leaseSeconds": LEASE,
        "renewSeconds": RENEW,
        "leaseMarginSeconds": MARGIN,
    }
    apply(cluster, group)
    deployment = consumer_deployment(images, replicas=3, spread_zones=True)
    if IGNORE_GRANT:
        app = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "app")
        app.setdefault("env", []).append({"name": "IGNORE_GRANT", "value": "1"})
    apply(cluster, deployment)
    run = Nemesis(cluster, faults, rng)
    run.scraper.start()
    run.documents.start()
    try:
        run.run("unready (no fault)", run.unready, victim_on_other_node=False)
        run.step = run.scores[0].step  # the floor of every later round's one-step latency
        print(
            f"nemesis set-up and control round {time.time() - began:.0f}s, one-step latency {run.step:.2f}s",
            flush=True,
        )
        plan: list[tuple[str, str, Callable[[Round, AssignmentDocument], float], bool]] = [
            ("partition", "node cut off from the API server", run.partition_api, True),
            ("sigstop", "consumer SIGSTOP for 2 x lease", run.sigstop, False),
            ("kubelet", "kubelet killed", run.kubelet_kill, True),
            ("force-delete", "pod force-deleted, container running", run.force_delete, True),
            ("api-restart", "API server restart", run.api_restart, False),
            ("operator-partition", "operator's node cut off", run.operator_partition, False),
            ("sigkill", "consumer SIGKILL", run.sigkill, False),
        ]
        chosen = [p for p in plan if not FAULTS or p[0] in FAULTS.split(",")]
        assert chosen, f"MQBALANCE_NEMESIS_FAULTS={FAULTS!r} names no fault of {[p[0] for p in plan]}"
        for _ in range(ROUNDS):
            for _key, name, act, other_node in chosen:
                run.run(name, act, other_node)
    finally:
        run.scraper.stop()
        run.documents.stop()
        print(nemesis.table(run.scores), flush=True)
        print(f"nemesis reads={run.scraper.reads} took={time.time() - began:.0f}s", flush=True)
    assert run.scraper.reads > 0
    for score in run.scores:
        if score.fault != "consumer SIGKILL":
            assert score.overlaps == [], f"{score.fault}: two owners {score.overlaps}"
        if score.detected_after is not None:
            assert score.after_detection <= score.bound, (
                f"{score.fault}: {score.longest} unconsumed {score.after_detection:.1f}s after the revocation"
            )
