"""A loopback TCP proxy that a test can cut: everything through it stops at once, as when a
pod loses its network path to the API server (standard library only).

    proxy = TcpProxy("127.0.0.1", api_port)
    proxy.start()            # listens on 127.0.0.1:proxy.port
    proxy.close()            # refuses new connections and resets the open ones
    proxy.start()            # the path is back, on the same port
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._open = False
        self.connections = 0
        """Connections accepted in all."""

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.2)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener, self._open = listener, True
        threading.Thread(target=self._accept, args=(listener,), name="tcp-proxy", daemon=True).start()

    def close(self) -> None:
        """Cut the path: no new connection, and every open one reset."""
        with self._lock:
            self._open = False
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while self._serving(listener):
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                break
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            if not self._serving(listener):
                client.close()
                upstream.close()
                return
            with self._lock:
                self._sockets.update((client, upstream))
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _serving(self, listener: socket.socket) -> bool:
        with self._lock:
            return self._open and self._listener is listener

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def proxied_kubeconfig(source: Path, target: Path, proxy: TcpProxy) -> Path:
    """A copy of the (JSON) kubeconfig ``source`` whose server is reached through ``proxy``."""
    config = json.loads(source.read_text())
    for entry in config["clusters"]:
        url = urlsplit(entry["cluster"]["server"])
        entry["cluster"]["server"] = urlunsplit(url._replace(netloc=f"{url.hostname}:{proxy.port}"))
    target.write_text(json.dumps(config, indent=2) + "\n")
    target.chmod(0o600)
    return target


def server_address(kubeconfig: Path) -> tuple[str, int]:
    """(host, port) of the first cluster's server in the (JSON) kubeconfig."""
    url = urlsplit(json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    assert url.hostname is not None
    return url.hostname, url.port or 443
