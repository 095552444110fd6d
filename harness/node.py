"""A real single-node Kubernetes cluster on this machine: pods run for real.

:class:`RealNode` extends :class:`~harness.cluster.LocalCluster` (etcd, kube-apiserver,
kube-controller-manager) with kube-scheduler, a kubelet, kube-proxy and its own containerd
(Debian's, with runc and the CNI bridge plugins). ServiceAccount admission is on and
tokens are mounted; pods reach the API server through the ``kubernetes`` Service
(kube-proxy's iptables rules). Everything binds to 127.0.0.1 or to the node's own address
(:data:`NODE_IP`, a /32 on the loopback interface), pods get no default route and an
iptables rule drops anything they would send off the machine. The binaries come from
``hack/build-control-plane.sh --node``, the images (the project's, and the sandbox's
``pause``) from ``hack/build-images.sh``; both are cached. See docs/real-node.md.

``RealNode(nodes=3)`` runs three nodes instead, in zones ``zone-a`` to ``zone-c``, each with its
own containerd, kubelet and kube-proxy in a network namespace of its own on a bridge the run makes
(:func:`node_specs`); :mod:`harness.netfault` partitions them.

The node is machine-global (one containerd socket, one bridge, iptables): one runs at a
time (a lock), it needs root, and :meth:`RealNode.stop` puts the machine back (processes,
mounts, network namespaces, iptables rules, the bridge, the address, sysctls, cgroups),
also at interpreter exit and on SIGTERM. A run killed outright is cleaned up by the next
start or by ``python -m harness.node down``.

Command line::

    python -m harness.node up [--version current|1.20] [--dir DIR] [--nodes N]  # start, print KUBECONFIG
    python -m harness.node down                                # undo what a killed run left behind
    python -m harness.node check                               # can a real node run here? why not?
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import node_host, polling
from harness.cluster import HELM_VERSION, SERVICE_CIDR, ClusterError, LocalCluster, resolve_version
from harness.containerd import (
    CNI_BIN_DIR,
    ContainerdLayout,
    Ctr,
    cni_config,
    render_config,
    write_registry_hosts,
)
from harness.node_host import CONTAINERD_SOCKET, NODE_ROOT, RUN_ROOT, HostError, HostState, MachineLock
from harness.paths import REPO, cache_dir
from harness.processes.command import run_command, stop_on_ctrl_c
from harness.processes.managed import Component
from harness.processes.net import free_port

NODE_NAME = "mqbalance-node"
NODE_IP = os.environ.get("MQBALANCE_NODE_IP", "198.18.0.1")
"""The node's own address (RFC 2544 benchmarking range), on the loopback interface; with several
nodes, the API server's address only (each node has its own, on the nodes' bridge)."""
NODE_ZONE = "zone-a"
POD_CIDR = "10.244.0.0/16"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
MAX_NODES = 3
NODES_SUBNET = "198.18.1.0/24"
"""Several nodes: the bridge on the machine that joins their network namespaces (the run makes it)."""
NODES_BRIDGE_IP = "198.18.1.1"
HOST_TEST_RANGE = "198.18.0.0/24"
"""Addresses the run puts on the machine's loopback (the API server's, test hosts'): nodes route
them through the bridge, and their pods may send there."""
KUBELET_PORT = 10250
SERVICE_IP = "10.96.0.1"
CNI_NETWORK = "mqbalance-node"
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
_BUILD_SCRIPT = REPO / "hack" / "build-control-plane.sh"
_IMAGES_SCRIPT = REPO / "hack" / "build-images.sh"
# Host commands the node runs (Debian packages: containerd, runc, containernetworking-plugins,
# iptables, iproute2); the build script installs them.
_HOST_COMMANDS = (
    "containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-save", "ip", "nsenter",
)  # fmt: skip


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name, zone, address, pods' range and where its containerd and kubelet keep things."""

    name: str
    zone: str
    ip: str
    pod_subnet: str
    gateway: str
    netns: str | None
    """The node's network namespace; None for the single node (on the machine's own network)."""
    run_dir: Path
    """containerd's socket and state, the runc root."""
    node_dir: Path
    """The kubelet's root, the CNI address allocations, the pods' logs."""
    containerd_root: Path
    cgroup_root: str | None
    """The kubelet's ``cgroupRoot``; None: the default (``/kubepods``)."""

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def letter(self) -> str:
        return self.zone.rsplit("-", 1)[-1]

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run on this node's network."""
        return argv if self.netns is None else node_host.in_netns(self.netns, argv)


