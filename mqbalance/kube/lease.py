"""coordination.k8s.io/v1 Leases: one holder at a time, as client-go's leaderelection does it.

A :class:`LeaseLock` takes or renews one Lease when it is free, expired or already ours.
Expiry is judged by the local clock since the record was last *seen to change* (client-go's
observedTime), never by comparing the holder's renewTime with our clock, so clock skew
between machines cannot make two holders. Every write carries the resourceVersion read,
so two candidates can never both take it. A holder renews every ``duration / 3`` and must
treat the Lease as lost once it could not renew for ``2 * duration / 3``: before any other
candidate may take it over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from mqbalance.kube.client import ApiError, Conflict, KubeClient

logger = logging.getLogger("mqbalance.kube.lease")


def default_identity() -> str:
    """The pod name in a pod (downward API ``POD_NAME``), else host, process and a random tag."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: object) -> float | None:
    """A Lease's renewTime as unix seconds (None when absent or unreadable)."""
    if not isinstance(text, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


class LeaseLock:
    """One Lease, ``namespace/name``, held by ``identity`` when free, expired or already ours."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        labels: dict[str, str] | None = None,
        owner_references: list[dict[str, Any]] | None = None,
    ) -> None:
        self.client, self.namespace, self.name, self.identity = client, namespace, name, identity
        self.duration = duration
        self.labels = labels or {}
        self.owner_references = owner_references or []
        """Set on the Lease when this lock creates it (a member Lease goes with its Pod)."""
        self.annotations: dict[str, str] = {}
        """Written with each take or renewal (a member Lease names its pod's RocketMQ clients)."""
        self._monotonic, self._wall = monotonic, wall
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.renewed_at: float | None = None
        """Monotonic time of our last successful take or renewal; None when not ours."""
        self.holder: str | None = None
        """The holder seen last."""

    @property
    def held(self) -> bool:
        """Ours and renewed recently enough that nobody else can have taken it."""
        return self.renewed_at is not None and self._monotonic() - self.renewed_at < self.duration * 2 / 3

    async def try_hold(self) -> bool:
        """Take or renew the Lease if we may; whether we hold it afterwards."""
        # Held from before the request, not from its answer: a slow answer must not stretch the
        # time we count on past what the others count from the write.
        asked = self._monotonic()
        try:
            self.holder = await self._try()
        except ApiError as e:
            logger.warning("lease %s/%s: %s", self.namespace, self.name, e)
            return self.held
        if self.holder == self.identity:
            self.renewed_at = asked
        else:
            self.renewed_at = None
        return self.holder == self.identity

    async def release(self) -> None:
        """Give the Lease up so another candidate can take it at once (a clean hand-over)."""
        self.renewed_at = None
        try:
            lease = await self.client.get(f"{self._path}/{self.name}")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1}
            await self.client.replace(f"{self._path}/{self.name}", lease)
        except ApiError as e:
            logger.warning("releasing lease %s/%s failed: %s", self.namespace, self.name, e)

    async def delete(self) -> None:
        """Remove the Lease (a member lease of a replica that stops)."""
        self.renewed_at = None
        try:
            await self.client.delete(f"{self._path}/{self.name}")
        except ApiError as e:
            if e.status != 404:
                logger.warning("deleting lease %s/%s failed: %s", self.namespace, self.name, e)

    def observe(self, lease: dict[str, Any]) -> None:
        """Note the Lease as read elsewhere (a listing): its expiry counts from its last change seen."""
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()
        self.holder = spec.get("holderIdentity")

    async def _try(self) -> str | None:
        now = self._wall()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "renewTime": micro_time(now),
        }
        try:
            lease = await self.client.get(f"{self._path}/{self.name}")
        except ApiError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": self.labels,
                    **({"annotations": self.annotations} if self.annotations else {}),
                    **({"ownerReferences": self.owner_references} if self.owner_references else {}),
                },
                "spec": {**spec, "acquireTime": micro_time(now), "leaseTransitions": 0},
            }
            try:
                await self.client.create(self._path, body)
            except Conflict:
                return None  # another candidate created it first
            return self.identity
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        self.observe(lease)
        length = float(current.get("leaseDurationSeconds") or self.duration)
        expired = not holder or self._monotonic() - self._observed_at > length
        if holder != self.identity and not expired:
            return str(holder)
        new = {**current, **spec}
        if holder != self.identity:
            new["acquireTime"] = micro_time(now)
            new["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = new
        if self.annotations:
            meta = lease.setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **self.annotations}
        try:
            await self.client.replace(f"{self._path}/{self.name}", lease)  # carries resourceVersion
        except Conflict:
            return None
        return self.identity


class LeaseElector:
    """Leader election over one :class:`LeaseLock`.

    ``blocked`` (optional) says why this candidate must not lead even with the Lease free (other
    replicas that coordinate differently are live), or "" when it may.
    """

    def __init__(self, lock: LeaseLock, blocked: Callable[[], Awaitable[str]] | None = None) -> None:
        self.lock = lock
        self.blocked = blocked

    async def _why_not(self) -> str:
        return await self.blocked() if self.blocked is not None else ""

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        announced = False
        said = ""
        while True:
            why = await self._why_not()
            if why:
                if why != said:
                    logger.error("standing by: %s", why)
                    said = why
                await asyncio.sleep(self.lock.duration / 3)
                continue
            if await self.lock.try_hold():
                break
            if not announced:
                logger.info(
                    "standing by: lease %s/%s is held by %s",
                    self.lock.namespace,
                    self.lock.name,
                    self.lock.holder,
                )
                announced = True
            await asyncio.sleep(self.lock.duration / 3)
        logger.info("holding lease %s/%s as %s", self.lock.namespace, self.lock.name, self.lock.identity)

    async def hold(self) -> None:
        """Renew until the Lease is lost, or leading becomes blocked (then return)."""
        while True:
            await asyncio.sleep(self.lock.duration / 3)
            why = await self._why_not()
            if why:
                logger.error("giving up lease %s/%s: %s", self.lock.namespace, self.lock.name, why)
                await self.lock.release()
                return
            await self.lock.try_hold()
            if not self.lock.held:
                logger.error(
                    "lost lease %s/%s (holder now %s)", self.lock.namespace, self.lock.name, self.lock.holder
                )
                return
