"""Groups sharded over the running replicas through Kubernetes Leases.

A fleet that outgrows one process runs several replicas, each working on some of the groups.
The groups fall into ``count`` shards by a hash of their namespace and name, or of their
namespace alone (``by="namespace"``: a replica then lists and watches only the namespaces of its
shards, scopes.py); each shard is a
Lease (``<prefix>-<i>``), and a replica works on a group only while it holds that group's shard
Lease. Replicas find each other through member Leases (``<prefix>-member-<identity>``, labelled
``mqbalance.io/shard-set: <prefix>``) that each renews; the live members, sorted, deal the
shards out in turn (shard i to member i mod M), so every replica computes the same plan.

A replica announces itself one step before it takes anything, so replicas started together
agree at once. It takes a shard of its plan once the shard's Lease is free or expired, and gives up a
shard that is no longer its own after its work on that shard has drained (it first stops
starting any), releasing the Lease so the new owner takes it at once. A replica that dies (a
SIGKILL, a lost node) stops renewing: its member Lease and shard Leases expire after one
duration and the others take its shards over. A holder treats a shard as lost once it could not
renew it for two thirds of the duration, before anyone else may take it, so no group is ever
worked on by two replicas at once; and the assignment ConfigMap is replaced with the
resourceVersion read besides. The steps run on the Lease thread (kube/lease_loop.py), so however
much work is due, the renewals keep their time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple
from urllib.parse import quote

from mqbalance.kube import ApiError, KubeClient, LeaseLock, parse_micro_time

logger = logging.getLogger("mqbalance.operator.shards")

SHARD_SET_LABEL = "mqbalance.io/shard-set"
ROLE_LABEL = "mqbalance.io/shard-role"
"""``shard`` or ``member``: one listing of the set's Leases tells members and shard holders apart."""
COUNT_LABEL = "mqbalance.io/shard-count"
"""On member Leases: the replica's --shards. Replicas that disagree would hash a group into
different shard Leases and both work on it, so only the count of the longest-running member works."""
BY_LABEL = "mqbalance.io/shard-by"
"""On member Leases: the replica's --shard-by (``group`` when missing), which must agree as the count must."""

ShardBy = Literal["group", "namespace"]


def shard_of(namespace: str, name: str, count: int, by: ShardBy = "group") -> int:
    """The shard of a group or Topic: a stable hash (every replica and every restart agree)."""
    key = namespace if by == "namespace" else f"{namespace}/{name}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def member_lease_name(prefix: str, identity: str) -> str:
    """A Lease name for ``identity`` (a pod name fits; anything else is hashed into a DNS label)."""
    suffix = identity.lower()
    if not suffix.replace("-", "").isalnum() or len(prefix) + len(suffix) > 240:
        suffix = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
    return f"{prefix}-member-{suffix}"


class ShardChanges(NamedTuple):
    """What one step of :class:`Shards` changed."""

    gained: frozenset[int]
    """Shards newly held: every group of theirs is due."""
    lost: frozenset[int]
    """Shards no longer worked on here."""
    retry: frozenset[tuple[str, str]]
    """(namespace, name) of work refused on shards that were renewed late and are held again."""


