"""End to end with real messages: one workload, several ways of balancing consumers, side by side.

A producer sends keyed messages at a steady rate to a real RocketMQ (each key always to one
queue). Every variant is one RocketMQ consumer group of push consumers (clients/java's
``E2eConsumer``, and in the mixed variants clients/go's consumer) consuming the whole topic; all
variants run at the same time, against the same messages, and go through the same membership
script: members join, one is SIGKILLed, one leaves cleanly, another joins. Afterwards each
variant is scored from what its consumers wrote down:

- lost: messages the broker stored (SEND_OK) that no member of the group ever consumed;
- duplicates: consumptions beyond the first of the same (broker, queue, offset);
- longest gap: the longest time any queue went without a consumption while messages kept coming;
- order violations: a key's message consumed for the first time after a later message of the same key.

Variants (``VARIANTS``):

- ``rocketmq``: plain push consumers, RocketMQ's own client-side rebalance (AVG);
- ``mqbalance``: the same consumers with ``SidecarPushConsumer``; every member is a pod acted out
  on the local control plane (``harness.kube.kubelet``) with its own sidecar, and the real operator
  assigns the queues (STICKY by default).

- ``mqbalance-handover``: the same with ``spec.handover`` Release (revoke, release, then assign),
  and pods that terminate before they go, as Kubernetes runs them;
- ``rocketmq-orderly``: as ``rocketmq`` with orderly consumers (``MessageListenerOrderly``: one
  queue at a time, under the broker's lock);
- ``mqbalance-orderly``: as ``mqbalance-handover`` with ``spec.handover`` Orderly and orderly
  consumers;
- ``mixed-rocketmq`` and ``mixed-handover``: as ``rocketmq`` and ``mqbalance-handover`` with every
  odd member a Go consumer (clients/go's ``e2e/consumer``: rocketmq-client-go v2, the same
  arguments and records), so one group has Java and Go members at once.

RocketMQ and the Java members are of one release (``world(version=...)``: its servers, and
clients/java built against its client line).

For the mqbalance variants the operator's journal also gives each queue that moved between live
members, and how long it went unconsumed (``harness.e2e_moves``).
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness import polling
from harness.apps.operator import OperatorProcess
from harness.apps.sidecar import SidecarProcess
from harness.e2e_moves import (
    MoveFigures,
    TraceFigures,
    figures,
    journal_moves,
    move_lines,
    trace_figures,
    with_first_consumption,
)
from harness.kube import kubelet
from harness.kube.api import KubeApi
from harness.kube.cluster import CRD_NAMES, LocalCluster
from harness.paths import REPO
from harness.processes.managed import ManagedProcess
from harness.rocketmq.releases import CURRENT_VERSION, DEFAULT_VERSION, is_5x
from harness.rocketmq.resources import topic_resource
from harness.rocketmq.server import RocketMQ
from mqbalance.contract import APPROVE_ANNOTATION
from mqbalance.journal import JournalRecord

JAVA_MODULE = REPO / "clients" / "java"
NAMESPACE = "e2e"
TOPIC = "e2e"
BROKERS = ("broker-a", "broker-b")
QUEUES_PER_BROKER = 4
NODE = "e2e-node"
_JVM = ("-Xms32m", "-Xmx96m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k")


def _log_root(directory: Path) -> tuple[str, str]:
    """Where RocketMQ's client logs: 4.x reads rocketmq.client.logRoot (ClientLogger), 5.x
    rocketmq.log.root (its rmq.client.logback.xml); otherwise ~/logs/rocketmqlogs."""
    return (f"-Drocketmq.client.logRoot={directory}", f"-Drocketmq.log.root={directory}")


class E2eError(RuntimeError):
    """The scenario could not run; the message carries the relevant logs."""


# -- Java -------------------------------------------------------------------------------------


def client_profile(version: str) -> tuple[str, Path]:
    """clients/java's Maven profile that builds against ``version``'s client line, and its build
    directory: ``rocketmq4`` for 4.x, ``rocketmq55`` for the current line, none for 5.3.3."""
    if not is_5x(version):
        return "rocketmq4", JAVA_MODULE / "target" / "rocketmq4"
    if version == CURRENT_VERSION:
        return "rocketmq55", JAVA_MODULE / "target" / "rocketmq55"
    return "", JAVA_MODULE / "target"


def java_classpath(version: str = DEFAULT_VERSION) -> str:
    """Compile clients/java (main and test sources) against ``version``'s client and return the
    classpath of its programs."""
    profile, target = client_profile(version)
    out = target / "test-classpath.txt"
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise E2eError("java and mvn are needed: `make rocketmq` installs them (Debian's JDK 17 and Maven)")
    argv = [
        "mvn", "-B", "-q", "-f", str(JAVA_MODULE / "pom.xml"), *(("-P", profile) if profile else ()),
        "test-compile", "dependency:build-classpath", f"-Dmdep.outputFile={out}", "-Dmdep.includeScope=test",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise E2eError(f"building clients/java failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    deps = out.read_text().strip()
    return os.pathsep.join([str(target / "classes"), str(target / "test-classes"), deps])


def build_go_consumer() -> Path:
    """Build clients/go's e2e consumer (its modules fetched once into the cache) and return it."""
    script = REPO / "hack" / "build-go-client.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise E2eError(f"{script} failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