def node_specs(nodes: int) -> list[NodeSpec]:
    """The single node as it always was, or ``nodes`` (2 or 3) nodes ``mqbalance-node-a``, ``-b``, ``-c``
    in zones ``zone-a``... at 198.18.1.11, .12, .13 with pods in 10.244.1.0/24, 10.244.2.0/24, ..."""
    if not 1 <= nodes <= MAX_NODES:
        raise ClusterError(f"nodes={nodes}: between 1 and {MAX_NODES} (one zone each)")
    if nodes == 1:
        return [
            NodeSpec(
                NODE_NAME, NODE_ZONE, NODE_IP, POD_SUBNET, POD_GATEWAY, None, RUN_ROOT, NODE_ROOT,
                cache_dir() / "node" / "containerd", None,
            )
        ]  # fmt: skip
    specs = []
    for i, letter in enumerate("abc"[:nodes]):
        specs.append(
            NodeSpec(
                name=f"{NODE_NAME}-{letter}",
                zone=f"zone-{letter}",
                ip=f"198.18.1.{11 + i}",
                pod_subnet=f"10.244.{i + 1}.0/24",
                gateway=f"10.244.{i + 1}.1",
                netns=f"{node_host.NETNS_PREFIX}{letter}",
                run_dir=RUN_ROOT / f"node-{letter}",
                node_dir=NODE_ROOT / f"node-{letter}",
                containerd_root=cache_dir() / "node" / f"containerd-{letter}",
                cgroup_root=f"/{node_host.CGROUP_PREFIX}{letter}",
            )
        )
    return specs


def containerd_roots() -> list[Path]:
    """Every node's containerd root in the cache (images and snapshots kept between runs)."""
    return sorted((cache_dir() / "node").glob("containerd*"))


