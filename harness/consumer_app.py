"""The consumer application of the real-pod tests, run as ``python -c <this file>`` in the app container.

It does what a consumer does with the sidecar: long-polls ``$MQBALANCE_URL/v1/queues`` and
prints every generation it is handed, with the time it arrived (one JSON line each, read
back with ``kubectl logs``).
Its readiness endpoint (``GET :8080/ready``, the container's readinessProbe) answers 503
while ``/tmp/unready`` exists, so a test can fail the kubelet's probe from outside with
``kubectl exec ... touch /tmp/unready``. SIGTERM ends it at once.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

UNREADY_FILE = "/tmp/unready"
PORT = 8080


def follow(url: str) -> None:
    after = -1
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v1/queues?after={after}&timeout=30", timeout=40) as resp:
                view: dict[str, Any] = json.load(resp)
        except OSError as exc:  # the sidecar is not listening yet, or restarts
            print(json.dumps({"waiting": str(exc)}), flush=True)
            time.sleep(1)
            continue
        at = time.time()  # the node's clock: a benchmark compares it with its own watch events
        after = int(view["generation"])
        print(json.dumps({"generation": after, "at": at, "queues": view["queues"]}), flush=True)


class Readiness(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503 if os.path.exists(UNREADY_FILE) else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the kubelet probes every second


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Thread(target=follow, args=(os.environ["MQBALANCE_URL"],), daemon=True).start()
    HTTPServer(("", PORT), Readiness).serve_forever()


if __name__ == "__main__":
    main()
    sys.exit(0)
