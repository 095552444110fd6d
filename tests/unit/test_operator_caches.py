"""The operator's own caches: the pod index, the informers' list and watch, the controller's gating."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mqbalance.operator.controller import Controller
from mqbalance.operator.informer import Informer, Key
from mqbalance.operator.kubeapi import ApiError
from mqbalance.operator.membership import PodIndex, PodInfo
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.spec import LabelSelector, Requirement

# -- PodIndex ------------------------------------------------------------------------------------

KEYS = st.sampled_from(["app", "tier", "zone"])
VALUES = st.sampled_from(["a", "b", "c"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)
SELECTORS = st.builds(
    LabelSelector,
    st.dictionaries(KEYS, VALUES, max_size=2),
    st.lists(
        st.builds(Requirement, KEYS, st.sampled_from(["In", "NotIn"]), st.frozensets(VALUES, min_size=1)),
        max_size=1,
    ).map(tuple),
)
# (namespace, pod name, labels or None for a deletion)
CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["ns1", "ns2"]), st.sampled_from([f"p{i}" for i in range(6)]), LABELS | st.none()
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(changes=CHANGES, selector=SELECTORS)
def test_candidates_hold_every_matching_pod_of_the_namespace_and_only_its_pods(
    changes: list[tuple[str, str, dict[str, str] | None]], selector: LabelSelector
) -> None:
    index = PodIndex()
    world: dict[tuple[str, str], PodInfo] = {}
    for ns, name, labels in changes:
        if labels is None:
            assert index.remove(ns, name) == world.pop((ns, name), None)
        else:
            info = PodInfo(name, labels)
            assert index.put(ns, info) == world.get((ns, name))
            world[(ns, name)] = info
    assert len(index) == len(world)
    for ns in ("ns1", "ns2"):
        pods = {n: p for (pns, n), p in world.items() if pns == ns}
        candidates = index.candidates(ns, selector)
        names = [p.name for p in candidates]
        assert names == sorted(set(names)), "candidates are unique and sorted by name"
        assert all(pods[p.name] == p for p in candidates), "only this namespace's current pods"
        matching = {n for n, p in pods.items() if selector.matches(p.labels)}
        assert matching <= set(names)
        if not selector.match_labels:
            assert set(names) == set(pods)
        assert index.candidates(ns, None) == [pods[n] for n in sorted(pods)]


def test_candidates_of_a_match_labels_selector_are_the_pods_with_its_rarest_pair() -> None:
    index = PodIndex()
    for i in range(10):
        index.put("ns", PodInfo(f"web-{i}", {"tier": "web", "app": f"a{i % 5}"}))
    index.put("ns", PodInfo("db-0", {"tier": "db", "app": "a1"}))
    selector = LabelSelector({"tier": "web", "app": "a1"})
    assert [p.name for p in index.candidates("ns", selector)] == ["db-0", "web-1", "web-6"]
    # A relabelled pod leaves its old pairs.
    index.put("ns", PodInfo("web-1", {"tier": "web", "app": "a2"}))
    assert [p.name for p in index.candidates("ns", selector)] == ["db-0", "web-6"]
    assert index.candidates("ns", LabelSelector({"app": "nowhere"})) == []
    assert index.candidates("other", selector) == []


# -- Informer ------------------------------------------------------------------------------------


class FakeApi:
    """Answers the informer's list pages and watch streams from scripts."""

    def __init__(self, pages: list[Any], streams: list[Any]) -> None:
        self.pages, self.streams = pages, streams
        self.requests: list[str] = []

    def request(self, method: str, path: str, *_: Any) -> dict[str, Any]:
        self.requests.append(path)
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return dict(page)

    def open_stream(self, path: str, read_timeout: float) -> Iterator[bytes]:
        self.requests.append(path)
        stream = self.streams.pop(0) if self.streams else None
        if stream is None:
            raise ApiError(0, "connection refused")  # no more scripts: keep the informer backing off
        if isinstance(stream, Exception):
            raise stream
        return iter([json.dumps(e).encode() + b"\n" for e in stream])

    def close(self) -> None:
        pass


def obj(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv, "labels": labels}}


def labels_of(body: Mapping[str, Any]) -> dict[str, str]:
    return dict(body["metadata"]["labels"])


async def run_informer(api: FakeApi, until: Any) -> tuple[Informer[dict[str, str]], list[Any]]:
    changes: list[tuple[Key, Any, Any]] = []
    informer: Informer[dict[str, str]] = Informer(
        api,  # type: ignore[arg-type]
        "/api/v1/namespaces/ns/pods",
        labels_of,
        lambda key, old, new: changes.append((key, old, new)),
        "app=x",
    )
    informer.start()
    try:
        for _ in range(500):
            if until(informer, changes):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"the informer never got there: {changes}")
    finally:
        informer.stop()
    return informer, changes


