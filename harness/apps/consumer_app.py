"""The consumer application of the real-pod tests, run in the app container as ``python -c`` with
harness.rocketmq.broker_client beside it (``harness.apps.pods.pod_app_command``).

It does what a consumer does with the sidecar: long-polls ``$MQBALANCE_URL/v1/queues`` with the
project's client and prints every generation it is handed, with the time it arrived (one JSON
line each, read back with ``kubectl logs``).

It also acts out a consumer that honours the grant (docs/sidecar.md, "Time-bounded grants"):
every ``TICK`` seconds it would process one batch of each queue of its last view, but only while
the grant is valid and lasts the batch's length (``SidecarClient.await_grant`` semantics: a batch
never outlives the grant). It records, per queue, the intervals during which it processed
(``start`` to the end of the last batch), and acknowledges each generation it has applied
(``POST /v1/release``) once the queues that generation took away are no longer processed.
``GET :8080/intervals`` serves them: the nemesis runner (tests/node/test_nemesis.py) scores them
with ``harness.faults.nemesis``. On SIGTERM it stops processing, acknowledges ``all`` and exits.
With ``IGNORE_GRANT=1`` in its environment it is the client the grant cannot protect: it ignores
fenced answers and the grant's expiry and keeps processing its last queues (the nemesis suite's
check that its scoring catches two owners on real pods).

With ``BROKERS`` in its environment (JSON: broker name -> host:port) the batches are real: for each
queue of its view it pulls the next messages from the broker (PULL_MESSAGE with the subscription in
the request, with harness.rocketmq.broker_client as harness/apps/lag_consumer_app.py does), processes
them one by one while the batch's deadline (the tick's end, inside the grant) has not passed,
reports them to ``COLLECTOR`` (an HTTP server on the machine: what the sink received outlives the
pod) and then commits the next offset, forward only (the broker's offset is read back first and
never moved backwards). A queue's offset is read from the broker when the queue enters the view and
kept in memory while it stays; a batch whose report fails is not committed (pulled again). The
messages' bodies are the producer's JSON ``{"key": ..., "seq": ...}``. Also ``GROUP`` (RocketMQ's
consumer group), ``TOPIC``, ``BATCH`` (messages a pull asks for). With ``ORDERLY=1`` it also does
what RocketMQ's orderly consumer does: it processes a queue only while it holds the broker's lock
on it (LOCK_BATCH_MQ for every queue of its view, renewed every ``LOCK_RENEW`` seconds; a lock
counts for ``LOCK_VALID`` seconds from when its request was sent, well inside the broker's own
lifetime) and unlocks a queue (UNLOCK_BATCH_MQ) when it leaves the view, before the generation is
acknowledged.

With ``CLIENT_REBALANCE=1`` it uses no sidecar: it rebalances on its own as RocketMQ's clients do
(``RebalanceImpl``), the baseline the nemesis suite compares with. Every ``REBALANCE`` seconds it
sends a heartbeat (HEART_BEAT, which registers it with the broker as a consumer of ``GROUP``, its
pod name as client id), asks the broker for the group's consumer list
(GET_CONSUMER_LIST_BY_GROUP), and takes its share of the topic's ``QUEUES`` queues with
``AllocateMessageQueueAveragely`` (``mqbalance.strategies.avg.allocate_avg``, the sorted queues
over the sorted client ids). There is no grant: it processes its share until the next rebalance
says otherwise.

Its readiness endpoint (``GET :8080/ready``, the container's readinessProbe) answers 503
while ``/tmp/unready`` exists, so a test can fail the kubelet's probe from outside with
``kubectl exec ... touch /tmp/unready``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.rocketmq import broker_client
from harness.rocketmq.broker_client import SUCCESS, BrokerError
from mqbalance.sidecar.client import SidecarClient, SidecarError

UNREADY_FILE = "/tmp/unready"
PORT = 8080
TICK = 0.1
"""Seconds one batch takes: a batch starts only when the grant lasts at least this long more."""
SEEN_KEPT = 200
IGNORE_GRANT = os.environ.get("IGNORE_GRANT") == "1"
BROKERS: dict[str, str] = json.loads(os.environ.get("BROKERS") or "{}")
"""Broker name -> host:port; empty: processing is acted out, no messages."""
MQ_GROUP = os.environ.get("GROUP", "")
TOPIC = os.environ.get("TOPIC", "")
COLLECTOR = os.environ.get("COLLECTOR", "")
BATCH = int(os.environ.get("BATCH", "16"))
IDLE_PULL = 0.3
"""Seconds before a queue whose last pull found nothing is pulled again."""

ORDERLY = os.environ.get("ORDERLY") == "1"
LOCK_RENEW = 1.0
LOCK_VALID = 3.0
LOCK_RETRY = 0.2
"""Seconds a broker lock counts here after its request was sent (the broker keeps it longer)."""
LOCK_BATCH_MQ, UNLOCK_BATCH_MQ = 41, 42
HEART_BEAT, GET_CONSUMER_LIST_BY_GROUP = 34, 38
CLIENT_REBALANCE = os.environ.get("CLIENT_REBALANCE") == "1"
REBALANCE = float(os.environ.get("REBALANCE_SECONDS", "2"))
QUEUE_COUNT = int(os.environ.get("QUEUES", "0"))
MAGIC_V2 = 0xDAA320AB
"""MessageDecoder.MESSAGE_MAGIC_CODE_V2: the topic's length takes two bytes (else one)."""
BORN_V6, STORE_V6 = 0x10, 0x20
"""MessageSysFlag: the born or store host is an IPv6 address (16 bytes, else 4)."""


