"""The group loop with a fake API and a hand-driven clock: debounce, conflicts, backoff, gating.

The fake API keeps objects by path with resourceVersions (so a stale replace conflicts, as on a
real server) and can be told to fail; the work queue's timer is advanced by hand, so the tests
say exactly when a reconcile happens. Integration tests run the same loop on a real API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.contract import Ack, configmap_name, member_lease_name
from mqbalance.contract.bounds import MAX_HISTORY
from mqbalance.kube import ApiError, Conflict
from mqbalance.model import Broker
from mqbalance.operator.controller import Controller
from mqbalance.operator.group_reconciler import LEGACY_FINALIZER
from mqbalance.operator.leases import LeaseTable, lease_record
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.spec import LabelSelector, Requirement
from mqbalance.operator.topics import RouteRead, topic_status
from mqbalance.operator.workqueue import WorkQueue
from mqbalance.operator.world import work_priority
from mqbalance.operator.writes import Writer

pytestmark = pytest.mark.asyncio

NS = "ns"
CM_PATH = f"/api/v1/namespaces/{NS}/configmaps"


class FakeApi:
    """Objects by path with resourceVersions; ``fail`` holds errors to raise on the next writes."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.versions = itertools.count(1)
        self.fail: list[ApiError] = []
        self.writes: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        self.json_patches: list[list[dict[str, Any]]] = []
        self.merge_patches: list[tuple[str, dict[str, Any]]] = []

    def _written(self, method: str, path: str) -> None:
        self.writes.append((method, path))
        if self.fail:
            raise self.fail.pop(0)

    async def get(self, path: str, params: Any = None) -> dict[str, Any]:
        if path not in self.objects:
            raise ApiError(404, "not found")
        return self.objects[path]

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if path.endswith("/events"):
            self.events.append(dict(body))
            return dict(body)
        self._written("POST", path)
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise Conflict(409, "already exists")
        return self._store(full, body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._written("PUT", path)
        current = self.objects.get(path)
        if current is None or current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise Conflict(409, "the object has been modified")
        return self._store(path, body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self._written("PATCH", path)
        self.merge_patches.append((path, dict(patch)))
        return dict(patch)

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        self._written("JSON-PATCH", path)
        self.json_patches.append(operations)
        return {}

    def _store(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(next(self.versions))}}
        self.objects[path] = stored
        return stored

    def foreign_write(self, path: str) -> None:
        """Someone else replaces the object: our resourceVersion goes stale."""
        self._store(path, self.objects[path])


class HandTimer:
    """The work queue's clock, advanced by hand."""

    def __init__(self) -> None:
        self.time = 0.0
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._due, (when, next(self._order), callback))

    def advance(self, seconds: float) -> None:
        self.time += seconds
        while self._due and self._due[0][0] <= self.time:
            heapq.heappop(self._due)[2]()


class Journal:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def write(self, record: Any) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


TOPIC_SPEC = {"brokers": [{"name": "b", "readQueueNums": 4, "writeQueueNums": 4}]}
TOPIC = {
    "metadata": {"namespace": NS, "name": "t", "generation": 1},
    "spec": TOPIC_SPEC,
    # What the operator writes, so no Topic status patch takes part in these tests.
    "status": topic_status("t", TOPIC_SPEC, 1, {}, None, 0.0),
}


def group(debounce: float = 2.0, **spec: Any) -> dict[str, Any]:
    return {
        "kind": "ConsumerGroup",
        "metadata": {"namespace": NS, "name": "g", "uid": "u1", "generation": 1},
        "spec": {
            "topics": ["t"],
            "selector": {"matchLabels": {"app": "g"}},
            "debounceSeconds": debounce,
            **spec,
        },
        "status": {},
    }


def pod(name: str, **labels: str) -> PodInfo:
    return PodInfo(name, {"app": "g", **labels}, "n1", running=True, ready=True)