@pytest.mark.asyncio
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
    api = FakeApi(pages, streams)
    informer, changes = await run_informer(api, lambda i, c: len(c) >= 4)
    assert informer.synced.is_set()
    assert changes == [
        (("ns", "a"), None, {"v": "1"}),
        (("ns", "b"), None, {"v": "1"}),
        (("ns", "a"), {"v": "1"}, {"v": "2"}),
        (("ns", "b"), {"v": "1"}, None),
    ]
    assert informer.store == {("ns", "a"): {"v": "2"}}
    assert "continue=t1" in api.requests[1]
    assert "labelSelector=app%3Dx" in api.requests[1]
    assert "watch=true" in api.requests[2]
    assert "resourceVersion=10" in api.requests[2]
    # The second watch resumes after the bookmark.
    assert "resourceVersion=15" in api.requests[3]


@pytest.mark.asyncio
async def test_informer_lists_again_when_the_watch_is_gone_and_delivers_the_differences() -> None:
    pages = [
        {"items": [obj("a", "1", v="1"), obj("b", "2", v="1")], "metadata": {"resourceVersion": "10"}},
        ApiError(503, "the API server is restarting"),
        {"items": [obj("a", "20", v="2"), obj("c", "21", v="1")], "metadata": {"resourceVersion": "22"}},
    ]
    streams = [[{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]]
    api = FakeApi(pages, streams)
    informer, changes = await run_informer(api, lambda i, c: len(c) >= 5)
    assert changes[2:] == [
        (("ns", "b"), {"v": "1"}, None),
        (("ns", "a"), {"v": "1"}, {"v": "2"}),
        (("ns", "c"), None, {"v": "1"}),
    ]
    assert informer.store == {("ns", "a"): {"v": "2"}, ("ns", "c"): {"v": "1"}}


# -- the controller's caches before and after the first listing ------------------------------------


class Recorder:
    def write(self, record: Any) -> None:
        pass

    def close(self) -> None:
        pass


def controller() -> Controller:
    metrics = OperatorMetrics(CollectorRegistry(), list)
    return Controller(None, metrics, Recorder(), lambda *_: None)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_no_group_is_poked_before_the_caches_are_listed_and_only_concerned_groups_after() -> None:
    c = controller()
    body = {"metadata": {"namespace": "ns", "name": "g", "generation": 1}, "spec": {}}
    task = asyncio.create_task(c.run_group(body))
    await asyncio.sleep(0)
    state = c.groups[("ns", "g")]
    state.selector = LabelSelector({"app": "g"})
    state.topics = frozenset({"t"})
    state.trigger.clear()  # the first, urgent reconcile waits for the listing
    state.urgent = False
    c.on_pod("ns", "p", PodInfo("p", {"app": "g"}, running=True, ready=True))
    c.on_topic("ns", "t", {"brokers": []})
    assert not state.trigger.is_set()
    assert [p.name for p in c.pods.candidates("ns", state.selector)] == ["p"]
    c.synced.set()
    c.on_pod("ns", "q", PodInfo("q", {"app": "other"}))
    c.on_topic("ns", "t", {"brokers": []})  # a status-only change: the same spec
    c.on_topic("ns", "u", {"brokers": []})
    assert not state.trigger.is_set()
    c.on_pod("ns", "p", None)
    assert state.trigger.is_set()
    assert not state.urgent
    state.trigger.clear()
    c.on_topic("ns", "t", None)
    assert state.trigger.is_set()
    assert c.groups[("ns", "g")].urgent  # (read anew: mypy narrowed state.urgent above)
    assert c.topics == {"ns": {"u": {"brokers": []}}}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert c.groups == {}
    assert c._in_namespace("ns") == []


@pytest.mark.asyncio
async def test_a_pod_that_starts_matching_when_a_label_is_removed_pokes_its_group() -> None:
    # `canary DoesNotExist`: removing the label makes the pod match. Matching the union of its
    # old and new labels (which still holds `canary`) missed it until some other event came.
    c = controller()
    body = {"metadata": {"namespace": "ns", "name": "g", "generation": 1}, "spec": {}}
    task = asyncio.create_task(c.run_group(body))
    await asyncio.sleep(0)
    state = c.groups[("ns", "g")]
    state.selector = LabelSelector({"app": "g"}, (Requirement("canary", "DoesNotExist"),))
    c.synced.set()
    c.on_pod("ns", "p", PodInfo("p", {"app": "g", "canary": "yes"}, running=True, ready=True))
    state.trigger.clear()
    c.on_pod("ns", "p", PodInfo("p", {"app": "g"}, running=True, ready=True))
    assert state.trigger.is_set()
    state.trigger.clear()
    # ...and with NotIn: the value changes from an excluded one to nothing at all.
    state.selector = LabelSelector({"app": "g"}, (Requirement("track", "NotIn", frozenset({"beta"})),))
    state.pods = frozenset()
    c.on_pod("ns", "p", PodInfo("p", {"app": "g", "track": "beta"}, running=True, ready=True))
    state.trigger.clear()
    c.on_pod("ns", "p", PodInfo("p", {"app": "g"}, running=True, ready=True))
    assert state.trigger.is_set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
