"""The consumer application of the real-pod tests, run as ``python -c <this file>`` in the app container.

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
with ``harness.nemesis``. On SIGTERM it stops processing, acknowledges ``all`` and exits.
With ``IGNORE_GRANT=1`` in its environment it is the client the grant cannot protect: it ignores
fenced answers and the grant's expiry and keeps processing its last queues (the nemesis suite's
check that its scoring catches two owners on real pods).

Its readiness endpoint (``GET :8080/ready``, the container's readinessProbe) answers 503
while ``/tmp/unready`` exists, so a test can fail the kubelet's probe from outside with
``kubectl exec ... touch /tmp/unready``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mqbalance.sidecar.client import SidecarClient, SidecarError

UNREADY_FILE = "/tmp/unready"
PORT = 8080
TICK = 0.1
"""Seconds one batch takes: a batch starts only when the grant lasts at least this long more."""
SEEN_KEPT = 200
IGNORE_GRANT = os.environ.get("IGNORE_GRANT") == "1"


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

    def process(self) -> None:
        while not self.stopping:
            self.tick()
            time.sleep(TICK)

    def tick(self) -> None:
        # The grant first, then the clock: a batch that starts now ends by now + TICK, inside it.
        remaining = self.client.grant_remaining()
        valid = IGNORE_GRANT or (self.client.grant_valid() and (remaining is None or remaining > TICK))
        now = time.time()
        with self.lock:
            view = self.view
            wanted = _queue_keys(view) if valid and view is not None and not self.stopping else set()
            for key in sorted(set(self.open) - wanted):
                self.closed.append({**self.open.pop(key), "open": False})
            generation = int(view["generation"]) if view is not None else -1
            for key in wanted:
                if key in self.open:
                    self.open[key]["end"] = now + TICK
                else:
                    self.open[key] = {"queue": key, "start": now, "end": now + TICK, "generation": generation}
            ack = generation if valid and generation > self.acked else None
        if ack is not None:
            try:  # nothing outside this generation's share is processed any more
                self.client.release(ack)
                self.acked = ack
            except SidecarError:
                pass  # asked again at the next tick

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for key in sorted(self.open):
                self.closed.append({**self.open.pop(key), "open": False})
            generation = int(self.view["generation"]) if self.view is not None else -1
        if generation >= 0:
            with contextlib.suppress(SidecarError):  # unrecorded: the operator waits for its timeout
                self.client.release(generation, all=True)

    def record(self) -> dict[str, Any]:
        with self.lock:
            intervals = self.closed + [{**i, "open": True} for i in self.open.values()]
            return {
                "pod": os.environ.get("HOSTNAME", ""),
                "boot": self.boot,
                "now": time.time(),
                "intervals": intervals,
                "seen": {str(g): t for g, t in self.seen.items()},
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
    threading.Thread(target=consumer.follow, daemon=True).start()
    threading.Thread(target=consumer.process, daemon=True).start()
    ThreadingHTTPServer(("", PORT), handler(consumer)).serve_forever()


if __name__ == "__main__":
    main()
    sys.exit(0)
