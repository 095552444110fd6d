"""Which Kubernetes release a cluster runs, and where its binaries are cached.

Two kinds of release are supported side by side: the current release (the default) and any release
from 1.34 on, built from Go modules, and v1.20.2, built from Debian bookworm's source package.
Chosen by the caller or ``MQBALANCE_K8S_VERSION`` (``current``, ``1.20``, or a release such as
``v1.36.3``); docs/local-cluster.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.kube.errors import ClusterError
from harness.paths import cache_dir

CURRENT_K8S_VERSION = "v1.37.2"
"""The release built from Go modules (hack/build-kubernetes.sh's default); the default cluster."""
LEGACY_K8S_VERSION = "v1.20.2"
"""Debian bookworm's ``kubernetes`` source package."""
K8S_VERSION_ENV = "MQBALANCE_K8S_VERSION"
"""Selects the cluster version when the caller does not: ``current``, ``1.20`` or ``v1.Y.Z``."""
OLDEST_MODULE_MINOR = 34
"""The oldest minor release (1.34) that hack/build-kubernetes.sh builds from Go modules."""
HELM_VERSION = "v3.17.2"
_VERSION_RE = re.compile(r"v?1\.(\d+)(?:\.(\d+))?")


def resolve_version(requested: str | None = None) -> str:
    """The full release a request names: ``None`` reads ``MQBALANCE_K8S_VERSION`` (default
    ``current``); ``current`` or its minor (``1.37``) is CURRENT_K8S_VERSION; ``1.20`` or
    ``v1.20.2`` is LEGACY_K8S_VERSION; ``v1.Y.Z`` with Y >= 34 is that release, built from Go
    modules."""
    raw = os.environ.get(K8S_VERSION_ENV, "") if requested is None else requested
    value = raw.strip() or "current"
    if value == "current":
        return CURRENT_K8S_VERSION
    match = _VERSION_RE.fullmatch(value)
    if match is not None:
        minor, patch = int(match.group(1)), match.group(2)
        legacy_minor = minor_of(LEGACY_K8S_VERSION)
        if minor == legacy_minor and patch in (None, LEGACY_K8S_VERSION.rsplit(".", 1)[1]):
            return LEGACY_K8S_VERSION
        if patch is None and minor == minor_of(CURRENT_K8S_VERSION):
            return CURRENT_K8S_VERSION
        if patch is not None and minor >= OLDEST_MODULE_MINOR:
            return f"v1.{minor}.{patch}"
    where = f"{K8S_VERSION_ENV}={raw!r}" if requested is None else f"Kubernetes version {raw!r}"
    raise ClusterError(
        f"{where}: use 'current' ({CURRENT_K8S_VERSION}, the default), '1.20' ({LEGACY_K8S_VERSION}), "
        f"or a release v1.Y.Z with Y >= {OLDEST_MODULE_MINOR} that the Go module proxy serves"
    )


def minor_of(version: str) -> int:
    """``v1.37.2`` -> 37."""
    match = _VERSION_RE.fullmatch(version)
    if match is None:
        raise ClusterError(f"not a Kubernetes version: {version!r}")
    return int(match.group(1))


def is_legacy(version: str) -> bool:
    """Whether ``version`` is the Debian-built 1.20 (no CEL rules, no field selectors on CRDs)."""
    return version == LEGACY_K8S_VERSION


def default_bin_dir(version: str | None = None) -> Path:
    """Where the binaries of ``version`` (resolved) are cached (the build scripts' layout)."""
    return cache_dir() / f"k8s-{resolve_version(version)}" / "bin"


def helm_path() -> Path:
    return cache_dir() / f"helm-{HELM_VERSION}" / "bin" / "helm"
