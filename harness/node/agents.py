"""What runs on one real node: its containerd (with the images imported), its kubelet and its
kube-proxy, set up against the control plane that :class:`harness.node.cluster.RealNode` runs."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.kube.cluster import LocalCluster
from harness.kube.profile import SERVICE_CIDR, SERVICE_IP
from harness.node import host
from harness.node.containerd import ContainerdLayout, Ctr, cni_config, render_config, write_registry_hosts
from harness.node.host import HostError
from harness.node.images import Images
from harness.node.profile import PROXY_USER
from harness.node.specs import HOST_TEST_RANGE, KUBELET_PORT, NODE_IP, POD_CIDR, NodeSpec
from harness.processes.managed import Component
from harness.processes.net import free_port, http_ok

CNI_NETWORK = "mqbalance-node"
Wait = Callable[[str, Component, Callable[[], bool]], None]
"""Until a probe holds, failing at once when the component exits (``RealNode.wait_ready``)."""


class NodeAgents:
    """One node's containerd, kubelet and kube-proxy: started in that order, stopped in reverse."""

    def __init__(self, spec: NodeSpec, control_plane: LocalCluster, wait: Wait, *, single: bool) -> None:
        """``single``: the one node of its run (its files and logs without a letter)."""
        self.spec = spec
        self.ctr = Ctr(spec.socket)
        self._control_plane = control_plane
        self._wait = wait
        self._single = single
        self._ports: dict[str, int] = {}
        self.containerd: Component | None = None
        self.kubelet: Component | None = None
        self.proxy: Component | None = None

    def components(self) -> list[Component]:
        return [c for c in (self.containerd, self.kubelet, self.proxy) if c is not None]

    def _log(self, component: str) -> Path:
        suffix = "" if self._single else f"-{self.spec.letter}"
        return self._control_plane.workdir / "logs" / f"{component}{suffix}.log"

    # -- containerd ------------------------------------------------------------------------------

    def start_containerd(self, images: Images) -> None:
        spec = self.spec
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
        layout = ContainerdLayout(spec.containerd_root, cni_dir, registry_dir, images.pause, spec.run_dir)
        config = config_dir / "containerd.toml"
        config.write_text(render_config(layout))
        self.containerd = Component(
            "containerd", spec.argv(["containerd", "--config", str(config)]), self._log("containerd")
        )
        self.containerd.start()
        self._wait("containerd", self.containerd, self.ctr.up)
        try:
            self._import_images(images)
        except HostError as exc:
            # A root left broken (an import killed halfway, or an image record whose content is
            # gone) refuses imports: the root is only a cache of imports, so start again from an
            # empty one.
            print(f"{spec.name}: {exc}; importing into an empty containerd root", file=sys.stderr)
            self.containerd.stop(10.0)
            host.unmount_all([spec.containerd_root])
            shutil.rmtree(spec.containerd_root)
            spec.containerd_root.mkdir(parents=True)
            self.containerd.start()
            self._wait("containerd", self.containerd, self.ctr.up)
            self._import_images(images)

    def _import_images(self, images: Images) -> None:
        present = self.ctr.images()
        for ref, archive in images.archives.items():
            if ref not in present:
                self.ctr.import_image(archive, ref)
        wanted = set(images.archives)
        stale = [
            ref
            for ref in present
            if ref.startswith(("localhost/mqbalance:", "localhost/mqbalance-pause:")) and ref not in wanted
        ]
        self.ctr.remove_images(stale)

    def stop_containerd(self) -> None:
        """Every container removed, then containerd stopped."""
        if self.containerd is not None:
            with contextlib.suppress(Exception):  # best effort: the host is cleaned up after
                if self.ctr.up():
                    self.ctr.remove_all()
            self.containerd.stop(10.0)
            self.containerd = None

    # -- kubelet ---------------------------------------------------------------------------------

    def kubelet_config(self) -> dict[str, Any]:
        spec = self.spec
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": spec.ip,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._ports.setdefault("kubelet-healthz", free_port()),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self._control_plane.ca_file)},
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
        minor = self._control_plane.minor
        if minor >= 27:
            config["containerRuntimeEndpoint"] = f"unix://{spec.socket}"
        if minor >= 31:
            config["failCgroupV1"] = False  # many sandboxes still mount cgroup v1
        if spec.cgroup_root is not None:
            config["cgroupRoot"] = spec.cgroup_root  # kubepods of its own
        if spec.netns is not None:
            # Each kubelet removes log directories of pods it does not know: one directory each.
            config["podLogsDir"] = str(spec.node_dir / "pods")
        return config

    def start_kubelet(self, images: Images) -> None:
        spec, control_plane = self.spec, self._control_plane
        root = spec.node_dir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        suffix = "" if self._single else f"-{spec.letter}"
        config = control_plane.workdir / f"kubelet-config{suffix}.json"
        config.write_text(json.dumps(self.kubelet_config(), indent=2) + "\n")
        argv = [
            str(control_plane.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={control_plane.user_kubeconfig(spec.user)}",
            f"--hostname-override={spec.name}",
            f"--node-ip={spec.ip}",
            f"--node-labels=topology.kubernetes.io/zone={spec.zone}",
            f"--root-dir={root}",
            f"--cert-dir={control_plane.workdir / f'kubelet-pki{suffix}'}",
            "--v=1",
        ]
        if control_plane.minor < 27:
            argv += [
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{spec.socket}",
                f"--pod-infra-container-image={images.pause}",
            ]
        self.kubelet = Component("kubelet", spec.argv(argv), self._log("kubelet"))
        self.kubelet.start()

    # -- kube-proxy ------------------------------------------------------------------------------

    def start_proxy(self) -> None:
        spec = self.spec
        if spec.netns is None:
            health_host = "127.0.0.1"
            healthz = self._ports.setdefault("proxy-healthz", free_port())
            metrics = self._ports.setdefault("proxy-metrics", free_port())
        else:  # the node's own network: its own ports, reached from the machine at the node's address
            health_host, healthz, metrics = spec.ip, 10256, 10249
        argv = [
            str(self._control_plane.bin_dir / "kube-proxy"),
            f"--kubeconfig={self._control_plane.user_kubeconfig(PROXY_USER)}",
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
        self.proxy = Component("kube-proxy", spec.argv(argv), self._log("kube-proxy"))
        self.proxy.start()
        self._wait(
            "kube-proxy /healthz", self.proxy, lambda: http_ok(f"http://{health_host}:{healthz}/healthz")
        )

    def service_rules(self) -> bool:
        """Whether kube-proxy's rules send the ``kubernetes`` Service to the API server. Checked in
        the rules rather than by sending to the Service IP: until the rules exist, such a packet
        would follow the default route off the machine."""
        out = host.run(self.spec.argv(["iptables-save", "-t", "nat"]), check=False).stdout
        port = self._control_plane.apiserver_port
        return f"-d {SERVICE_IP}/32" in out and f"--to-destination {NODE_IP}:{port}" in out

    def stop_agents(self, grace: float = 5.0) -> None:
        """kube-proxy and the kubelet stopped (the pods keep running until containerd goes)."""
        for comp in (self.proxy, self.kubelet):
            if comp is not None:
                comp.stop(grace)
        self.proxy = self.kubelet = None