class Shards:
    """This replica's shards: which it holds, and the loop that keeps them in line with the plan."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        prefix: str,
        identity: str,
        count: int,
        duration: float,
        *,
        by: ShardBy = "group",
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client, self.namespace, self.prefix, self.identity = client, namespace, prefix, identity
        self.count, self.duration, self.by = count, duration, by
        self._monotonic, self._wall = monotonic, wall
        self.locks = [
            LeaseLock(
                client,
                namespace,
                f"{prefix}-{i}",
                identity,
                duration,
                monotonic=monotonic,
                wall=wall,
                labels={SHARD_SET_LABEL: prefix, ROLE_LABEL: "shard"},
            )
            for i in range(count)
        ]
        self.member = LeaseLock(
            client,
            namespace,
            member_lease_name(prefix, identity),
            identity,
            duration,
            monotonic=monotonic,
            wall=wall,
            labels={SHARD_SET_LABEL: prefix, ROLE_LABEL: "member", COUNT_LABEL: str(count), BY_LABEL: by},
        )
        self.owned: frozenset[int] = frozenset()
        """Shards this replica may work on now."""
        self.members: tuple[str, ...] = ()
        """The live replicas at the last step, sorted."""
        self._seen: dict[str, tuple[object, float]] = {}
        self._refused: dict[int, set[tuple[str, str]]] = {}
        """Shard -> (namespace, name) of the work refused on it since the last step (its Lease was not
        renewed in time)."""
        self._refused_lock = threading.Lock()
        """:meth:`owns` is asked on the reconciling loop, :meth:`step` runs on the Lease thread."""
        self._announcing = True
        self.conflict = ""
        """Why this replica works on nothing now (another shard count or a single leader is live)."""

    def shard(self, namespace: str, name: str) -> int:
        return shard_of(namespace, name, self.count, self.by)

    def owns(self, namespace: str, name: str) -> bool:
        """Whether this replica may work on the group now."""
        shard = self.shard(namespace, name)
        if shard not in self.owned:
            return False  # its owner works on it; should it become ours, it is gained then
        if self.locks[shard].held:
            return True
        with self._refused_lock:
            self._refused.setdefault(shard, set()).add((namespace, name))
        return False

    def plan(self, members: tuple[str, ...]) -> frozenset[int]:
        """The shards this replica should hold when ``members`` (sorted) are live."""
        if self.identity not in members:
            return frozenset()
        return frozenset(i for i in range(self.count) if members[i % len(members)] == self.identity)

    async def step(self, busy: Callable[[int], bool]) -> ShardChanges:
        """Renew, look at the members, take and give up shards.

        ``busy(shard)`` says whether work on that shard is still in flight: a shard leaving the
        plan is released only once it is not.
        """
        before = self.owned
        await self.member.try_hold()
        self.members = await self._live_members()
        if self._announcing:
            # The first step only announces this replica: replicas started together (a new
            # Deployment, a cold start) see each other before anyone takes a shard, rather than
            # the first one taking them all and handing most over a step later.
            self._announcing = False
            return ShardChanges(frozenset(), frozenset(), frozenset())
        wanted = frozenset() if self.conflict else self.plan(self.members)

        async def keep(shard: int, lock: LeaseLock) -> bool:
            if shard in wanted:
                return await lock.try_hold()
            if lock.renewed_at is not None:
                if busy(shard):  # stop starting work on it, release once drained
                    await lock.try_hold()
                else:
                    await lock.release()
            return False

        # All at once: a busy API server delays one step by one round trip, not one per shard.
        held = await asyncio.gather(*(keep(shard, lock) for shard, lock in enumerate(self.locks)))
        self.owned = frozenset(shard for shard, ok in enumerate(held) if ok)
        gained, lost = self.owned - before, before - self.owned
        # Work refused on a shard of ours whose Lease was not renewed in time (a slow API server)
        # was skipped: now renewed, that work is due again.
        with self._refused_lock:
            refused, self._refused = self._refused, {}
        renewed = (self.owned & refused.keys()) - gained
        if renewed:
            logger.warning(
                "shards %s were not renewed in time and work on them waited; it runs now", sorted(renewed)
            )
        if gained or lost:
            logger.info(
                "shards: holding %s of %d (members %s)",
                sorted(self.owned),
                self.count,
                ", ".join(self.members),
            )
        return ShardChanges(gained, lost, frozenset(key for shard in renewed for key in refused[shard]))

    async def stop(self) -> None:
        """Give every shard up at once and leave the member list (a clean shutdown)."""
        self.owned = frozenset()
        for lock in self.locks:
            if lock.renewed_at is not None:
                await lock.release()
        await self.member.delete()

    async def _live_members(self) -> tuple[str, ...]:
        """Replicas of our shard count whose member Lease was renewed within one duration, and this
        one; sets :attr:`conflict` when replicas of another configuration are live.

        A Lease seen before counts while it changed within one duration by our clock; one seen
        for the first time (a replica that just started knows nobody's history) by its renewTime
        on the holder's clock, which skew can only make err for a step or two: who is a member
        decides the plan, never who holds a shard. The same listing keeps every shard Lease's
        expiry clock going, so a dead replica's shards are taken one duration after its last
        renewal, and member Leases dead for ten durations are deleted.
        """
        path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(self.namespace, safe='')}/leases"
        try:
            listing = await self.client.get(path, {"labelSelector": f"{SHARD_SET_LABEL}={self.prefix}"})
            leader = await self._get_or_none(f"{path}/{quote(self.prefix, safe='')}")
        except ApiError as e:
            logger.warning("listing the shard leases failed: %s; keeping the last members", e)
            return self.members or (self.identity,)
        now, wall = self._monotonic(), self._wall()
        live = {self.identity}
        joined: list[tuple[str, str, str]] = []  # (acquireTime, identity, configuration) of live members
        foreign: list[str] = []
        seen: dict[str, tuple[object, float]] = {}
        by_name = {lock.name: lock for lock in self.locks}
        for item in [*(listing.get("items") or []), *([leader] if leader else [])]:
            meta = item.get("metadata") or {}
            name, labels = meta.get("name", ""), meta.get("labels") or {}
            if name in by_name:
                by_name[name].observe(item)
                continue
            spec = item.get("spec") or {}
            holder = spec.get("holderIdentity")
            record = (holder, spec.get("renewTime"))
            previous = self._seen.get(name)
            renewed = parse_micro_time(spec.get("renewTime"))
            age = wall - renewed if renewed is not None else float("inf")
            if previous is None or previous[0] != record:
                # A change seen now; one seen for the first time dates from its renewTime.
                previous = (record, now if previous is not None else now - min(max(age, 0.0), 1e9))
            seen[name] = previous
            length = float(spec.get("leaseDurationSeconds") or self.duration)
            fresh = bool(holder) and now - previous[1] <= max(length, self.duration)
            if name == self.prefix:
                if fresh:
                    foreign.append(
                        f"the single-leader Lease {name} is held by {holder} (a replica without --shards)"
                    )
            elif labels.get(ROLE_LABEL) == "shard":
                if fresh:  # a shard Lease of another shard count: ours are in by_name
                    foreign.append(f"shard Lease {name} of another shard count is held by {holder}")
            elif fresh:
                config = _configuration(labels.get(COUNT_LABEL, str(self.count)), labels.get(BY_LABEL))
                joined.append((str(spec.get("acquireTime") or ""), str(holder), config))
                if config == self.configuration:  # a replica configured otherwise takes no part in our plan
                    live.add(str(holder))
            elif age > 10 * self.duration and holder != self.identity:
                with contextlib.suppress(ApiError):
                    await self.client.delete(f"{path}/{name}")
        self._seen = seen
        self._judge(sorted(joined), foreign)
        return tuple(sorted(live))

    @property
    def configuration(self) -> str:
        return _configuration(str(self.count), self.by)

    def _judge(self, joined: list[tuple[str, str, str]], foreign: list[str]) -> None:
        """Work only with the shard count and key of the longest-running live member, and only while
        no Lease of another configuration is held (their holders stop working on it first)."""
        problem = ""
        first = joined[0] if joined else None  # (acquireTime, identity, configuration), oldest first
        if first is not None and first[2] != self.configuration:
            problem = (
                f"replica {first[1]}, the longest-running, has {first[2]} and this one "
                f"{self.configuration}; this one waits until every replica has the same"
            )
        elif foreign:
            problem = "; ".join(foreign) + "; this one waits until it is released or expires"
        if problem != self.conflict:
            if problem:
                logger.error("working on no group: %s", problem)
            else:
                logger.info("no other configuration is live any more; taking shards")
        self.conflict = problem

    async def _get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.client.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise


def _configuration(count: str, by: str | None) -> str:
    """How a replica shards, as its flags say it: ``--shards 12`` or ``--shards 12 --shard-by namespace``."""
    return f"--shards {count}" + (f" --shard-by {by}" if by and by != "group" else "")


async def live_shard_set(
    client: KubeClient, namespace: str, prefix: str, wall: Callable[[], float] = time.time
) -> str:
    """Why a single leader of Lease ``prefix`` must not lead: replicas sharding under the same
    name are live (their Leases renewed within their duration, by the renewTime they wrote);
    "" when none is, or when the Leases cannot be read now. ApiError 403 when listing Leases is
    not allowed (a single leader needs only its own Lease)."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    try:
        listing = await client.get(path, {"labelSelector": f"{SHARD_SET_LABEL}={prefix}"})
    except ApiError as e:
        if e.status == 403:
            raise  # the caller stops asking
        logger.warning("listing the shard leases failed: %s", e)
        return ""
    now = wall()
    for item in listing.get("items") or []:
        spec = item.get("spec") or {}
        renewed = parse_micro_time(spec.get("renewTime"))
        length = float(spec.get("leaseDurationSeconds") or 15)
        if spec.get("holderIdentity") and renewed is not None and now - renewed <= length:
            return (
                f"replicas with --shards are live under the same name ({item['metadata']['name']} is "
                f"held by {spec['holderIdentity']}); run every replica with the same --shards"
            )
    return ""


class ShardSetCheck:
    """:func:`live_shard_set` for a single leader, switched off for good when listing Leases is
    forbidden (the Helm chart grants a single leader its own Lease only, and refuses the upgrades
    that would mix the two)."""

    def __init__(self, client: KubeClient, namespace: str, prefix: str) -> None:
        self.client, self.namespace, self.prefix = client, namespace, prefix
        self.enabled = True

    async def __call__(self) -> str:
        if not self.enabled:
            return ""
        try:
            return await live_shard_set(self.client, self.namespace, self.prefix)
        except ApiError as e:
            self.enabled = False
            logger.info("not checking for sharded replicas under lease %s: %s", self.prefix, e)
            return ""


async def run_shards(
    shards: Shards, busy: Callable[[int], bool], on_change: Callable[[ShardChanges], None]
) -> None:
    """ShardChanges every third of the duration until cancelled; ``on_change`` when a step changed anything.

    At a fixed rate, not a fixed pause: a step that waited on a busy API server must not push the
    next renewal past the two thirds of the duration after which a shard counts as lost."""
    while True:
        started = time.monotonic()
        step = await shards.step(busy)
        if step.gained or step.lost or step.retry:
            on_change(step)
        await asyncio.sleep(max(0.0, shards.duration / 3 - (time.monotonic() - started)))
