"""Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does.

Only the holder of the Lease runs the operator; a standby only reads the Lease (and tries to
take it once it has expired), so it writes nothing else. The holder renews every
``duration / 3`` seconds and gives up (the process exits and is restarted as a standby) when
it could not renew for ``2 * duration / 3``, before any standby may take over. Every write of
the Lease carries the resourceVersion read, so two candidates can never both take it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from mqbalance.operator.kubeapi import ApiError, KubeApi

logger = logging.getLogger("mqbalance.operator.leader")


def default_identity() -> str:
    """The pod name in a pod (downward API ``POD_NAME``), else host and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


class LeaseElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration = duration
        self.retry = duration / 3
        self.renew_deadline = duration * 2 / 3
        self.clock = clock
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        announced = False
        while True:
            holder = await self._try()
            if holder == self.identity:
                logger.info("holding lease %s/%s as %s", self.namespace, self.name, self.identity)
                return
            if not announced:
                logger.info("standing by: lease %s/%s is held by %s", self.namespace, self.name, holder)
                announced = True
            await asyncio.sleep(self.retry)

    async def hold(self) -> None:
        """Renew until the Lease is lost (returns then)."""
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(self.retry)
            try:
                holder = await self._try()
            except ApiError as e:
                logger.warning("renewing lease %s/%s failed: %s", self.namespace, self.name, e)
                holder = None
            if holder == self.identity:
                last_renewal = time.monotonic()
            elif holder is not None or time.monotonic() - last_renewal > self.renew_deadline:
                logger.error("lost lease %s/%s (holder now %s)", self.namespace, self.name, holder)
                return

    async def release(self) -> None:
        """Let a standby take over at once (a clean shutdown)."""
        try:
            lease = await asyncio.to_thread(self.api.request, "GET", f"{self.path}/{self.name}")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**spec, "leaseDurationSeconds": 1, "renewTime": _micro_time(self.clock() - 2)}
            await asyncio.to_thread(self.api.request, "PUT", f"{self.path}/{self.name}", lease)
        except ApiError as e:
            logger.warning("releasing lease %s/%s failed: %s", self.namespace, self.name, e)

    async def _try(self) -> str | None:
        return await asyncio.to_thread(self._try_sync)

    def _try_sync(self) -> str | None:
        """Take or renew the Lease if it is ours or expired; the holder afterwards."""
        now = self.clock()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "renewTime": _micro_time(now),
        }
        try:
            lease = self.api.request("GET", f"{self.path}/{self.name}")
        except ApiError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _micro_time(now), "leaseTransitions": 0},
            }
            try:
                self.api.request("POST", self.path, body)
            except ApiError as e2:
                if e2.status == 409:
                    return None  # another candidate created it first
                raise
            return self.identity
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        renewed = _parse_time(current.get("renewTime"))
        length = float(current.get("leaseDurationSeconds") or self.duration)
        expired = not holder or renewed is None or renewed + length < now
        if holder != self.identity and not expired:
            return str(holder)
        new = {**current, **spec}
        if holder != self.identity:
            new["acquireTime"] = _micro_time(now)
            new["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = new
        try:
            self.api.request("PUT", f"{self.path}/{self.name}", lease)  # carries resourceVersion
        except ApiError as e:
            if e.status == 409:
                return None
            raise
        return self.identity
