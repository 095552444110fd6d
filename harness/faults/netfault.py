"""Faults on the nodes of a :class:`~harness.node.cluster.RealNode` cluster of several nodes.

- **Partitions**: a node cut off from the API server, from given addresses (a broker, a test
  host) or both. The rules are iptables rules in the node's own network namespace (chain
  ``MQBALANCE-FAULT``, jumped to first from INPUT, OUTPUT and FORWARD), so they hold for the
  kubelet, kube-proxy, containerd and every pod of that node alike, established connections
  included, and nothing on the machine is touched. Cut off from the API server means: nothing from
  the node or its pods reaches the API server's address and nothing comes back, and the API server
  cannot reach the node's kubelet (logs, exec) either.
- **The kubelet** of a node killed (SIGKILL) or stopped, and started again.
- **A container's processes** stopped with SIGSTOP and continued with SIGCONT.

:meth:`Faults.heal` undoes every fault (or one node's); the cluster's ``stop()`` heals too
(:attr:`RealNode.stop_hooks`), and deleting a node's namespace on teardown takes its rules with it.

    with RealNode(nodes=3) as cluster:
        faults = Faults(cluster)
        faults.partition("mqbalance-node-b", api=True)
        ...
        faults.heal()
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Any

from harness.node import host
from harness.node.cluster import RealNode
from harness.node.host import FAULT_CHAIN, HostError
from harness.node.specs import KUBELET_PORT, NODE_IP, NODES_BRIDGE_IP, NodeSpec

_HOOKS = ("INPUT", "OUTPUT", "FORWARD")


class FaultError(RuntimeError):
    """A fault that cannot be made on this cluster (no such node, a node without a namespace)."""


class Faults:
    """Partitions, kubelet and process faults on ``cluster``'s nodes; see the module's text."""

    def __init__(self, cluster: RealNode) -> None:
        self.cluster = cluster
        self._partitioned: set[str] = set()
        self._kubelets_down: set[str] = set()
        self._paused: dict[tuple[str, str, str], list[int]] = {}
        # On teardown: partitions and paused processes are undone; stopped kubelets stay stopped
        # (the teardown stops them all anyway).
        cluster.stop_hooks.append(lambda: self.heal(kubelets=False))

    # -- partitions ------------------------------------------------------------------------------

    def _spec(self, node: str) -> NodeSpec:
        try:
            spec = self.cluster.spec(node)
        except Exception as exc:
            raise FaultError(str(exc)) from None
        if spec.netns is None:
            raise FaultError(
                f"{node} runs on the machine's own network: partitions need a node in a network namespace "
                "(RealNode(nodes=3))"
            )
        return spec

    def partition(self, node: str, *, api: bool = True, hosts: Sequence[str] = ()) -> None:
        """Cut ``node`` (and its pods) off from the API server (``api``) and from ``hosts``
        (addresses), both directions; adds to a partition already in place."""
        spec = self._spec(node)
        if not api and not hosts:
            raise FaultError("a partition from nothing: give api=True or hosts")
        assert spec.netns is not None
        self._on_top(spec.netns)
        rules: list[list[str]] = []
        for address in ([NODE_IP] if api else []) + list(hosts):
            rules += [["-d", address], ["-s", address]]
        if api:
            # The API server reaches the kubelet from the machine's address on the nodes' bridge.
            rules.append(["-s", NODES_BRIDGE_IP, "-p", "tcp", "--dport", str(KUBELET_PORT)])
        for rule in rules:
            host.ns_run(spec.netns, ["iptables", "-w", "-A", FAULT_CHAIN, *rule, "-j", "DROP"])
        self._partitioned.add(node)

    def _on_top(self, netns: str) -> None:
        """The fault chain first in each hook: kube-proxy's rules accept established flows before it."""
        for hook in _HOOKS:
            jump = [hook, "-j", FAULT_CHAIN]
            while host.ns_run(netns, ["iptables", "-w", "-D", *jump], check=False).returncode == 0:
                pass
            host.ns_run(netns, ["iptables", "-w", "-I", hook, "1", "-j", FAULT_CHAIN])

    def rules(self, node: str) -> list[str]:
        """The fault rules in place on ``node`` (``iptables -S`` lines); empty when healed."""
        spec = self._spec(node)
        assert spec.netns is not None
        result = host.ns_run(spec.netns, ["iptables", "-w", "-S", FAULT_CHAIN], check=False)
        return [ln for ln in result.stdout.splitlines() if ln.startswith(f"-A {FAULT_CHAIN}")]

    def heal_partition(self, node: str) -> None:
        spec = self._spec(node)
        assert spec.netns is not None
        host.ns_run(spec.netns, ["iptables", "-w", "-F", FAULT_CHAIN], check=False)
        self._partitioned.discard(node)

    # -- the kubelet -----------------------------------------------------------------------------

    def kill_kubelet(self, node: str) -> None:
        """SIGKILL ``node``'s kubelet: no graceful stop; its pods keep running."""
        self.cluster.stop_kubelet(node, kill=True)
        self._kubelets_down.add(node)

    def stop_kubelet(self, node: str) -> None:
        self.cluster.stop_kubelet(node)
        self._kubelets_down.add(node)

    def restart_kubelet(self, node: str) -> None:
        """Start ``node``'s kubelet again; returns once the node is Ready."""
        self.cluster.start_kubelet(node)
        self._kubelets_down.discard(node)

    # -- processes -------------------------------------------------------------------------------

    def container_pids(self, namespace: str, pod: str, container: str) -> list[int]:
        """Every process of ``container`` in ``pod`` (its containerd task's)."""
        status, body = self.cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
        if status != 200:
            raise FaultError(f"no pod {namespace}/{pod}: {status}")
        node = body["spec"].get("nodeName")
        cid = _container_id(body, container)
        ctr = self.cluster.node_ctr(node)
        lines = ctr("tasks", "ps", cid, check=False).stdout.splitlines()[1:]
        pids = [int(line.split()[0]) for line in lines if line.split() and line.split()[0].isdigit()]
        if not pids:
            raise FaultError(f"no processes of {namespace}/{pod} container {container} on {node}")
        return pids

    def pause(self, namespace: str, pod: str, container: str) -> list[int]:
        """SIGSTOP every process of the container; returns their pids."""
        pids = self.container_pids(namespace, pod, container)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self._paused[(namespace, pod, container)] = pids
        return pids

    def resume(self, namespace: str, pod: str, container: str) -> None:
        """SIGCONT the processes :meth:`pause` stopped."""
        for pid in self._paused.pop((namespace, pod, container), []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    # -- undo ------------------------------------------------------------------------------------

    def heal(self, node: str | None = None, *, kubelets: bool = True) -> None:
        """Undo every fault (of ``node`` only, when given): partitions, paused processes and, with
        ``kubelets``, stopped kubelets (started again, each waited for Ready)."""
        for key in [k for k in self._paused if node is None or self._pod_node(k) in (node, None)]:
            self.resume(*key)
        for name in sorted(self._partitioned):
            if node in (None, name):
                with contextlib.suppress(HostError):
                    self.heal_partition(name)
        for name in sorted(self._kubelets_down):
            if kubelets and node in (None, name):
                self.restart_kubelet(name)

    def _pod_node(self, key: tuple[str, str, str]) -> str | None:
        status, body = self.cluster.request("GET", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}")
        return body.get("spec", {}).get("nodeName") if status == 200 else None


def _container_id(pod: dict[str, Any], container: str) -> str:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status["name"] == container and status.get("containerID"):
            return str(status["containerID"]).split("://", 1)[-1]
    raise FaultError(f"pod {pod['metadata']['name']} has no running container {container}")
