"""List, then watch, one kind of object: client-go's reflector and informer in small.

A listing (paged) replaces the store and delivers its differences from the store as
changes, so nothing is missed across API server restarts; :attr:`Informer.synced` is set
after the first. Single changes follow from a watch that starts at the listing's
resourceVersion and resumes from the last version seen (bookmarks included). A watch the
server can no longer resume (410 Gone) is replaced by a fresh listing at once; any other
failure by one after a backoff. Objects are kept as ``transform`` makes them, so a cache
holds only what its user reads.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from mqbalance.kube.client import ApiError, Gone, KubeClient

logger = logging.getLogger("mqbalance.kube")

T = TypeVar("T")
Key = tuple[str, str]
"""(namespace, name); the namespace is "" for cluster-scoped objects."""
OnChange = Callable[[Key, "T | None", "T | None"], None]
"""(key, old, new): None for old when added, for new when deleted."""

PAGE_SIZE = 100
"""Objects a listing asks for at once. A page is decoded whole and mostly thrown away (a cache keeps
what ``transform`` makes of it); the few objects kept are scattered over the memory the page took,
which the allocator cannot give back while they live. Pages of 500 left an operator of 1,000
groups 15 MiB larger than pages of 100 (docs/benchmarks.md); 100 costs a few more requests."""
WATCH_SECONDS = 290
"""Server-side timeout of one watch request, below the read timeout so a silent stall is caught."""
READ_TIMEOUT = WATCH_SECONDS + 40.0


class Backoff:
    """Exponential delays with jitter, reset once things work again."""

    def __init__(self, initial: float = 0.2, maximum: float = 10.0) -> None:
        self.initial, self.maximum = initial, maximum
        self._next = 0.0

    def next(self) -> float:
        self._next = self.initial if self._next == 0 else min(self.maximum, self._next * 2)
        return self._next * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = 0.0


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


class Informer(Generic[T]):
    """The objects under list path ``path`` (``/api/v1/nodes``), kept as ``transform`` makes them."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        transform: Callable[[Mapping[str, Any]], T],
        on_change: OnChange[T],
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_restart: Callable[[], None] | None = None,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.client = client
        self.path = path
        self.transform = transform
        self.on_change = on_change
        self.on_restart = on_restart
        self.page_size = page_size
        self._selectors = {
            k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        }
        self.store: dict[Key, T] = {}
        self.synced = asyncio.Event()
        self._backoff = Backoff()

    async def run(self) -> None:
        """List and watch until cancelled."""
        while True:
            try:
                version = await self._list()
                while True:
                    version = await self._watch(version)
            except Gone:
                logger.info("watch %s: resourceVersion expired, listing again", self.path)
                delay = 0.0
            except ApiError as e:
                delay = self._backoff.next()
                logger.warning("watching %s failed (%s); listing again in %.1f s", self.path, e, delay)
            except Exception:  # a line that is not JSON, an object `transform` cannot read, ...
                delay = self._backoff.next()
                logger.exception("watching %s failed; listing again in %.1f s", self.path, delay)
            if self.on_restart is not None:
                self.on_restart()
            await asyncio.sleep(delay)

    def on_list(self, objects: dict[Key, T]) -> None:
        """A complete listing: deliver its differences from the store, then mark it synced."""
        old, self.store = self.store, objects
        for key in old.keys() - objects.keys():
            self.on_change(key, old[key], None)
        for key, new in objects.items():
            if key not in old or old[key] != new:
                self.on_change(key, old.get(key), new)
        self.synced.set()

    def on_event(self, kind: str, key: Key, new: T) -> None:
        known = key in self.store
        old = self.store.pop(key, None)
        if kind == "DELETED":
            if known:
                self.on_change(key, old, None)
            return
        self.store[key] = new
        if not known or old != new:
            self.on_change(key, old, new)

    async def _list(self) -> str:
        objects: dict[Key, T] = {}
        token = ""
        while True:
            params = {**self._selectors, "limit": str(self.page_size)}
            if token:
                params["continue"] = token
            try:
                page = await self.client.get(self.path, params)
            except Gone:
                if not token:
                    raise
                objects.clear()  # the paging snapshot expired: start over
                token = ""
                continue
            for item in page.get("items") or []:
                objects[object_key(item)] = self.transform(item)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                self.on_list(objects)
                self._backoff.reset()
                return str(meta.get("resourceVersion") or "")

    async def _watch(self, version: str) -> str:
        """One watch request from ``version``; the last resourceVersion seen when it ends."""
        started = time.monotonic()
        params = {
            **self._selectors,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        async for event in self.client.watch(self.path, params, READ_TIMEOUT):
            kind, obj = event.get("type"), event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.on_event(str(kind), object_key(obj), self.transform(obj))
        # The server ended the watch (its timeout, or shutting down): resume. A watch that
        # ends at once again and again is backed off.
        if time.monotonic() - started < 1.0:
            await asyncio.sleep(self._backoff.next())
        else:
            self._backoff.reset()
        return version
