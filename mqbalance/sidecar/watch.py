"""Where assignments and routes come from: API watches, mounted files, or a test.

Each group's ConfigMap is watched alone (``fieldSelector=metadata.name=<name>``), so
the sidecar's Role can grant get/list/watch on that one ``resourceName``. A watch
that fails reconnects with backoff; one whose resourceVersion expired (410 Gone)
lists again at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from mqbalance.document import CONFIGMAP_KEY, AssignmentDocument, DocumentError, configmap_name
from mqbalance.model import PERM_READ_WRITE, UNKNOWN_ZONE, Broker, TopicRoute
from mqbalance.sidecar.kube import KubeApiError, KubeClient
from mqbalance.sidecar.state import SidecarState

log = logging.getLogger(__name__)

TOPIC_API = "/apis/mqbalance.io/v1alpha1"
WATCH_TIMEOUT_SECONDS = 290
"""Server-side watch timeout; below the client's read timeout so a silent stall is caught."""


class AssignmentSource(Protocol):
    """Feeds a :class:`SidecarState` until cancelled."""

    async def run(self, state: SidecarState) -> None: ...


@dataclass
class Backoff:
    """Exponential delays with jitter, reset once a connection works again."""

    initial: float = 0.2
    maximum: float = 10.0
    factor: float = 2.0
    _next: float = field(default=0.0, init=False)

    def next(self) -> float:
        self._next = self.initial if self._next == 0 else min(self.maximum, self._next * self.factor)
        return self._next * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = 0.0


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class WatchHandler(Protocol):
    def on_list(self, items: list[dict[str, Any]]) -> None: ...

    def on_event(self, kind: str, obj: dict[str, Any]) -> None: ...


class Reflector:
    """List, then watch from the list's resourceVersion, forever."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        handler: WatchHandler,
        *,
        name: str,
        field_selector: str | None = None,
        state: SidecarState,
        backoff: Backoff | None = None,
    ) -> None:
        self._kube = kube
        self._path = path
        self._handler = handler
        self._name = name
        self._params = {"fieldSelector": field_selector} if field_selector else {}
        self._restarts = state.metrics.watch_restarts.labels(name.split("/", 1)[0])
        self._backoff = backoff or Backoff()

    async def run(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except _Expired:
                log.info("watch %s: resourceVersion expired, listing again", self._name)
                self._restarts.inc()
            except (aiohttp.ClientError, KubeApiError, TimeoutError, OSError, ValueError) as e:
                delay = self._backoff.next()
                if isinstance(e, KubeApiError) and e.status == 410:
                    delay = 0.0
                log.warning(
                    "watch %s failed (%s); retrying in %.1f s", self._name, e or type(e).__name__, delay
                )
                self._restarts.inc()
                await asyncio.sleep(delay)

    async def _list_and_watch(self) -> None:
        listing = await self._kube.get(self._path, self._params)
        version = str(listing["metadata"]["resourceVersion"])
        self._handler.on_list(list(listing.get("items") or []))
        self._backoff.reset()
        while True:
            started = time.monotonic()
            params = {
                **self._params,
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS),
            }
            async for event in self._kube.watch(self._path, params):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise KubeApiError(int(obj.get("code") or 500), str(obj.get("message", obj)))
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if kind != "BOOKMARK":
                    self._handler.on_event(str(kind), obj)
            # The server ended the watch (its timeout, or shutting down). Resume from the
            # last version; a watch that ends at once again and again gets backed off.
            if time.monotonic() - started < 1.0:
                await asyncio.sleep(self._backoff.next())
            else:
                self._backoff.reset()


class ConfigMapHandler:
    """One group's assignment ConfigMap -> the state."""

    def __init__(self, state: SidecarState, group: str) -> None:
        self._state = state
        self._group = group

    def on_list(self, items: list[dict[str, Any]]) -> None:
        if items:
            self.apply(items[0])
        else:
            log.info("group %s: ConfigMap %s does not exist yet", self._group, configmap_name(self._group))
            self._state.withdraw(self._group)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._state.withdraw(self._group)
        else:
            self.apply(obj)

    def apply(self, obj: dict[str, Any]) -> None:
        text = (obj.get("data") or {}).get(CONFIGMAP_KEY)
        if text is None:
            log.error("group %s: ConfigMap has no key %r; keeping what is served", self._group, CONFIGMAP_KEY)
            self._state.metrics.invalid_documents.labels(self._group).inc()
            return
        apply_text(self._state, self._group, text)


def apply_text(state: SidecarState, group: str, text: str) -> None:
    """Decode and serve a document; a bad one is logged and the previous one kept."""
    try:
        doc = AssignmentDocument.decode(text)
    except DocumentError as e:
        log.error("group %s: unreadable assignment document (%s); keeping what is served", group, e)
        state.metrics.invalid_documents.labels(group).inc()
        return
    state.publish(group, doc)


