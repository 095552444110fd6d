"""Choosing the local control plane's Kubernetes version (harness.kube.versions, the build scripts)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.kube.cluster import LocalCluster
from harness.kube.errors import ClusterError
from harness.kube.versions import (
    CURRENT_K8S_VERSION,
    K8S_VERSION_ENV,
    LEGACY_K8S_VERSION,
    default_bin_dir,
    resolve_version,
)
from harness.paths import cache_dir

HACK = Path(__file__).resolve().parents[2] / "hack"


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("current", CURRENT_K8S_VERSION),
        ("", CURRENT_K8S_VERSION),
        (CURRENT_K8S_VERSION, CURRENT_K8S_VERSION),
        (CURRENT_K8S_VERSION.rsplit(".", 1)[0], CURRENT_K8S_VERSION),
        ("1.20", LEGACY_K8S_VERSION),
        ("v1.20", LEGACY_K8S_VERSION),
        ("1.20.2", LEGACY_K8S_VERSION),
        ("v1.20.2", LEGACY_K8S_VERSION),
        ("v1.34.4", "v1.34.4"),
        ("1.36.3", "v1.36.3"),
    ],
)
def test_resolve_version(requested: str, expected: str) -> None:
    assert resolve_version(requested) == expected


@pytest.mark.parametrize(
    "requested", ["1.19", "v1.20.5", "v1.33.9", "1.36", "2.0.0", "latest", "v1.37.2-rc.0"]
)
def test_unknown_versions_say_what_to_use(requested: str) -> None:
    with pytest.raises(ClusterError, match=r"use 'current' \(v1\.\d+\.\d+, the default\), '1\.20'"):
        resolve_version(requested)


def test_environment_variable_selects_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(K8S_VERSION_ENV, raising=False)
    assert resolve_version() == CURRENT_K8S_VERSION
    assert LocalCluster().version == CURRENT_K8S_VERSION
    monkeypatch.setenv(K8S_VERSION_ENV, "1.20")
    assert resolve_version() == LEGACY_K8S_VERSION
    assert LocalCluster().version == LEGACY_K8S_VERSION
    assert LocalCluster().legacy
    # The constructor argument wins over the environment.
    assert LocalCluster(version="current").version == CURRENT_K8S_VERSION
    monkeypatch.setenv(K8S_VERSION_ENV, "1.2O")
    with pytest.raises(ClusterError, match=f"{K8S_VERSION_ENV}='1.2O'"):
        resolve_version()


def _script_value(script: str, variable: str) -> str:
    match = re.search(rf'^{variable}="([^"]+)"$', (HACK / script).read_text(), re.MULTILINE)
    assert match, f"{variable}= not found in hack/{script}"
    return match.group(1)


def test_harness_and_build_scripts_name_the_same_versions() -> None:
    assert _script_value("build-kubernetes.sh", "DEFAULT_VERSION") == CURRENT_K8S_VERSION
    assert _script_value("build-control-plane.sh", "K8S_VERSION") == LEGACY_K8S_VERSION


@pytest.mark.parametrize("requested", ["current", "1.20", "v1.36.3"])
def test_build_script_and_harness_agree_on_the_cache_layout(
    requested: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQBALANCE_CACHE", str(tmp_path))
    out = subprocess.run(
        ["bash", str(HACK / "build-control-plane.sh"), "--k8s", requested, "--print-bin-dir"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MQBALANCE_CACHE": str(tmp_path)},
    )
    assert Path(out.stdout.strip()) == default_bin_dir(requested)
    assert default_bin_dir(requested).parent.parent == tmp_path == cache_dir()


def test_build_scripts_refuse_unknown_versions(tmp_path: Path) -> None:
    env = {**os.environ, "MQBALANCE_CACHE": str(tmp_path)}
    for argv in (["build-control-plane.sh", "--k8s", "1.19"], ["build-kubernetes.sh", "v1.33.0"]):
        result = subprocess.run(
            ["bash", str(HACK / argv[0]), *argv[1:]], capture_output=True, text=True, env=env
        )
        assert result.returncode != 0
        assert "error:" in result.stderr, result.stderr
    assert not any(tmp_path.iterdir()), "a refused version must not touch the cache"
