"""Shards over replicas through Leases, on an in-memory API with the server's optimistic concurrency
and a hand-driven clock: every shard held by at most one replica at any moment, all of them held
once the replicas agree, and a dead replica's shards taken over after one lease duration."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from mqbalance.kube import ApiError, Conflict, LeaseLock
from mqbalance.operator.shards import (
    ShardBy,
    ShardChanges,
    Shards,
    live_shard_set,
    member_lease_name,
    shard_of,
)

DURATION = 9.0
GROUPS = [f"g{i}" for i in range(60)]


class LeaseApi:
    """Leases by name: get, create, replace (resourceVersion checked), delete, list by label."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.versions = itertools.count(1)

    async def get(self, path: str, params: Any = None) -> dict[str, Any]:
        if path.endswith("/leases"):
            key, _, value = (params or {}).get("labelSelector", "=").partition("=")
            items = [x for x in self.leases.values() if x["metadata"].get("labels", {}).get(key) == value]
            return {"items": items}
        name = path.rsplit("/", 1)[1]
        if name not in self.leases:
            raise ApiError(404, "not found")
        return self.leases[name]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.leases:
            raise Conflict(409, "already exists")
        return self._store(name, body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        if self.leases[name]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise Conflict(409, "modified")
        return self._store(name, body)

    async def delete(self, path: str) -> dict[str, Any]:
        self.leases.pop(path.rsplit("/", 1)[1], None)
        return {}

    def _store(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(next(self.versions))}}
        self.leases[name] = stored
        return stored


class Fleet:
    def __init__(self, count: int = 8) -> None:
        self.api = LeaseApi()
        self.now = 0.0
        self.count = count
        self.replicas: dict[str, Shards] = {}

    def add(self, name: str, count: int | None = None, by: ShardBy = "group") -> Shards:
        shards = Shards(
            self.api,  # type: ignore[arg-type]
            "ns",
            "op",
            name,
            count or self.count,
            DURATION,
            by=by,
            monotonic=lambda: self.now,
            wall=lambda: 1_800_000_000.0 + self.now,
        )
        self.replicas[name] = shards
        return shards

    async def tick(self, running: list[str] | None = None, times: int = 1) -> None:
        """``times`` rounds of: every running replica steps once, then a third of the duration passes;
        check safety."""
        for _ in range(times):
            for name in running if running is not None else list(self.replicas):
                await self.replicas[name].step(lambda shard: False)
            # By group: replicas with different counts hold different Leases for the same group.
            workers = Counter(
                group for shards in self.replicas.values() for group in GROUPS if shards.owns("ns", group)
            )
            assert all(n == 1 for n in workers.values()), f"a group worked on twice: {workers}"
            self.now += DURATION / 3

    def owned(self) -> dict[str, list[int]]:
        return {name: sorted(s.owned) for name, s in self.replicas.items()}


@pytest.mark.asyncio
async def test_replicas_split_the_shards_and_take_over_a_dead_ones() -> None:
    fleet = Fleet()
    for name in ("a", "b", "c"):
        fleet.add(name)
    await fleet.tick(times=4)
    assert fleet.owned() == {"a": [0, 3, 6], "b": [1, 4, 7], "c": [2, 5]}
    # c dies (SIGKILL): it renews nothing. a and b hold everything within two durations.
    died = fleet.now
    while sorted(fleet.owned()["a"] + fleet.owned()["b"]) != list(range(8)):
        assert fleet.now - died < 2 * DURATION, fleet.owned()
        await fleet.tick(["a", "b"])
    await fleet.tick(["a", "b"], times=3)
    assert fleet.owned()["a"] == [0, 2, 4, 6]
    # A new replica joins: the others hand shards over (released, so no expiry to wait for).
    fleet.replicas.pop("c")
    fleet.add("d")
    await fleet.tick(times=3)
    assert fleet.owned() == {"a": [0, 3, 6], "b": [1, 4, 7], "d": [2, 5]}


@pytest.mark.asyncio
async def test_replicas_started_together_take_their_own_shards_at_once() -> None:
    """No replica takes everything first to hand most of it over later: the first step announces."""
    fleet = Fleet(count=6)
    for name in ("a", "b", "c"):
        fleet.add(name)
    await fleet.tick()
    assert fleet.owned() == {"a": [], "b": [], "c": []}
    await fleet.tick()
    assert fleet.owned() == {"a": [0, 3], "b": [1, 4], "c": [2, 5]}
    assert all(lease["spec"].get("leaseTransitions", 0) == 0 for lease in fleet.api.leases.values())


@pytest.mark.asyncio
async def test_a_clean_stop_hands_shards_over_at_once() -> None:
    fleet = Fleet(count=4)
    a, b = fleet.add("a"), fleet.add("b")
    await fleet.tick(times=3)
    assert (sorted(a.owned), sorted(b.owned)) == ([0, 2], [1, 3])
    await b.stop()
    assert member_lease_name("op", "b") not in fleet.api.leases
    fleet.replicas.pop("b")
    await fleet.tick()  # a sees one member and takes the released shards in this very step
    assert sorted(a.owned) == [0, 1, 2, 3]


