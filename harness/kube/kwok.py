"""kwok (sigs.k8s.io/kwok) beside a :class:`~harness.kube.cluster.LocalCluster`: fake nodes and the pods on
them brought to life without kubelets.

kwok runs in its controller mode against the local API server: it manages the Nodes annotated
``kwok.x-k8s.io/node=fake`` (``--manage-nodes-with-annotation-selector``) and the pods bound to them,
and plays the pinned release's own "fast" Stages (``stages.yaml``, written by hack/build-kwok.sh):
a new fake Node turns Ready, a pod on one turns Running and Ready with an IP, a pod being deleted
is deleted at once (what a kubelet does after its containers stop). No node heartbeats and no
node Leases (``--node-lease-duration-seconds=0``): nothing marks a node NotReady unless a caller
does, since the cluster runs no node lifecycle controller. There is no scheduler either: pods are
created with ``spec.nodeName`` set (:func:`pod_body`).

The binary is built once from Go modules by hack/build-kwok.sh into the per-user cache (see
docs/scale.md). Like the cluster's own components, kwok runs in its own process group and is killed
by the kernel if the Python process dies (``Component``).
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from harness import polling
from harness.kube.cluster import LocalCluster
from harness.kube.errors import ClusterError
from harness.paths import REPO, cache_dir
from harness.processes.managed import Component
from harness.processes.net import free_port
from harness.processes.service import Service, forget, stop_at_exit

KWOK_VERSION = "v0.8.0"
"""The release hack/build-kwok.sh builds (its DEFAULT_VERSION)."""
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"
ZONE_LABEL = "topology.kubernetes.io/zone"
_BUILD_SCRIPT = REPO / "hack" / "build-kwok.sh"


def kwok_dir(version: str = KWOK_VERSION) -> Path:
    return cache_dir() / f"kwok-{version}"


def kwok_built(version: str = KWOK_VERSION) -> bool:
    """Whether hack/build-kwok.sh has built ``version`` (its stamp and files are there)."""
    return subprocess.run(["bash", str(_BUILD_SCRIPT), "--check", version], check=False).returncode == 0


def ensure_kwok(version: str = KWOK_VERSION) -> Path:
    """The directory holding ``bin/kwok`` and ``stages.yaml``, building them first when missing."""
    if not kwok_built(version):
        result = subprocess.run(
            ["bash", str(_BUILD_SCRIPT), version], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise ClusterError(f"hack/build-kwok.sh {version} failed:\n{result.stderr[-3000:]}")
    return kwok_dir(version)


def zone_of(index: int, zones: Sequence[str]) -> str:
    """The zone of the ``index``-th node: round-robin over ``zones``."""
    return zones[index % len(zones)]


def node_body(name: str, zone: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Node kwok manages: the fake-node annotation, the zone and hostname labels, and kwok's
    recommended taint so that nothing real is ever scheduled onto it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: FAKE_NODE_VALUE},
            "labels": {
                ZONE_LABEL: zone,
                "kubernetes.io/hostname": name,
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": [{"key": FAKE_NODE_ANNOTATION, "value": FAKE_NODE_VALUE, "effect": "NoSchedule"}]},
    }


def pod_body(name: str, labels: Mapping[str, str], node: str) -> dict[str, Any]:
    """A pod bound to ``node`` at creation (no scheduler), tolerating the fake nodes' taint."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "consumer", "image": "example/consumer"}],
            "tolerations": [{"key": FAKE_NODE_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def condition_true(obj: Mapping[str, Any], kind: str = "Ready") -> bool:
    """Whether the object's status has condition ``kind`` with status True (a Node or a Pod)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


class Kwok(Service):
    """kwok's controller against ``cluster``, managing the nodes annotated ``kwok.x-k8s.io/node=fake``.

    Use as a context manager, or :meth:`start` and :meth:`stop`, from a thread that outlives it
    (normally the main thread, as for the cluster). Its log is ``<cluster workdir>/logs/kwok.log``.
    """

    def __init__(self, cluster: LocalCluster, *, version: str = KWOK_VERSION, build: bool = True) -> None:
        self.cluster = cluster
        self.version = version
        self._build = build
        self.port = 0
        self._component: Component | None = None

    @property
    def pid(self) -> int:
        if self._component is None or self._component.proc is None:
            raise ClusterError("kwok is not running")
        return self._component.proc.pid

    def argv(self, home: Path) -> list[str]:
        return [
            str(home / "bin" / "kwok"),
            f"--config={home / 'stages.yaml'}",
            f"--kubeconfig={self.cluster.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={FAKE_NODE_VALUE}",
            "--node-lease-duration-seconds=0",
            f"--server-address=127.0.0.1:{self.port}",
            "--node-ip=10.254.0.1",
            "--cidr=10.128.0.0/10",
            "-v=WARN",  # INFO logs every pod and node it patches
        ]

    def start(self, timeout: float = 60.0) -> Self:
        if self._component is not None:
            return self
        if self._build:
            home = ensure_kwok(self.version)
        elif kwok_built(self.version):
            home = kwok_dir(self.version)
        else:
            raise ClusterError(f"kwok {self.version} is not built; run hack/build-kwok.sh")
        self.port = free_port()
        env = {**self.cluster.env, "HOME": str(self.cluster.workdir)}  # kwok keeps nothing in the real home
        self._component = Component(
            "kwok", self.argv(home), self.cluster.workdir / "logs" / "kwok.log", env=env
        )
        self._component.start()
        stop_at_exit(self)
        try:
            polling.wait_for("kwok's /healthz", self._healthy, timeout, error=ClusterError)
        except BaseException:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        component = self._component
        if component is None or not component.running():
            tail = component.tail() if component is not None else ""
            raise ClusterError(f"kwok exited while starting:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        return self._component is not None and self._component.running()

    def tail(self, lines: int = 25) -> str:
        return self._component.tail(lines) if self._component is not None else "(not started)"

    def stop(self) -> None:
        if self._component is not None:
            self._component.stop(5.0)
            self._component = None
        forget(self)
