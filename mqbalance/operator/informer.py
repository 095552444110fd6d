"""List, then watch, one kind of object into the event loop: client-go's reflector in small.

The operator keeps Pods, Nodes, Topics and its assignment ConfigMaps in its own
caches instead of kopf indexes: kopf runs its per-object machinery (a task, a
batching window, handler selection, a wait for every index) for each of the
thousands of pods of a large namespace, where the operator needs only a snapshot.

Each informer runs its list and its watch in a thread of its own with the same
synchronous client as the rest of the operator, and hands the results to the event
loop: a full listing as one :meth:`Informer.on_list` call (so the caches are whole
before anyone reads them: :attr:`Informer.synced` is set after the first), single
changes as ``on_change(key, old, new)``. A watch that ends is resumed from the last
resourceVersion seen (bookmarks included); one the server no longer can resume
(410 Gone) or that fails is replaced by a fresh listing, whose differences from the
cache are delivered as changes, so nothing is missed across API server restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

from mqbalance.operator.kubeapi import ApiError, KubeApi

logger = logging.getLogger("mqbalance.operator")

T = TypeVar("T")
Key = tuple[str, str]
"""(namespace, name); the namespace is "" for cluster-scoped objects."""
OnChange = Callable[[Key, "T | None", "T | None"], None]

PAGE_SIZE = 500
WATCH_SECONDS = 300
"""Server-side timeout of one watch request; it is then resumed from the last resourceVersion."""
READ_TIMEOUT = WATCH_SECONDS + 30.0
MAX_BACKOFF_SECONDS = 5.0


class Gone(Exception):
    """The resourceVersion to resume from is too old (HTTP 410): list again."""


class Informer(Generic[T]):
    """The objects under list URL ``path`` (``/api/v1/nodes``), kept as ``transform`` makes them."""

    def __init__(
        self,
        api: KubeApi,
        path: str,
        transform: Callable[[Mapping[str, Any]], T],
        on_change: OnChange[T],
        label_selector: str | None = None,
    ) -> None:
        self.api = api
        self.path = path
        self.transform = transform
        self.on_change = on_change
        self.label_selector = label_selector
        self.store: dict[Key, T] = {}
        self.synced = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None

    # -- the event loop's side -----------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"informer {self.path}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def on_list(self, objects: dict[Key, T]) -> None:
        """A complete listing: deliver its differences from the cache, then mark the cache synced."""
        old = self.store
        self.store = objects
        for key in old.keys() - objects.keys():
            self.on_change(key, old[key], None)
        for key, new in objects.items():
            before = old.get(key)
            if before != new:
                self.on_change(key, before, new)
        self.synced.set()

    def on_event(self, kind: str, key: Key, new: T) -> None:
        old = self.store.pop(key, None)
        if kind == "DELETED":
            if old is not None:
                self.on_change(key, old, None)
            return
        self.store[key] = new
        if old != new:
            self.on_change(key, old, new)

    # -- the thread's side ---------------------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the operator stopped without stopping us
            self._stopping.set()

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                version = self._list()
                failures = 0
                while not self._stopping.is_set():
                    version = self._watch(version)
            except Gone:
                continue
            except Exception as e:
                if self._stopping.is_set():
                    return
                failures += 1
                delay = min(0.5 * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
                logger.warning("watching %s failed (%s); listing again in %g s", self.path, e, delay)
                self._stopping.wait(delay)

    def _url(self, **params: str) -> str:
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        return f"{self.path}?{urlencode(params)}"

    def _list(self) -> str:
        objects: dict[Key, T] = {}
        token = ""
        while True:
            params = {"limit": str(PAGE_SIZE)}
            if token:
                params["continue"] = token
            try:
                page = self.api.request("GET", self._url(**params))
            except ApiError as e:
                if e.status == 410 and token:  # the paging snapshot expired: start over
                    objects.clear()
                    token = ""
                    continue
                raise
            for item in page.get("items") or []:
                objects[_key(item)] = self.transform(item)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                self._post(self.on_list, objects)
                return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One watch request from ``version``; the last resourceVersion seen when it ends."""
        url = self._url(
            watch="true",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_SECONDS),
        )
        try:
            self._response = response = self.api.open_stream(url, READ_TIMEOUT)
        except ApiError as e:
            if e.status == 410:
                raise Gone() from None
            raise
        try:
            for line in response:
                if self._stopping.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiError(int(obj.get("code") or 0), str(obj.get("message") or obj))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self.on_event, kind, _key(obj), self.transform(obj))
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()
        return version


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")