class JavaProgram(ManagedProcess):
    """One JVM running an e2e program in a session of its own, its output in a log file, 'started'
    awaited; its standard input a pipe. No parent-death signal: members are started from
    short-lived pool threads, and Linux ties that signal to the starting thread."""

    live: ClassVar[set[JavaProgram]] = set()
    """Every program started and not yet killed: :func:`world` kills what is left (an
    interrupted run; each JVM has a session of its own, so nothing else would)."""

    tail_lines = 30
    scale_grace = False

    def __init__(self, classpath: str, main: str, args: Sequence[str], log: Path) -> None:
        argv = ["java", *_JVM, "-cp", classpath, *_log_root(log.parent), main, *args]
        super().__init__(log.stem, argv, None, log, E2eError, group=True, stdin=subprocess.PIPE, cwd=None)
        JavaProgram.live.add(self)

    def start(self, timeout: float = 120.0, attempts: int = 3) -> None:
        """Start and wait for 'started'. A JVM that exits first is started again: on a loaded
        machine RocketMQ's client can fail its first NameServer request and give up in start()."""
        for attempt in range(attempts):
            self.spawn()
            try:
                outcome = polling.wait_for(
                    f"{self.log.name} to start",
                    self._started_or_exited,
                    timeout,
                    0.05,
                    E2eError,
                    details=self.tail,
                )
            except E2eError:
                self.kill()
                raise
            if outcome == "started":
                return
            if attempt + 1 == attempts:
                assert self.proc is not None
                raise E2eError(f"{self.log.name}: exited with {self.proc.returncode}:\n{self.tail()}")

    def _started_or_exited(self) -> str | None:
        if "started" in self.log.read_text(errors="replace"):
            return "started"
        return "exited" if self.proc is not None and self.proc.poll() is not None else None

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no offset persisted, the TCP connections closed by the kernel."""
        super().kill()
        JavaProgram.live.discard(self)

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM: the JVM's shutdown hook shuts the client down cleanly (SIGKILL after ``timeout``)."""
        self.stop(timeout)

    def close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def wait(self, timeout: float) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class GoProgram(JavaProgram):
    """clients/go's e2e consumer: the same arguments, output and signals as the Java member (SIGTERM
    shuts the consumer down cleanly), started and awaited the same way."""

    def __init__(self, binary: Path, args: Sequence[str], log: Path) -> None:
        argv = [str(binary), *args]
        pipe = subprocess.PIPE
        ManagedProcess.__init__(self, log.stem, argv, None, log, E2eError, group=True, stdin=pipe, cwd=None)
        JavaProgram.live.add(self)


# -- the world ----------------------------------------------------------------------------------


@dataclass
class World:
    """What every variant shares: RocketMQ, the control plane, the operator, the Java classpath."""

    workdir: Path
    mq: RocketMQ
    cluster: LocalCluster
    api: KubeApi
    classpath: str
    operator: OperatorProcess | None = None

    go_consumer: Path | None = None
    """clients/go's e2e consumer, built by the first Go member (hack/build-go-client.sh)."""

    def consumer(
        self,
        group: str,
        name: str,
        mode: str,
        sidecar: str | None = None,
        listener: str = "concurrently",
        language: str = "java",
    ) -> JavaProgram:
        """A member: clients/java's E2eConsumer, or (``language="go"``) clients/go's consumer,
        which takes the same arguments and writes the same records."""
        args = [
            "--namesrv", self.mq.namesrv_addr, "--group", group, "--topic", TOPIC, "--mode", mode,
            "--name", name, "--out", str(self.workdir / f"{group}.{name}.tsv"), "--listener", listener,
        ]  # fmt: skip
        if sidecar is not None:
            args += ["--sidecar", sidecar]
        log = self.workdir / f"{group}.{name}.log"
        if language == "go":
            if self.go_consumer is None:
                self.go_consumer = build_go_consumer()
            return GoProgram(self.go_consumer, args, log)
        return JavaProgram(self.classpath, "io.mqbalance.rocketmq.e2e.E2eConsumer", args, log)

    def group_status(self, group: str) -> dict[str, Any]:
        """The ConsumerGroup ``group``'s status as the operator last wrote it."""
        out = self.cluster.kubectl("get", "consumergroup", group, "-n", NAMESPACE, "-o", "json").stdout
        return dict(json.loads(out).get("status") or {})