class FakeRoutes(RouteReader):
    """Answers route reads from ``answers`` (the last one repeats) and counts them."""

    def __init__(self, *answers: RouteRead) -> None:
        super().__init__()
        self.answers = list(answers)
        self.asked: list[tuple[str, list[str]]] = []

    async def read(self, topic: str, addresses: Any = ()) -> RouteRead:
        self.asked.append((topic, list(addresses)))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class Harness:
    def __init__(self, routes: RouteReader | None = None) -> None:
        self.api = FakeApi()
        self.timer = HandTimer()
        self.journal = Journal()
        self.registry = CollectorRegistry()
        self.metrics = OperatorMetrics(self.registry, lambda: self.world.gauges())
        self.controller = Controller(
            Writer(self.api),  # type: ignore[arg-type]
            self.metrics,
            self.journal,  # type: ignore[arg-type]
            clock=lambda: 1_800_000_000.0 + self.timer.time,
            queue=WorkQueue(self.timer, work_priority),
            routes=routes or RouteReader(),
        )
        self.world = self.controller.world
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Harness:
        self.tasks = [asyncio.create_task(self.controller.run_worker()) for _ in range(2)]
        self.tasks.append(asyncio.create_task(self.controller.writer.run_event_poster()))
        return self

    async def __aexit__(self, *_: Any) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def settle(self) -> None:
        """Let the workers run until nothing is queued or being processed."""
        for _ in range(200):
            await asyncio.sleep(0)
            queue = self.world.queue
            if not len(queue) and not queue.busy:
                await asyncio.sleep(0)
                if not len(queue) and not queue.busy:
                    return
        pytest.fail("the work queue did not settle")

    def published_generations(self) -> list[int]:
        return [r.generation for r in self.journal.records]

    def counter(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


async def start(h: Harness, body: Mapping[str, Any], pods: list[PodInfo]) -> None:
    c = h.world
    c.on_topic((NS, "t"), None, TOPIC)
    for p in pods:
        c.on_pod((NS, p.name), None, p)
    c.on_group((NS, "g"), None, body)
    c.synced.set()
    await h.settle()


async def test_nothing_is_reconciled_before_every_cache_is_listed() -> None:
    async with Harness() as h:
        h.world.on_topic((NS, "t"), None, TOPIC)
        h.world.on_group((NS, "g"), None, group())
        h.world.on_pod((NS, "p1"), None, pod("p1"))
        await asyncio.sleep(0.01)
        assert h.api.writes == []
        h.world.synced.set()
        await h.settle()
        assert h.published_generations() == [1]


async def test_a_burst_of_pod_changes_in_the_window_is_one_rebalance_at_its_end() -> None:
    async with Harness() as h:
        await start(h, group(debounce=2.0), [pod("p1")])
        assert h.published_generations() == [1]
        for i, at in ((2, 0.0), (3, 0.5), (4, 1.5)):  # the first change opens the window
            h.timer.advance(at - (h.timer.time % 10 if i > 2 else 0))
            h.world.on_pod((NS, f"p{i}"), None, pod(f"p{i}"))
            await h.settle()
        assert h.published_generations() == [1]
        h.timer.advance(0.49)
        await h.settle()
        assert h.published_generations() == [1]
        h.timer.advance(0.02)  # 2 s after the first change
        await h.settle()
        assert h.published_generations() == [1, 2]
        assert h.journal.records[-1].members.keys() == {"p1", "p2", "p3", "p4"}


async def test_spec_and_topic_changes_skip_the_window() -> None:
    async with Harness() as h:
        await start(h, group(debounce=60.0), [pod("p1"), pod("p2")])
        h.world.on_pod((NS, "p3"), None, pod("p3"))  # waits for its window...
        changed = {
            **group(debounce=60.0, strategy={"name": "STICKY"}),
            "metadata": {**group()["metadata"], "generation": 2},
        }
        h.world.on_group((NS, "g"), group(), changed)  # ...but the spec change does not
        await h.settle()
        assert h.published_generations() == [1, 2]
        assert h.journal.records[-1].reason == "spec-changed"
        assert h.world.queue.due_at(("group", NS, "g")) is None  # the pending window went with it


async def test_a_conflicting_write_is_read_again_and_reconciled_at_once() -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0), [pod("p1")])
        h.api.foreign_write(f"{CM_PATH}/{configmap_name('g')}")
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        assert h.published_generations() == [1, 2]
        assert ("PUT", f"{CM_PATH}/{configmap_name('g')}") in h.api.writes
        assert h.counter("mqbalance_reconcile_errors_total", kind="conflict") == 1


