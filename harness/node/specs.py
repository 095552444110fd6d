"""The nodes of a run: their names, zones, addresses, pod ranges and where each keeps its state.

One node runs on the machine's own network at :data:`NODE_IP`; two or three run each in a network
namespace of its own on a bridge the run makes (:func:`node_specs`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.kube.errors import ClusterError
from harness.node import host
from harness.node.host import NODE_ROOT, RUN_ROOT
from harness.paths import cache_dir

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

    @property
    def user(self) -> str:
        """The kubelet's user at the API server."""
        return f"system:node:{self.name}"

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run on this node's network."""
        return argv if self.netns is None else host.in_netns(self.netns, argv)


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
                netns=f"{host.NETNS_PREFIX}{letter}",
                run_dir=RUN_ROOT / f"node-{letter}",
                node_dir=NODE_ROOT / f"node-{letter}",
                containerd_root=cache_dir() / "node" / f"containerd-{letter}",
                cgroup_root=f"/{host.CGROUP_PREFIX}{letter}",
            )
        )
    return specs


def containerd_roots() -> list[Path]:
    """Every node's containerd root in the cache (images and snapshots kept between runs)."""
    return sorted((cache_dir() / "node").glob("containerd*"))
