"""A real Prometheus (Debian's package, installed with promtool by hack/build-control-plane.sh)
that scrapes the operator and the sidecars of a cluster the way the chart's ServiceMonitor and
PodMonitor do — pods, by their ``metrics`` and ``mqb-metrics`` ports, the operator's with
``honorLabels`` — and evaluates the chart's rules. Used by the real-pod monitoring test
(tests/node/test_node_prometheus.py).

Debian builds Prometheus without its Kubernetes service discovery, so the pods are found here,
from the API server, and handed over in ``file_sd`` files that a thread keeps current (Prometheus
reads them again when they change): the same targets and labels the discovery would give.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import yaml

from harness.paths import REPO
from harness.polling import wait_for
from harness.processes.managed import Component
from harness.processes.net import free_port

RULES = REPO / "charts" / "mqbalance" / "files" / "prometheus-rules.yaml"
OPERATOR_PORT, SIDECAR_PORT = "metrics", "mqb-metrics"
"""The container ports the chart's ServiceMonitor (operator) and PodMonitor (sidecars) scrape."""
JOBS = {"operator": (OPERATOR_PORT, True), "sidecars": (SIDECAR_PORT, False)}
"""Job -> (the port it scrapes, honor_labels), as the chart's two monitors have them."""

ListPods = Callable[[], list[dict[str, Any]]]
"""Every pod of the cluster, as the API server lists them (``items`` of ``GET /api/v1/pods``)."""


def binary() -> Path:
    found = shutil.which("prometheus")
    if found is None:
        raise FileNotFoundError(
            "no prometheus binary: run make control-plane (it installs Debian's prometheus)"
        )
    return Path(found)


def rules_with_short_waits(seconds: int) -> dict[str, Any]:
    """The chart's rules, each alert's ``for`` set to ``seconds``: the expressions as shipped, without
    the minutes a test would otherwise sit through before an alert may fire."""
    rules: dict[str, Any] = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and "for" in rule:
                rule["for"] = f"{seconds}s"
    return rules


def targets(pods: list[dict[str, Any]], port_name: str) -> list[dict[str, Any]]:
    """``file_sd`` target groups: each running pod's container port named ``port_name``, labelled
    with the pod's namespace and name (what the monitors' targets carry)."""
    found = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or (pod.get("status") or {}).get("phase") != "Running":
            continue
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                if port.get("name") == port_name:
                    found.append(
                        {
                            "targets": [f"{ip}:{port['containerPort']}"],
                            "labels": {
                                "namespace": pod["metadata"]["namespace"],
                                "pod": pod["metadata"]["name"],
                            },
                        }
                    )
    return sorted(found, key=lambda t: (t["labels"]["namespace"], t["labels"]["pod"]))


class Prometheus:
    """``prometheus`` on 127.0.0.1 scraping the pods ``list_pods`` returns, by their metrics ports;
    evaluates ``rules`` every ``interval``."""

    def __init__(
        self, workdir: Path, list_pods: ListPods, rules: dict[str, Any], interval: str = "1s"
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self._list_pods = list_pods
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._discover, name="prometheus-sd", daemon=True)
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": honor,
                    "file_sd_configs": [{"files": [str(workdir / f"{job}.json")], "refresh_interval": "1s"}],
                }
                for job, (_, honor) in JOBS.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        self._write_targets()
        self._process = Component(
            "prometheus",
            [
                str(binary()),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            workdir / "prometheus.log",
        )

    def _write_targets(self) -> None:
        pods = self._list_pods()
        for job, (port, _) in JOBS.items():
            path = self.workdir / f"{job}.json"
            text = json.dumps(targets(pods, port), indent=1)
            if not path.exists() or path.read_text() != text:
                path.with_suffix(".tmp").write_text(text)
                path.with_suffix(".tmp").replace(path)  # whole files only: Prometheus may read at any time

    def _discover(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._write_targets()
            except Exception:  # the API server may be away for a moment; the last targets stay
                continue

    def __enter__(self) -> Self:
        self._process.start()
        self._thread.start()
        wait_for("Prometheus ready", lambda: self._ready(), 60)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._process.stop()

    def tail(self, lines: int = 40) -> str:
        return self._process.tail(lines)

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}{query}", timeout=5) as response:
            return json.loads(response.read())

    def _ready(self) -> bool:
        if not self._process.running():
            raise AssertionError(f"prometheus exited:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` gives now."""
        result: list[dict[str, Any]] = self._get("/api/v1/query", query=expr)["data"]["result"]
        return result

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        """Alerts ``name`` in ``state`` (pending or firing), with their labels."""
        found: list[dict[str, Any]] = self._get("/api/v1/alerts")["data"]["alerts"]
        return [a for a in found if a["labels"].get("alertname") == name and a["state"] == state]

    def targets_up(self, pod_prefix: str) -> list[str]:
        """Pods whose name starts with ``pod_prefix`` that were scraped successfully."""
        return [
            r["metric"].get("pod", "")
            for r in self.query("up == 1")
            if r["metric"].get("pod", "").startswith(pod_prefix)
        ]