@pytest.mark.asyncio
async def test_work_in_flight_keeps_a_shard_until_it_drains() -> None:
    fleet = Fleet(count=2)
    a = fleet.add("a")
    await fleet.tick()
    await fleet.tick()
    assert sorted(a.owned) == [0, 1]
    b = fleet.add("b")
    await b.step(lambda shard: False)  # b announces itself; shard 1 is b's now
    busy = {1}
    await a.step(lambda shard: shard in busy)
    assert sorted(a.owned) == [0]  # stops starting work on shard 1 ...
    assert a.locks[1].held  # ... but holds it while work is in flight
    assert not await b.locks[1].try_hold()
    busy.clear()
    await a.step(lambda shard: shard in busy)
    await b.step(lambda shard: False)
    assert (sorted(a.owned), sorted(b.owned)) == ([0], [1])


@pytest.mark.asyncio
async def test_work_refused_on_a_shard_renewed_late_runs_once_it_is_renewed() -> None:
    """A busy loop renews late: the groups refused meanwhile are looked at again after."""
    fleet = Fleet(count=2)
    a = fleet.add("a")
    await a.step(lambda shard: False)  # announces itself
    step = await a.step(lambda shard: False)
    assert step.gained == {0, 1}
    fleet.now += DURATION * 0.7  # past two thirds: no longer safe to work on
    group = next(f"g{i}" for i in range(100) if shard_of("ns", f"g{i}", 2) == 0)
    assert not a.owns("ns", group)
    step = await a.step(lambda shard: False)
    # Only the work refused is due again, not the shards' other groups.
    assert step == ShardChanges(frozenset(), frozenset(), frozenset({("ns", group)}))
    assert a.owns("ns", group)
    step = await a.step(lambda shard: False)
    assert step == ShardChanges(frozenset(), frozenset(), frozenset())


def test_the_shard_of_a_group_is_stable_and_spread() -> None:
    # Pinned: every replica, restart and release must put a group in the same shard, so these
    # values may never change (blake2b, 8 bytes, big-endian, modulo the count).
    pinned: dict[tuple[str, str, int, ShardBy], int] = {
        ("shop", "orders", 16, "group"): 14,
        ("shop", "payments", 16, "group"): 8,
        ("ns", "g0", 8, "group"): 6,
        ("ns", "g1", 8, "group"): 7,
        ("ns", "g2", 8, "group"): 4,
        ("shop", "", 16, "namespace"): 6,
        ("team-1", "g", 8, "namespace"): 4,
    }
    got = {(ns, name, count, by): shard_of(ns, name, count, by) for ns, name, count, by in pinned}
    assert got == pinned
    spread = Counter(shard_of("ns", f"g{i}", 8) for i in range(8000))
    assert min(spread.values()) > 900


@pytest.mark.asyncio
async def test_a_replica_with_another_shard_count_works_on_nothing_until_the_others_go() -> None:
    fleet = Fleet(count=6)
    a, b = fleet.add("a"), fleet.add("b")
    await fleet.tick(times=2)
    fleet.now += 1.0  # c starts later, with another count (a rolling update changing --shards)
    c = fleet.add("c", count=4)
    await fleet.tick(times=3)
    assert (sorted(a.owned), sorted(b.owned), sorted(c.owned)) == ([0, 2, 4], [1, 3, 5], [])
    assert "--shards 6" in c.conflict
    assert not a.conflict
    assert not b.conflict
    await a.stop()
    await b.stop()
    fleet.replicas.pop("a")
    fleet.replicas.pop("b")
    await fleet.tick()
    assert sorted(c.owned) == [0, 1, 2, 3]
    assert not c.conflict


@pytest.mark.asyncio
async def test_sharded_replicas_and_a_single_leader_never_work_at_once() -> None:
    fleet = Fleet(count=2)
    leader = LeaseLock(
        fleet.api,  # type: ignore[arg-type]
        "ns",
        "op",
        "leader",
        DURATION,
        monotonic=lambda: fleet.now,
        wall=lambda: 1_800_000_000.0 + fleet.now,
    )
    assert await leader.try_hold()
    a = fleet.add("a")
    await fleet.tick(times=2)
    assert not a.owned
    assert "single-leader Lease op" in a.conflict
    # The leader, for its part, sees the shard set's live members and must not lead.
    wall = lambda: 1_800_000_000.0 + fleet.now  # noqa: E731
    assert "run every replica with the same --shards" in await live_shard_set(fleet.api, "ns", "op", wall)  # type: ignore[arg-type]
    await leader.release()
    await fleet.tick()
    assert sorted(a.owned) == [0, 1]


def test_sharded_by_namespace_every_group_of_a_namespace_falls_in_its_shard() -> None:
    shards = {shard_of("shop", f"g{i}", 16, "namespace") for i in range(100)}
    assert shards == {shard_of("shop", "", 16, "namespace")}
    spread = Counter(shard_of(f"team-{i}", "g", 8, "namespace") for i in range(8000))
    assert min(spread.values()) > 900


@pytest.mark.asyncio
async def test_a_replica_sharding_by_another_key_works_on_nothing_until_the_others_go() -> None:
    fleet = Fleet(count=4)
    a = fleet.add("a")
    await fleet.tick(times=2)
    fleet.now += 1.0  # b starts later with --shard-by namespace: the same Lease names, other groups
    b = fleet.add("b", by="namespace")
    await fleet.tick(times=3)
    assert (sorted(a.owned), sorted(b.owned)) == ([0, 1, 2, 3], [])
    assert "--shards 4 --shard-by namespace" in b.conflict
    await a.stop()
    fleet.replicas.pop("a")
    await fleet.tick()
    assert sorted(b.owned) == [0, 1, 2, 3]
    assert not b.conflict
