"""The operator's leader-election gauges in each mode, read from the runtime's Leases; the version."""

from __future__ import annotations

from importlib import metadata
from typing import cast

import pytest

from mqbalance import buildinfo, cli
from mqbalance.kube import KubeClient, LeaseLock
from mqbalance.operator.metrics import Leadership
from mqbalance.operator.runtime import Runtime
from mqbalance.operator.settings import OperatorConfig
from mqbalance.operator.shards import Shards

NO_CLIENT = cast(KubeClient, None)  # nothing here talks to an API server


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_leader_election_the_operator_always_leads() -> None:
    assert Runtime(OperatorConfig(namespaces=("shop",))).leadership() == Leadership(
        "", leader=True, shards=1, shards_held=1
    )


def test_a_single_leader_counts_while_it_holds_the_lease() -> None:
    clock = Clock()
    runtime = Runtime(OperatorConfig(namespaces=("shop",), leader_election="mq", lease_namespace="mq"))
    assert runtime.leadership() == Leadership("mq", leader=False, shards=1, shards_held=0)  # electing
    lock = runtime._lock = LeaseLock(NO_CLIENT, "mq", "mq", "op-0", 15, monotonic=clock)
    assert runtime.leadership().leader is False  # standing by
    lock.renewed_at = clock.now
    assert runtime.leadership() == Leadership("mq", leader=True, shards=1, shards_held=1)
    clock.now += 10  # not renewed for two thirds of the duration: lost, whatever comes next
    assert runtime.leadership() == Leadership("mq", leader=False, shards=1, shards_held=0)


def test_sharded_replicas_count_the_shard_leases_they_hold() -> None:
    clock = Clock()
    config = OperatorConfig(namespaces=("shop",), leader_election="mq", lease_namespace="mq", shards=4)
    runtime = Runtime(config)
    assert runtime.leadership() == Leadership("mq", leader=False, shards=4, shards_held=0)
    shards = runtime._shards = Shards(NO_CLIENT, "mq", "mq", "op-0", 4, 15, monotonic=clock)
    shards.owned = frozenset({0, 2, 3})
    for i in (0, 2):
        shards.locks[i].renewed_at = clock.now
    # Shard 3 is in the plan but its Lease is not renewed in time: not counted.
    assert runtime.leadership() == Leadership("mq", leader=False, shards=4, shards_held=2)


def test_version_flag_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"mqbalance {buildinfo.version()} (")


def test_version_falls_back_to_the_package_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import mqbalance

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert buildinfo.version() == mqbalance.__version__
