"""Real messages for the nemesis suite (tests/node/test_nemesis.py): a RocketMQ broker the nodes'
pods reach on an address of its own, a producer of keyed messages at a steady rate, and the
collector that receives every message the consumer apps processed.

Addresses: the API server is at ``NODE_IP`` (198.18.0.1) on the machine's loopback interface,
which the nodes' network namespaces reach through their bridge (docs/real-node.md, "Three
nodes"). The broker and the collector get two more addresses of that range on the loopback
interface (:class:`LoopbackAddress`), so a node can be cut off from the API server alone, from the
broker as well, and never from the collector (it is the suite's observer, not part of the system
under test). Nothing here talks to anything but those loopback addresses.

RocketMQ 5.3.3 binds the address given as ``bindAddress``; 4.9.7 binds the wildcard address and is
reached there too (:func:`start_broker`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.faults import nemesis
from harness.polling import wait_for
from harness.processes.net import serving_in_thread
from harness.rocketmq.broker_client import SEND_MESSAGE, SUCCESS, Broker, BrokerError
from harness.rocketmq.server import RocketMQ

BROKER_IP = "198.18.0.3"
COLLECTOR_IP = "198.18.0.2"
BROKER = "broker-a"


@contextlib.contextmanager
def loopback_address(address: str) -> Iterator[str]:
    """``address``/32 on the loopback interface for the block; removed afterwards (and first, when a
    killed run left it)."""
    subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False, capture_output=True)
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True, capture_output=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False, capture_output=True)


def nemesis_rocketmq(version: str, lock_ms: int | None = None) -> RocketMQ:
    """One NameServer (loopback, for the harness only) and one broker that registers and, on 5.x,
    binds ``BROKER_IP``: the pods reach it there. ``lock_ms``: the broker's lock lifetime
    (``rocketmq.broker.rebalance.lockMaxLiveTime``, 60 s by default) for orderly consumers."""
    options = [] if lock_ms is None else [f"-Drocketmq.broker.rebalance.lockMaxLiveTime={lock_ms}"]
    return RocketMQ(version, broker_host=BROKER_IP, jvm_options=options)


@dataclasses.dataclass(eq=False)
class Producer(threading.Thread):
    """Sends ``rate`` keyed messages a second to ``address`` until stopped: message ``n`` carries key
    ``n mod keys`` and that key's next sequence number, and goes to queue ``key mod queues`` (one
    queue per key, as an orderly producer's selector puts it). A send that fails is sent again
    (same key and sequence number) on a new connection; only acknowledged sends are recorded."""

    address: str
    topic: str
    queues: int
    rate: float
    keys: int = 36

    def __post_init__(self) -> None:
        super().__init__(name="nemesis-producer", daemon=True)
        self.stopping = threading.Event()
        self.sent: list[nemesis.Sent] = []
        self.failures = 0
        self.lock = threading.Lock()
        self._broker = Broker(self.address, timeout=3)

    def queue_of(self, key: int) -> str:
        return f"{self.topic}/{BROKER}:{key % self.queues}"

    def run(self) -> None:
        started = time.monotonic()
        seqs = [0] * self.keys
        n = 0
        while not self.stopping.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while n < due and not self.stopping.is_set():
                key = n % self.keys
                if self._send(key, seqs[key]):
                    seqs[key] += 1
                    n += 1
                else:
                    self.stopping.wait(0.2)  # the broker away: try again on a new connection
            self.stopping.wait(0.05)
        self._broker.close()

    def _send(self, key: int, seq: int) -> bool:
        name = f"k{key:03d}"
        header = {
            "producerGroup": "PID_nemesis", "topic": self.topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": self.queues, "queueId": key % self.queues, "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": f"KEYS\x01{name}\x02",
            "reconsumeTimes": 0, "unitMode": False, "batch": False,
        }  # fmt: skip
        body = json.dumps({"key": name, "seq": seq}).encode()
        try:
            answer = self._broker.call(SEND_MESSAGE, header, body)
        except BrokerError:
            self.failures += 1
            return False
        if answer.code != SUCCESS:
            self.failures += 1
            self._broker.close()  # sent again on a new connection, as after a broken one
            return False
        queue = f"{self.topic}/{BROKER}:{int(answer.ext_fields['queueId'])}"
        offset = int(answer.ext_fields["queueOffset"])
        with self.lock:
            self.sent.append(nemesis.Sent(queue, offset, name, seq, time.time()))
        return True

    def records(self) -> list[nemesis.Sent]:
        with self.lock:
            return list(self.sent)


class Collector(ThreadingHTTPServer):
    """The sink: receives the apps' reports of processed messages on ``COLLECTOR_IP``."""

    daemon_threads = True

    def __init__(self) -> None:
        self.processed: dict[str, list[nemesis.Processed]] = {}
        """group -> every message processed, in the order the reports came."""
        self.batches: dict[str, list[nemesis.Batch]] = {}
        """group -> every batch reported, per queue, in the order they came."""
        self.lock = threading.Lock()
        super().__init__((COLLECTOR_IP, 0), _Report)

    @property
    def url(self) -> str:
        return f"http://{COLLECTOR_IP}:{self.server_address[1]}/batch"

    def add(self, report: dict[str, Any]) -> None:
        group, pod, boot = str(report["group"]), str(report["pod"]), float(report["boot"])
        items = [
            nemesis.Processed(
                pod, boot, m["queue"], int(m["offset"]), m["key"], int(m["seq"]), float(m["at"])
            )
            for m in report["messages"]
        ]
        with self.lock:
            self.processed.setdefault(group, []).extend(items)
            came = time.time()
            for queue in sorted({i.queue for i in items}):
                offsets = frozenset(i.offset for i in items if i.queue == queue)
                self.batches.setdefault(group, []).append(nemesis.Batch(pod, boot, queue, came, offsets))

    def of(self, group: str) -> list[nemesis.Processed]:
        with self.lock:
            return list(self.processed.get(group, []))

    def in_flight(
        self, group: str, runs: Sequence[nemesis.CutRun]
    ) -> dict[tuple[str, float], set[tuple[str, int]]]:
        """:func:`harness.faults.nemesis.in_flight` of the batches ``group`` reported."""
        with self.lock:
            return nemesis.in_flight(self.batches.get(group, []), runs)


class _Report(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        report = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        assert isinstance(server, Collector)
        server.add(report)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def collecting() -> Iterator[Collector]:
    with serving_in_thread(Collector(), "nemesis-collector") as collector:
        yield collector


def drained(producer: Producer, collector: Collector, groups: Sequence[str], timeout: float) -> None:
    """Wait until every acknowledged message was processed in every group (or the deadline)."""

    def done() -> bool:
        sent = {(s.queue, s.offset) for s in producer.records()}
        return all(sent <= {(p.queue, p.offset) for p in collector.of(g)} for g in groups)

    with contextlib.suppress(TimeoutError, AssertionError):
        wait_for("every acknowledged message processed in every group", done, timeout, 0.5)
