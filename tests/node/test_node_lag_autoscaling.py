"""Scaling by lag on real pods: a HorizontalPodAutoscaler of type External, fed by the operator's
external.metrics.k8s.io through the API server's aggregation layer, scales a consumer Deployment up
while lag builds and back down once it drains, never above the queue count, every step a Release
handover with no message consumed twice.

RocketMQ 4.9.7 runs on the machine and advertises the node's address (4.9.x binds the wildcard
address, so pods reach it there). Every consumer pod runs harness/apps/lag_consumer_app.py: it pulls its
sidecar's queues, spends DELAY_MS a message, reports each batch to a collector on the node's address
and commits it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from harness.apps.pods import LAG_CONSUMER_APP, pod_app_command
from harness.node.cluster import RealNode
from harness.node.images import Images
from harness.node.specs import NODE_IP
from harness.node.workload import (
    CHART,
    NAMESPACE,
    RELEASE,
    RELEASE_NAMESPACE,
    apply,
    consumer_deployment,
    group_status,
    helm,
    kubectl_json,
    pods_timeout,
    rollout_status,
)
from harness.polling import scaled, wait_for, work_timeout
from harness.processes.net import serving_in_thread
from harness.rocketmq.broker_client import SEND_MESSAGE, read_exactly
from harness.rocketmq.server import RocketMQ
from mqbalance.rocketmq.remoting import decode_payload, encode, frame_length, request

NAME = "lag-consumer"
TOPIC = "lagscale"
QUEUES = 4
DELAY_MS = 20
"""A member consumes about 1000 / DELAY_MS = 50 messages a second."""
RATE = 150
"""Messages a second produced while lag builds: three members' worth, so one member falls behind."""


def node_rocketmq() -> RocketMQ:
    """RocketMQ whose Broker registers with the node's address (``brokerIP1``), so that the route the
    operator's pod reads leads there; everything on the machine talks to it there too."""
    return RocketMQ("4.9.7", broker_host=NODE_IP)


class Collector(ThreadingHTTPServer):
    """Receives the consumers' batch reports on the node's address."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__((NODE_IP, 0), _Report)

    @property
    def url(self) -> str:
        return f"http://{NODE_IP}:{self.server_address[1]}/batch"

    def duplicates(self) -> int:
        """Messages processed more than once: overlaps of the reported [start, end) ranges of a queue."""
        with self.lock:
            ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
            for r in self.records:
                ranges.setdefault((r["broker"], r["queue"]), []).append((r["start"], r["end"]))
        twice = 0
        for spans in ranges.values():
            reached = 0
            for start, end in sorted(spans):
                twice += max(0, min(end, reached) - start)
                reached = max(reached, end)
        return twice

    def consumed(self) -> dict[tuple[str, int], int]:
        """How far each queue was consumed without a gap from offset 0."""
        with self.lock:
            spans = sorted((r["broker"], r["queue"], r["start"], r["end"]) for r in self.records)
        reached: dict[tuple[str, int], int] = {}
        for broker, queue, start, end in spans:
            if start <= reached.get((broker, queue), 0):
                reached[(broker, queue)] = max(reached.get((broker, queue), 0), end)
        return reached

    def pods(self) -> set[str]:
        with self.lock:
            return {r["pod"] for r in self.records}


class _Report(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        record = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        assert isinstance(server, Collector)
        with server.lock:
            server.records.append(record)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Producer(threading.Thread):
    """Sends RATE messages a second, round robin over the queues, until stopped."""

    def __init__(self, address: str) -> None:
        super().__init__(name="lag-producer", daemon=True)
        self.address = address
        self.stopping = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            host, _, port = self.address.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                started = time.monotonic()
                while not self.stopping.is_set():
                    due = int((time.monotonic() - started) * RATE)
                    self._send(sock, due - self.sent)
                    time.sleep(0.02)
        except BaseException as e:  # reported by check()
            self.error = e

    def _send(self, sock: socket.socket, count: int) -> None:
        """``count`` messages written at once, then their answers read (one round trip a batch)."""
        frames = []
        for i in range(self.sent, self.sent + count):
            header = {
                "producerGroup": "PID_lag_scaling", "topic": TOPIC, "defaultTopic": "TBW102",
                "defaultTopicQueueNums": QUEUES, "queueId": i % QUEUES, "sysFlag": 0,
                "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "", "reconsumeTimes": 0,
                "unitMode": False, "batch": False,
            }  # fmt: skip
            frames.append(encode(dataclasses.replace(request(SEND_MESSAGE, i + 1, header), body=b"m%d" % i)))
        sock.sendall(b"".join(frames))
        for _ in frames:
            answer = decode_payload(read_exactly(sock, frame_length(read_exactly(sock, 4))))
            if answer.code != 0:
                raise RuntimeError(f"SEND_MESSAGE: {answer.code} {answer.remark}")
            self.sent += 1

    def check(self) -> bool:
        """False while sending; raises once it failed (for wait_for's probes)."""
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}")
        return False


