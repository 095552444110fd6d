"""The Kubernetes edge with a scripted API: the informer's paged listing, watch, bookmarks and relist;
Lease locks held by one candidate at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from mqbalance.kube import ApiError, Backoff, Conflict, Gone, Informer, Key, LeaseLock

pytestmark = pytest.mark.asyncio


class ScriptedClient:
    """Answers the informer's list pages and watch streams from scripts (the KubeClient interface)."""

    def __init__(self, pages: list[Any], streams: list[Any]) -> None:
        self.pages, self.streams = pages, streams
        self.requests: list[tuple[str, dict[str, str]]] = []

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.requests.append((path, dict(params or {})))
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return dict(page)

    async def watch(
        self, path: str, params: Mapping[str, str], read_timeout: float
    ) -> AsyncIterator[dict[str, Any]]:
        self.requests.append((path, {**params, "watch": "true"}))
        stream = self.streams.pop(0) if self.streams else None
        if stream is None:
            raise ApiError(0, "connection refused")  # no more scripts: keep the informer backing off
        for event in stream:
            if event.get("type") == "ERROR":
                raise Gone(410, "too old resource version")
            yield event


def obj(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv, "labels": labels}}


def labels_of(body: Mapping[str, Any]) -> dict[str, str]:
    return dict(body["metadata"]["labels"])


async def run_informer(client: ScriptedClient, until: Any) -> tuple[Informer[dict[str, str]], list[Any]]:
    changes: list[tuple[Key, Any, Any]] = []
    informer: Informer[dict[str, str]] = Informer(
        client,  # type: ignore[arg-type]
        "/api/v1/namespaces/ns/pods",
        labels_of,
        lambda key, old, new: changes.append((key, old, new)),
        label_selector="app=x",
    )
    informer._backoff = Backoff(initial=0.01, maximum=0.02)
    task = asyncio.create_task(informer.run())
    try:
        for _ in range(500):
            if until(informer, changes):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"the informer never got there: {changes}")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return informer, changes


async def test_informer_pages_the_listing_then_watches_from_its_version() -> None:
    pages = [
        {"items": [obj("a", "1", v="1")], "metadata": {"continue": "t1"}},
        {"items": [obj("b", "2", v="1")], "metadata": {"resourceVersion": "10"}},
    ]
    streams = [
        [
            {"type": "MODIFIED", "object": obj("a", "11", v="2")},
            {"type": "MODIFIED", "object": obj("b", "12", v="1")},  # nothing we keep changed
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
        ],
        [{"type": "DELETED", "object": obj("b", "16", v="1")}],
    ]
    client = ScriptedClient(pages, streams)
    informer, changes = await run_informer(client, lambda i, c: len(c) >= 4)
    assert informer.synced.is_set()
    assert changes == [
        (("ns", "a"), None, {"v": "1"}),
        (("ns", "b"), None, {"v": "1"}),
        (("ns", "a"), {"v": "1"}, {"v": "2"}),
        (("ns", "b"), {"v": "1"}, None),
    ]
    assert informer.store == {("ns", "a"): {"v": "2"}}
    (_, first), (_, second), (_, watch), (_, resumed) = client.requests[:4]
    assert "continue" not in first
    assert second["continue"] == "t1"
    assert second["labelSelector"] == "app=x"
    assert (watch["watch"], watch["resourceVersion"], watch["allowWatchBookmarks"]) == ("true", "10", "true")
    assert resumed["resourceVersion"] == "15"  # the second watch resumes after the bookmark


async def test_informer_lists_again_when_the_watch_is_gone_and_delivers_the_differences() -> None:
    pages = [
        {"items": [obj("a", "1", v="1"), obj("b", "2", v="1")], "metadata": {"resourceVersion": "10"}},
        ApiError(503, "the API server is restarting"),
        {"items": [obj("a", "20", v="2"), obj("c", "21", v="1")], "metadata": {"resourceVersion": "22"}},
    ]
    streams = [[{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]]
    client = ScriptedClient(pages, streams)
    informer, changes = await run_informer(client, lambda i, c: len(c) >= 5)
    assert changes[2:] == [
        (("ns", "b"), {"v": "1"}, None),
        (("ns", "a"), {"v": "1"}, {"v": "2"}),
        (("ns", "c"), None, {"v": "1"}),
    ]
    assert informer.store == {("ns", "a"): {"v": "2"}, ("ns", "c"): {"v": "1"}}


async def test_informer_starts_the_listing_over_when_its_paging_snapshot_expires() -> None:
    pages = [
        {"items": [obj("a", "1", v="1")], "metadata": {"continue": "t1"}},
        Gone(410, "the continue token expired"),
        {"items": [obj("b", "5", v="1")], "metadata": {"resourceVersion": "6"}},
    ]
    client = ScriptedClient(pages, [])
    _, changes = await run_informer(client, lambda i, c: i.synced.is_set())
    assert changes == [(("ns", "b"), None, {"v": "1"})]  # "a" of the expired snapshot never shows


class LeaseServer:
    """One Lease in memory with the API's optimistic concurrency, shared by several clients."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get(self, path: str, params: Any = None) -> dict[str, Any]:
        if self.lease is None:
            raise ApiError(404, "not found")
        return {**self.lease, "metadata": {**self.lease["metadata"], "resourceVersion": str(self.version)}}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.lease is not None:
            raise Conflict(409, "already exists")
        self.version += 1
        self.lease = body
        return body

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise Conflict(409, "the object has been modified")
        self.version += 1
        self.lease = body
        return body


async def test_one_lease_holder_at_a_time_and_takeover_only_after_expiry() -> None:
    server = LeaseServer()
    now = [0.0]
    a = LeaseLock(server, "ns", "l", "a", 3.0, monotonic=lambda: now[0])  # type: ignore[arg-type]
    b = LeaseLock(server, "ns", "l", "b", 3.0, monotonic=lambda: now[0])  # type: ignore[arg-type]
    assert await a.try_hold()
    assert not await b.try_hold()
    assert b.holder == "a"
    now[0] = 2.0
    assert await a.try_hold()  # renewed: b saw the record change, so its clock starts over
    assert not await b.try_hold()
    now[0] = 4.5
    assert not await b.try_hold()  # 2.5 s since b saw the renewal: not yet expired
    assert not a.held  # a could not renew for 2/3 of the duration: it must stop acting as holder
    now[0] = 5.5
    assert await b.try_hold()  # 3.5 s since b last saw it change: expired, taken over
    assert server.lease is not None
    assert server.lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_hold()
    await b.release()
    assert await a.try_hold()  # released: taken at once