async def test_api_errors_back_off_exponentially_and_say_so() -> None:
    async with Harness() as h:
        h.api.fail = [ApiError(500, "etcd timeout")] * 3
        await start(h, group(), [pod("p1")])
        assert h.published_generations() == []
        for delay in (1.0, 2.0):  # 1 s, then 2 s, then 4 s ...
            h.timer.advance(delay - 0.01)
            await h.settle()
            assert h.published_generations() == []
            h.timer.advance(0.01)
            await h.settle()
        h.timer.advance(4.0)
        await h.settle()
        assert h.published_generations() == [1]
        assert h.counter("mqbalance_reconciles_total", result="error") == 3
        warnings = [e for e in h.api.events if e["reason"] == "ReconcileFailed"]
        assert [w["message"].rsplit("retrying in ", 1)[1] for w in warnings] == ["1s", "2s", "4s"]


async def test_endless_conflicts_fall_back_to_backoff() -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0), [pod("p1")])
        h.api.fail = [Conflict(409, "modified")] * 7
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        # Five immediate retries from fresh reads, then the sixth conflict waits 1 s.
        assert h.counter("mqbalance_reconcile_errors_total", kind="conflict") == 6
        assert h.published_generations() == [1]
        h.timer.advance(1.0)
        await h.settle()
        h.timer.advance(2.0)
        await h.settle()
        assert h.published_generations() == [1, 2]


async def test_a_pod_that_starts_matching_when_a_label_is_removed_reconciles_its_group() -> None:
    # `canary DoesNotExist`: removing the label makes the pod match. Matching the union of its
    # old and new labels (which still holds `canary`) missed it until some other event came.
    body = group(
        debounce=0.0,
        selector={
            "matchLabels": {"app": "g"},
            "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}],
        },
    )
    async with Harness() as h:
        await start(h, body, [pod("p1"), pod("p2", canary="yes")])
        assert set(h.journal.records[-1].members) == {"p1"}
        h.world.on_pod((NS, "p2"), pod("p2", canary="yes"), pod("p2"))
        await h.settle()
        assert set(h.journal.records[-1].members) == {"p1", "p2"}
    selector = h.world.groups[(NS, "g")].interest.selector
    assert selector == LabelSelector({"app": "g"}, (Requirement("canary", "DoesNotExist"),))


async def test_a_deleted_group_is_forgotten_with_its_pending_work() -> None:
    async with Harness() as h:
        await start(h, group(debounce=5.0), [pod("p1")])
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        assert h.world.queue.due_at(("group", NS, "g")) is not None
        h.world.on_group((NS, "g"), group(), None)
        assert h.world.queue.due_at(("group", NS, "g")) is None
        assert h.world.groups == {}
        h.timer.advance(10.0)
        await h.settle()
        assert h.published_generations() == [1]


async def test_topic_status_is_written_in_the_same_loop_and_retried() -> None:
    status_path = f"/apis/mqbalance.io/v1alpha1/namespaces/{NS}/topics/t/status"
    async with Harness() as h:
        h.api.fail = [ApiError(500, "etcd timeout")]
        h.world.on_topic((NS, "t"), None, {**TOPIC, "status": {}})
        h.world.synced.set()
        await h.settle()
        assert h.api.writes == [("PATCH", status_path)]
        h.timer.advance(1.0)
        await h.settle()
        assert h.api.writes == [("PATCH", status_path)] * 2
        h.world.on_topic((NS, "t"), {**TOPIC, "status": {}}, TOPIC)  # our status came back
        await h.settle()
        assert len(h.api.writes) == 2  # nothing left to write