def consumers(images: Images, broker: str, collector: str) -> dict[str, Any]:
    deployment = consumer_deployment(images, replicas=1)
    deployment["metadata"]["name"] = NAME
    deployment["metadata"]["labels"] = {"app": NAME}
    deployment["spec"]["selector"]["matchLabels"] = {"app": NAME}
    template = deployment["spec"]["template"]
    template["metadata"]["labels"] = {"app": NAME}
    pod = template["spec"]
    pod["terminationGracePeriodSeconds"] = 30  # above the drain: the queues are handed over first
    containers = {c["name"]: c for c in pod["containers"]}
    app, sidecar = containers["app"], containers["mqbalance-sidecar"]
    app["command"] = pod_app_command(LAG_CONSUMER_APP)
    app.pop("readinessProbe", None)
    app.pop("ports", None)
    env = {
        "BROKERS": json.dumps({"broker-a": broker}),
        "GROUP": NAME,
        "TOPIC": TOPIC,
        "DELAY_MS": str(DELAY_MS),
    }
    env |= {"COLLECTOR": collector, "MQBALANCE_URL": "http://127.0.0.1:8081"}
    app["env"] = [{"name": k, "value": v} for k, v in env.items()] + [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    for var in sidecar["env"]:
        if var["name"] == "MQBALANCE_GROUP":
            var["value"] = NAME
    return deployment


def group_and_topic(namesrv: str) -> list[dict[str, Any]]:
    topic = {
        "apiVersion": "mqbalance.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": TOPIC, "namespace": NAMESPACE},
        "spec": {"topicName": TOPIC, "nameServer": {"addresses": [namesrv], "pollSeconds": 5}},
    }
    group = {
        "apiVersion": "mqbalance.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
        "spec": {
            "groupName": NAME,
            "topics": [TOPIC],
            "selector": {"matchLabels": {"app": NAME}},
            "strategy": {"name": "STICKY"},
            "debounceSeconds": 0,
            "handover": {"mode": "Release", "releaseTimeoutSeconds": 60},
        },
    }
    return [topic, group]


def autoscaler() -> dict[str, Any]:
    return copy.deepcopy(HPA)


HPA: dict[str, Any] = {
    "apiVersion": "autoscaling/v2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
        "minReplicas": 1,
        # Above the queue count on purpose: the recommendation is what keeps the Deployment within it.
        "maxReplicas": 2 * QUEUES,
        "metrics": [
            {
                "type": "External",
                "external": {
                    "metric": {
                        "name": "mqbalance_consumergroup_recommended_members",
                        "selector": {"matchLabels": {"app": NAME}},
                    },
                    "target": {"type": "AverageValue", "averageValue": "1"},
                },
            }
        ],
        "behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 0},
            "scaleDown": {"stabilizationWindowSeconds": 4},
        },
    },
}


