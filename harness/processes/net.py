"""Loopback networking for the harness's processes: a free port, a health check, an in-process
server for the length of a block."""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import ssl
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

_Server = TypeVar("_Server", bound=socketserver.BaseServer)


_LOWEST, _HIGHEST = 10000, 30000
"""Where the harness's servers listen: beneath Kubernetes' NodePort range (30000-32767) and, where
the kernel's ephemeral range lies above (Linux: 32768-60999), apart from every outgoing connection's
port, which the kernel could otherwise hand out between a port's pick and its server's bind."""


class _Ports:
    """Ports of 127.0.0.1 handed out by this process, each once: two picks before either server
    binds never share a port (asking the kernel for port 0 twice can return the same one). Each
    process starts at its own place, so the test workers and the processes they start rarely meet;
    a port something listens on is skipped."""

    def __init__(self) -> None:
        low, _high = _ephemeral_range()
        self.candidates = range(_LOWEST, min(_HIGHEST, low)) if low - _LOWEST >= 2000 else range(0)
        self.cursor = os.getpid() * 7919 % max(1, len(self.candidates))
        self.handed_out: set[int] = set()
        self.lock = threading.Lock()

    def take(self, offsets: Sequence[int]) -> int:
        with self.lock:
            for _ in range(len(self.candidates) or 200):
                base = self._next()
                ports = [base + o for o in offsets]
                if all(1024 < p < 65536 and p not in self.handed_out and bindable(p) for p in ports):
                    self.handed_out.update(ports)
                    return base
        raise OSError("no free port on 127.0.0.1")

    def _next(self) -> int:
        if not self.candidates:  # no room beneath the ephemeral range: the kernel's choice
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                return int(sock.getsockname()[1])
        self.cursor = (self.cursor + 1) % len(self.candidates)
        return self.candidates[self.cursor]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 1024, 65535  # unknown: no range is safe from it


def bindable(port: int) -> bool:
    """Whether nothing holds ``port`` of 127.0.0.1 (a listener or a connection in TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PORTS = _Ports()


def free_port() -> int:
    """A port of 127.0.0.1 free now and not handed out before by this process."""
    return _PORTS.take((0,))


def free_port_block(offsets: Sequence[int]) -> int:
    """A port P with P+offset free for every offset (a RocketMQ broker also listens on P-2 and
    P+1)."""
    return _PORTS.take(offsets)


def http_ok(url: str, *, insecure_tls: bool = False) -> bool:
    """Whether ``url`` answers 200 within 2 s; errors (refused, HTTP errors, timeouts) raise
    ``OSError`` for the caller's wait to retry. ``insecure_tls``: a component's own health endpoint
    on 127.0.0.1 with a self-signed certificate."""
    context = None
    if insecure_tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
        return bool(resp.status == 200)


@contextlib.contextmanager
def serving_in_thread(server: _Server, name: str) -> Iterator[_Server]:
    """``server`` answering requests in a daemon thread ``name`` for the block; shut down and closed
    afterwards."""
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
