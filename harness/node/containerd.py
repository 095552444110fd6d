"""The real node's containerd (Debian's package): its configuration and a ``ctr`` client.

The node runs its own containerd with its own socket, state and root directories (nothing
under /run/containerd or /var/lib/containerd), the CRI plugin on cgroupfs, overlayfs and
Debian's CNI plugins, and the pod sandbox image built by ``hack/build-images.sh``. Images
are never pulled: every registry host resolves to a closed port on 127.0.0.1, so a missing
image fails on the machine instead of reaching out.

Only the standard library is imported here.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.node.host import CONTAINERD_SOCKET, RUN_ROOT, HostError
from harness.polling import scaled

CNI_BIN_DIR = Path("/usr/lib/cni")
NAMESPACE = "k8s.io"
"""The containerd namespace the CRI plugin keeps pods' images and containers in."""


@dataclass(frozen=True)
class ContainerdLayout:
    """Where one node's containerd keeps things."""

    root: Path
    """Images and snapshots: kept between runs, so imported images survive a restart."""
    cni_conf_dir: Path
    registry_dir: Path
    sandbox_image: str
    run_dir: Path = RUN_ROOT
    """Its socket, its state and the runc root: the node's own run directory."""

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def state(self) -> Path:
        return self.run_dir / "containerd"

    @property
    def runc_root(self) -> Path:
        return self.run_dir / "runc"


def render_config(layout: ContainerdLayout) -> str:
    """containerd 1.6 configuration (version 2)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{layout.root}"
state = "{layout.state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{layout.socket}"

[ttrpc]
  address = "{layout.socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[{cri}]
  sandbox_image = "{layout.sandbox_image}"
  # No CAP_SYS_RESOURCE in some sandboxes: runc then cannot lower oom_score_adj below the
  # caller's (the pause container asks for -998) and every sandbox fails to start.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{layout.runc_root}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{layout.cni_conf_dir}"
  max_conf_num = 1

[{cri}.registry]
  config_path = "{layout.registry_dir}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{layout.root}/opt"
"""


CLOSED_REGISTRY = "http://127.0.0.1:9"
"""Where every registry host is sent: nothing listens there, so a pull fails at once, locally."""


def write_registry_hosts(registry_dir: Path) -> None:
    """Send every registry (``_default``) and Docker Hub (named, as it is the implied one) to a
    closed port on 127.0.0.1: images come only from imports, and no pull leaves the machine."""
    # containerd 1.6 refuses a hosts.toml without a [host] tree ("invalid `host` tree",
    # containerd#10027) and then falls back to the real registry: give the host explicitly.
    hosts = (
        f'server = "{CLOSED_REGISTRY}"\n\n[host."{CLOSED_REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n'
    )
    for name in ("_default", "docker.io"):
        (registry_dir / name).mkdir(parents=True, exist_ok=True)
        (registry_dir / name / "hosts.toml").write_text(hosts)


def cni_config(network: str, pod_subnet: str, gateway: str, routes: list[str], ipam_dir: Path) -> str:
    """A bridge network for pods. Pods get routes to the Service range and the node's address
    only, no default route: a pod cannot address anything beyond this machine."""
    conf: dict[str, Any] = {
        "cniVersion": "0.4.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "mqb-cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_subnet, "gateway": gateway}]],
                    "routes": [{"dst": r} for r in routes],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


class Ctr:
    """``ctr`` against the node's containerd, in the CRI namespace."""

    def __init__(self, socket: Path = CONTAINERD_SOCKET) -> None:
        self.socket = socket

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(timeout), check=False)
        if check and result.returncode != 0:
            raise HostError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def up(self) -> bool:
        return self.socket.exists() and self("version", check=False, timeout=5).returncode == 0

    def images(self) -> set[str]:
        return set(self("images", "list", "--quiet").stdout.split())

    def import_image(self, archive: Path, ref: str) -> None:
        """Import an OCI archive as ``ref`` (unpacked for the CRI's snapshotter).

        The image is named by the archive's ``org.opencontainers.image.ref.name`` (podman writes
        ``ref``), as ``ctr images import`` names it for a user. Not ``--index-name``: containerd
        1.6 can lose that extra index record's blob before it unpacks it ("failed to resolve
        rootfs: content digest ... not found"), even in an empty root.
        """
        self("images", "import", str(archive), timeout=600)
        if ref not in self.images():
            raise HostError(f"importing {archive} did not give image {ref}")

    def remove_images(self, refs: list[str]) -> None:
        if refs:
            self("images", "remove", *refs, check=False)

    def containers(self) -> list[str]:
        return self("containers", "list", "--quiet", check=False).stdout.split()

    def tasks(self) -> list[str]:
        lines = self("tasks", "list", check=False).stdout.splitlines()[1:]
        return [line.split()[0] for line in lines if line.strip()]

    def remove_all(self) -> int:
        """Kill every task, delete every container (a stop that did not go through the kubelet)."""
        containers = self.containers()
        for task in self.tasks():
            self("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        for task in self.tasks():
            self("tasks", "delete", "--force", task, check=False)
        for container in containers:
            self("containers", "delete", container, check=False)
        return len(containers)