async def test_the_finalizer_of_operator_0_1_is_removed_once() -> None:
    body = group()
    body["metadata"]["finalizers"] = ["other.io/keep", "mqbalance.io/operator"]
    async with Harness() as h:
        await start(h, body, [pod("p1")])
        assert h.api.json_patches == [
            [
                {"op": "test", "path": "/metadata/finalizers/1", "value": "mqbalance.io/operator"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]
        ]
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        h.timer.advance(2.0)
        await h.settle()
        assert h.published_generations() == [1, 2]
        assert len(h.api.json_patches) == 1


def releases_configmap(data: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": "g-releases", "labels": {"mqbalance.io/group": "g"}},
        "data": data,
    }


async def test_a_handover_revokes_then_assigns_once_the_old_owner_releases() -> None:
    body = group(debounce=0.0, strategy={"name": "STICKY"}, handover={"mode": "Release"})
    async with Harness() as h:
        await start(h, body, [pod("p1")])
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        first, revoke = h.journal.records
        assert revoke.releasing
        assert revoke.releasing[0].owner == "p1"
        assert revoke.assignment["t"]["p2"] == ()  # nothing given yet: p1 still holds what moves
        assert ("POST", CM_PATH) in h.api.writes  # the releases ConfigMap, before anyone acknowledges
        reasons = [e["reason"] for e in h.api.events]
        assert "QueuesRevoked" in reasons
        ack = releases_configmap({"p1": Ack(revoke.generation).encode()})
        h.world.on_configmap((NS, "g-releases"), None, ack)
        await h.settle()
        assign = h.journal.records[-1]
        assert assign.generation == revoke.generation + 1
        assert assign.releasing == ()
        assert sorted(len(q) for q in assign.assignment["t"].values()) == [2, 2]
        assert assign.reason == "released"
        assert h.counter("mqbalance_handover_assigned_queues_total", outcome="released") == 2
        assert first.generation == 1


async def test_a_release_that_never_comes_is_overridden_at_the_timeout() -> None:
    body = group(
        debounce=0.0, strategy={"name": "STICKY"}, handover={"mode": "Release", "releaseTimeoutSeconds": 30}
    )
    async with Harness() as h:
        await start(h, body, [pod("p1")])
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        revoked = h.journal.records[-1].generation
        h.timer.advance(29.9)
        await h.settle()
        assert h.journal.records[-1].generation == revoked  # still waiting
        h.timer.advance(0.1)  # the reconcile the operator scheduled for the timeout
        await h.settle()
        assert h.journal.records[-1].generation == revoked + 1
        assert h.journal.records[-1].releasing == ()
        assert h.counter("mqbalance_handover_assigned_queues_total", outcome="overridden") == 2
        overridden = [e for e in h.api.events if e["reason"] == "ReleaseOverridden"]
        assert overridden
        assert overridden[0]["type"] == "Warning"
        # The history says which generation gave queues on without their release.
        latest = (h.world.groups[(NS, "g")].publication.status or {})["history"][0]
        assert latest["generation"] == revoked + 1
        assert latest["overriddenQueues"] == 2
        assert latest["handoverSeconds"] == 30.0


def merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch applied to ``base``."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_of(**queues: int) -> RouteRead:
    return RouteRead(tuple(Broker(b, n, n) for b, n in queues.items()), address="10.0.0.5:9876")


async def test_a_route_read_from_a_name_server_reaches_the_groups_and_is_polled() -> None:
    spec = {"topicName": "orders", "nameServer": {"addresses": ["10.0.0.5:9876"], "pollSeconds": 30}}
    topic: dict[str, Any] = {
        "metadata": {"namespace": NS, "name": "t", "generation": 1},
        "spec": spec,
        "status": {},
    }
    unreachable = RouteRead(None, reason="NameServerUnreachable", message="no NameServer answered")
    routes = FakeRoutes(read_of(a=2), read_of(a=2, b=2), unreachable)
    status_path = f"/apis/mqbalance.io/v1alpha1/namespaces/{NS}/topics/t/status"

    async def status_comes_back() -> dict[str, Any]:
        nonlocal topic
        patch = [p for path, p in h.api.merge_patches if path == status_path][-1]
        old, topic = topic, merge(topic, patch)
        h.world.on_topic((NS, "t"), old, topic)
        await h.settle()
        status: dict[str, Any] = topic["status"]
        return status

    async with Harness(routes) as h:
        c = h.world
        c.on_topic((NS, "t"), None, topic)
        c.on_pod((NS, "p1"), None, pod("p1"))
        c.on_group((NS, "g"), None, group())
        c.synced.set()
        await h.settle()
        assert routes.asked == [("orders", ["10.0.0.5:9876"])]
        assert h.published_generations() == []  # the group waits for the route
        status = await status_comes_back()
        assert status["readableQueues"] == 2
        assert len(h.journal.records[-1].queues["orders"]) == 2
        assert len(routes.asked) == 1  # our own status write does not read again

        h.timer.advance(30.0)  # the poll: broker b joined the route
        await h.settle()
        assert len(routes.asked) == 2
        status = await status_comes_back()
        assert status["readableQueues"] == 4
        assert h.published_generations() == [1, 2]

        h.timer.advance(30.0)  # unreachable: the route read before stays, and so does the assignment
        await h.settle()
        status = await status_comes_back()
        available = next(c for c in status["conditions"] if c["type"] == "RouteAvailable")
        assert (available["status"], available["reason"]) == ("False", "NameServerUnreachable")
        assert "keeping the route read before" in available["message"]
        assert status["route"]["brokers"][1]["name"] == "b"
        assert h.published_generations() == [1, 2]
        h.timer.advance(1.0)  # failures are retried sooner than the poll
        await h.settle()
        assert len(routes.asked) == 4


async def test_a_namespace_being_listed_is_not_worked_on_and_a_forgotten_one_leaves_nothing() -> None:
    """Sharded by namespace: a replica that takes a namespace over works on it only once all of
    its caches are listed, and keeps nothing of a namespace it gave up."""
    async with Harness() as h:
        c = h.world
        c.synced.set()  # the cluster-wide caches (Nodes) are listed
        c.listing.add(NS)
        c.on_group((NS, "g"), None, group(debounce=0.0))
        c.on_topic((NS, "t"), None, TOPIC)
        await h.settle()
        assert h.api.writes == []  # its pods are not listed yet: an assignment now would be empty
        c.on_pod((NS, "p1"), None, pod("p1"))
        c.listed(NS)
        await h.settle()
        assert h.published_generations() == [1]
        assert h.journal.records[0].members == {"p1": "unknown"}
        c.on_pod((NS, "p2"), None, pod("p2"))  # queued, then the namespace goes to another replica
        c.forget_namespace(NS)
        assert (c.groups, c.topics, len(c.pods), c.configmaps) == ({}, {}, 0, {})
        assert len(c.queue) == 0
        assert c.queue.due_at(("group", NS, "g")) is None
        h.timer.advance(5.0)
        await h.settle()
        assert h.published_generations() == [1]


async def test_a_group_deleted_while_its_reconcile_waits_is_not_filed_again() -> None:
    """A reconcile that waited on the API (here: removing the legacy finalizer) must not route
    pod changes to a group deleted meanwhile: they would look it up and fail."""
    gate = asyncio.Event()

    class SlowApi(FakeApi):
        async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
            await gate.wait()
            return await super().json_patch(path, operations)

    async with Harness() as h:
        h.api = SlowApi()
        h.controller.writer = Writer(h.api)  # type: ignore[arg-type]
        body = group(debounce=0.0)
        body["metadata"]["finalizers"] = [LEGACY_FINALIZER]
        c = h.world
        c.on_topic((NS, "t"), None, TOPIC)
        c.on_pod((NS, "p1"), None, pod("p1"))
        c.on_group((NS, "g"), None, body)
        c.synced.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert c.queue.busy  # waiting on the finalizer's removal
        c.on_group((NS, "g"), body, None)
        gate.set()
        await h.settle()
        c.on_pod((NS, "p2"), None, pod("p2"))  # raised KeyError when the group was filed again
        await h.settle()
        assert c.groups == {}
        assert h.published_generations() == [1]  # the write in flight completed; nothing after it


async def test_what_comes_back_through_the_watch_is_kept_once_and_the_next_reconcile_reads_it() -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0), [pod("p1")])
        publication = h.world.groups[(NS, "g")].publication
        assert publication.configmap is not None
        assert publication.status
        # The watch brings the ConfigMap and the status back as new objects with equal contents.
        written = h.api.objects[f"{CM_PATH}/{configmap_name('g')}"]
        echo = {
            "metadata": dict(written["metadata"]),
            "data": {k: "".join(v) for k, v in written["data"].items()},
        }
        h.world.on_configmap((NS, configmap_name("g")), None, echo)
        body = {**group(debounce=0.0), "status": {**publication.status}}
        h.world.on_group((NS, "g"), group(debounce=0.0), body)
        assert publication.configmap.text is echo["data"]["assignment.json"]
        assert publication.status is body["status"]
        await h.settle()
        assert h.published_generations() == [1], "our own writes coming back change nothing"
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        assert h.published_generations() == [1, 2]
        assert h.journal.records[-1].reason == "member-joined"
        assert publication.configmap.document is not None
        assert publication.configmap.document.members.keys() == {"p1", "p2"}