@contextlib.contextmanager
def world(workdir: Path | None = None, version: str = DEFAULT_VERSION) -> Iterator[World]:
    """RocketMQ of ``version`` with the topic, a control plane with the CRDs, a node and the Topic,
    and the operator; the Java programs built against the client of ``version``'s line."""
    own = workdir is None
    path = Path(tempfile.mkdtemp(prefix="mqbalance-e2e-")) if workdir is None else workdir
    path.mkdir(parents=True, exist_ok=True)
    classpath = java_classpath(version)
    try:
        with RocketMQ(version, brokers=BROKERS) as mq, LocalCluster() as cluster:
            mq.create_topic(TOPIC, QUEUES_PER_BROKER)
            cluster.apply_crds(REPO / "crds", CRD_NAMES)
            cluster.kubectl("create", "namespace", NAMESPACE)
            topic = topic_resource(TOPIC, NAMESPACE, BROKERS, QUEUES_PER_BROKER)
            cluster.kubectl("apply", "-f", "-", input=_json(topic))
            api = cluster.api
            kubelet.create_node(api, NODE, "zone-a")
            w = World(path, mq, cluster, api, classpath)
            # The NameServer: OffsetResets find the brokers of the (static) Topic's queues there.
            flags = ("--log-level", "WARNING", "--name-server", mq.namesrv_addr)
            w.operator = OperatorProcess(cluster, [NAMESPACE], path, *flags, error=E2eError)
            w.operator.start(timeout=120)
            try:
                yield w
            finally:
                for program in list(JavaProgram.live):
                    program.kill()
                w.operator.stop()
    finally:
        if own and not os.environ.get("MQBALANCE_KEEP_LOGS"):
            shutil.rmtree(path, ignore_errors=True)


def _json(doc: Any) -> str:
    return json.dumps(doc)


# -- variants -----------------------------------------------------------------------------------


class Variant(abc.ABC):
    """One way of balancing the group's consumers; members are numbered 0, 1, 2..."""

    name: ClassVar[str]
    listener: ClassVar[str] = "concurrently"
    """The consumers' message listener: ``concurrently`` or ``orderly``."""

    def __init__(self, world: World, tag: str = "") -> None:
        self.world = world
        self.group = f"e2e-{tag}-{self.name}" if tag else f"e2e-{self.name}"
        self.killed: set[str] = set()
        """Consumer names (pod names) that were SIGKILLed."""
        self.killed_at: dict[str, float] = {}
        """When (unix time) each of ``killed`` was SIGKILLed."""
        self.left: dict[str, float] = {}
        """Consumer names that left the group cleanly while the script ran (not at the end), and
        when (unix time) their leaving began."""
        self.started_at: dict[str, float] = {}
        """When (unix time) each member's consumer was last started (joined, or restarted after a crash)."""

    @abc.abstractmethod
    def member(self, i: int) -> str:
        """Member ``i``'s consumer name (its pod's name), as the journal and the records name it."""

    def language(self, i: int) -> str:
        """Member ``i``'s client: ``java`` (clients/java's E2eConsumer) or ``go`` (clients/go's)."""
        return "java"

    def setup(self) -> None:  # noqa: B027 (a hook: most variants need nothing before the first member)
        """Before the first member starts."""

    @abc.abstractmethod
    def join(self, i: int) -> None: ...

    @abc.abstractmethod
    def kill(self, i: int) -> None: ...

    @abc.abstractmethod
    def leave(self, i: int) -> None: ...

    @abc.abstractmethod
    def stop_all(self) -> None: ...

    def consuming(self, i: int) -> None:
        """Wait until member ``i``'s consumer, as last started, has consumed a message: a step that
        acts on a consuming member (kill, freeze) or on its return after a crash must follow the
        event, not a guess at how long a JVM takes to start and get queues on a busy machine."""
        name = self.member(i)
        since_ms = self.started_at[name] * 1000

        def consumed() -> bool:
            records = consumed_records(self.world.workdir, self.group)
            return any(r[6] == name and r[0] >= since_ms for r in records)

        polling.wait_for(f"{name} of {self.group} to consume a message", consumed, 60, 0.2, E2eError)

    crash_restart_seconds: ClassVar[float] = 5.0
    """How long after a ``crash`` the member's container is started again (its JVM then starts)."""

    def crash(self, i: int) -> None:
        """SIGKILL member ``i``'s consumer; the kubelet starts its container again
        ``crash_restart_seconds`` later (the pod, for mqbalance, stays)."""
        raise NotImplementedError(f"{self.name} has no crash")


class RocketMQVariant(Variant):
    """Plain push consumers: RocketMQ's own client-side rebalance, AVG."""

    name = "rocketmq"

    def __init__(self, world: World, tag: str = "") -> None:
        super().__init__(world, tag)
        self.members: dict[int, JavaProgram] = {}

    def member(self, i: int) -> str:
        return f"c{i}"

    def join(self, i: int) -> None:
        program = self.world.consumer(
            self.group, self.member(i), "rocketmq", listener=self.listener, language=self.language(i)
        )
        self.started_at[self.member(i)] = time.time()
        program.start()
        self.members[i] = program

    def kill(self, i: int) -> None:
        self.killed_at[self.member(i)] = time.time()
        self.members.pop(i).kill()
        self.killed.add(self.member(i))

    def leave(self, i: int) -> None:
        self.members.pop(i).terminate()

    def crash(self, i: int) -> None:
        self.kill(i)
        time.sleep(self.crash_restart_seconds)
        self.join(i)

    def stop_all(self) -> None:
        for i in list(self.members):
            self.leave(i)


