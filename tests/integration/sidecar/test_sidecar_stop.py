"""A stopping sidecar answers its waiting long-polls at once, not when they time out."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

from harness.apps.sidecar import SidecarProcess
from harness.polling import scaled, wait_for


def test_sigterm_ends_waiting_long_polls_at_once(
    start_sidecar: Callable[..., SidecarProcess], tmp_path: Path
) -> None:
    document = {
        "group": "orders-consumer",
        "generation": 3,
        "strategy": "CONFIG",
        "messageModel": "CLUSTERING",
        "computedAt": time.time(),
        "reason": "initial",
        "members": {"p0": "zone-a"},
        "brokerZones": {},
        "topics": {"orders": {"p0": {"broker-a": [0, 1]}}},
    }
    path = tmp_path / "orders.json"
    path.write_text(json.dumps(document))
    sidecar = start_sidecar(
        "--pod-name", "p0", "--namespace", "shop", "--group", "orders",
        "--assignment-file", f"orders={path}", "--no-topics", "--max-wait", "120",
    )  # fmt: skip
    # One long-poll from a client still connected, one from a client that went away.
    waiting = socket.create_connection(("127.0.0.1", sidecar.port))
    gone = socket.create_connection(("127.0.0.1", sidecar.port))
    for conn in (waiting, gone):
        conn.sendall(b"GET /v1/queues?after=3&timeout=120 HTTP/1.1\r\nHost: sidecar\r\n\r\n")
    wait_for(
        "both long-polls to wait in the sidecar",
        lambda: sidecar.metric("mqbalance_sidecar_long_polls", group="orders") >= 2,
    )
    gone.close()
    # "At once" is seconds, against the 120 s the long-polls would otherwise wait: a busy machine
    # may stretch the seconds (harness.polling.scaled), never to the long-polls' timeout.
    limit = scaled(5, at_most=60)
    started = time.monotonic()
    sidecar.stop(timeout=60)
    took = time.monotonic() - started
    answer = waiting.recv(65536).decode()
    waiting.close()
    assert took < limit, (
        f"the sidecar took {took:.1f} s (limit {limit:.0f} s) to stop with long-polls waiting"
    )
    assert answer.startswith("HTTP/1.1 200"), answer
    assert '"generation":3' in answer