@contextlib.contextmanager
def scaling_release(node: RealNode) -> Iterator[None]:
    """The session's release with lag read every 2 s, external metrics served and the group's handover
    rights; rolled back afterwards. A drain time of 10 s makes the backlog ask for more members than
    there are queues (ceil(150/50 + 1,000/(50 x 10)) = 5): the clamp to the queues is what holds."""
    helm(
        node, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--reuse-values",
        "--set", "operator.lag.intervalSeconds=2", "--set", "operator.lag.drainSeconds=10",
        "--set", "operator.externalMetrics.enabled=true",
        "--set", f"sidecar.groups={{orders-consumer,{NAME}}}",
        "--wait", "--timeout", f"{scaled(240):.0f}s",
        timeout=360,
    )  # fmt: skip
    try:
        yield
    finally:
        helm(node, "rollback", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", timeout=360)


def apiservice_available(node: RealNode) -> bool:
    status, body = node.request(
        "GET", "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io"
    )
    conditions = ((body.get("status") or {}).get("conditions") or []) if status == 200 else []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


@pytest.mark.timeout(1200)
def test_hpa_scales_consumers_up_by_lag_and_down_once_drained(
    node: RealNode, images: Images, release: None
) -> None:
    seen: list[int] = []

    def replicas() -> int:
        deployment = kubectl_json(node, "get", "deployment", NAME, "-n", NAMESPACE)
        seen.append(int(deployment["spec"]["replicas"]))
        assert seen[-1] <= QUEUES, f"the Deployment went above the {QUEUES} queues: {seen}"
        return seen[-1]

    def lag() -> dict[str, Any]:
        return dict(group_status(node, NAMESPACE, NAME).get("lag") or {})

    with (
        node_rocketmq() as mq,
        serving_in_thread(Collector(), "collector") as collector,
        scaling_release(node),
    ):
        mq.create_topic(TOPIC, QUEUES)
        broker = mq.broker_addr("broker-a")
        namesrv = f"{NODE_IP}:{mq.namesrv_addr.rpartition(':')[2]}"
        wait_for("the external metrics APIService to be Available", lambda: apiservice_available(node), 120)
        apply(node, *group_and_topic(namesrv), consumers(images, broker, collector.url), autoscaler())
        try:
            rollout_status(node, NAME)
            producer = Producer(mq.broker_addr("broker-a"))
            producer.start()
            began = time.monotonic()
            try:
                # Lag builds: one member consumes a third of what arrives; the HPA follows the
                # recommendation up to the queue count (its own maxReplicas is twice that).
                wait_for(
                    f"the HPA to scale {NAME} to {QUEUES}",
                    lambda: producer.check() or replicas() == QUEUES,
                    work_timeout(60, 30, QUEUES),
                )
                up = time.monotonic() - began
                rollout_status(node, NAME, timeout=pods_timeout(QUEUES))
                wait_for(
                    "every pod to consume",
                    lambda: producer.check() or len(collector.pods()) >= QUEUES,
                    pods_timeout(QUEUES),
                )
            finally:
                producer.stopping.set()
                producer.join(10)
            producer.check()
            stopped = time.monotonic()
            # Drained: nothing arrives, nothing waits, one member is enough.
            wait_for(
                f"the HPA to scale {NAME} back to 1", lambda: replicas() == 1, work_timeout(90, 30, QUEUES)
            )
            down = time.monotonic() - stopped
            wait_for(
                "the lag to be 0",
                lambda: lag().get("total") == 0 and lag().get("recommendedMembers") == 1,
                60,
            )
            rollout_status(node, NAME)
            wait_for(
                "every message to be consumed",
                lambda: sum(collector.consumed().values()) >= producer.sent,
                work_timeout(30),
            )
            handover = group_status(node, NAMESPACE, NAME).get("handover") or {}
        finally:
            node.kubectl(
                "delete",
                "-n",
                NAMESPACE,
                "hpa,deployment,consumergroup,topic",
                "-l",
                f"app={NAME}",
                check=False,
            )
            node.kubectl("delete", "-n", NAMESPACE, "topic", TOPIC, "--wait=false", check=False)
        print(
            f"lag scaling: sent {producer.sent}, 1 -> {QUEUES} replicas in {up:.0f} s, back to 1 in "
            f"{down:.0f} s after the producer stopped; replicas seen {sorted(set(seen))}; "
            f"pods that consumed {len(collector.pods())}"
        )
        assert max(seen) <= QUEUES, f"the Deployment went above the {QUEUES} queues: {sorted(set(seen))}"
        assert collector.duplicates() == 0
        # Every step a handover: each moving queue was released by its owner, none taken over at a timeout.
        assert int(handover.get("overriddenQueues") or 0) == 0, handover