class _NodeRun:
    """What runs for one node: its containerd, kubelet and kube-proxy."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.ctr = Ctr(spec.socket)
        self.containerd: Component | None = None
        self.kubelet: Component | None = None
        self.proxy: Component | None = None

    def components(self) -> list[Component]:
        return [c for c in (self.containerd, self.kubelet, self.proxy) if c is not None]


def _minor(version: str) -> int:
    """The minor number of ``v1.20.2``."""
    try:
        return int(version.lstrip("v").split(".")[1])
    except (IndexError, ValueError):
        raise ClusterError(f"not a Kubernetes version: {version!r} (expected e.g. v1.20.2)") from None


def default_version() -> str:
    """The node's Kubernetes version: the control plane's (``$MQBALANCE_K8S_VERSION``, default the
    current release; see :func:`harness.cluster.resolve_version`)."""
    return resolve_version(None)


def bin_dir_for(version: str) -> Path:
    """Where the binaries of ``version`` are cached (the build scripts' layout)."""
    return cache_dir() / f"k8s-{version}" / "bin"


def helm_path() -> Path:
    return cache_dir() / f"helm-{HELM_VERSION}" / "bin" / "helm"


# -- images -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    """The images ``hack/build-images.sh`` built, and their OCI archives."""

    mqbalance: str
    """e.g. ``localhost/mqbalance:3f2a...``: repository and tag for the chart's values."""
    pause: str
    archives: dict[str, Path]

    @property
    def repository(self) -> str:
        return self.mqbalance.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.mqbalance.rsplit(":", 1)[1]

    @classmethod
    def load(cls, manifest: Path) -> Images:
        try:
            data = json.loads(manifest.read_text())
            app, pause = data["mqbalance"], data["pause"]
            images = cls(
                app["image"],
                pause["image"],
                {app["image"]: Path(app["archive"]), pause["image"]: Path(pause["archive"])},
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterError(
                f"no usable image manifest at {manifest} ({exc}); run {_IMAGES_SCRIPT}"
            ) from None
        missing = [str(p) for p in images.archives.values() if not p.is_file()]
        if missing:
            raise ClusterError(f"image archives missing: {', '.join(missing)}; run {_IMAGES_SCRIPT}")
        return images


def images_manifest() -> Path:
    return cache_dir() / "images" / "images.json"


def ensure_images(build: bool = True) -> Images:
    """The current images: built (or found unchanged, by content hash) by hack/build-images.sh."""
    if build:
        result = subprocess.run(["bash", str(_IMAGES_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(f"{_IMAGES_SCRIPT} failed with exit code {result.returncode}")
    return Images.load(images_manifest())


# -- can it run here? ---------------------------------------------------------------------------


def node_binaries_present(bin_dir: Path) -> bool:
    names = (*NODE_BINARIES, "kube-apiserver", "kube-controller-manager", "kubectl")
    return all(os.access(bin_dir / n, os.X_OK) for n in names)


def unavailable(version: str | None = None, *, need_built: bool = True, nodes: int = 1) -> str | None:
    """Why a real node (``nodes`` of them) cannot run here, or None. ``need_built``: also require
    cached binaries and images."""
    version = resolve_version(version)
    if nodes > 1 and _minor(version) < 29:
        return f"several nodes need Kubernetes 1.29 or later (the kubelet's podLogsDir), not {version}"
    if sys.platform != "linux":
        return "a real node needs Linux"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, iptables, mounts)"
    missing = [c for c in _HOST_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"missing commands {', '.join(missing)} (run hack/build-control-plane.sh --node)"
    if not (CNI_BIN_DIR / "bridge").exists():
        return f"no CNI plugins in {CNI_BIN_DIR} (Debian package containernetworking-plugins)"
    if need_built:
        if not node_binaries_present(bin_dir_for(version)):
            return f"node binaries {version} not built (hack/build-control-plane.sh --k8s {version} --node)"
        try:
            Images.load(images_manifest())
        except ClusterError as exc:
            return str(exc)
    holder = node_host.LOCK_FILE
    lock = MachineLock(holder)
    try:
        lock.acquire()
    except HostError as exc:
        return str(exc)
    finally:
        lock.release()
    return None


# -- the node -----------------------------------------------------------------------------------


class RealNode(LocalCluster):
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, containerd.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``version`` picks the
    Kubernetes release (:func:`harness.cluster.resolve_version`; default the control plane's) and
    its binaries from the cache (``k8s-<version>/bin``), built when missing (``build``).
    ``nodes`` (1 to 3): with more than one, each node (containerd, kubelet, kube-proxy) runs in a
    network namespace of its own on the nodes' bridge, in zone ``zone-a``, ``zone-b``, ...
    (:func:`node_specs`); the control plane and kube-scheduler stay on the machine.
    """

    listen_address = NODE_IP

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        version: str | None = None,
        ready_timeout: float = 180.0,
        build: bool = True,
        images: Images | None = None,
        nodes: int = 1,
    ) -> None:
        self.specs = node_specs(nodes)
        self.version = resolve_version(version)
        super().__init__(
            workdir,
            bin_dir=bin_dir_for(self.version),
            ready_timeout=ready_timeout,
            build=build,
            version=self.version,
        )
        self.images = images
        self._machine = MachineLock()
        self._host_state: HostState | None = None
        self._scheduler: Component | None = None
        self._nodes = {spec.name: _NodeRun(spec) for spec in self.specs}
        users = [f"system:node:{spec.name}" for spec in self.specs]
        self._tokens = {
            user: os.urandom(16).hex() for user in (*users, "system:kube-scheduler", "system:kube-proxy")
        }
        self._ports: dict[str, int] = {}
        self.containerd_root = self.specs[0].containerd_root
        self.ctr = self._nodes[self.specs[0].name].ctr
        """The first node's containerd (the single node's)."""
        self.timings: dict[str, float] = {}
        """Seconds from the start of :meth:`start` to each milestone."""
        self.stop_hooks: list[Callable[[], None]] = []
        """Called first by :meth:`stop` (undo faults: :class:`harness.netfault.Faults`)."""

    # -- public properties -----------------------------------------------------------------------

    @property
    def helm(self) -> Path:
        return helm_path()

    @property
    def node_name(self) -> str:
        """The first node's name (the single node's)."""
        return self.specs[0].name

    @property
    def node_names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def spec(self, node: str | None = None) -> NodeSpec:
        """The node named ``node`` (default the first)."""
        return self._run(node).spec

    def _run(self, node: str | None) -> _NodeRun:
        try:
            return self._nodes[node or self.specs[0].name]
        except KeyError:
            raise ClusterError(f"no node {node!r}; nodes: {', '.join(self._nodes)}") from None

    def node_ctr(self, node: str | None = None) -> Ctr:
        """``ctr`` against the containerd of ``node`` (default the first)."""
        return self._run(node).ctr

    @property
    def kubelet_running(self) -> bool:
        return self.kubelet_running_on(None)

    def kubelet_running_on(self, node: str | None) -> bool:
        kubelet = self._run(node).kubelet
        return kubelet is not None and kubelet.running()

    @property
    def pids(self) -> dict[str, int]:
        out = super().pids
        for comp in self._node_components():
            if comp.proc is not None:
                out[comp.name] = comp.proc.pid
        return out

    @property
    def running(self) -> bool:
        return (
            super().running
            and all(c.running() for c in self._node_components())
            and len(self._node_components()) == 1 + 3 * len(self.specs)
        )

    def _node_components(self) -> list[Component]:
        comps = [self._scheduler] + [c for run in self._nodes.values() for c in run.components()]
        return [c for c in comps if c is not None]

    def logs(self, lines: int = 25) -> str:
        parts = [super().logs(lines)]
        for comp in self._node_components():
            parts.append(f"--- {comp.name} ({comp.log}) ---\n{comp.tail(lines)}")
        return "\n".join(parts)

    # -- lifecycle -------------------------------------------------------------------------------

    def ensure_binaries(self) -> Path:
        bin_dir = self.bin_dir
        if node_binaries_present(bin_dir):
            self._bin_dir = bin_dir
            return bin_dir
        build = ["bash", str(_BUILD_SCRIPT), "--k8s", self.version, "--node"]
        if not self._build:
            raise ClusterError(
                f"node binaries for {self.version} missing in {bin_dir}; run {' '.join(build)}"
            )
        print(f"building the node binaries with {' '.join(build)} (once; cached)", file=sys.stderr)
        result = subprocess.run(build, stdout=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0 or not node_binaries_present(bin_dir):
            raise ClusterError(f"{' '.join(build)} failed (exit code {result.returncode})")
        self._bin_dir = bin_dir
        return bin_dir

    def _prepare_start(self) -> None:
        reason = unavailable(self.version, need_built=False)
        if reason is not None:
            raise ClusterError(reason)
        began = time.monotonic()
        super()._prepare_start()  # the node binaries
        if self.images is None:
            self.images = ensure_images(self._build)
        self.timings["built"] = time.monotonic() - began
        try:
            self._machine.acquire()
        except HostError as exc:
            raise ClusterError(str(exc)) from None

    def _start_components(self) -> None:
        began = time.monotonic()
        done = node_host.cleanup(extra_mount_roots=containerd_roots())
        if done:
            print(f"cleaned up after an earlier node: {'; '.join(done)}", file=sys.stderr)
        self._host_state = HostState.record(NODE_IP, self.containerd_root)
        node_host.add_node_address(NODE_IP)
        if len(self.specs) == 1:
            node_host.write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
            node_host.guard_egress(POD_CIDR)
        else:
            links = [
                node_host.NodeLink(
                    spec.netns or "",
                    f"{node_host.VETH_PREFIX}{spec.letter}",
                    spec.ip,
                    spec.pod_subnet,
                )
                for spec in self.specs
            ]
            prefix = int(NODES_SUBNET.split("/")[1])
            node_host.add_nodes_network(NODES_BRIDGE_IP, prefix, links, [HOST_TEST_RANGE], POD_CIDR)
            for spec in self.specs:
                node_host.make_cgroup_root(spec.cgroup_root or "")
        super()._start_components()  # keys, etcd, kube-apiserver, kube-controller-manager
        self.timings["control plane"] = time.monotonic() - began
        for run in self._nodes.values():
            self._start_containerd(run)
        self.timings["containerd"] = time.monotonic() - began
        self._start_scheduler()
        for run in self._nodes.values():
            self._start_kubelet(run)
            self._start_proxy(run)
        for run in self._nodes.values():
            self._wait_node_ready(run)
        self.timings["node Ready" if len(self.specs) == 1 else "nodes Ready"] = time.monotonic() - began

    def stop(self) -> None:
        """Stop everything and put the machine back; safe to call more than once."""
        with self._lock:
            if not self._machine.held:
                super().stop()
                return
            try:
                for hook in reversed(self.stop_hooks):
                    with contextlib.suppress(Exception):
                        hook()
                self.stop_hooks.clear()
                self._drain_pods()
            finally:
                for run in self._nodes.values():
                    for comp in (run.proxy, run.kubelet):
                        if comp is not None:
                            comp.stop(5.0)
                    run.proxy = run.kubelet = None
                if self._scheduler is not None:
                    self._scheduler.stop(5.0)
                self._scheduler = None
                super().stop()  # kube-controller-manager, kube-apiserver, etcd, the work dir
                for run in self._nodes.values():
                    if run.containerd is not None:
                        with contextlib.suppress(Exception):
                            if run.ctr.up():
                                run.ctr.remove_all()
                        run.containerd.stop(10.0)
                        run.containerd = None
                node_host.cleanup(self._host_state, extra_mount_roots=containerd_roots())
                self._host_state = None
                self._machine.release()

    def stop_kubelet(self, node: str | None = None, *, kill: bool = False) -> None:
        """Stop the kubelet of ``node`` (default the first) only: its pods keep running, the node goes
        NotReady after the grace period. ``kill``: SIGKILL, no graceful stop."""
        with self._lock:
            kubelet = self._run(node).kubelet
            if kubelet is not None:
                kubelet.stop(0 if kill else 5.0)

    def start_kubelet(self, node: str | None = None) -> None:
        """Start the kubelet stopped by :meth:`stop_kubelet` again; returns once the node is Ready."""
        with self._lock:
            run = self._run(node)
            if run.kubelet is None:
                raise ClusterError("node not started")
            if not run.kubelet.running():
                run.kubelet.start()
            self._wait_node_ready(run)

    # -- control plane (LocalCluster with what pods need) ---------------------------------------

    def _serving_names(self) -> list[str]:
        return [*super()._serving_names(), f"IP:{NODE_IP}", "DNS:kubernetes.default.svc.cluster.local"]

    def _write_pki(self) -> None:
        super()._write_pki()
        # kube-apiserver -> kubelet (logs, exec, port-forward): a client in system:masters.
        subject = "/O=system:masters/CN=kube-apiserver-kubelet-client"
        self._issue("apiserver-kubelet-client", subject, "ca", "clientAuth")

    def _write_auth(self) -> None:
        super()._write_auth()
        tokens = self.workdir / "pki" / "tokens.csv"
        lines = [
            f'{self._tokens[f"system:node:{n}"]},system:node:{n},kubelet-{n},"system:nodes"'
            for n in self._nodes
        ]
        lines += [f"{self._tokens[u]},{u},{u}" for u in ("system:kube-scheduler", "system:kube-proxy")]
        with tokens.open("a") as out:
            out.write("\n".join(lines) + "\n")

    def _write_kubeconfigs(self) -> None:
        super()._write_kubeconfigs()
        files = [(f"system:node:{n}", self._kubelet_kubeconfig_name(n)) for n in self._nodes]
        for user, file in (
            *files,
            ("system:kube-scheduler", "scheduler.kubeconfig"),
            ("system:kube-proxy", "proxy.kubeconfig"),
        ):
            doc = self._kubeconfig_document()
            doc["users"] = [{"name": user, "user": {"token": self._tokens[user]}}]
            doc["contexts"][0]["context"]["user"] = user
            path = self.workdir / file
            path.write_text(json.dumps(doc, indent=2) + "\n")
            path.chmod(0o600)

    def _kubelet_kubeconfig_name(self, node: str) -> str:
        return "kubelet.kubeconfig" if len(self.specs) == 1 else f"kubelet-{node}.kubeconfig"

    def _log(self, run: _NodeRun, component: str) -> Path:
        suffix = "" if len(self.specs) == 1 else f"-{run.spec.letter}"
        return self.workdir / "logs" / f"{component}{suffix}.log"

    def _apiserver_flags(self, pki: Path) -> list[str]:
        return [
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--enable-admission-plugins=NodeRestriction",
            # Straight to an APIService's pod, not through its Service's cluster IP.
            "--enable-aggregator-routing=true",
        ]

    def _controller_manager_flags(self) -> list[str]:
        return [
            # One identity per controller: the node lifecycle controller's own rights are what
            # lets it lift the not-ready taint.
            "--use-service-account-credentials=true",
            f"--cluster-cidr={POD_CIDR}",
            "--allocate-node-cidrs=false",
            # A stopped kubelet turns the node NotReady within 16 s (default 40 s).
            "--node-monitor-period=2s",
            "--node-monitor-grace-period=16s",
            # HorizontalPodAutoscalers act within seconds (default 15 s): tests wait for them.
            "--horizontal-pod-autoscaler-sync-period=2s",
        ]

    def _controllers_off(self) -> list[str]:
        """Everything a node needs runs (node lifecycle, service accounts and their tokens, ...) but
        what needs a cloud, a CA we do not run, or node CIDR allocation; by the names this release
        knows (1.27 renamed them, later releases dropped the cloud ones)."""
        wanted = (
            ("cloud-node-lifecycle",),
            ("route",),
            ("service",),
            ("nodeipam", "node-ipam-controller"),
            ("csrsigning", "certificatesigningrequest-signing-controller"),
            ("csrapproving", "certificatesigningrequest-approving-controller"),
            ("csrcleaner", "certificatesigningrequest-cleaner-controller"),
        )
        argv = [str(self.bin_dir / "kube-controller-manager"), "--help"]
        help_text = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        known: set[str] = set()
        for line in help_text.splitlines():
            if "All controllers:" in line:
                known = {name.strip() for name in line.split("All controllers:", 1)[1].split(",")}
        return [name for names in wanted for name in names if name in known]

    # -- the node --------------------------------------------------------------------------------

    def _start_containerd(self, run: _NodeRun) -> None:
        assert self.images is not None
        spec = run.spec
        config_dir = spec.run_dir / "config"
        cni_dir = config_dir / "net.d"
        registry_dir = config_dir / "registry"
        cni_dir.mkdir(parents=True, exist_ok=True)
        (spec.node_dir / "cni-ipam").mkdir(parents=True, exist_ok=True)
        spec.containerd_root.mkdir(parents=True, exist_ok=True)
        write_registry_hosts(registry_dir)
        # One node: routes to the Service range and the node's address. Several: also to the other
        # nodes' pods and to the machine's test addresses (the API server's), through the node.
        routes = (
            [SERVICE_CIDR, f"{NODE_IP}/32"]
            if spec.netns is None
            else [SERVICE_CIDR, HOST_TEST_RANGE, POD_CIDR]
        )
        (cni_dir / f"10-{CNI_NETWORK}.conflist").write_text(
            cni_config(CNI_NETWORK, spec.pod_subnet, spec.gateway, routes, spec.node_dir / "cni-ipam")
        )
        layout = _Layout(spec.containerd_root, cni_dir, registry_dir, self.images.pause, spec.run_dir)
        config = config_dir / "containerd.toml"
        # render_config() names the single node's socket; each node has its own.
        config.write_text(render_config(layout).replace(str(CONTAINERD_SOCKET), str(spec.socket)))
        run.containerd = Component(
            "containerd", spec.argv(["containerd", "--config", str(config)]), self._log(run, "containerd")
        )
        run.containerd.start()
        self._wait("containerd", run.containerd, run.ctr.up)
        try:
            self._import_images(run.ctr)
        except HostError as exc:
            # A root left broken (an import killed halfway, or an image record whose content is
            # gone) refuses imports: the root is only a cache of imports, so start again from an
            # empty one.
            print(f"{spec.name}: {exc}; importing into an empty containerd root", file=sys.stderr)
            run.containerd.stop(10.0)
            node_host.unmount_all([spec.containerd_root])
            shutil.rmtree(spec.containerd_root)
            spec.containerd_root.mkdir(parents=True)
            run.containerd.start()
            self._wait("containerd", run.containerd, run.ctr.up)
            self._import_images(run.ctr)

    def _import_images(self, ctr: Ctr) -> None:
        assert self.images is not None
        present = ctr.images()
        for ref, archive in self.images.archives.items():
            if ref not in present:
                ctr.import_image(archive, ref)
        wanted = set(self.images.archives)
        stale = [
            ref
            for ref in present
            if ref.startswith(("localhost/mqbalance:", "localhost/mqbalance-pause:")) and ref not in wanted
        ]
        ctr.remove_images(stale)

    def _start_scheduler(self) -> None:
        port = self._ports.setdefault("scheduler", free_port())
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        argv = [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            *(["--port=0"] if self.minor < 23 else []),
            "--leader-elect=false",
            "--v=1",
        ]
        self._scheduler = Component("kube-scheduler", argv, self.workdir / "logs" / "kube-scheduler.log")
        self._scheduler.start()
        self._wait(
            "kube-scheduler /healthz", self._scheduler, lambda: _https_ok(f"https://127.0.0.1:{port}/healthz")
        )

    def _kubelet_config(self, spec: NodeSpec | None = None) -> dict[str, Any]:
        spec = spec or self.specs[0]
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": spec.ip,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._ports.setdefault(f"kubelet-healthz-{spec.name}", free_port()),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "clusterDomain": "cluster.local",
            "resolvConf": "",  # no DNS for pods: they talk to the API server by Service IP only
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "nodeLeaseDurationSeconds": 8,  # renewed every 2 s: NotReady is detected quickly
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,  # never collect the imported images
            "imageGCLowThresholdPercent": 99,
        }
        if self.minor >= 27:
            config["containerRuntimeEndpoint"] = f"unix://{spec.socket}"
        if self.minor >= 31:
            config["failCgroupV1"] = False  # many sandboxes still mount cgroup v1
        if spec.cgroup_root is not None:
            config["cgroupRoot"] = spec.cgroup_root  # kubepods of its own
        if spec.netns is not None:
            # Each kubelet removes log directories of pods it does not know: one directory each.
            config["podLogsDir"] = str(spec.node_dir / "pods")
        return config

    def _start_kubelet(self, run: _NodeRun) -> None:
        assert self.images is not None
        spec = run.spec
        root = spec.node_dir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        suffix = "" if len(self.specs) == 1 else f"-{spec.letter}"
        config = self.workdir / f"kubelet-config{suffix}.json"
        config.write_text(json.dumps(self._kubelet_config(spec), indent=2) + "\n")
        argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={self.workdir / self._kubelet_kubeconfig_name(spec.name)}",
            f"--hostname-override={spec.name}",
            f"--node-ip={spec.ip}",
            f"--node-labels=topology.kubernetes.io/zone={spec.zone}",
            f"--root-dir={root}",
            f"--cert-dir={self.workdir / f'kubelet-pki{suffix}'}",
            "--v=1",
        ]
        if self.minor < 27:
            argv += [
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{spec.socket}",
                f"--pod-infra-container-image={self.images.pause}",
            ]
        run.kubelet = Component("kubelet", spec.argv(argv), self._log(run, "kubelet"))
        run.kubelet.start()

    def _start_proxy(self, run: _NodeRun) -> None:
        spec = run.spec
        if spec.netns is None:
            health_host = "127.0.0.1"
            healthz = self._ports.setdefault("proxy-healthz", free_port())
            metrics = self._ports.setdefault("proxy-metrics", free_port())
        else:  # the node's own network: its own ports, reached from the machine at the node's address
            health_host, healthz, metrics = spec.ip, 10256, 10249
        argv = [
            str(self.bin_dir / "kube-proxy"),
            f"--kubeconfig={self.workdir / 'proxy.kubeconfig'}",
            f"--hostname-override={spec.name}",
            f"--bind-address={spec.ip}",
            f"--cluster-cidr={POD_CIDR}",
            "--proxy-mode=iptables",
            # Leave the machine's conntrack settings alone.
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            f"--nodeport-addresses={spec.ip}/32",
            f"--healthz-bind-address={health_host}:{healthz}",
            f"--metrics-bind-address={health_host}:{metrics}",
            "--v=1",
        ]
        run.proxy = Component("kube-proxy", spec.argv(argv), self._log(run, "kube-proxy"))
        run.proxy.start()
        self._wait(
            "kube-proxy /healthz", run.proxy, lambda: _http_ok(f"http://{health_host}:{healthz}/healthz")
        )

    def node_ready(self, node: str | None = None) -> bool:
        """The node's Ready condition is True and it has no taints."""
        status, body = self.request("GET", f"/api/v1/nodes/{self.spec(node).name}")
        if status != 200:
            return False
        conditions = {c["type"]: c["status"] for c in body.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True" and not body.get("spec", {}).get("taints")

    def _wait_node_ready(self, run: _NodeRun) -> None:
        assert run.kubelet is not None
        what = "the node" if len(self.specs) == 1 else f"node {run.spec.name}"
        self._wait(f"{what} Ready and untainted", run.kubelet, lambda: self.node_ready(run.spec.name))
        if run.proxy is not None:
            self._wait(
                "kube-proxy's rules for the kubernetes Service",
                run.proxy,
                lambda: self._service_rules(run.spec),
            )

    def _service_rules(self, spec: NodeSpec) -> bool:
        # Checked in the rules rather than by sending to the Service IP: until the rules exist,
        # such a packet would follow the default route off the machine.
        out = node_host.run(spec.argv(["iptables-save", "-t", "nat"]), check=False).stdout
        return f"-d {SERVICE_IP}/32" in out and f"--to-destination {NODE_IP}:{self._apiserver_port}" in out

    def _drain_pods(self) -> None:
        """Delete every pod through the kubelets (so CNI and mounts are released), quickly."""
        kubelets = [run.kubelet for run in self._nodes.values()]
        if not (all(k and k.running() for k in kubelets) and self._apiserver and self._apiserver.running()):
            return
        for comp in (self._controller_manager, self._scheduler):
            if comp is not None:
                comp.stop(5.0)  # no replacement pods
        self._controller_manager = self._scheduler = None
        self.kubectl(
            "delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force", "--wait=false",
            check=False, timeout=60,
        )  # fmt: skip
        ctrs = [run.ctr for run in self._nodes.values()]
        with contextlib.suppress(TimeoutError):  # best effort: the stop carries on after 60 s
            polling.wait_for(
                "the nodes' containers to go",
                lambda: not any(c.up() and c.containers() for c in ctrs),
                60, 0.2, TimeoutError,
            )  # fmt: skip


@dataclass(frozen=True)
class _Layout(ContainerdLayout):
    """A node's containerd with its own state and runc root under the node's run directory."""

    run_dir: Path = RUN_ROOT

    @property
    def state(self) -> Path:
        return self.run_dir / "containerd"

    @property
    def runc_root(self) -> Path:
        return self.run_dir / "runc"


def _https_ok(url: str) -> bool:
    # Components' own health endpoints on 127.0.0.1 with self-signed certificates.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
        return bool(resp.status == 200)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


# -- command line -------------------------------------------------------------------------------


def _cmd_up(args: argparse.Namespace) -> int:
    stop_on_ctrl_c()
    node = RealNode(args.dir, version=args.version, nodes=args.nodes)
    started = time.monotonic()
    with node:
        what = "real node" if args.nodes == 1 else f"{args.nodes} real nodes"
        print(
            f"# {what} {node.version} Ready in {time.monotonic() - started:.1f} s at {node.server}",
            file=sys.stderr,
        )
        for spec in node.specs:
            where = f"netns {spec.netns}" if spec.netns else "the machine's network"
            print(f"# {spec.name}: {spec.zone}, {spec.ip}, pods {spec.pod_subnet}, {where}", file=sys.stderr)
        assert node.images is not None
        print(
            f"# images: {node.images.mqbalance}, {node.images.pause}; logs: {node.workdir / 'logs'}",
            file=sys.stderr,
        )
        return node.serve_until_interrupted(" (everything is torn down)")


def _cmd_down(args: argparse.Namespace) -> int:
    lock = MachineLock()
    lock.acquire()  # refuses while a node runs
    try:
        done = node_host.cleanup(extra_mount_roots=containerd_roots())
    finally:
        lock.release()
    print("\n".join(done) if done else "nothing left behind")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    reason = unavailable(args.version)
    print(reason or f"a real node {resolve_version(args.version)} can run here")
    return 0 if reason is None else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.node", description="A real single-node cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
        "up": ("start a node, print `export KUBECONFIG=...`, wait for Ctrl-C", _cmd_up),
        "down": ("undo what a killed node left behind (processes, mounts, iptables, bridge)", _cmd_down),
        "check": ("say whether a real node can run here, and why not", _cmd_check),
    }
    for name, (text, func) in commands.items():
        cmd = sub.add_parser(name, help=text)
        cmd.set_defaults(func=func)
        if name != "down":
            cmd.add_argument(
                "--version",
                default=None,
                help="current, 1.20 or v1.Y.Z (default: $MQBALANCE_K8S_VERSION, else current)",
            )
        if name == "up":
            cmd.add_argument("--dir", type=Path, default=None, help="keep kubeconfig, keys and logs here")
            cmd.add_argument(
                "--nodes",
                type=int,
                default=1,
                help=f"1 (default) to {MAX_NODES}: one zone and network namespace each",
            )
    return run_command(parser, argv, (ClusterError, HostError))


if __name__ == "__main__":
    sys.exit(main())
