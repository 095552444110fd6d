"""What a real node changes on its machine, and undoing all of it.

A kubelet, containerd and kube-proxy are machine-global: they add an address, a bridge,
iptables chains, sysctls, mounts, cgroups and network namespaces. :class:`HostState`
records, before the node starts, what it is about to change (sysctl values, whether the
pod log directories existed) in a state file under :data:`RUN_ROOT`; :func:`cleanup` puts
the machine back, both after a clean stop and after a run that was killed outright (the
next start, or ``python -m harness.node down``, finds the state file and finishes the job).

Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import polling
from harness.processes.procfs import process_files

RUN_ROOT = Path(os.environ.get("MQBALANCE_NODE_RUN", "/run/mqbalance-node"))
"""containerd's state and socket, the runc root, the state file; fixed: there is one node per machine."""
NODE_ROOT = Path(os.environ.get("MQBALANCE_NODE_ROOT", "/var/lib/mqbalance-node"))
"""The kubelet's root dir and the CNI address allocations."""
LOCK_FILE = Path(os.environ.get("MQBALANCE_NODE_LOCK", "/run/mqbalance-node.lock"))
STATE_FILE = RUN_ROOT / "state.json"
CONTAINERD_SOCKET = RUN_ROOT / "containerd.sock"
BRIDGE = "mqb-cni0"
EGRESS_CHAIN = "MQBALANCE-NODE-EGRESS"
FAULT_CHAIN = "MQBALANCE-FAULT"
"""Inside a node's network namespace: the rules of :mod:`harness.faults.netfault` (partitions)."""
# A cluster of several nodes: each node in a network namespace of its own, joined to a bridge on
# the machine by a veth pair; the names below are the project's own, so cleanup finds them by name.
NODES_BRIDGE = "mqb-nodes"
NETNS_PREFIX = "mqb-node-"
VETH_PREFIX = "mqb-veth-"
CGROUP_PREFIX = "mqb-node-"
"""Each node's kubelet has its own cgroup root (``/sys/fs/cgroup/<controller>/mqb-node-<x>``)."""
POD_LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
CNI_CACHE = Path("/var/lib/cni")
NETNS_DIR = Path("/run/netns")
# Directories the kubelet (pod logs), libcni (its result cache) and containerd (network
# namespaces) create at fixed paths; removed afterwards when the node made them.
CREATED_DIRS = (*POD_LOG_DIRS, CNI_CACHE, NETNS_DIR)

# What the kubelet (kernel tunables it wants), kube-proxy and the CNI bridge set.
SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)


class HostError(RuntimeError):
    """The machine is not in a state a real node can start in."""


def run(argv: list[str], *, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=polling.scaled(timeout), check=False
    )
    if check and result.returncode != 0:
        raise HostError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


# -- one node per machine ---------------------------------------------------------------------


