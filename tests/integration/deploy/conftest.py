"""Fixtures of the deployment tests: the cached helm binary (helpers live in deploy_support.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.kube.binaries import ensure_binaries


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm v3 from the control-plane cache (hack/build-control-plane.sh fetches it)."""
    path = ensure_binaries() / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm is missing at {path}: run hack/build-control-plane.sh")
    return path
