"""What kind of cluster a control plane serves: the part of its set-up that differs between a
control plane alone (:class:`Standalone`: tests act out kubelets and the scheduler) and one with
real nodes (:class:`harness.node.profile.NodesProfile`).

The control plane (:class:`harness.kube.cluster.LocalCluster`) asks its profile; it is not
subclassed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.kube.pki import Pki

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
"""The ``kubernetes`` Service's cluster IP, the first of :data:`SERVICE_CIDR`."""

# Controllers that need kubelets, a cloud provider or a CA we do not run. Garbage collection,
# namespace deletion and the service-account controllers stay on. Later releases accept these
# names as aliases of their "-controller" names.
DISABLED_CONTROLLERS = (
    "nodelifecycle",
    "attachdetach",
    "csrsigning",
    "csrapproving",
    "csrcleaner",
    "bootstrapsigner",
    "tokencleaner",
    "nodeipam",
    "persistentvolume-expander",
    "horizontalpodautoscaling",
    "ttl",
)
# 1.20 still runs the cloud provider's controllers; later releases moved them out of the
# controller manager and refuse the names.
DISABLED_CONTROLLERS_LEGACY = ("cloud-node-lifecycle", "route", "service")
# Split out of nodelifecycle in 1.29: evicts pods from tainted nodes, which only a kubelet and
# the node lifecycle controller would taint.
DISABLED_CONTROLLERS_CURRENT = ("taint-eviction-controller",)

# ServiceAccount admission would reject pods until the namespace's "default" account exists
# (a race in every fresh test namespace) and mounts tokens no kubelet will use.
# TaintNodesByCondition would taint every new Node not-ready forever without a kubelet.
DISABLED_ADMISSION_PLUGINS = ("ServiceAccount", "TaintNodesByCondition")

BASE_SERVING_NAMES = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    f"IP:{SERVICE_IP}",
)
"""subjectAltName entries of every API server's certificate."""


@dataclass(frozen=True)
class User:
    """A user the API server knows by a bearer token (``tokens.csv``), with a kubeconfig of its own
    in the cluster's work directory."""

    name: str
    uid: str
    groups: tuple[str, ...]
    kubeconfig: str
    """The kubeconfig's file name in the work directory."""


@dataclass(frozen=True)
class Versions:
    """What a profile's flags depend on: the release and its binaries."""

    minor: int
    legacy: bool
    bin_dir: Path


class Profile(Protocol):
    """The control plane's set-up for one kind of cluster."""

    @property
    def listen_address(self) -> str:
        """Where the API server listens and what the kubeconfigs name."""
        ...

    def serving_names(self) -> tuple[str, ...]:
        """subjectAltName entries beyond :data:`BASE_SERVING_NAMES`."""
        ...

    def write_keys(self, pki: Pki) -> None:
        """Keys and certificates beyond the control plane's own."""
        ...

    def users(self) -> tuple[User, ...]:
        """Users beyond the admin (node agents, the scheduler), each with a kubeconfig."""
        ...

    def apiserver_flags(self, pki: Pki) -> list[str]: ...

    def controller_manager_flags(self) -> list[str]: ...

    def controllers_off(self, versions: Versions) -> list[str]:
        """The controller manager's controllers to turn off, by the names ``versions`` knows."""
        ...


class Standalone:
    """A control plane without nodes, on 127.0.0.1: tests act out kubelets and the scheduler
    (:mod:`harness.kube.kubelet`) or run kwok (:mod:`harness.kube.kwok`)."""

    listen_address = "127.0.0.1"

    def serving_names(self) -> tuple[str, ...]:
        return ()

    def write_keys(self, pki: Pki) -> None:
        pass

    def users(self) -> tuple[User, ...]:
        return ()

    def apiserver_flags(self, pki: Pki) -> list[str]:
        return [
            # The "kubernetes" Endpoints may not hold a loopback address: the reconciler would
            # log a validation error every 10 s.
            "--endpoint-reconciler-type=none",
            f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
        ]

    def controller_manager_flags(self) -> list[str]:
        return []

    def controllers_off(self, versions: Versions) -> list[str]:
        extra = DISABLED_CONTROLLERS_LEGACY if versions.legacy else DISABLED_CONTROLLERS_CURRENT
        return [*DISABLED_CONTROLLERS, *extra]