@dataclass
class _Pod:
    name: str
    sidecar: SidecarProcess
    consumer: JavaProgram


class MqbalanceVariant(Variant):
    """Push consumers with SidecarPushConsumer; pods on the local control plane, the operator assigns."""

    name = "mqbalance"
    kubelet_notice_seconds: ClassVar[float] = 1.0
    """How long a kubelet takes to see a killed container (PLEG relist) and turn the pod not Ready."""

    def group_spec(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "topics": [TOPIC],
            "selector": {"matchLabels": {"app": self.group}},
            "messageModel": "CLUSTERING",
            "strategy": {"name": "STICKY"},
            "debounceSeconds": 0,
        }

    def __init__(self, world: World, tag: str = "") -> None:
        super().__init__(world, tag)
        self.pods: dict[int, _Pod] = {}
        self.marked_ms = 0

    def setup(self) -> None:
        doc = {
            "apiVersion": "mqbalance.io/v1alpha1",
            "kind": "ConsumerGroup",
            "metadata": {"name": self.group, "namespace": NAMESPACE},
            "spec": self.group_spec(),
        }
        self.world.cluster.kubectl("apply", "-f", "-", input=_json(doc))

    def member(self, i: int) -> str:
        return f"{self.group}-{i}"

    def join(self, i: int) -> None:
        name = self.member(i)
        kubelet.create_pod(self.world.api, NAMESPACE, name, {"app": self.group}, NODE)
        sidecar = SidecarProcess(
            self.world.cluster.kubeconfig,
            self.world.workdir / f"sidecar-{name}.log",
            "--pod-name", name, "--namespace", NAMESPACE, "--group", self.group, "--no-topics",
            metrics=False,
            env={"MQBALANCE_LOG_LEVEL": "INFO"},  # INFO: its move lines, for the trace
            error=E2eError,
        )  # fmt: skip
        sidecar.start()
        consumer = self.world.consumer(
            self.group, name, "mqbalance", f"http://127.0.0.1:{sidecar.port}", self.listener, self.language(i)
        )
        self.started_at[name] = time.time()
        try:
            consumer.start()
        except BaseException:
            sidecar.stop()
            raise
        # The container is up: its readiness probe passes and the kubelet reports it Ready.
        kubelet.set_pod_ready(self.world.api, NAMESPACE, name, True)
        self.pods[i] = _Pod(name, sidecar, consumer)

    def kill(self, i: int) -> None:
        pod = self.pods.pop(i)
        self.killed_at[pod.name] = time.time()
        pod.consumer.kill()
        self.killed.add(pod.name)
        time.sleep(self.kubelet_notice_seconds)
        kubelet.set_pod_ready(self.world.api, NAMESPACE, pod.name, False)
        pod.sidecar.stop()
        kubelet.delete_pod(self.world.api, NAMESPACE, pod.name, wait=False)

    kubelet_notices_crash: ClassVar[bool] = True
    """Whether the pod turns NotReady ``kubelet_notice_seconds`` after a ``crash`` (False: the
    kubelet is slow to notice, and only the sidecar sees the consumer go)."""

    def crash(self, i: int) -> None:
        """The consumer container crashes (SIGKILL) and is started again, in the same pod with the same
        sidecar: NotReady once the kubelet notices, Ready again once the new JVM has started."""
        pod = self.pods[i]
        self.killed_at[pod.name] = time.time()
        pod.consumer.kill()
        self.killed.add(pod.name)
        restart_at = time.monotonic() + self.crash_restart_seconds
        if self.kubelet_notices_crash:
            time.sleep(self.kubelet_notice_seconds)
            kubelet.set_pod_ready(self.world.api, NAMESPACE, pod.name, False)
        time.sleep(max(0.0, restart_at - time.monotonic()))
        consumer = self.world.consumer(
            self.group,
            pod.name,
            "mqbalance",
            f"http://127.0.0.1:{pod.sidecar.port}",
            self.listener,
            self.language(i),
        )
        self.started_at[pod.name] = time.time()
        consumer.start()
        kubelet.set_pod_ready(self.world.api, NAMESPACE, pod.name, True)
        self.pods[i] = _Pod(pod.name, pod.sidecar, consumer)

    def leave(self, i: int) -> None:
        # A deleted pod is terminating at once (the operator drops it) and gets SIGTERM.
        pod = self.pods.pop(i)
        kubelet.delete_pod(self.world.api, NAMESPACE, pod.name, wait=False)
        pod.consumer.terminate()
        pod.sidecar.stop()

    def stop_all(self) -> None:
        for i in list(self.pods):
            self.leave(i)

    def freeze(self, i: int) -> None:
        """SIGSTOP member ``i``'s consumer (a stalled JVM, a long GC): alive, its sidecar renewing."""
        self._signal(i, signal.SIGSTOP)

    def thaw(self, i: int) -> None:
        """SIGCONT member ``i``'s consumer: it carries on where it stopped."""
        self._signal(i, signal.SIGCONT)

    def _signal(self, i: int, sig: signal.Signals) -> None:
        proc = self.pods[i].consumer.proc
        assert proc is not None
        os.kill(proc.pid, sig)

    def pause(self, _member: int) -> None:
        """``spec.paused``: every member gives up its queues (through the handover, if on)."""
        self._set_paused(True)

    def resume(self, _member: int) -> None:
        self._set_paused(False)

    def mark(self, _member: int) -> None:
        """Remember this moment: the time a later ``reset`` rewinds the group to."""
        self.marked_ms = int(time.time() * 1000)

    def reset(self, _member: int) -> None:
        """An OffsetReset of the group to the time of the last ``mark``, approved as it is created
        (as automation approves it), followed until it ended; its name is ``reset_name``."""
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.marked_ms / 1000))
        doc = {
            "apiVersion": "mqbalance.io/v1alpha1",
            "kind": "OffsetReset",
            "metadata": {
                "name": self.reset_name,
                "namespace": NAMESPACE,
                "annotations": {APPROVE_ANNOTATION: "true"},
            },
            "spec": {"group": self.group, "to": {"time": f"{at}.{self.marked_ms % 1000:03d}Z"}},
        }
        self.world.cluster.kubectl("apply", "-f", "-", input=_json(doc))

        def ended() -> bool:
            got = self.world.cluster.kubectl(
                "get", "offsetreset", self.reset_name, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}"
            )
            return got.stdout.strip() in ("Succeeded", "Failed")

        polling.wait_for(f"OffsetReset {self.reset_name} to end", ended, 120, 0.2, E2eError)

    @property
    def reset_name(self) -> str:
        return f"{self.group}-rewind"

    def _set_paused(self, paused: bool) -> None:
        patch = _json({"spec": {"paused": paused}})
        self.world.cluster.kubectl(
            "patch", "consumergroup", self.group, "-n", NAMESPACE, "--type=merge", "-p", patch
        )


