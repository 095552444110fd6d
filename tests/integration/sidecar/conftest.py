"""Fixtures of the sidecar's integration tests: a sidecar process factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.cluster import LocalCluster
from harness.processes import SidecarProcess


@pytest.fixture
def start_sidecar(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[..., SidecarProcess]]:
    """Starts ``mqbalance sidecar ARGS`` with the cluster's kubeconfig; stops them all afterwards."""
    started: list[SidecarProcess] = []

    def start(*args: str) -> SidecarProcess:
        proc = SidecarProcess(cluster.kubeconfig, tmp_path / f"sidecar-{len(started)}.log", *args)
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        proc.stop()
