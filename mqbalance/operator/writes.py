"""Every write the operator makes: the assignment ConfigMap, status, Events.

Concurrency is optimistic: the ConfigMap is replaced with the resourceVersion last read,
and a 409 raises :class:`Conflict` so the caller re-reads and reconciles again from the
fresh state (a create that finds the object already there is the same thing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.parse import quote

from mqbalance.contract import (
    API_VERSION,
    CONFIGMAP_KEY,
    CONSUMER_GROUP_KIND,
    GENERATION_ANNOTATION,
    GROUP_LABEL,
    MANAGED_BY,
    AssignmentDocument,
    DocumentError,
    configmap_name,
    custom_path,
    releases_configmap_name,
)
from mqbalance.kube import ApiError, Conflict, KubeClient

logger = logging.getLogger("mqbalance.operator")

EVENT_QUEUE = 1000
"""Events waiting to be posted; beyond it new ones are dropped (and counted), as client-go's event
broadcaster drops beyond its 1000."""
EVENT_RATE = 20.0
"""Events posted a second at most (bursts of EVENT_BURST): a cold start of thousands of groups
writes their ConfigMaps and status first; their Events follow at a pace the API server barely
notices, as client-go's event broadcaster paces its own."""
EVENT_BURST = 50


@dataclass(slots=True)
class Published:
    """The assignment ConfigMap as last read or written.

    The document is kept as its text and decoded when a reconcile needs it: decoded, it takes
    several times the memory of its text, and between reconciles nothing reads it. The text is
    the watch cache's own string once the ConfigMap comes back through the watch (one copy).
    """

    text: str | None
    """The document's JSON; None when there is none or it cannot be read."""
    resource_version: str | None
    """None when the ConfigMap does not exist."""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    problem: str | None = None
    """Why the existing document could not be read (it is then treated as absent)."""
    decoded: AssignmentDocument | None = None
    """The document as decoded when it was read, until the reconcile that reads it drops it."""

    @property
    def document(self) -> AssignmentDocument | None:
        """The document (decoded afresh unless just read; a read text was checked when it was read)."""
        if self.decoded is not None:
            return self.decoded
        return None if self.text is None else AssignmentDocument.decode(self.text)

    def share(self, configmap: Mapping[str, Any] | None) -> None:
        """Keep the watch cache's copies of the text, labels and annotations when ``configmap`` is
        this same version (our own write come back)."""
        meta = (configmap or {}).get("metadata") or {}
        if configmap is None or meta.get("resourceVersion") != self.resource_version:
            return
        self.labels = meta.get("labels") or {}
        self.annotations = meta.get("annotations") or {}
        if self.text is not None:
            self.text = (configmap.get("data") or {}).get(CONFIGMAP_KEY) or self.text


def published_from(obj: Mapping[str, Any] | None) -> Published:
    """A ConfigMap as read (a GET or the watch cache); None is one that does not exist."""
    if obj is None:
        return Published(None, None)
    meta = obj.get("metadata") or {}
    published = Published(
        None, meta.get("resourceVersion"), meta.get("labels") or {}, meta.get("annotations") or {}
    )
    text = (obj.get("data") or {}).get(CONFIGMAP_KEY)
    if text is None:
        published.problem = f"ConfigMap {meta.get('name', '')} has no key {CONFIGMAP_KEY}"
        return published
    try:
        published.decoded = AssignmentDocument.decode(text)
    except DocumentError as e:
        published.problem = f"ConfigMap {meta.get('name', '')}: {e}"
    else:
        published.text = text
    return published


def configmap_body(
    owner: Mapping[str, Any], document: AssignmentDocument, current: Published
) -> dict[str, Any]:
    """The ConfigMap for ``document``, owned by the ConsumerGroup; foreign labels and annotations are kept."""
    meta = owner["metadata"]
    labels = {**current.labels, MANAGED_BY[0]: MANAGED_BY[1], GROUP_LABEL: meta["name"]}
    annotations = {**current.annotations, GENERATION_ANNOTATION: str(document.generation)}
    metadata: dict[str, Any] = {
        "name": configmap_name(meta["name"]),
        "namespace": meta["namespace"],
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(owner)],
    }
    if current.resource_version is not None:
        metadata["resourceVersion"] = current.resource_version
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {CONFIGMAP_KEY: document.encode()},
    }


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": CONSUMER_GROUP_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _q(segment: str) -> str:
    return quote(segment, safe="")


class PendingEvent(NamedTuple):
    namespace: str
    name: str
    uid: str | None
    kind: str
    type: str
    reason: str
    message: str
    time: float