class Broker(broker_client.Broker):
    """The group's and topic's connection to a broker, with what this app does beyond pulling."""

    def __init__(self, address: str) -> None:
        super().__init__(address, MQ_GROUP, TOPIC)

    def commit_forward(self, queue_id: int, offset: int) -> None:
        """Commit ``offset`` unless the broker already holds a later one (its own commit overwrites)."""
        if self.committed(queue_id) < offset:
            self.commit(queue_id, offset)

    def lock(self, broker_name: str, queue_ids: list[int], unlock: bool = False) -> set[int]:
        """Lock (or unlock) the queues on the broker for this pod, as an orderly consumer does;
        returns the queues locked."""
        body = {
            "consumerGroup": MQ_GROUP,
            "clientId": os.environ.get("HOSTNAME", ""),
            "onlyThisBroker": True,
            "mqSet": [{"topic": TOPIC, "brokerName": broker_name, "queueId": q} for q in queue_ids],
        }
        answer = self.call(UNLOCK_BATCH_MQ if unlock else LOCK_BATCH_MQ, {}, json.dumps(body).encode())
        if answer.code != SUCCESS:
            raise BrokerError(f"{'UN' if unlock else ''}LOCK_BATCH_MQ: {answer.code} {answer.remark}")
        if unlock:
            return set()
        locked = json.loads(answer.body or b"{}").get("lockOKMQSet") or []
        return {int(q["queueId"]) for q in locked}

    def heartbeat(self, client_id: str) -> None:
        """Register (again) as a consumer of the group, pulling the topic, as a RocketMQ client does."""
        subscription = {
            "topic": TOPIC, "subString": "*", "classFilterMode": False, "tagsSet": [], "codeSet": [],
            "subVersion": int(time.time() * 1000), "expressionType": "TAG",
        }  # fmt: skip
        body = {
            "clientID": client_id,
            "producerDataSet": [],
            "consumerDataSet": [
                {
                    "groupName": MQ_GROUP,
                    "consumeType": "CONSUME_ACTIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                    "unitMode": False,
                    "subscriptionDataSet": [subscription],
                }
            ],
        }
        answer = self.call(HEART_BEAT, {}, json.dumps(body).encode())
        if answer.code != SUCCESS:
            raise BrokerError(f"HEART_BEAT: {answer.code} {answer.remark}")

    def consumers(self) -> list[str]:
        answer = self.call(GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": MQ_GROUP})
        if answer.code != SUCCESS:
            raise BrokerError(f"GET_CONSUMER_LIST_BY_GROUP: {answer.code} {answer.remark}")
        return sorted(json.loads(answer.body or b"{}").get("consumerIdList") or [])

    def messages(self, queue_id: int, offset: int) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """The messages from ``offset`` on, as (queue offset, body), and the next offset."""
        try:
            data, following = self.pull(queue_id, offset, BATCH)
        except broker_client.OffsetMoved as moved:
            print(json.dumps({"offsetMoved": queue_id, "from": offset, "fields": moved.fields}), flush=True)
            return [], moved.next_offset
        return decode_messages(data), following


def decode_messages(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """(queue offset, JSON body) of each message in RocketMQ's store format (MessageDecoder)."""
    found = []
    at = 0
    while at + 4 <= len(data):
        size = struct.unpack_from(">i", data, at)[0]
        magic = struct.unpack_from(">I", data, at + 4)[0]
        queue_offset = struct.unpack_from(">q", data, at + 20)[0]
        sys_flag = struct.unpack_from(">i", data, at + 36)[0]
        pos = at + 40 + 8  # the born timestamp
        pos += (16 if sys_flag & BORN_V6 else 4) + 4 + 8  # born host and port, store timestamp
        pos += (16 if sys_flag & STORE_V6 else 4) + 4 + 4 + 8  # store host, reconsume times, prepared offset
        body_length = struct.unpack_from(">i", data, pos)[0]
        body = data[pos + 4 : pos + 4 + body_length]
        del magic  # the topic and properties that follow are not needed
        found.append((queue_offset, json.loads(body)))
        at += size
    return found


class Consumer:
    """The view followed, the queues processed and the intervals recorded; one lock for all."""

    def __init__(self, client: SidecarClient) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.boot = time.time()
        self.view: dict[str, Any] | None = None
        self.seen: dict[int, float] = {}
        """generation -> when it first arrived (this node's wall clock, as every node's: one machine)."""
        self.open: dict[str, dict[str, Any]] = {}
        self.closed: list[dict[str, Any]] = []
        self.acked = -1
        self.stopping = False
        self.brokers = {name: Broker(address) for name, address in BROKERS.items()}
        self.offsets: dict[str, int] = {}
        """queue -> the next offset to process, while the queue stays in the view."""
        self.batch_lock = threading.Lock()
        """Held while a tick's batches run: a stop waits for them before it acknowledges."""
        self.pulled = self.reported = 0
        self.idle_until: dict[str, float] = {}
        self.pending: dict[str, int] = {}
        """queue -> an offset processed but not committed yet (the commit failed): retried, and no
        generation is acknowledged meanwhile."""
        self.locked_until: dict[str, float] = {}
        """ORDERLY: queue -> until when its broker lock counts (monotonic)."""
        self.lock_sent = 0.0
        """queue -> when to pull it again after a pull that found nothing (monotonic)."""

    def follow(self) -> None:
        after = -1
        while not self.stopping:
            try:
                timeout = 30.0 if after < 0 else self.client.grant_poll_timeout(30.0)
                view = self.client.wait_for_change(after, timeout=timeout)
            except SidecarError as exc:  # not listening yet, restarting, or its API unreachable
                print(json.dumps({"waiting": str(exc)}), flush=True)
                time.sleep(0.2)
                continue
            at = time.time()  # the node's clock: a benchmark compares it with its own watch events
            generation = int(view["generation"])
            with self.lock:
                if not (IGNORE_GRANT and view.get("fenced") is True):
                    self.view = view
                if generation not in self.seen:
                    self.seen[generation] = at
                    for old in sorted(self.seen)[:-SEEN_KEPT]:
                        del self.seen[old]
            if generation != after:
                print(json.dumps({"generation": generation, "at": at, "queues": view["queues"]}), flush=True)
            after = generation
            if view.get("fenced") is True:
                time.sleep(TICK)  # a fenced sidecar answers long-polls at once

    def rebalance(self) -> None:
        """CLIENT_REBALANCE: heartbeat, consumer list, AllocateMessageQueueAveragely, every REBALANCE s."""
        from mqbalance.model import MessageQueue
        from mqbalance.strategies.avg import allocate_avg

        me = os.environ.get("HOSTNAME", "")
        broker_name, address = next(iter(BROKERS.items()))
        control = Broker(address)  # its own connection: the broker forgets the client when it closes
        queues = [MessageQueue(TOPIC, broker_name, q) for q in range(QUEUE_COUNT)]
        generation = 0
        while not self.stopping:
            try:
                control.heartbeat(me)
                ids = control.consumers()
            except BrokerError as exc:
                print(json.dumps({"rebalance": str(exc)}), flush=True)
                time.sleep(REBALANCE)
                continue
            share = allocate_avg(queues, ids).get(me, []) if me in ids else []
            view = {
                "queues": {TOPIC: [{"brokerName": q.broker_name, "queueId": q.queue_id} for q in share]},
                "consumers": ids,
            }
            with self.lock:
                if self.view is None or self.view["queues"] != view["queues"]:
                    generation += 1
                    self.view = {**view, "generation": generation}
                    self.seen[generation] = time.time()
                    print(
                        json.dumps({"generation": generation, "consumers": ids, "queues": view["queues"]}),
                        flush=True,
                    )
            time.sleep(REBALANCE)

    def process(self) -> None:
        while not self.stopping:
            self.tick()
            time.sleep(TICK)

    def tick(self) -> None:
        with self.batch_lock:
            self._tick()

    def _tick(self) -> None:
        # The grant first, then the clock: a batch that starts now ends by now + TICK, inside it.
        remaining = None if CLIENT_REBALANCE else self.client.grant_remaining()
        valid = (
            IGNORE_GRANT
            or CLIENT_REBALANCE
            or (self.client.grant_valid() and (remaining is None or remaining > TICK))
        )
        deadline = time.monotonic() + TICK
        with self.lock:
            view = self.view
            wanted = _queue_keys(view) if valid and view is not None and not self.stopping else set()
            generation = int(view["generation"]) if view is not None else -1
        in_view = wanted
        self.flush_commits()
        if ORDERLY and self.brokers:
            # An orderly consumer processes only the queues it holds the broker's lock on (kept while
            # a commit of a queue that left is pending).
            self.relock(wanted | set(self.pending))
            wanted = {k for k in wanted if time.monotonic() < self.locked_until.get(k, 0.0)}
        now = time.time()
        with self.lock:
            for key in sorted(set(self.open) - wanted):
                self.closed.append({**self.open.pop(key), "open": False})
            for key in wanted:
                if key in self.open:
                    self.open[key]["end"] = now + TICK
                else:
                    self.open[key] = {"queue": key, "start": now, "end": now + TICK, "generation": generation}
            ack = generation if valid and generation > self.acked else None
        for key in set(self.offsets) - in_view:
            # Read again when it comes back (another may have gone on meanwhile); kept while only its
            # lock is missing. A commit still pending keeps its own offset.
            del self.offsets[key]
        for key in sorted(wanted) if self.brokers else ():
            if ORDERLY and time.monotonic() >= self.locked_until.get(key, 0.0):
                continue  # the lock ran out meanwhile: renewed at the next tick
            try:
                self.batch(key, deadline)
            except BrokerError as exc:
                print(json.dumps({"broker": str(exc), "queue": key}), flush=True)
        if ack is not None and not CLIENT_REBALANCE and not self.pending:
            try:  # nothing outside this generation's share is processed any more
                self.client.release(ack)
                self.acked = ack
            except SidecarError:
                pass  # asked again at the next tick

    def relock(self, wanted: set[str]) -> None:
        """ORDERLY: unlock the queues that left the view, lock (renew) the ones in it."""
        by_broker: dict[str, dict[int, str]] = {}
        for key in set(self.locked_until) - wanted:
            del self.locked_until[key]
            broker_name, _, queue = key.partition("/")[2].rpartition(":")
            with contextlib.suppress(BrokerError):  # the broker's lock lifetime frees it anyway
                self.brokers[broker_name].lock(broker_name, [int(queue)], unlock=True)
        since = time.monotonic() - self.lock_sent
        if not wanted or (since < LOCK_RENEW and (since < LOCK_RETRY or wanted <= set(self.locked_until))):
            return  # renewed every LOCK_RENEW; a queue not locked yet is tried every LOCK_RETRY
        for key in wanted:
            broker_name, _, queue = key.partition("/")[2].rpartition(":")
            by_broker.setdefault(broker_name, {})[int(queue)] = key
        self.lock_sent = sent = time.monotonic()
        for broker_name, queues in by_broker.items():
            try:
                locked = self.brokers[broker_name].lock(broker_name, sorted(queues))
            except BrokerError as exc:
                print(json.dumps({"lock": str(exc)}), flush=True)
                continue
            if set(queues) - locked:
                print(json.dumps({"notLocked": sorted(set(queues) - locked), "at": time.time()}), flush=True)
            for queue_id, key in queues.items():
                if queue_id in locked:
                    self.locked_until[key] = sent + LOCK_VALID
                else:
                    self.locked_until.pop(key, None)

    def batch(self, key: str, deadline: float) -> None:
        """One batch of ``key``: pull, process while before ``deadline``, report, commit forward."""
        now = time.monotonic()
        if now >= deadline or now < self.idle_until.get(key, 0.0):
            return
        broker_name, _, queue = key.partition("/")[2].rpartition(":")
        broker, queue_id = self.brokers[broker_name], int(queue)
        if key not in self.offsets:  # this run's own commit may still be pending: never behind it
            self.offsets[key] = max(broker.committed(queue_id), self.pending.get(key, 0))
        messages, following = broker.messages(queue_id, self.offsets[key])
        self.pulled += len(messages)
        done = []
        for offset, body in messages:
            if time.monotonic() >= deadline:
                break  # the grant's batch is over: the rest is pulled again
            done.append(
                {"queue": key, "offset": offset, "key": body["key"], "seq": body["seq"], "at": time.time()}
            )
        if not messages:
            self.offsets[key] = following
            self.idle_until[key] = time.monotonic() + IDLE_PULL
            return
        if not done or time.monotonic() >= deadline:
            return  # nothing handed to the sink: nothing processed, nothing committed
        report = {
            "group": MQ_GROUP,
            "pod": os.environ.get("HOSTNAME", ""),
            "boot": self.boot,
            "messages": done,
        }
        req = urllib.request.Request(
            COLLECTOR, json.dumps(report).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=2):
                pass
        except OSError as exc:
            print(json.dumps({"collector": str(exc)}), flush=True)
            return
        self.reported += len(done)
        self.offsets[key] = int(done[-1]["offset"]) + 1
        self.pending[key] = self.offsets[key]
        broker.commit_forward(queue_id, self.offsets[key])
        del self.pending[key]

    def flush_commits(self) -> None:
        """Commit what a failed commit left (the broker away): before any acknowledgement."""
        for key, offset in sorted(self.pending.items()):
            broker_name, _, queue = key.partition("/")[2].rpartition(":")
            try:
                self.brokers[broker_name].commit_forward(int(queue), offset)
            except BrokerError:
                continue
            if self.pending.get(key) == offset:
                del self.pending[key]

    def stop(self) -> None:
        # The batch in hand finishes (reported and committed) before anything is acknowledged.
        acquired = self.batch_lock.acquire(timeout=2)
        self.flush_commits()
        with self.lock:
            self.stopping = True
            for key in sorted(self.open):
                self.closed.append({**self.open.pop(key), "open": False})
            generation = int(self.view["generation"]) if self.view is not None else -1
        if generation >= 0 and not CLIENT_REBALANCE:
            with contextlib.suppress(SidecarError):  # unrecorded: the operator waits for its timeout
                self.client.release(generation, all=True)
        if acquired:
            self.batch_lock.release()

    def record(self) -> dict[str, Any]:
        with self.lock:
            intervals = self.closed + [{**i, "open": True} for i in self.open.values()]
            return {
                "pod": os.environ.get("HOSTNAME", ""),
                "boot": self.boot,
                "now": time.time(),
                "intervals": intervals,
                "seen": {str(g): t for g, t in self.seen.items()},
                "pulled": self.pulled,
                "reported": self.reported,
            }


def _queue_keys(view: dict[str, Any]) -> set[str]:
    if view.get("fenced") is True:
        return set()
    return {
        f"{topic}/{q['brokerName']}:{q['queueId']}"
        for topic, queues in view["queues"].items()
        for q in queues
    }


def handler(consumer: Consumer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/intervals":
                body = json.dumps(consumer.record()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
            else:
                body = b""
                self.send_response(503 if os.path.exists(UNREADY_FILE) else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the kubelet probes every second

    return Handler


def main() -> None:
    consumer = Consumer(SidecarClient(os.environ["MQBALANCE_URL"], timeout=5.0))

    def terminate(*_: Any) -> None:
        consumer.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    threading.Thread(target=consumer.rebalance if CLIENT_REBALANCE else consumer.follow, daemon=True).start()
    threading.Thread(target=consumer.process, daemon=True).start()
    ThreadingHTTPServer(("", PORT), handler(consumer)).serve_forever()


if __name__ == "__main__":
    main()
    sys.exit(0)
