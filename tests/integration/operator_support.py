"""Helpers for the operator's integration tests: the operator process, resources, polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.cluster import LocalCluster, free_port
from mqbalance.document import CONFIGMAP_KEY, AssignmentDocument, configmap_name
from mqbalance.journal import JournalRecord

GROUP, VERSION = "mqbalance.io", "v1alpha1"
REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0

T = TypeVar("T")


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = DEADLINE, interval: float = 0.05
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


class OperatorProcess:
    """``mqbalance operator`` as a subprocess, the way it runs in a pod."""

    def __init__(self, cluster: LocalCluster, namespaces: list[str], workdir: Path, *extra: str) -> None:
        self.cluster = cluster
        self.namespaces = namespaces
        self.workdir = workdir
        self.extra = extra
        self.journal = workdir / "journal.jsonl"
        self.log = workdir / "operator.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.spawn()
        wait_for("the operator's /healthz", self._healthy, timeout=60)

    def spawn(self) -> None:
        """Start the process without waiting for it to serve /healthz."""
        self.port = free_port()
        argv = [sys.executable, "-m", "mqbalance", "operator", "--metrics-port", str(self.port)]
        argv += ["--metrics-host", "127.0.0.1", "--journal", str(self.journal), *self.extra]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        env = {**self.cluster.env, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        total = 0.0
        for line in self.metrics_text().splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, rest = head.partition("{")
            if metric != name:
                continue
            got = dict(_label_pairs(rest.rstrip("}")))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(value)
        return total

    def journal_records(self) -> list[JournalRecord]:
        if not self.journal.exists():
            return []
        return [JournalRecord.decode(line) for line in self.journal.read_text().splitlines() if line.strip()]


def _label_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in text.split('",'):
        if "=" in part:
            key, _, value = part.partition("=")
            pairs.append((key.strip(), value.strip().strip('"')))
    return pairs


# -- resources ----------------------------------------------------------------------------------


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def apply_topic(
    api: client.ApiClient, namespace: str, name: str, brokers: list[dict[str, Any]], **spec: Any
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": {"brokers": brokers, **spec},
    }
    try:
        custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, "topics", body)
    except ApiException as e:
        if e.status != 409:
            raise
        custom(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "topics", name, {"spec": body["spec"]}
        )


def apply_group(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ConsumerGroup",
        "metadata": {"name": name},
        "spec": spec,
    }
    try:
        custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, "consumergroups", body)
    except ApiException as e:
        if e.status != 409:
            raise
        custom(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "consumergroups", name, {"spec": spec}
        )


def get_group(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "consumergroups", name)
        return cast(dict[str, Any], obj)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def status_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = get_group(api, namespace, name) or {}
    return dict(obj.get("status") or {})


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return next((dict(c) for c in status.get("conditions") or [] if c.get("type") == kind), {})


def read_document(api: client.ApiClient, namespace: str, group: str) -> AssignmentDocument | None:
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(configmap_name(group), namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return AssignmentDocument.decode((cm.data or {})[CONFIGMAP_KEY])


def wait_generation(api: client.ApiClient, namespace: str, group: str, at_least: int) -> AssignmentDocument:
    """The group's document once its generation reaches ``at_least`` and status agrees."""

    def probe() -> AssignmentDocument | None:
        doc = read_document(api, namespace, group)
        if doc is None or doc.generation < at_least:
            return None
        if status_of(api, namespace, group).get("assignmentGeneration") != doc.generation:
            return None
        return doc

    return wait_for(f"{namespace}/{group} generation >= {at_least}", probe)


def events_of(api: client.ApiClient, namespace: str, name: str, reason: str | None = None) -> list[Any]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [e for e in events.items if reason is None or e.reason == reason]


def kubectl_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def env_without_incluster() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
