"""Fixtures of the deployment tests: the cached helm binary and the chart."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mqbalance.testing.cluster import ensure_binaries

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "mqbalance"


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm v3 from the control-plane cache (hack/build-control-plane.sh fetches it)."""
    path = ensure_binaries() / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm is missing at {path}: run hack/build-control-plane.sh")
    return path


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result