class MqbalanceHandoverVariant(MqbalanceVariant):
    """As ``mqbalance``, with spec.handover Release: a queue moves only after its old owner's
    consumer dropped it, persisted its offset and released it through the sidecar; a leaving pod
    is terminating first (its sidecar keeps serving: the chart's preStop, ``mqbalance drain``) while
    its consumer shuts down and releases everything, and only then goes."""

    name = "mqbalance-handover"
    mode: ClassVar[str] = "Release"
    release_timeout: ClassVar[float] = 120.0
    """Far above a release's usual 0.1-2 s: an override here means a release that never came, not a
    consumer JVM slowed by a busy machine (the tests assert none was overridden)."""

    def group_spec(self) -> dict[str, Any]:
        return {
            **super().group_spec(),
            "handover": {"mode": self.mode, "releaseTimeoutSeconds": self.release_timeout},
        }

    def leave(self, i: int) -> None:
        pod = self.pods.pop(i)
        kubelet.mark_terminating(self.world.api, NAMESPACE, pod.name)
        pod.consumer.terminate()  # SIGTERM: consumer.shutdown() persists offsets, then releases all
        pod.sidecar.client.drain(timeout=self.release_timeout)  # the preStop hook
        pod.sidecar.stop()
        kubelet.delete_pod(self.world.api, NAMESPACE, pod.name, wait=False)


class RocketMQOrderlyVariant(RocketMQVariant):
    """RocketMQ's own rebalance with orderly consumers (the broker's lock keeps a queue to one)."""

    name = "rocketmq-orderly"
    listener = "orderly"


class MqbalanceOrderlyVariant(MqbalanceHandoverVariant):
    """mqbalance with spec.handover Orderly and orderly consumers."""

    name = "mqbalance-orderly"
    listener = "orderly"
    mode = "Orderly"


class MqbalanceOrderlyLeaseVariant(MqbalanceOrderlyVariant):
    """As ``mqbalance-orderly`` with short member Leases (6 s, renewed every 2 s, a 2 s margin): a
    member known stopped is handed on, and its broker locks released, 8 s after its revocation."""

    name = "mqbalance-orderly-lease"
    lease: ClassVar[dict[str, float]] = {"leaseSeconds": 6, "renewSeconds": 2, "leaseMarginSeconds": 2}

    def group_spec(self) -> dict[str, Any]:
        spec = super().group_spec()
        return {**spec, "handover": {**spec["handover"], **self.lease}}


