"""The control plane's binaries: present in the cache, or built once by hack/build-control-plane.sh.

:class:`Binaries` is what a cluster asks of them; :class:`ControlPlaneBinaries` are the local control
plane's, and a real node brings its own (:class:`harness.node.requirements.NodeBinaries`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from harness.kube.errors import ClusterError
from harness.kube.versions import default_bin_dir, is_legacy, resolve_version
from harness.paths import REPO

BUILD_SCRIPT = REPO / "hack" / "build-control-plane.sh"
_REQUIRED = ("kube-apiserver", "kube-controller-manager", "kubectl")
# A cluster without the controller manager (the demo's: it runs no Deployments, no namespace
# deletion) needs only what `build-control-plane.sh --demo` builds.
_DEMO_REQUIRED = ("kube-apiserver", "kubectl")


class Binaries(Protocol):
    """Where a cluster's binaries are, and making sure they are there before it starts."""

    @property
    def directory(self) -> Path: ...

    def ensure(self) -> Path:
        """The directory, once every binary the cluster runs is in it (built when allowed)."""
        ...


def find_etcd(bin_dir: Path) -> Path | None:
    """etcd beside the other binaries (a module build), else on PATH (Debian's, for 1.20)."""
    candidate = bin_dir / "etcd"
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("etcd")
    return Path(found) if found else None


def binaries_present(
    bin_dir: Path | None = None, version: str | None = None, *, controller_manager: bool = True
) -> bool:
    resolved = resolve_version(version)
    directory = bin_dir or default_bin_dir(resolved)
    # 1.20 uses Debian's etcd from PATH; a module build brings its own next to the apiserver.
    etcd = find_etcd(directory) if is_legacy(resolved) else directory / "etcd"
    required = _REQUIRED if controller_manager else _DEMO_REQUIRED
    return (
        all(os.access(directory / name, os.X_OK) for name in required)
        and etcd is not None
        and os.access(etcd, os.X_OK)
    )


def ensure_binaries(
    bin_dir: Path | None = None, version: str | None = None, *, controller_manager: bool = True
) -> Path:
    """Return the bin dir, running the build script first when binaries are missing."""
    resolved = resolve_version(version)
    directory = bin_dir or default_bin_dir(resolved)
    if binaries_present(directory, resolved, controller_manager=controller_manager):
        return directory
    if bin_dir is not None and bin_dir != default_bin_dir(resolved):
        raise ClusterError(f"control-plane binaries missing in {bin_dir}")
    if not BUILD_SCRIPT.is_file():
        raise ClusterError(
            f"control-plane binaries missing in {directory} and no build script at {BUILD_SCRIPT}"
        )
    print(f"building the local control plane {resolved} with {BUILD_SCRIPT} (once; cached)", file=sys.stderr)
    argv = ["bash", str(BUILD_SCRIPT), "--k8s", resolved, *([] if controller_manager else ["--demo"])]
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(argv[1:])} failed with exit code {result.returncode}")
    if not binaries_present(directory, resolved, controller_manager=controller_manager):
        raise ClusterError(f"{BUILD_SCRIPT} finished but binaries are still missing in {directory}")
    return directory


class ControlPlaneBinaries:
    """etcd, kube-apiserver, kubectl and (``controller_manager``) kube-controller-manager of
    ``version``: in ``bin_dir`` (default the cache), built there when missing if ``build``."""

    def __init__(
        self,
        version: str,
        bin_dir: Path | None = None,
        *,
        build: bool = True,
        controller_manager: bool = True,
    ) -> None:
        self.version = version
        self._given = bin_dir
        self._build = build
        self._controller_manager = controller_manager

    @property
    def directory(self) -> Path:
        return self._given or default_bin_dir(self.version)

    def ensure(self) -> Path:
        cm = self._controller_manager
        if self._build:
            return ensure_binaries(self._given, self.version, controller_manager=cm)
        if binaries_present(self.directory, self.version, controller_manager=cm):
            return self.directory
        raise ClusterError(
            f"control-plane binaries missing in {self.directory}; run "
            f"hack/build-control-plane.sh --k8s {self.version}"
        )