class Writer:
    """The operator's writes through the one client."""

    def __init__(self, client: KubeClient, component: str = "mqbalance-operator") -> None:
        self.client = client
        self.component = component
        self._events: asyncio.Queue[PendingEvent] = asyncio.Queue(EVENT_QUEUE)
        self.on_event_dropped: Callable[[], None] = lambda: None

    async def read_published(self, namespace: str, group: str) -> Published:
        path = f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(configmap_name(group))}"
        try:
            return published_from(await self.client.get(path))
        except ApiError as e:
            if e.status == 404:
                return Published(None, None)
            raise

    async def read_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A Lease read from the API server itself (not the watch cache); None when there is none.

        A list narrowed to the name, without a resourceVersion (so read from etcd, not a cache):
        ``list`` is what the operator may do with Leases where it serves groups, ``get`` is not."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
        found = await self.client.get(path, params={"fieldSelector": f"metadata.name={name}"})
        items: list[Mapping[str, Any]] = found.get("items") or []
        return items[0] if items else None

    async def publish(
        self, owner: Mapping[str, Any], document: AssignmentDocument, current: Published
    ) -> Published:
        """Create or replace the group's ConfigMap; Conflict when it changed since ``current`` was read."""
        meta = owner["metadata"]
        body = configmap_body(owner, document, current)
        base = f"/api/v1/namespaces/{_q(meta['namespace'])}/configmaps"
        try:
            if current.resource_version is None:
                obj = await self.client.create(base, body)
            else:
                obj = await self.client.replace(f"{base}/{_q(configmap_name(meta['name']))}", body)
        except Conflict:
            raise Conflict(409, f"ConfigMap {configmap_name(meta['name'])} changed meanwhile") from None
        written = obj.get("metadata") or {}
        return Published(
            body["data"][CONFIGMAP_KEY],
            written.get("resourceVersion"),
            written.get("labels") or {},
            written.get("annotations") or {},
        )

    async def remove_finalizer(
        self, namespace: str, plural: str, name: str, finalizers: list[str], which: str
    ) -> None:
        """Remove finalizer ``which`` if the object still lists it where it did (a JSON patch with a test)."""
        index = finalizers.index(which)
        path = f"/metadata/finalizers/{index}"
        operations = [{"op": "test", "path": path, "value": which}, {"op": "remove", "path": path}]
        await self.client.json_patch(custom_path(plural, _q(namespace), _q(name)), operations)

    async def ensure_releases(self, owner: Mapping[str, Any]) -> None:
        """Create the group's releases ConfigMap (the sidecars write their acknowledgements there)."""
        meta = owner["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": releases_configmap_name(meta["name"]),
                "namespace": meta["namespace"],
                "labels": {MANAGED_BY[0]: MANAGED_BY[1], GROUP_LABEL: meta["name"]},
                "ownerReferences": [owner_reference(owner)],
            },
        }
        with contextlib.suppress(Conflict):  # there already
            await self.client.create(f"/api/v1/namespaces/{_q(meta['namespace'])}/configmaps", body)

    async def patch_status(self, namespace: str, plural: str, name: str, status: Mapping[str, Any]) -> None:
        path = custom_path(plural, _q(namespace), _q(name)) + "/status"
        await self.client.merge_patch(path, {"status": dict(status)})

    # -- Events: posted in the background, off every reconcile's path --------------------------

    def post_event(self, involved: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """Queue an Event on ``involved``; kept small until it is posted (a cold start queues many)."""
        meta = involved["metadata"]
        kind = involved.get("kind") or CONSUMER_GROUP_KIND
        pending = PendingEvent(
            meta["namespace"], meta["name"], meta.get("uid"), kind, type, reason, message, time.time()
        )
        try:
            self._events.put_nowait(pending)
        except asyncio.QueueFull:
            self.on_event_dropped()

    def event_body(self, e: PendingEvent) -> dict[str, Any]:
        at = datetime.fromtimestamp(e.time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{e.name}.", "namespace": e.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": e.kind,
                "name": e.name,
                "namespace": e.namespace,
                "uid": e.uid,
            },
            "type": e.type,
            "reason": e.reason,
            "message": e.message[:1000],  # the API server caps messages at 1 KiB
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        }

    async def run_event_poster(self) -> None:
        """Post queued Events until cancelled, at most EVENT_RATE a second; a failed post is logged
        and dropped."""
        loop = asyncio.get_running_loop()
        tokens, refilled = float(EVENT_BURST), loop.time()
        while True:
            pending = await self._events.get()
            now = loop.time()
            tokens = min(float(EVENT_BURST), tokens + (now - refilled) * EVENT_RATE)
            refilled = now
            if tokens < 1.0:
                await asyncio.sleep((1.0 - tokens) / EVENT_RATE)
                tokens, refilled = 1.0, loop.time()
            tokens -= 1.0
            path = f"/api/v1/namespaces/{_q(pending.namespace)}/events"
            try:
                await self.client.create(path, self.event_body(pending))
            except ApiError as e:
                logger.debug("event %s on %s not posted: %s", pending.reason, pending.name, e)


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch from ``old`` to ``new``; keys that disappeared become null, else they would stay."""
    patch: dict[str, Any] = {}
    old = old or {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        elif value != before or key not in old:
            patch[key] = value
    return patch