class MixedRocketMQVariant(RocketMQVariant):
    """A group of Java and Go push consumers (odd members Go) under their own clients' rebalance:
    each computes its share alone, Java's AllocateMessageQueueAveragely beside rocketmq-client-go's
    AllocateByAveragely, from member lists read at different moments."""

    name = "mixed-rocketmq"

    def language(self, i: int) -> str:
        return "go" if i % 2 else "java"


class MqbalanceUnnoticedCrashVariant(MqbalanceHandoverVariant):
    """As ``mqbalance-handover``, on a kubelet that does not notice a crashed consumer container before
    it runs again (its pod stays Ready): only the sidecar, whose connections from it close, sees it go."""

    name = "mqbalance-handover-unnoticed"
    kubelet_notices_crash = False


class MixedHandoverVariant(MqbalanceHandoverVariant):
    """The same mixed group through the sidecars with spec.handover Release: Java members through
    SidecarPushConsumer, Go members through clients/go's PushConsumer."""

    name = "mixed-handover"

    def language(self, i: int) -> str:
        return "go" if i % 2 else "java"


VARIANTS: dict[str, type[Variant]] = {
    v.name: v
    for v in (
        RocketMQVariant,
        MqbalanceVariant,
        MqbalanceHandoverVariant,
        RocketMQOrderlyVariant,
        MqbalanceOrderlyVariant,
        MqbalanceOrderlyLeaseVariant,
        MqbalanceUnnoticedCrashVariant,
        MixedRocketMQVariant,
        MixedHandoverVariant,
    )
}


# -- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    at: float
    """Fraction of the sending time."""
    action: str
    """join, kill or leave; crash (SIGKILL, the container started again) a member's consumer; freeze
    (SIGSTOP) or thaw (SIGCONT) a member's consumer; consuming: wait until a member's consumer, as last
    started, has consumed (later steps and the sending stretch by the wait); pause or resume
    the group, mark a time and reset the group's offsets to it (mqbalance variants; ``member``
    unused by the last four)."""
    member: int


SCRIPT = (
    Step(0.2, "join", 3),
    Step(0.4, "kill", 1),
    Step(0.6, "leave", 0),
    Step(0.8, "join", 4),
)
"""Start with members 0, 1, 2; then a join, a SIGKILL, a clean leave and another join."""


@dataclass
class Score:
    variant: str
    produced: int
    consumed: int
    lost: int
    duplicates: int
    longest_gap_s: float
    gap_queue: str
    gap_at_s: float
    """When the longest gap began, seconds after the producer started."""
    order_violations: int
    drained_s: float
    events: list[str] = field(default_factory=list)
    moves: MoveFigures | None = None
    """Queues moved between live members and how long they went unconsumed (mqbalance variants)."""
    duplicates_after_kill: int = 0
    """Of ``duplicates``, those whose first consumer was SIGKILLed (it had not committed them)."""
    produced_queues: frozenset[str] = frozenset()
    """Queues (``broker:id``) this run's producer wrote to."""
    consumers: dict[str, frozenset[str]] = field(default_factory=dict)
    """Queue (``broker:id``) -> the members that consumed this run's messages from it."""
    owners: dict[str, frozenset[str]] | None = None
    """mqbalance variants: queue -> every member a generation of the group named as its owner."""
    queue_gaps: dict[str, float] = field(default_factory=dict)
    """Queue (``broker:id``) -> the longest time it went without a consumption while messages came."""
    killed_at: dict[str, float] = field(default_factory=dict)
    """Member -> when (unix time) it was SIGKILLed."""
    latency_ms: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    """From each message's send to its first consumption: median, p99 and max, milliseconds."""
    trace: TraceFigures | None = None
    """mqbalance variants: the medians of the steps of its moves (the journal's and the sidecars')."""

    def idle_queues(self, seconds: float) -> list[str]:
        """The queues that went unconsumed for longer than ``seconds`` at some point of the run."""
        return sorted(q for q, gap in self.queue_gaps.items() if gap > seconds)


