"""``mqbalance sidecar`` as a subprocess on free ports of 127.0.0.1, with the project's client."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from harness.apps.argv import mqbalance_argv
from harness.apps.metrics import parse_metric
from harness.polling import wait_for
from harness.processes.managed import ManagedProcess, ProcessExited
from harness.processes.net import free_port
from mqbalance.sidecar.client import SidecarClient


class SidecarProcess(ManagedProcess):
    """``mqbalance sidecar`` with ``args``, on free ports of 127.0.0.1."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *args: str,
        metrics: bool = True,
        env: Mapping[str, str] | None = None,
        error: type[Exception] = ProcessExited,
    ) -> None:
        self.port = free_port()
        self.metrics_port = free_port() if metrics else 0
        argv = ["sidecar", "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        if metrics:
            argv += ["--metrics-host", "127.0.0.1"]
        environment = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "MQBALANCE_LOG_LEVEL": "DEBUG",
            **(env or {}),
        }
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        super().__init__("sidecar", mqbalance_argv(*argv, *args), environment, log, error)
        self.client = SidecarClient(f"http://127.0.0.1:{self.port}")

    def start(self, timeout: float = 60) -> None:
        self.spawn()
        wait_for(f"the sidecar to listen on port {self.port}", self.listening, timeout, error=self.error)

    def listening(self) -> bool:
        self.check()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # it answers: up
        except OSError:
            return False
        return True

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return parse_metric(r.read().decode(), name, labels)

    def long_poll(self, after: int, timeout: float = 30) -> int:
        """Block until the sidecar serves a generation other than ``after``; that generation."""
        return int(self.client.wait_for_change(after, timeout)["generation"])
