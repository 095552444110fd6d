"""A slow RocketMQ consumer for real pods: consumes exactly the queues its sidecar serves, with the
handover's release acknowledgements, and reports every batch it processed.

Run in the project's image beside the sidecar as ``python -c`` with harness.rocketmq.broker_client
(``harness.apps.pods.pod_app_command``; the image has mqbalance, whose remoting codec and sidecar
client need only the standard library). It pulls each of its queues from the broker (PULL_MESSAGE
with the subscription in the request, as a lite pull consumer does),
spends ``DELAY_MS`` a message, reports the batch's offsets ``[start, next)`` to ``COLLECTOR`` (the
test's HTTP server: a pod that is scaled away takes its logs with it), then commits ``next``
synchronously (UPDATE_CONSUMER_OFFSET). A queue that leaves its share was committed after its last
batch, so the new generation is acknowledged at once; on SIGTERM it finishes the batch in hand,
commits and releases everything.

Environment: ``BROKERS`` (JSON broker name -> host:port), ``GROUP``, ``TOPIC``, ``DELAY_MS``,
``BATCH``, ``COLLECTOR`` (URL), ``POD_NAME``, ``MQBALANCE_URL``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from typing import Any

from harness.rocketmq.broker_client import Broker
from mqbalance.sidecar.client import SidecarClient, SidecarError

BROKERS: dict[str, str] = json.loads(os.environ["BROKERS"])
GROUP, TOPIC = os.environ["GROUP"], os.environ["TOPIC"]
DELAY = float(os.environ.get("DELAY_MS", "20")) / 1000
BATCH = int(os.environ.get("BATCH", "8"))
COLLECTOR = os.environ["COLLECTOR"]
POD = os.environ.get("POD_NAME", socket.gethostname())
stopping = False


def on_term(signum: int, frame: Any) -> None:
    global stopping
    stopping = True


def pull(broker: Broker, queue_id: int, offset: int) -> tuple[int, int]:
    """(messages, next offset) of one batch from ``offset``; (0, offset) when none is there yet."""
    body, following = broker.pull(queue_id, offset, BATCH)
    count, at = 0, 0
    while at + 4 <= len(body):  # messages in the store's format, each led by its total size
        at += int.from_bytes(body[at : at + 4], "big")
        count += 1
    return count, following


def report(queue: tuple[str, int], start: int, end: int) -> None:
    record = {
        "pod": POD,
        "broker": queue[0],
        "queue": queue[1],
        "start": start,
        "end": end,
        "at": time.time(),
    }
    req = urllib.request.Request(COLLECTOR, json.dumps(record).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10):
        pass


def share_of(view: dict[str, Any]) -> set[tuple[str, int]]:
    return {(q["brokerName"], int(q["queueId"])) for q in (view.get("queues") or {}).get(TOPIC, [])}


def main() -> None:
    signal.signal(signal.SIGTERM, on_term)
    sidecar = SidecarClient()
    brokers = {name: Broker(address, GROUP, TOPIC, timeout=10) for name, address in BROKERS.items()}
    while True:
        try:
            view = sidecar.queues()
            break
        except SidecarError:
            time.sleep(0.2)  # the sidecar container starts beside this one
    sidecar.release(view["generation"])  # nothing held yet
    released = view["generation"]
    offsets: dict[tuple[str, int], int] = {}
    while not stopping:
        share = share_of(view)
        for queue in set(offsets) - share:
            del offsets[queue]  # committed after its last batch already
        for queue in share - set(offsets):
            offsets[queue] = brokers[queue[0]].committed(queue[1])
        if view["generation"] != released:  # everything outside the share is stopped and committed
            sidecar.release(view["generation"])
            released = view["generation"]
        busy = False
        for queue in sorted(share):
            if stopping or not sidecar.grant_valid():
                break
            broker, start = brokers[queue[0]], offsets[queue]
            count, end = pull(broker, queue[1], start)
            if count:
                time.sleep(DELAY * count)  # the work
                report(queue, start, end)
                broker.commit(queue[1], end)
                offsets[queue], busy = end, True
        latest = sidecar.queues() if busy else sidecar.wait_for_change(view["generation"], timeout=0.5)
        view = latest
    sidecar.release(view["generation"], all=True)


if __name__ == "__main__":
    main()
