"""Real Kubernetes nodes on this machine: pods run for real.

:class:`RealNode` is composed of a local control plane (:class:`~harness.kube.cluster.LocalCluster`
with the :class:`~harness.node.profile.NodesProfile`: etcd, kube-apiserver, kube-controller-manager;
ServiceAccount admission on, tokens mounted), kube-scheduler, and per node its own containerd
(Debian's, with runc and the CNI bridge plugins), kubelet and kube-proxy
(:class:`~harness.node.agents.NodeAgents`). Pods reach the API server through the ``kubernetes``
Service (kube-proxy's iptables rules). Everything binds to 127.0.0.1 or to the node's own address
(:data:`~harness.node.specs.NODE_IP`, a /32 on the loopback interface), pods get no default route
and an iptables rule drops anything they would send off the machine. The binaries come from
``hack/build-control-plane.sh --node``, the images (the project's, and the sandbox's ``pause``) from
``hack/build-images.sh``; both are cached. See docs/real-node.md.

``RealNode(nodes=3)`` runs three nodes instead, in zones ``zone-a`` to ``zone-c``, each with its
own containerd, kubelet and kube-proxy in a network namespace of its own on a bridge the run makes
(:func:`~harness.node.specs.node_specs`); :mod:`harness.faults.netfault` partitions them.

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
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from harness import polling
from harness.kube.api import KubeApi
from harness.kube.cluster import LocalCluster
from harness.kube.errors import ClusterError
from harness.kube.versions import helm_path, resolve_version
from harness.node import host
from harness.node.agents import NodeAgents
from harness.node.containerd import Ctr
from harness.node.host import HostError, HostState, MachineLock
from harness.node.images import Images, ensure_images
from harness.node.profile import SCHEDULER_USER, NodesProfile
from harness.node.requirements import NodeBinaries, unavailable
from harness.node.specs import (
    HOST_TEST_RANGE,
    MAX_NODES,
    NODE_IP,
    NODES_BRIDGE_IP,
    NODES_SUBNET,
    POD_CIDR,
    NodeSpec,
    containerd_roots,
    node_specs,
)
from harness.processes.command import run_command, serve_until_interrupted, stop_on_ctrl_c
from harness.processes.managed import Component
from harness.processes.net import free_port, http_ok
from harness.processes.service import Service, forget, stop_at_exit


class RealNode(Service):
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and per node kubelet, kube-proxy
    and containerd.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``version`` picks the
    Kubernetes release (:func:`harness.kube.versions.resolve_version`; default the control plane's)
    and its binaries from the cache (``k8s-<version>/bin``), built when missing (``build``).
    ``nodes`` (1 to 3): with more than one, each node (containerd, kubelet, kube-proxy) runs in a
    network namespace of its own on the nodes' bridge, in zone ``zone-a``, ``zone-b``, ...
    (:func:`~harness.node.specs.node_specs`); the control plane and kube-scheduler stay on the machine.
    """

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
        self.ready_timeout = ready_timeout
        self._build = build
        self._binaries = NodeBinaries(self.version, build=build)
        self.control_plane = LocalCluster(
            workdir,
            ready_timeout=ready_timeout,
            version=self.version,
            profile=NodesProfile(self.specs),
            binaries=self._binaries,
            at_exit=False,
        )
        self.images = images
        self._machine = MachineLock()
        self._host_state: HostState | None = None
        self._scheduler: Component | None = None
        single = len(self.specs) == 1
        self._nodes = {
            spec.name: NodeAgents(spec, self.control_plane, self.wait_ready, single=single)
            for spec in self.specs
        }
        self._scheduler_port = 0
        self._lock = threading.RLock()
        self.containerd_root = self.specs[0].containerd_root
        self.ctr = self._nodes[self.specs[0].name].ctr
        """The first node's containerd (the single node's)."""
        self.timings: dict[str, float] = {}
        """Seconds from the start of :meth:`start` to each milestone."""
        self.stop_hooks: list[Callable[[], None]] = []
        """Called first by :meth:`stop` (undo faults: :class:`harness.faults.netfault.Faults`)."""

    # -- the control plane's, for callers --------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self.control_plane.workdir

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    @property
    def bin_dir(self) -> Path:
        return self.control_plane.bin_dir

    @property
    def minor(self) -> int:
        return self.control_plane.minor

    @property
    def env(self) -> dict[str, str]:
        return self.control_plane.env

    @property
    def api(self) -> KubeApi:
        return self.control_plane.api

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """The control plane's :meth:`~harness.kube.cluster.LocalCluster.kubectl`."""
        return self.control_plane.kubectl(*args, check=check, input=input, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 10.0,
        *,
        content_type: str | None = None,
    ) -> tuple[int, Any]:
        """The control plane's :meth:`~harness.kube.cluster.LocalCluster.request`."""
        return self.control_plane.request(method, path, body, timeout, content_type=content_type)

    def restart_apiserver(self, *, kill: bool = False) -> None:
        self.control_plane.restart_apiserver(kill=kill)

    # -- the nodes -------------------------------------------------------------------------------

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
        return self._agents(node).spec

    def _agents(self, node: str | None) -> NodeAgents:
        try:
            return self._nodes[node or self.specs[0].name]
        except KeyError:
            raise ClusterError(f"no node {node!r}; nodes: {', '.join(self._nodes)}") from None

    def node_ctr(self, node: str | None = None) -> Ctr:
        """``ctr`` against the containerd of ``node`` (default the first)."""
        return self._agents(node).ctr

    @property
    def kubelet_running(self) -> bool:
        return self.kubelet_running_on(None)

    def kubelet_running_on(self, node: str | None) -> bool:
        kubelet = self._agents(node).kubelet
        return kubelet is not None and kubelet.running()

    def _node_components(self) -> list[Component]:
        comps = [self._scheduler] + [c for agents in self._nodes.values() for c in agents.components()]
        return [c for c in comps if c is not None]

    @property
    def pids(self) -> dict[str, int]:
        out = self.control_plane.pids
        for comp in self._node_components():
            if comp.proc is not None:
                out[comp.name] = comp.proc.pid
        return out

    @property
    def running(self) -> bool:
        return (
            self.control_plane.running
            and all(c.running() for c in self._node_components())
            and len(self._node_components()) == 1 + 3 * len(self.specs)
        )

    def logs(self, lines: int = 25) -> str:
        parts = [self.control_plane.logs(lines)]
        for comp in self._node_components():
            parts.append(f"--- {comp.name} ({comp.log}) ---\n{comp.tail(lines)}")
        return "\n".join(parts)

    def wait_ready(self, what: str, comp: Component, probe: Callable[[], bool]) -> None:
        """Until ``probe`` holds (within the ready timeout), failing at once when ``comp`` exits;
        every component's log in the error."""
        comp.wait_ready(what, probe, self.ready_timeout, ClusterError, self.logs)

    def serve_until_interrupted(self, hint: str = "") -> int:
        """``up``'s last step: export the kubeconfig, run until Ctrl-C or a component exits."""
        export = f"export KUBECONFIG={self.kubeconfig}"
        return serve_until_interrupted(export, lambda: self.running, self.logs, hint)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Self:
        with self._lock:
            if self.control_plane.started:
                return self
            self._prepare()
            stop_at_exit(self)
            try:
                self._start_all()
            except BaseException:
                self.stop()
                raise
            return self

    def _prepare(self) -> None:
        """What must be there before anything runs: nothing to stop when it fails."""
        reason = unavailable(self.version, need_built=False)
        if reason is not None:
            raise ClusterError(reason)
        began = time.monotonic()
        self._binaries.ensure()
        if self.images is None:
            self.images = ensure_images(self._build)
        self.timings["built"] = time.monotonic() - began
        try:
            self._machine.acquire()
        except HostError as exc:
            raise ClusterError(str(exc)) from None

    def _prepare_host(self) -> None:
        """What an earlier run left behind undone, then the addresses, bridge, rules and cgroups the
        nodes need (recorded first, so a stop puts them back)."""
        done = host.cleanup(extra_mount_roots=containerd_roots())
        if done:
            print(f"cleaned up after an earlier node: {'; '.join(done)}", file=sys.stderr)
        self._host_state = HostState.record(NODE_IP, self.containerd_root)
        host.add_node_address(NODE_IP)
        if len(self.specs) == 1:
            host.write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
            host.guard_egress(POD_CIDR)
        else:
            links = [
                host.NodeLink(spec.netns or "", f"{host.VETH_PREFIX}{spec.letter}", spec.ip, spec.pod_subnet)
                for spec in self.specs
            ]
            prefix = int(NODES_SUBNET.split("/")[1])
            host.add_nodes_network(NODES_BRIDGE_IP, prefix, links, [HOST_TEST_RANGE], POD_CIDR)
            for spec in self.specs:
                host.make_cgroup_root(spec.cgroup_root or "")

    def _start_all(self) -> None:
        """Everything, in order; :meth:`start` stops it all on an error."""
        assert self.images is not None
        began = time.monotonic()
        self._prepare_host()
        self.control_plane.start()  # keys, etcd, kube-apiserver, kube-controller-manager
        self.timings["control plane"] = time.monotonic() - began
        for agents in self._nodes.values():
            agents.start_containerd(self.images)
        self.timings["containerd"] = time.monotonic() - began
        self._start_scheduler()
        for agents in self._nodes.values():
            agents.start_kubelet(self.images)
            agents.start_proxy()
        for agents in self._nodes.values():
            self._wait_node_ready(agents)
        self.timings["node Ready" if len(self.specs) == 1 else "nodes Ready"] = time.monotonic() - began

    def stop(self) -> None:
        """Stop everything and put the machine back; safe to call more than once."""
        with self._lock:
            forget(self)
            if not self._machine.held:
                self.control_plane.stop()
                return
            try:
                for hook in reversed(self.stop_hooks):
                    with contextlib.suppress(Exception):
                        hook()
                self.stop_hooks.clear()
                self._drain_pods()
            finally:
                for agents in self._nodes.values():
                    agents.stop_agents()
                if self._scheduler is not None:
                    self._scheduler.stop(5.0)
                self._scheduler = None
                self.control_plane.stop()  # kube-controller-manager, kube-apiserver, etcd, the work dir
                for agents in self._nodes.values():
                    agents.stop_containerd()
                host.cleanup(self._host_state, extra_mount_roots=containerd_roots())
                self._host_state = None
                self._machine.release()

    def stop_kubelet(self, node: str | None = None, *, kill: bool = False) -> None:
        """Stop the kubelet of ``node`` (default the first) only: its pods keep running, the node goes
        NotReady after the grace period. ``kill``: SIGKILL, no graceful stop."""
        with self._lock:
            kubelet = self._agents(node).kubelet
            if kubelet is not None:
                kubelet.stop(0 if kill else 5.0)

    def start_kubelet(self, node: str | None = None) -> None:
        """Start the kubelet stopped by :meth:`stop_kubelet` again; returns once the node is Ready."""
        with self._lock:
            agents = self._agents(node)
            if agents.kubelet is None:
                raise ClusterError("node not started")
            if not agents.kubelet.running():
                agents.kubelet.start()
            self._wait_node_ready(agents)

    # -- the scheduler and readiness -------------------------------------------------------------

    def _start_scheduler(self) -> None:
        port = self._scheduler_port = self._scheduler_port or free_port()
        kubeconfig = self.control_plane.user_kubeconfig(SCHEDULER_USER)
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
        self.wait_ready(
            "kube-scheduler /healthz",
            self._scheduler,
            lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure_tls=True),
        )

    def node_ready(self, node: str | None = None) -> bool:
        """The node's Ready condition is True and it has no taints."""
        status, body = self.request("GET", f"/api/v1/nodes/{self.spec(node).name}")
        if status != 200:
            return False
        conditions = {c["type"]: c["status"] for c in body.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True" and not body.get("spec", {}).get("taints")

    def _wait_node_ready(self, agents: NodeAgents) -> None:
        assert agents.kubelet is not None
        what = "the node" if len(self.specs) == 1 else f"node {agents.spec.name}"
        self.wait_ready(
            f"{what} Ready and untainted", agents.kubelet, lambda: self.node_ready(agents.spec.name)
        )
        if agents.proxy is not None:
            self.wait_ready(
                "kube-proxy's rules for the kubernetes Service", agents.proxy, agents.service_rules
            )

    def _drain_pods(self) -> None:
        """Delete every pod through the kubelets (so CNI and mounts are released), quickly."""
        kubelets = [agents.kubelet for agents in self._nodes.values()]
        if not (all(k and k.running() for k in kubelets) and self.control_plane.apiserver_running):
            return
        self.control_plane.stop_controller_manager()  # no replacement pods
        if self._scheduler is not None:
            self._scheduler.stop(5.0)
        self._scheduler = None
        self.kubectl(
            "delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force", "--wait=false",
            check=False, timeout=60,
        )  # fmt: skip
        ctrs = [agents.ctr for agents in self._nodes.values()]
        with contextlib.suppress(TimeoutError):  # best effort: the stop carries on after 60 s
            polling.wait_for(
                "the nodes' containers to go",
                lambda: not any(c.up() and c.containers() for c in ctrs),
                60, 0.2, TimeoutError,
            )  # fmt: skip


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
        done = host.cleanup(extra_mount_roots=containerd_roots())
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
