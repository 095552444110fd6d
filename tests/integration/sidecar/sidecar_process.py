"""Running ``mqbalance sidecar`` as a subprocess against the local cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.cluster import free_port
from harness.polling import wait_for
from mqbalance.document import CONFIGMAP_KEY, AssignmentDocument, configmap_name
from mqbalance.sidecar.client import SidecarClient, SidecarError


def configmap_body(group: str, doc: AssignmentDocument) -> dict[str, object]:
    """The ConfigMap the operator publishes for ``doc``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(group), "labels": {"app.kubernetes.io/managed-by": "mqbalance"}},
        "data": {CONFIGMAP_KEY: doc.encode()},
    }


class SidecarProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, *args: str) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_path
        self.argv = [
            sys.executable,
            "-m",
            "mqbalance",
            "sidecar",
            "--port",
            str(self.port),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            *args,
        ]
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "MQBALANCE_LOG_LEVEL": "DEBUG"}
        self.client = SidecarClient(f"http://127.0.0.1:{self.port}")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(f"the sidecar to listen\n{self.tail()}", self._listening)

    def _listening(self) -> bool | None:
        if self._proc is not None and self._proc.poll() is not None:
            raise AssertionError(f"the sidecar exited with {self._proc.returncode}\n{self.tail()}")
        try:
            self.client.ready()
        except SidecarError:
            return None
        return True

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def metric(self, name: str, **labels: str) -> float | None:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        key = f"{name}{{{want}}}" if want else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
