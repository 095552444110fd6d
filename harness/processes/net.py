"""Loopback networking for the harness's processes: a free port, a health check, an in-process
server for the length of a block."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from typing import TypeVar

_Server = TypeVar("_Server", bound=socketserver.BaseServer)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