class WriteGatedApi(FakeApi):
    """ConfigMap creates are stored at once but answered only when ``gate`` is set: the watch can
    bring a write back before its answer, as it does under load."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = await super().create(path, body)
        if path == CM_PATH:
            await self.gate.wait()
        return stored


def watched(api: FakeApi, name: str) -> dict[str, Any]:
    written = api.objects[f"{CM_PATH}/{name}"]
    return {"metadata": dict(written["metadata"]), "data": dict(written["data"])}


@pytest.mark.parametrize("foreign", [False, True], ids=["own-echo", "changed-right-after"])
async def test_a_configmap_event_during_its_write_is_judged_once_the_write_is_answered(foreign: bool) -> None:
    """Our own write seen through the watch before its answer is not a change to reconcile again;
    someone else's write right after ours is."""
    async with Harness() as h:
        api = h.api = WriteGatedApi()
        h.controller.writer = Writer(api)  # type: ignore[arg-type]
        c = h.world
        c.on_topic((NS, "t"), None, TOPIC)
        c.on_pod((NS, "p1"), None, pod("p1"))
        c.on_group((NS, "g"), None, group(debounce=0.0))
        c.synced.set()
        for _ in range(5):
            await asyncio.sleep(0)
        key = (NS, configmap_name("g"))
        c.on_configmap(key, None, watched(api, key[1]))  # the echo, while the create waits
        if foreign:
            api.foreign_write(f"{CM_PATH}/{key[1]}")
            c.on_configmap(key, None, watched(api, key[1]))
        api.gate.set()
        await h.settle()
        assert h.published_generations() == [1]
        reconciles = h.counter("mqbalance_reconciles_total", result="published")
        reconciles += h.counter("mqbalance_reconciles_total", result="unchanged")
        assert reconciles == (2 if foreign else 1)


