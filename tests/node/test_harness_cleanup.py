"""A node whose owner was killed outright leaves containerd shims, mounts, a bridge and iptables
rules behind; ``python -m harness.node down`` (and the next start) removes all of it.

Runs before the session's node (this file sorts first): one node runs per machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.kube.versions import default_bin_dir
from harness.node import host
from harness.node.images import Images
from harness.node.specs import NODE_IP
from harness.paths import cache_dir
from harness.polling import scaled, wait_for
from harness.processes.procfs import process_files

REPO = Path(__file__).resolve().parents[2]


def test_a_killed_node_is_cleaned_up_by_down(images: Images, tmp_path: Path) -> None:
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "harness.node", "up", "--dir", str(tmp_path / "node")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert up.stdout is not None
        line = up.stdout.readline()
        assert line.startswith("export KUBECONFIG="), (tmp_path / "up.log").read_text()
        kubectl = [
            str(default_bin_dir() / "kubectl"),
            "--kubeconfig",
            line.strip().split("=", 1)[1],
        ]
        pod = (
            '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "left"}, "spec": {"containers": '
            f'[{{"name": "c", "image": "{images.mqbalance}", "imagePullPolicy": "Never", '
            '"command": ["python", "-c", "import time; time.sleep(600)"]}]}}'
        )
        subprocess.run([*kubectl, "apply", "-f", "-"], input=pod, text=True, check=True, capture_output=True)
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Ready", "pod/left", f"--timeout={scaled(120):.0f}s"],
            check=True,
            capture_output=True,
        )
    finally:
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
        log.close()
    roots = [cache_dir() / "node" / "containerd"]
    markers = (str(tmp_path / "node"), str(host.RUN_ROOT / "config"))
    wait_for("the components gone with their owner", lambda: _components_gone(markers) or None, 30, 0.2)
    found = host.leftovers(NODE_IP, roots)
    assert any("shims" in f for f in found), found
    assert any("mounts" in f for f in found), found
    assert any("iptables" in f for f in found), found
    down = subprocess.run(
        [sys.executable, "-m", "harness.node", "down"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert down.returncode == 0, down.stderr
    assert "killed" in down.stdout
    assert host.leftovers(NODE_IP, roots) == []


def _components_gone(markers: tuple[str, ...]) -> bool:
    """No process of the killed node runs any more (their argv names its dirs): PR_SET_PDEATHSIG."""
    for _pid, argv in process_files("cmdline"):
        if b"containerd-shim" not in argv and any(m.encode() in argv for m in markers):
            return False
    return True
