"""What real nodes need on this machine, and why they cannot run here when they cannot: Linux, root,
the host's commands and CNI plugins, the node binaries (:class:`NodeBinaries`), the images, and the
machine to themselves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.kube.binaries import BUILD_SCRIPT
from harness.kube.errors import ClusterError
from harness.kube.versions import default_bin_dir, minor_of, resolve_version
from harness.node import host
from harness.node.containerd import CNI_BIN_DIR
from harness.node.host import HostError, MachineLock
from harness.node.images import Images, images_manifest

NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
# Host commands the node runs (Debian packages: containerd, runc, containernetworking-plugins,
# iptables, iproute2); the build script installs them.
_HOST_COMMANDS = (
    "containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-save", "ip", "nsenter",
)  # fmt: skip


def node_binaries_present(bin_dir: Path) -> bool:
    names = (*NODE_BINARIES, "kube-apiserver", "kube-controller-manager", "kubectl")
    return all(os.access(bin_dir / n, os.X_OK) for n in names)


class NodeBinaries:
    """The control plane's and the nodes' binaries of ``version`` in the cache, built there by
    ``hack/build-control-plane.sh --node`` when missing (if ``build``)."""

    def __init__(self, version: str, *, build: bool = True) -> None:
        self.version = version
        self._build = build

    @property
    def directory(self) -> Path:
        return default_bin_dir(self.version)

    def ensure(self) -> Path:
        bin_dir = self.directory
        if node_binaries_present(bin_dir):
            return bin_dir
        build = ["bash", str(BUILD_SCRIPT), "--k8s", self.version, "--node"]
        if not self._build:
            raise ClusterError(
                f"node binaries for {self.version} missing in {bin_dir}; run {' '.join(build)}"
            )
        print(f"building the node binaries with {' '.join(build)} (once; cached)", file=sys.stderr)
        result = subprocess.run(build, stdout=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0 or not node_binaries_present(bin_dir):
            raise ClusterError(f"{' '.join(build)} failed (exit code {result.returncode})")
        return bin_dir


def unavailable(version: str | None = None, *, need_built: bool = True, nodes: int = 1) -> str | None:
    """Why a real node (``nodes`` of them) cannot run here, or None. ``need_built``: also require
    cached binaries and images."""
    version = resolve_version(version)
    if nodes > 1 and minor_of(version) < 29:
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
        if not node_binaries_present(default_bin_dir(version)):
            return f"node binaries {version} not built (hack/build-control-plane.sh --k8s {version} --node)"
        try:
            Images.load(images_manifest())
        except ClusterError as exc:
            return str(exc)
    lock = MachineLock(host.LOCK_FILE)
    try:
        lock.acquire()
    except HostError as exc:
        return str(exc)
    finally:
        lock.release()
    return None