def run(
    w: World,
    variants: Sequence[str],
    *,
    seconds: float = 60.0,
    rate: int = 200,
    keys: int = 64,
    drain_timeout: float = 90.0,
    script: Sequence[Step] = SCRIPT,
    tag: str = "",
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> list[Score]:
    """One run: every variant at once, the same producer, the same script.

    ``seconds`` is the planned sending time; ``script``'s steps come at their fractions of it,
    each at least its planned gap after the previous step finished (so a slow step stretches the
    run rather than squeezing the next). ``tag`` names the run's consumer groups
    (``e2e-<tag>-<variant>``), so several runs can share one world without reading each other's
    records.
    """
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")
    active = [VARIANTS[v](w, tag) for v in variants]
    produced_file = w.workdir / (f"produced-{tag}.tsv" if tag else "produced.tsv")
    events: list[str] = []
    producer: JavaProgram | None = None
    try:
        for v in active:
            v.setup()
        with ThreadPoolExecutor(len(active)) as pool:
            for future in [pool.submit(v.join, i) for v in active for i in (0, 1, 2)]:
                future.result()
        producer = JavaProgram(
            w.classpath,
            "io.mqbalance.rocketmq.e2e.E2eProducer",
            ["--namesrv", w.mq.namesrv_addr, "--topic", TOPIC, "--rate", str(rate), "--keys", str(keys),
             "--out", str(produced_file)],
            w.workdir / "producer.log",
        )  # fmt: skip
        producer.start()
        started = time.monotonic()
        started_epoch_ms = time.time() * 1000
        log(f"producing {rate}/s for {seconds:g} s; variants {', '.join(variants)}")
        # A step comes at its planned time, and never sooner after the previous step has finished
        # than planned: a join that took long (a JVM starting on a busy machine) must not bring the
        # next step onto it, or the two fold into one rebalance and the script's moves are lost.
        previous_at, previous_done = 0.0, started
        for step in sorted(script, key=lambda s: s.at):
            due = max(started + step.at * seconds, previous_done + (step.at - previous_at) * seconds)
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            begun = time.monotonic() - started
            begun_epoch = time.time()
            # Every variant at once: a kubelet's delay in one must not shift the other's timeline.
            with ThreadPoolExecutor(len(active)) as pool:
                for future in [pool.submit(getattr(v, step.action), step.member) for v in active]:
                    future.result()
            if step.action == "leave":
                for v in active:
                    v.left[v.member(step.member)] = begun_epoch
            previous_at, previous_done = step.at, time.monotonic()
            event = f"{begun:5.1f}-{previous_done - started:5.1f} s: {step.action} member {step.member}"
            events.append(event)
            log(event)
        end = max(started + seconds, previous_done + (1.0 - previous_at) * seconds)
        time.sleep(max(0.0, end - time.monotonic()))
        producer.close_stdin()
        producer.wait(polling.scaled(60))
        stopped = time.monotonic()
        stopped_epoch = time.time()
        produced = _read_produced(produced_file)
        log(f"produced {len(produced)} messages; draining")
        scores = []
        pending = {v.group for v in active}
        drained: dict[str, float] = {}

        def all_drained() -> bool:
            for group in list(pending):
                consumed = {(r[1], r[2], r[3]) for r in consumed_records(w.workdir, group)}
                if all(key in consumed for key in produced):
                    drained[group] = time.monotonic() - stopped
                    pending.discard(group)
            return not pending

        with contextlib.suppress(TimeoutError):  # a group not drained in time scores what it consumed
            polling.wait_for("every variant to drain", all_drained, drain_timeout, 0.5, TimeoutError)
    finally:
        if producer is not None:
            producer.close_stdin()
            producer.wait(30)
        for v in active:
            with contextlib.suppress(Exception):
                v.stop_all()
    journal = w.operator.journal_records() if w.operator is not None else []
    # Every sidecar's move lines, read once: each variant's trace takes its group's.
    lines = [
        m for log in w.workdir.glob("sidecar-*.log") for m in move_lines(log.read_text(errors="replace"))
    ]
    for v in active:
        records = [r for r in consumed_records(w.workdir, v.group) if (r[1], r[2], r[3]) in produced]
        score = score_variant(v.name, produced, records, started_epoch_ms, v.killed)
        score.drained_s = drained.get(v.group, float("nan"))
        score.events = events
        score.killed_at = dict(v.killed_at)
        if isinstance(v, MqbalanceVariant):
            score.owners = journal_owners(journal, v.group, TOPIC)
            moved = with_first_consumption(
                journal_moves(journal, v.group, TOPIC), ((r[0], r[1], r[2], r[6]) for r in records)
            )
            score.moves = figures(moved, v.killed, (started_epoch_ms / 1000, stopped_epoch), v.left)
            score.trace = trace_figures(lines, journal, v.group, started_epoch_ms / 1000)
        scores.append(score)
    return scores


def journal_owners(journal: Iterable[JournalRecord], group: str, topic: str) -> dict[str, frozenset[str]]:
    """Per queue (``broker:id``) of ``topic``: every member ``group``'s generations named as its owner."""
    owners: dict[str, set[str]] = defaultdict(set)
    for r in journal:
        if r.group != group:
            continue
        for member, queues in r.assignment.get(topic, {}).items():
            for mq in queues:
                owners[f"{mq.broker_name}:{mq.queue_id}"].add(member)
    return {q: frozenset(m) for q, m in owners.items()}


Produced = dict[tuple[str, int, int], tuple[str, int, int]]
"""(broker, queue, offset) -> (key, seq, when it was sent, unix ms)."""


def _read_produced(path: Path) -> Produced:
    out = {}
    for line in path.read_text().splitlines():
        broker, queue, offset, key, seq, sent_ms = line.split("\t")
        out[(broker, int(queue), int(offset))] = (key, int(seq), int(sent_ms))
    return out


Record = tuple[int, str, int, int, str, int, str]
"""(time ms, broker, queue, offset, key, seq, member)."""


def failover_waits(workdir: Path, group: str, dead: str, killed_at: float) -> dict[str, float]:
    """For each queue (``broker:id``) member ``dead`` of ``group`` consumed before it was SIGKILLed
    at ``killed_at`` (unix time): seconds from the kill to the queue's next consumption by another
    member (inf: none)."""
    killed_ms = killed_at * 1000
    records = consumed_records(workdir, group)
    held = {(r[1], r[2]) for r in records if r[6] == dead and r[0] < killed_ms}
    waits = {}
    for broker, queue in sorted(held):
        after = [
            r[0] for r in records if (r[1], r[2]) == (broker, queue) and r[6] != dead and r[0] >= killed_ms
        ]
        waits[f"{broker}:{queue}"] = (min(after) - killed_ms) / 1000 if after else float("inf")
    return waits


def consumed_records(workdir: Path, group: str) -> list[Record]:
    """Every consumption the members of ``group`` recorded, in time order."""
    records: list[Record] = []
    for path in workdir.glob(f"{group}.*.tsv"):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) != 7:
                continue  # a line cut by SIGKILL mid-write
            at, broker, queue, offset, key, body, member = parts
            records.append(
                (int(at), broker, int(queue), int(offset), key, int(body.rsplit(":", 1)[1]), member)
            )
    records.sort()
    return records