def member_lease(pod_name: str, renewed: float) -> tuple[Any, ...]:
    """A member Lease as the operator's informer keeps it, renewed at ``renewed``."""
    body = {
        "metadata": {"uid": f"u-{pod_name}"},
        "spec": {"holderIdentity": pod_name, "renewTime": str(renewed)},
    }
    return lease_record(body)


@contextlib.asynccontextmanager
async def leased_pair() -> AsyncIterator[Harness]:
    """Pods p1 and p2 in a STICKY group whose members hold Leases (4 s, renewed every second,
    2 s margin), the operator's monotonic clock the work queue's."""
    handover = {"mode": "Release", "releaseTimeoutSeconds": 1, "leaseSeconds": 4, "renewSeconds": 1}
    body = group(debounce=0.0, strategy={"name": "STICKY"}, handover={**handover, "leaseMarginSeconds": 2})
    async with Harness() as h:
        c = h.world
        c.leases = LeaseTable()
        c.monotonic = lambda: h.timer.time  # the work queue's clock stands in for the monotonic one
        await start(h, body, [pod("p1"), pod("p2")])
        yield h


async def test_a_member_whose_lease_stops_changing_is_revoked_after_the_lease_and_rejoins_on_renewal() -> (
    None
):
    async with leased_pair() as h:
        c = h.world

        def renew(*pods: str) -> None:
            for name in pods:
                c.on_lease((NS, member_lease_name(name)), None, member_lease(name, h.timer.time))

        renew("p1", "p2")  # first seen: the group looks again when they would lapse
        await h.settle()
        settled = h.journal.records[-1]
        assert set(settled.members) == {"p1", "p2"}
        for _ in range(3):  # both renew every second: nothing changes
            h.timer.advance(1.0)
            renew("p1", "p2")
            await h.settle()
        assert h.journal.records[-1] is settled
        for _ in range(4):  # p1 stops renewing (cut off from the API server); its pod stays Ready
            h.timer.advance(1.0)
            renew("p2")
            await h.settle()
        revoked = h.journal.records[-1]
        assert set(revoked.members) == {"p2"}, "p1 serves nothing 4 s after its last renewal"
        assert [r.owner for r in revoked.releasing] == ["p1"]
        # p1 renews again: it is a member again at once.
        renew("p1")
        await h.settle()
        assert set(h.journal.records[-1].members) == {"p1", "p2"}


