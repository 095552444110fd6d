"""The harness's Kubernetes client repeats a read or a patch the API server gave up on (504, 429),
as a kubelet would, and nothing else: a create may have happened."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from harness.kube import api
from harness.kube.api import ApiError, KubeApi

GAVE_UP = (
    b'{"kind":"Status","code":504,"message":"Timeout: request did not complete within requested timeout"}'
)


class Server(http.server.ThreadingHTTPServer):
    failures = 0
    """Requests still to answer 504."""
    seen: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.command)
        if self.server.failures:
            self.server.failures -= 1
            status, body = 504, GAVE_UP
        else:
            status, body = 200, b'{"kind":"Pod"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, KubeApi]]:
    monkeypatch.setattr(api, "RETRY_DELAY", 0.0)
    srv = Server(("127.0.0.1", 0), Handler)
    srv.seen = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{srv.server_address[1]}")
    kube = KubeApi(client.ApiClient(configuration))
    yield srv, kube
    kube.close()
    srv.shutdown()


def test_a_patch_the_api_server_gave_up_on_is_sent_again(server: tuple[Server, KubeApi]) -> None:
    srv, kube = server
    srv.failures = 2
    assert kube.request("PATCH", "/api/v1/namespaces/e2e/pods/p/status", {"status": {}}) == {"kind": "Pod"}
    assert srv.seen == ["PATCH"] * 3


def test_retries_end_and_a_create_is_sent_once(server: tuple[Server, KubeApi]) -> None:
    srv, kube = server
    srv.failures = api.RETRIES + 1
    with pytest.raises(ApiError, match="HTTP 504: Timeout"):
        kube.request("GET", "/api/v1/namespaces/e2e/pods/p")
    assert srv.seen == ["GET"] * (api.RETRIES + 1)
    srv.seen.clear()
    srv.failures = 1
    with pytest.raises(ApiError, match="HTTP 504"):
        kube.request("POST", "/api/v1/namespaces/e2e/pods", {"metadata": {"name": "p"}})
    assert srv.seen == ["POST"]