def score_variant(
    name: str,
    produced: Produced,
    records: Sequence[Record],
    started_epoch_ms: float,
    killed: Collection[str] = (),
) -> Score:
    """The figures of one variant. Only this run's messages count (a group new to the topic
    starts from its first offset, so it also consumes what earlier runs sent). A duplicate whose
    first consumer was SIGKILLed (``killed``) counts as one after a kill, the others as
    duplicates of rebalances between live members."""
    records = [r for r in records if (r[1], r[2], r[3]) in produced]
    seen: dict[tuple[str, int, int], int] = defaultdict(int)
    first_by: dict[tuple[str, int, int], str] = {}
    consumers: dict[str, set[str]] = defaultdict(set)
    for _, broker, queue, offset, *_, member in records:
        seen[(broker, queue, offset)] += 1
        consumers[f"{broker}:{queue}"].add(member)
        first_by.setdefault((broker, queue, offset), member)
    lost = sum(1 for key in produced if key not in seen)
    duplicates = sum(n - 1 for n in seen.values())
    after_kill = sum(n - 1 for key, n in seen.items() if first_by[key] in killed)
    # Order: a key's message consumed for the first time after a later one of the same key.
    highest: dict[str, int] = {}
    first_done: set[tuple[str, int, int]] = set()
    violations = 0
    for _, broker, queue, offset, key, seq, _ in records:
        ident = (broker, queue, offset)
        if ident in first_done:
            continue
        first_done.add(ident)
        if key in highest and seq < highest[key]:
            violations += 1
        highest[key] = max(highest.get(key, -1), seq)
    # Gaps: per queue, the longest time between consecutive consumptions (first delivery of each
    # offset) while the producer was sending; the end of sending closes the last gap only if
    # the queue still had messages to deliver.
    by_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
    first_at: dict[tuple[str, int, int], int] = {}
    for at, broker, queue, offset, *_ in records:
        first_at.setdefault((broker, queue, offset), at)
    for (broker, queue, _), at in first_at.items():
        by_queue[(broker, queue)].append(at)
    latencies = sorted(at - produced[ident][2] for ident, at in first_at.items())
    longest, where, gap_at = 0.0, "-", float("nan")
    queue_gaps: dict[str, float] = {}
    for queue_id, times in by_queue.items():
        times.sort()
        queue_gaps[f"{queue_id[0]}:{queue_id[1]}"] = max(
            ((b - a) / 1000 for a, b in itertools.pairwise(times)), default=0.0
        )
        for a, b in itertools.pairwise(times):
            if (b - a) / 1000 > longest:
                longest, where, gap_at = (
                    (b - a) / 1000,
                    f"{queue_id[0]}:{queue_id[1]}",
                    (a - started_epoch_ms) / 1000,
                )
    return Score(
        variant=name,
        produced=len(produced),
        consumed=len(records),
        lost=lost,
        duplicates=duplicates,
        longest_gap_s=longest,
        gap_queue=where,
        gap_at_s=gap_at,
        order_violations=violations,
        drained_s=float("nan"),
        duplicates_after_kill=after_kill,
        produced_queues=frozenset(f"{broker}:{queue}" for broker, queue, _ in produced),
        consumers={q: frozenset(members) for q, members in consumers.items()},
        queue_gaps=queue_gaps,
        latency_ms=_quantiles(latencies),
    )


def _quantiles(values: Sequence[int]) -> tuple[float, float, float]:
    """Median, 99th percentile and maximum of sorted ``values`` (nearest rank); NaNs when empty."""
    if not values:
        return (math.nan, math.nan, math.nan)

    def rank(p: float) -> float:
        return float(values[min(len(values) - 1, math.ceil(p * len(values)) - 1)])

    return (rank(0.5), rank(0.99), float(values[-1]))