async def test_a_departed_owner_is_held_when_the_api_server_shows_a_renewal_the_watch_has_not_brought() -> (
    None
):
    async with leased_pair() as h:
        c = h.world
        for name in ("p1", "p2"):
            c.on_lease((NS, member_lease_name(name)), None, member_lease(name, 0.0))
        await h.settle()
        c.on_pod((NS, "p1"), pod("p1"), None)  # force-deleted: departed, its sidecar may still run
        await h.settle()
        revoked = h.journal.records[-1]
        assert [r.owner for r in revoked.releasing] == ["p1"]
        # The watch brings nothing more of p1's Lease, but the API server has a later renewal.
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
        spec = {"holderIdentity": "p1", "renewTime": "later"}
        h.api.objects[path] = {"items": [{"metadata": {"uid": "u-p1", "resourceVersion": "9"}, "spec": spec}]}

        async def run(seconds: int) -> None:  # p2 renews every second; the watch brings no more of p1's
            for _ in range(seconds):
                h.timer.advance(1.0)
                c.on_lease((NS, member_lease_name("p2")), None, member_lease("p2", h.timer.time))
                await h.settle()

        await run(6)  # lease + margin after the revocation, and of silence on the watch
        assert h.journal.records[-1] is revoked, "the fresh read shows a renewal: not handed on"
        await run(5)
        assert h.journal.records[-1] is revoked
        await run(1)  # silent for lease + margin since that renewal was seen
        moved = h.journal.records[-1]
        assert moved.releasing == ()
        assert set(moved.members) == {"p2"}


def pause(h: Harness, body: dict[str, Any], paused: bool) -> dict[str, Any]:
    """The user sets spec.paused: the group's object changes, with its metadata.generation."""
    metadata = {**body["metadata"], "generation": body["metadata"]["generation"] + 1}
    new = {**body, "metadata": metadata, "spec": {**body["spec"], "paused": paused}}
    h.world.on_group((NS, "g"), body, new)
    return new


def group_status(h: Harness) -> Mapping[str, Any]:
    return h.world.groups[(NS, "g")].publication.status or {}


def held(record: Any) -> int:
    """Queues a journal record's generation gives or leaves to a member (revoked ones included)."""
    return sum(len(qs) for a in record.assignment.values() for qs in a.values()) + sum(
        len(r.queues) for r in record.releasing
    )


def paused_condition(h: Harness) -> tuple[str, str]:
    c = next(c for c in group_status(h)["conditions"] if c["type"] == "Paused")
    return c["status"], c["reason"]


async def test_a_paused_group_without_handover_publishes_one_generation_that_gives_nobody_anything() -> None:
    body = group(debounce=0.0)
    async with Harness() as h:
        await start(h, body, [pod("p1"), pod("p2")])
        assert held(h.journal.records[-1]) == 4
        body = pause(h, body, True)
        await h.settle()
        assert h.published_generations() == [1, 2]
        pausing = h.journal.records[-1]
        assert pausing.reason == "paused"
        assert held(pausing) == 0
        assert set(pausing.assignment["t"]) == {"p1", "p2"}  # still members, holding nothing
        status = group_status(h)
        assert status["pausedBy"] == ["spec.paused"]
        assert status["heldQueues"] == 0
        assert paused_condition(h) == ("True", "Paused")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "Paused")
        assert h.counter("mqbalance_group_paused", namespace=NS, group="g") == 1
        h.world.on_pod((NS, "p3"), None, pod("p3"))  # a member joining a paused group gets nothing
        await h.settle()
        assert h.journal.records[-1].reason == "member-joined"
        assert held(h.journal.records[-1]) == 0


