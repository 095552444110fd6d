"""A replica whose reconciling event loop is blocked for longer than its Leases last keeps them:
the renewals run on a thread of their own (kube/lease_loop.py). Renewed on the reconciling loop,
a sharded replica under a tight CPU limit lost its shards whenever the reconciles fell behind,
refused the work on them and took it all back at once (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from harness.kube.cluster import LocalCluster
from harness.processes.net import free_port
from mqbalance.operator.runtime import Runtime
from mqbalance.operator.settings import OperatorConfig

DURATION = 6.0
"""Renewed every 2 s, lost after 4 s without a renewal: the loop is blocked for longer than both."""


def held(runtime: Runtime) -> int:
    return runtime.leadership().shards_held


@pytest.mark.parametrize("shards", [1, 3], ids=["single-leader", "sharded"])
def test_leases_stay_held_while_the_reconciling_loop_is_blocked(
    cluster: LocalCluster, crds: None, namespace: str, tmp_path: Path, shards: int
) -> None:
    config = OperatorConfig(
        namespaces=(namespace,),
        metrics_port=free_port(),
        metrics_host="127.0.0.1",
        journal=str(tmp_path / "journal"),
        leader_election="busy-loop",
        lease_namespace=namespace,
        lease_duration=DURATION,
        shards=shards,
        kubeconfig=str(cluster.kubeconfig),
        lag_interval=0,
    )
    samples: list[int] = []

    async def scenario() -> None:
        runtime = Runtime(config)
        await runtime.start(asyncio.Event())
        try:
            # The first step of a sharded replica only announces it; the next takes the shards.
            while held(runtime) < shards:
                await asyncio.sleep(0.1)
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.1):
                    samples.append(held(runtime))

            sampler = threading.Thread(target=sample)
            sampler.start()
            time.sleep(DURATION * 1.5)  # the fault: nothing else runs on this loop meanwhile
            done.set()
            sampler.join()
        finally:
            await runtime.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    # One sample every 0.1 s for 9 s, however slowly a loaded machine takes them: at least a few.
    assert len(samples) >= 10, samples
    assert min(samples) == shards, f"Leases lapsed while the loop was blocked: {samples}"