class MachineLock:
    """An exclusive lock held while a node runs; released by the kernel if the holder dies."""

    def __init__(self, path: Path = LOCK_FILE) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = self.path.read_text().strip() or "another process"
            raise HostError(
                f"the real node is in use by pid {holder} ({self.path}); one node runs per machine"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


# -- the record of what a node changed ----------------------------------------------------------


@dataclass
class HostState:
    pid: int
    node_ip: str
    containerd_root: str
    sysctls: dict[str, str] = field(default_factory=dict)
    created_dirs: list[str] = field(default_factory=list)

    @classmethod
    def record(cls, node_ip: str, containerd_root: Path) -> HostState:
        state = cls(os.getpid(), node_ip, str(containerd_root))
        for key in SYSCTLS:
            value = read_sysctl(key)
            if value is not None:
                state.sysctls[key] = value
        state.created_dirs = [str(d) for d in CREATED_DIRS if not d.exists()]
        RUN_ROOT.mkdir(parents=True, exist_ok=True)
        tmp = STATE_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(STATE_FILE)
        return state

    @classmethod
    def load(cls) -> HostState | None:
        try:
            return cls(**json.loads(STATE_FILE.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def read_sysctl(key: str) -> str | None:
    try:
        return _sysctl_path(key).read_text().strip()
    except OSError:
        return None


def write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        _sysctl_path(key).write_text(value)


# -- network ------------------------------------------------------------------------------------


def add_node_address(node_ip: str) -> None:
    """The node's own address: a /32 on the loopback interface, so nothing it serves faces a network."""
    result = run(["ip", "-4", "-o", "addr", "show", "dev", "lo"])
    if f" {node_ip}/32 " not in result.stdout:
        run(["ip", "addr", "add", f"{node_ip}/32", "dev", "lo"])


def remove_node_address(node_ip: str) -> None:
    run(["ip", "addr", "del", f"{node_ip}/32", "dev", "lo"], check=False)


def guard_egress(pod_cidr: str, bridge: str = BRIDGE) -> None:
    """Drop anything pods send that would leave through another interface than ``bridge``."""
    run(["iptables", "-w", "-N", EGRESS_CHAIN], check=False)
    run(["iptables", "-w", "-F", EGRESS_CHAIN])
    run(["iptables", "-w", "-A", EGRESS_CHAIN, "-s", pod_cidr, "!", "-o", bridge, "-j", "DROP"])
    jump = ["FORWARD", "-j", EGRESS_CHAIN]
    if run(["iptables", "-w", "-C", *jump], check=False).returncode != 0:
        run(["iptables", "-w", "-I", *jump])


def _iptables_rules(table: str) -> list[str]:
    result = run(["iptables-save", "-t", table], check=False)
    return result.stdout.splitlines() if result.returncode == 0 else []


def remove_iptables_chains(prefixes: tuple[str, ...] = ("KUBE-", EGRESS_CHAIN)) -> None:
    """Jumps into, rules of, then the chains named ``prefixes`` (kube-proxy's, the kubelet's, ours)."""
    if shutil.which("iptables-save") is None:
        return
    for table in ("filter", "nat", "mangle"):
        lines = _iptables_rules(table)
        chains = [ln[1:].split()[0] for ln in lines if ln.startswith(":") and ln[1:].startswith(prefixes)]
        if not chains:
            continue
        for line in lines:
            if not line.startswith("-A "):
                continue
            parts = line.split()
            if parts[1].startswith(prefixes):
                continue  # goes with its chain
            if any(p.startswith(prefixes) for p in parts[2:]):
                # iptables-save quotes comments; the shell-free split keeps the rule as tokens.
                run(["iptables", "-w", "-t", table, "-D", *_unquote(parts[1:])], check=False)
        for chain in chains:
            run(["iptables", "-w", "-t", table, "-F", chain], check=False)
        for chain in chains:
            run(["iptables", "-w", "-t", table, "-X", chain], check=False)


def _unquote(tokens: list[str]) -> list[str]:
    """Join iptables-save's double-quoted arguments (comments with spaces) back into one token each."""
    out: list[str] = []
    buf: list[str] | None = None
    for tok in tokens:
        if buf is not None:
            buf.append(tok)
            if tok.endswith('"'):
                out.append(" ".join(buf)[1:-1])
                buf = None
        elif tok.startswith('"') and not (tok.endswith('"') and len(tok) > 1):
            buf = [tok]
        else:
            out.append(tok[1:-1] if len(tok) > 1 and tok[0] == tok[-1] == '"' else tok)
    return out


def remove_bridge() -> None:
    run(["ip", "link", "del", BRIDGE], check=False)


def in_netns(netns: str, argv: list[str]) -> list[str]:
    """``argv`` run in the network namespace ``netns`` only (same mounts, cgroups and processes)."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


def ns_run(netns: str, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(in_netns(netns, argv), check=check)


@dataclass(frozen=True)
class NodeLink:
    """One node of a cluster of several: its namespace, its address on the nodes' bridge, its pods' range."""

    netns: str
    veth: str
    address: str
    pod_subnet: str


def add_nodes_network(
    bridge_address: str, prefix_len: int, nodes: list[NodeLink], host_routes: list[str], pod_cidr: str
) -> None:
    """The nodes' bridge on the machine with ``bridge_address``, a network namespace per node
    joined to it by a veth pair (``eth0`` inside), and routes: each node reaches the machine's
    ``host_routes`` (the API server's address) through the bridge and the other nodes' pod ranges
    through those nodes; the machine reaches every pod range through its node. No namespace has a
    default route. Pods' packets may leave their node only towards other pods and ``host_routes``;
    the machine drops any pod packet it would route off the bridge."""
    run(["ip", "link", "add", NODES_BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{bridge_address}/{prefix_len}", "dev", NODES_BRIDGE])
    run(["ip", "link", "set", NODES_BRIDGE, "up"])
    for node in nodes:
        run(["ip", "netns", "add", node.netns])
        run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
        run(["ip", "link", "set", node.veth, "master", NODES_BRIDGE, "up"])
        ns_run(node.netns, ["ip", "link", "set", "lo", "up"])
        ns_run(node.netns, ["ip", "addr", "add", f"{node.address}/{prefix_len}", "dev", "eth0"])
        ns_run(node.netns, ["ip", "link", "set", "eth0", "up"])
        for dst in host_routes:
            ns_run(node.netns, ["ip", "route", "add", dst, "via", bridge_address, "dev", "eth0"])
        for other in nodes:
            if other is not node:
                ns_run(
                    node.netns, ["ip", "route", "add", other.pod_subnet, "via", other.address, "dev", "eth0"]
                )
        ns_run(node.netns, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        ns_run(node.netns, ["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"], check=False)
        guard = ["iptables", "-w", "-A", EGRESS_CHAIN, "-s", pod_cidr]
        ns_run(node.netns, ["iptables", "-w", "-N", EGRESS_CHAIN])
        ns_run(node.netns, [*guard, "-o", BRIDGE, "-j", "RETURN"])
        for dst in [pod_cidr, *host_routes]:
            ns_run(node.netns, [*guard, "-o", "eth0", "-d", dst, "-j", "RETURN"])
        ns_run(node.netns, [*guard, "-j", "DROP"])
        ns_run(node.netns, ["iptables", "-w", "-I", "FORWARD", "-j", EGRESS_CHAIN])
        ns_run(node.netns, ["iptables", "-w", "-N", FAULT_CHAIN])
        for hook in ("INPUT", "OUTPUT", "FORWARD"):
            ns_run(node.netns, ["iptables", "-w", "-I", hook, "-j", FAULT_CHAIN])
        run(["ip", "route", "add", node.pod_subnet, "via", node.address, "dev", NODES_BRIDGE])
    guard_egress(pod_cidr, NODES_BRIDGE)


def node_netns() -> list[str]:
    """The nodes' network namespaces present now (by the project's prefix)."""
    return sorted(p.name for p in NETNS_DIR.glob(f"{NETNS_PREFIX}*")) if NETNS_DIR.is_dir() else []


def node_links() -> list[str]:
    """The nodes' bridge and the machine's ends of their veth pairs present now."""
    names = [p.name for p in Path("/sys/class/net").iterdir()]
    return sorted(n for n in names if n == NODES_BRIDGE or n.startswith(VETH_PREFIX))


def remove_nodes_network() -> list[str]:
    """Delete the nodes' namespaces (their rules, routes and ``eth0`` go with them), the machine's
    veth ends and the bridge (the routes through it go with it); returns what was removed."""
    done = []
    for netns in node_netns():
        run(["ip", "netns", "del", netns], check=False)
        done.append(f"removed network namespace {netns}")
    for link in node_links():
        run(["ip", "link", "del", link], check=False)
        done.append(f"removed link {link}")
    return done


# -- processes, mounts, cgroups -----------------------------------------------------------------


def shim_pids(socket: Path | None = None) -> list[int]:
    """containerd shims of the nodes' containerds (they outlive it by design): of the one at
    ``socket``, or of every one whose socket is under :data:`RUN_ROOT`."""
    pids = []
    for pid, cmdline in process_files("cmdline"):
        argv = cmdline.split(b"\0")
        if not (argv and argv[0].endswith(b"containerd-shim-runc-v2")):
            continue
        under_root = any(a.startswith(str(RUN_ROOT).encode() + b"/") for a in argv)
        if (str(socket).encode() in argv) if socket is not None else under_root:
            pids.append(pid)
    return pids


def kill_pids(pids: Iterable[int], timeout: float = 5.0) -> None:
    pending = list(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def gone() -> bool:
        pending[:] = [p for p in pending if Path(f"/proc/{p}").exists() and not _zombie(p)]
        return not pending

    with contextlib.suppress(TimeoutError):  # best effort: the caller carries on after the timeout
        polling.wait_for("the killed processes to go", gone, timeout, 0.05, TimeoutError)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def mounts_under(roots: Iterable[Path]) -> list[str]:
    """Mount points at or below any of ``roots``, deepest first."""
    prefixes = [str(r).rstrip("/") for r in roots]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_all(roots: Iterable[Path]) -> None:
    for _ in range(3):  # a bind mount can hide another: go again until nothing is left
        points = mounts_under(roots)
        if not points:
            return
        for point in points:
            if run(["umount", point], check=False).returncode != 0:
                run(["umount", "-l", point], check=False)


def _pod_cgroup_tops() -> list[Path]:
    """The single node's ``kubepods`` hierarchies, and each node's own cgroup root of a cluster
    of several nodes (``mqb-node-<x>``, with its ``kubepods`` inside)."""
    root = Path("/sys/fs/cgroup")
    tops = [root / "kubepods"] + [d / "kubepods" for d in root.iterdir() if d.is_dir()]
    tops += sorted(root.glob(f"*/{CGROUP_PREFIX}*"))
    return [t for t in tops if t.is_dir()]


def make_cgroup_root(name: str) -> None:
    """``/<name>`` in every cgroup v1 hierarchy (the kubelet's ``cgroupRoot`` must exist); a new
    cpuset gets its parent's CPUs and memory nodes, or no process could join it."""
    root = Path("/sys/fs/cgroup")
    for hierarchy in sorted(d for d in root.iterdir() if d.is_dir() and (d / "cgroup.procs").exists()):
        group = hierarchy / name.strip("/")
        group.mkdir(exist_ok=True)
        for key in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / key).exists() and not (group / key).read_text().strip():
                (group / key).write_text((hierarchy / key).read_text().strip())


def pod_pids() -> list[int]:
    """Processes in the kubelet's pod cgroups: containers whose shim died (they outlive it)."""
    pids: set[int] = set()
    for top in _pod_cgroup_tops():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
    return sorted(pids)


def remove_pod_cgroups() -> None:
    """The kubelet's ``kubepods`` hierarchy (cgroupfs driver), removed bottom-up once empty."""
    for top in _pod_cgroup_tops():
        for directory, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def cni_netns_mounts() -> list[Path]:
    """Network namespaces containerd's CRI made for pod sandboxes (``/run/netns/cni-*``)."""
    netns = Path("/run/netns")
    return [p for p in netns.glob("cni-*")] if netns.is_dir() else []


# -- the whole undo -----------------------------------------------------------------------------


def cleanup(state: HostState | None = None, extra_mount_roots: Iterable[Path] = ()) -> list[str]:
    """Put the machine back as it was before the node; returns what was done (for logs).

    Safe to call when nothing is left, and after a killed run (it reads the state file).
    """
    state = state or HostState.load()
    done: list[str] = []
    shims = shim_pids()
    if shims:
        kill_pids(shims)
        done.append(f"killed {len(shims)} containerd shims")
    orphans = pod_pids()
    if orphans:
        kill_pids(orphans)
        done.append(f"killed {len(orphans)} container processes left by them")
    roots = [RUN_ROOT, NODE_ROOT, *extra_mount_roots]
    if state is not None:
        roots.append(Path(state.containerd_root))
        for ns in cni_netns_mounts():
            run(["umount", str(ns)], check=False)
            with contextlib.suppress(OSError):
                ns.unlink()
            done.append(f"removed network namespace {ns}")
    points = mounts_under(roots)
    if points:
        unmount_all(roots)
        done.append(f"unmounted {len(points)} mounts")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        remove_bridge()
        done.append(f"removed bridge {BRIDGE}")
    done += remove_nodes_network()
    if any(
        ln.startswith(":KUBE-") or EGRESS_CHAIN in ln for t in ("filter", "nat") for ln in _iptables_rules(t)
    ):
        remove_iptables_chains()
        done.append("removed KUBE-* and the egress iptables chains")
    remove_pod_cgroups()
    if state is not None:
        remove_node_address(state.node_ip)
        for key, value in state.sysctls.items():
            if read_sysctl(key) != value:
                write_sysctl(key, value)
                done.append(f"restored {key}={value}")
        results = CNI_CACHE / "results"
        for cached in results.glob("mqbalance-node-*") if results.is_dir() else []:
            with contextlib.suppress(OSError):
                cached.unlink()
        for directory in map(Path, state.created_dirs):
            if directory in POD_LOG_DIRS:
                shutil.rmtree(directory, ignore_errors=True)
            elif directory.is_dir():
                if directory == NETNS_DIR and mounts_under([NETNS_DIR]):
                    run(["umount", str(NETNS_DIR)], check=False)  # `ip netns add` made it a mount
                for sub in sorted(directory.rglob("*"), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        sub.rmdir()  # empty directories only: anything else is not ours
                with contextlib.suppress(OSError):
                    directory.rmdir()
    for path in (NODE_ROOT, RUN_ROOT):
        if path.exists() and not mounts_under([path]):
            shutil.rmtree(path, ignore_errors=True)
    return done


def leftovers(node_ip: str | None = None, extra_mount_roots: Iterable[Path] = ()) -> list[str]:
    """What a stopped node would have left on the machine; empty when everything was undone."""
    found = []
    shims = shim_pids()
    if shims:
        found.append(f"containerd shims {shims}")
    orphans = pod_pids()
    if orphans:
        found.append(f"container processes {orphans[:5]}")
    points = mounts_under([RUN_ROOT, NODE_ROOT, *extra_mount_roots])
    if points:
        found.append(f"mounts {points[:5]}")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"bridge {BRIDGE}")
    chains = [
        ln[1:].split()[0]
        for t in ("filter", "nat", "mangle")
        for ln in _iptables_rules(t)
        if ln.startswith(":") and (ln.startswith(":KUBE-") or ln.startswith(f":{EGRESS_CHAIN}"))
    ]
    if chains:
        found.append(f"iptables chains {sorted(set(chains))[:5]}")
    if node_ip and f" {node_ip}/32 " in run(["ip", "-4", "-o", "addr", "show", "dev", "lo"]).stdout:
        found.append(f"address {node_ip}/32 on lo")
    netns = cni_netns_mounts()
    if netns:
        found.append(f"network namespaces {[str(n) for n in netns]}")
    if node_netns():
        found.append(f"node network namespaces {node_netns()}")
    if node_links():
        found.append(f"links {node_links()}")
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods") if p.is_dir()]
    cgroups += [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PREFIX}*") if p.is_dir()]
    if Path("/sys/fs/cgroup/kubepods").is_dir():
        cgroups.append("/sys/fs/cgroup/kubepods")
    if cgroups:
        found.append(f"cgroups {cgroups[:3]}")
    if STATE_FILE.exists():
        found.append(f"state file {STATE_FILE}")
    return found