def topic_route(obj: Mapping[str, Any]) -> tuple[str, TopicRoute]:
    """(resource name, route) of a Topic resource; raises ValueError naming what is wrong."""
    name = str(obj.get("metadata", {}).get("name", ""))
    spec = obj.get("spec") or {}
    topic = spec.get("topicName") or name
    brokers = []
    for b in spec.get("brokers") or []:
        try:
            brokers.append(
                Broker(
                    name=str(b["name"]),
                    read_queue_nums=int(b["readQueueNums"]),
                    write_queue_nums=int(b["writeQueueNums"]),
                    perm=int(b.get("perm", PERM_READ_WRITE)),
                    zone=str(b.get("zone") or UNKNOWN_ZONE),
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"Topic {name!r}: broker entry {b!r} is malformed ({e})") from None
    return name, TopicRoute(topic=str(topic), brokers=tuple(brokers))


class TopicHandler:
    """Topic resources of the namespace -> routes for producer selection."""

    def __init__(self, state: SidecarState) -> None:
        self._state = state

    def on_list(self, items: list[dict[str, Any]]) -> None:
        routes = {}
        for obj in items:
            parsed = self._parse(obj)
            if parsed is not None:
                routes[parsed[0]] = parsed[1]
        self._state.replace_routes(routes)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._state.delete_route(str(obj.get("metadata", {}).get("name", "")))
            return
        parsed = self._parse(obj)
        if parsed is not None:
            self._state.put_route(*parsed)

    @staticmethod
    def _parse(obj: dict[str, Any]) -> tuple[str, TopicRoute] | None:
        try:
            return topic_route(obj)
        except ValueError as e:
            log.error("%s; ignoring it", e)
            return None


class FileSource:
    """A mounted ConfigMap file, read again every ``interval`` seconds.

    The kubelet refreshes mounted ConfigMaps up to a minute late; this is the
    fallback for pods that may not talk to the API server.
    """

    def __init__(self, group: str, path: Path, interval: float = 2.0) -> None:
        self.group = group
        self.path = path
        self.interval = interval

    async def run(self, state: SidecarState) -> None:
        last: str | None = None
        missing_logged = False
        while True:
            try:
                text = self.path.read_text()
            except OSError as e:
                if not missing_logged:
                    log.warning("group %s: cannot read %s (%s); waiting for it", self.group, self.path, e)
                    missing_logged = True
            else:
                missing_logged = False
                if text != last:
                    last = text
                    apply_text(state, self.group, text)
            await asyncio.sleep(self.interval)


class KubernetesSource:
    """Watches every group's ConfigMap (unless it has a file) and the namespace's Topics."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        groups: list[str],
        *,
        files: Mapping[str, Path] | None = None,
        watch_topics: bool = True,
        file_interval: float = 2.0,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._groups = groups
        self._files = dict(files or {})
        self._watch_topics = watch_topics
        self._file_interval = file_interval

    async def run(self, state: SidecarState) -> None:
        ns = self._namespace
        async with asyncio.TaskGroup() as tasks:
            for group in self._groups:
                if group in self._files:
                    tasks.create_task(FileSource(group, self._files[group], self._file_interval).run(state))
                    continue
                cm = configmap_name(group)
                reflector = Reflector(
                    self._kube,
                    f"/api/v1/namespaces/{ns}/configmaps",
                    ConfigMapHandler(state, group),
                    name=f"configmap/{cm}",
                    field_selector=f"metadata.name={cm}",
                    state=state,
                )
                tasks.create_task(reflector.run())
            if self._watch_topics:
                reflector = Reflector(
                    self._kube,
                    f"{TOPIC_API}/namespaces/{ns}/topics",
                    TopicHandler(state),
                    name="topics",
                    state=state,
                )
                tasks.create_task(reflector.run())


class FilesSource:
    """Every group from a mounted file; no API server involved."""

    def __init__(self, files: Mapping[str, Path], interval: float = 2.0) -> None:
        self._files = dict(files)
        self._interval = interval

    async def run(self, state: SidecarState) -> None:
        async with asyncio.TaskGroup() as tasks:
            for group, path in self._files.items():
                tasks.create_task(FileSource(group, path, self._interval).run(state))


class MemorySource:
    """Documents and routes handed over in-process: for tests and embedding."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()

    def publish(self, group: str, doc: AssignmentDocument) -> None:
        self._queue.put_nowait(("publish", group, doc))

    def put_route(self, resource: str, route: TopicRoute) -> None:
        self._queue.put_nowait(("route", resource, route))

    async def run(self, state: SidecarState) -> None:
        while True:
            action, key, value = await self._queue.get()
            if action == "publish":
                state.publish(key, value)
            else:
                state.put_route(key, value)