async def test_a_paused_group_with_release_revokes_every_owner_and_assigns_nothing_once_they_released() -> (
    None
):
    body = group(debounce=0.0, strategy={"name": "STICKY"}, handover={"mode": "Release"})
    async with Harness() as h:
        await start(h, body, [pod("p1"), pod("p2")])
        body = pause(h, body, True)
        await h.settle()
        revoke = h.journal.records[-1]
        assert revoke.reason == "paused"
        assert sorted((r.owner, len(r.queues)) for r in revoke.releasing) == [("p1", 2), ("p2", 2)]
        assert all(qs == () for qs in revoke.assignment["t"].values())
        assert group_status(h)["heldQueues"] == 4
        assert paused_condition(h) == ("False", "Pausing")
        h.world.on_configmap(
            (NS, "g-releases"), None, releases_configmap({"p1": Ack(revoke.generation).encode()})
        )
        await h.settle()
        assert group_status(h)["heldQueues"] == 2  # p2 has not released yet
        assert paused_condition(h) == ("False", "Pausing")
        acks = {p: Ack(revoke.generation).encode() for p in ("p1", "p2")}
        h.world.on_configmap((NS, "g-releases"), None, releases_configmap(acks))
        await h.settle()
        quiet = h.journal.records[-1]
        assert quiet.releasing == ()
        assert held(quiet) == 0
        assert group_status(h)["heldQueues"] == 0
        assert paused_condition(h) == ("True", "Paused")
        assert h.counter("mqbalance_handover_assigned_queues_total", outcome="released") == 4
        # p1's release, then p2's: each hands queues to nobody, and says so.
        assert [r.reason for r in h.journal.records[2:]] == ["released", "released"]


async def test_a_resumed_group_is_assigned_again_and_its_history_tells_the_pause() -> None:
    body = group(debounce=0.0)
    async with Harness() as h:
        await start(h, body, [pod("p1"), pod("p2")])
        before = h.journal.records[-1].assignment
        body = pause(h, body, True)
        await h.settle()
        body = pause(h, body, False)
        await h.settle()
        resumed = h.journal.records[-1]
        assert resumed.reason == "resumed"
        assert resumed.assignment == before  # the same members get the same queues back
        status = group_status(h)
        assert "pausedBy" not in status
        assert "heldQueues" not in status
        assert paused_condition(h) == ("False", "Resumed")
        assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True"
        assert [(e["generation"], e["reason"], e["moved"]) for e in status["history"]] == [
            (3, "resumed", 0),  # nobody held a queue to move from
            (2, "paused", 0),  # taken from their owners, given to nobody
            (1, "initial", 0),
        ]
        assert h.counter("mqbalance_group_paused", namespace=NS, group="g") == 0


async def test_the_history_keeps_the_last_generations_newest_first() -> None:
    body = group(debounce=0.0, strategy={"name": "STICKY"}, handover={"mode": "Release"})
    async with Harness() as h:
        await start(h, body, [pod("p1")])

        async def acknowledged_after(seconds: float) -> None:
            revoke = h.journal.records[-1]
            assert revoke.releasing
            h.timer.advance(seconds)
            acks = {r.owner: Ack(revoke.generation).encode() for r in revoke.releasing}
            h.world.on_configmap((NS, "g-releases"), None, releases_configmap(acks))
            await h.settle()

        for _ in range(3):  # p2 joins and leaves: each a revocation, then its release
            h.world.on_pod((NS, "p2"), None, pod("p2"))
            await h.settle()
            await acknowledged_after(2.5)
            h.world.on_pod((NS, "p2"), pod("p2"), pod("p2", app="other"))
            await h.settle()
            await acknowledged_after(2.5)
        history = group_status(h)["history"]
        generations = h.published_generations()
        assert len(generations) > MAX_HISTORY
        assert [e["generation"] for e in history] == generations[::-1][:MAX_HISTORY]
        released = [e for e in history if e["reason"] == "released"]
        assert released
        assert all(e["handoverSeconds"] == 2.5 for e in released)
        assert all("handoverSeconds" not in e for e in history if e["reason"] != "released")
        assert [e["members"] for e in history[:2]] == [1, 1]  # p2 left, then released its queues
