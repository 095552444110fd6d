"""The sidecar process's listeners under hostile clients: more connections than the cap, requests sent too
slowly or never finished, long-polls that outlast every timeout, and bodies no handler can read. The limits
are small here so that the test is quick (``--max-connections 8`` and ``--metrics-max-connections 8``,
``--read-timeout 1``,
``--idle-timeout 4``); the mechanism is the one of every listener (mqbalance/listener.py, whose unit tests
cover TLS and the operator's and the injector's listeners use)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.apps.sidecar import SidecarProcess
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument
from tests.unit.sidecar import sidecar_support

CAP = 8
READ_TIMEOUT = 1.0
IDLE_TIMEOUT = 4.0
GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


def document() -> AssignmentDocument:
    return sidecar_support.document(7, {"orders": {"pod-a": [("broker-a", 0)], "pod-b": [("broker-a", 1)]}})


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[SidecarProcess]:
    assignment = tmp_path / "assignment.json"
    assignment.write_text(document().encode())
    side = SidecarProcess(
        tmp_path / "no-kubeconfig",
        tmp_path / "sidecar.log",
        "--pod-name=pod-a",
        "--namespace=shop",
        "--group=orders-consumer",
        f"--assignment-file=orders-consumer={assignment}",
        "--no-topics",
        f"--max-connections={CAP}",
        f"--metrics-max-connections={CAP}",
        f"--read-timeout={READ_TIMEOUT:g}",
        f"--idle-timeout={IDLE_TIMEOUT:g}",
    )
    side.start()
    try:
        yield side
    finally:
        side.stop()
    log = side.tail(1_000_000)
    assert "Traceback" not in log, log[-4000:]


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=scaled(10))


def answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of the next response on ``sock`` (0 when it was closed instead)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(
        int(v) for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "content-length"
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), body


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (read to EOF within the socket's timeout; a reset counts)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("listener", ["api", "metrics"])
def test_twenty_idle_connections_leave_the_eight_newest_open(sidecar: SidecarProcess, listener: str) -> None:
    port = sidecar.port if listener == "api" else sidecar.metrics_port
    request = GET_HEALTHZ if listener == "api" else b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
    socks = [connect(port) for _ in range(20)]
    for sock in socks[:12]:
        assert closed(sock)
    for sock in socks[12:]:
        sock.sendall(request)
        assert answer(sock)[0] == 200
    for sock in socks:
        sock.close()


def test_a_request_trickled_or_never_finished_is_cut_off_at_the_read_timeout(sidecar: SidecarProcess) -> None:
    began = time.monotonic()
    silent = connect(sidecar.port)
    half = connect(sidecar.port)
    half.sendall(b"GET /v1/queues HTTP/1.1\r\nHost: t\r\n")
    assert closed(silent)
    assert closed(half)
    # Before the idle timeout, at which aiohttp (3.14.5 and later) would close a silent connection itself.
    assert READ_TIMEOUT <= time.monotonic() - began < IDLE_TIMEOUT


def test_a_long_poll_outlasts_every_timeout(sidecar: SidecarProcess) -> None:
    sock = connect(sidecar.port)
    sock.settimeout(scaled(30))
    began = time.monotonic()
    wait = READ_TIMEOUT + IDLE_TIMEOUT + 1  # longer than both
    sock.sendall(b"GET /v1/queues?after=7&timeout=%g HTTP/1.1\r\nHost: t\r\n\r\n" % wait)
    status, body = answer(sock)
    assert (status, json.loads(body)["generation"]) == (200, 7)
    assert time.monotonic() - began >= wait
    answered = time.monotonic()
    assert closed(sock)  # then idle, until the idle timeout
    assert time.monotonic() - answered >= IDLE_TIMEOUT - 0.1


HOSTILE = [
    (b"[" * 50_000, b"", 400),
    (b'{"broker": ' + b"[" * 50_000 + b"}", b"", 400),
    (b'{"broker": "\xff\xfe"}', b"", 400),
    (b"\x1f\x8b garbage", b"Content-Encoding: gzip\r\n", 400),
    (b"x" * 70_000, b"", 413),
    (b'{"broker": "broker-z", "latencyMs": 1}', b"", 404),
]
"""(body, extra headers, status): too deep to decode, not UTF-8, a broken encoding, too large, a broker of
no route (the sidecar runs with --no-topics)."""


@pytest.mark.parametrize("path", ["/v1/sends", "/v1/topics/orders/select", "/v1/release"])
def test_hostile_bodies_get_a_4xx_json_error(sidecar: SidecarProcess, path: str) -> None:
    for body, headers, status in HOSTILE:
        if status == 404 and path != "/v1/sends":
            continue
        sock = connect(sidecar.port)
        head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" % path.encode()
        sock.sendall(head + b"Content-Length: %d\r\n" % len(body) + headers + b"\r\n" + body)
        got, answered = answer(sock)
        assert got == status, (path, body[:40], answered)
        assert json.loads(answered)["status"] == got
        sock.close()
    # Slowly: the head on time, then 10 of 100 bytes.
    sock = connect(sidecar.port)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" % path.encode() + b"{" * 10)
    got, answered = answer(sock)
    assert (got, json.loads(answered)["status"]) == (408, 408)
    sock.close()
    wait_for("the sidecar to answer", lambda: sidecar.client.ready(), timeout=10)


SIDECAR_MEMORY_LIMIT_MIB = 128
"""The chart's limit for the sidecar container (sidecar.resources)."""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_heads_the_parser_refuses_do_not_pile_up_in_memory(tmp_path: Path) -> None:
    """aiohttp keeps what it read of a refused head in reference cycles until the garbage collector runs;
    the listener collects after such connections. Default limits (16 metrics connections), 64 at a time."""
    assignment = tmp_path / "assignment.json"
    assignment.write_text(document().encode())
    side = SidecarProcess(
        tmp_path / "no-kubeconfig",
        tmp_path / "sidecar.log",
        "--pod-name=pod-a",
        "--namespace=shop",
        "--group=orders-consumer",
        f"--assignment-file=orders-consumer={assignment}",
        "--no-topics",
        env={"MQBALANCE_LOG_LEVEL": "WARNING"},
    )
    side.start()
    # 100 header lines of 8 KB: refused (400) at the 33rd.
    junk = b"GET /metrics HTTP/1.1\r\nHost: t\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(100)
    )
    rounds: list[float] = []
    try:
        before = rss_mib(side.pid)
        for _ in range(24):
            socks = [connect(side.metrics_port) for _ in range(64)]
            for sock in socks:
                with contextlib.suppress(OSError):  # answered 400 and closed before it took everything
                    sock.sendall(junk)
            for sock in socks:
                assert closed(sock)
                sock.close()
            rounds.append(rss_mib(side.pid))
        assert side.client.ready()
    finally:
        side.stop()
    first, last, peak = max(rounds[:8]), max(rounds[-8:]), max(rounds)
    print(f"listener figures: rss_before_mib={before:.0f} first_mib={first:.0f} last_mib={last:.0f}")
    assert last < first + 10, rounds  # it does not pile up
    assert peak < min(before + 40, SIDECAR_MEMORY_LIMIT_MIB), (before, rounds)
