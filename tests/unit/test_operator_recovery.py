"""No lost worker: whatever one key's reconcile raises, its worker lives on, the key is retried with
backoff, and the failure is logged, counted and reported on the resource; a NameServer answering
junk is a failed read (a condition), not an exception; /healthz fails when the loop cannot make
progress (a dead worker, keys waiting behind reconciles that never end).

The hostile NameServers listen on 127.0.0.1; the work queue's clock is driven by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.contract import configmap_name
from mqbalance.operator import group_reconciler
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.metrics import create_app
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.offsets import BrokerFailure, OffsetReader
from mqbalance.operator.reconcile import reconcile
from mqbalance.operator.runtime import Runtime
from mqbalance.operator.settings import OperatorConfig
from mqbalance.operator.topics import RouteRead
from mqbalance.rocketmq.remoting import RemotingCommand, decode_payload, encode, frame_length
from tests.unit.test_operator_loop import CM_PATH, NS, TOPIC, FakeRoutes, Harness, group, merge, pod, start

pytestmark = pytest.mark.asyncio


def response(opaque: int, body: bytes) -> bytes:
    return encode(RemotingCommand(code=0, opaque=opaque, flag=1, body=body))


def json_header_frame(header: bytes) -> bytes:
    return struct.pack(">iI", 4 + len(header), len(header)) + header


def binary_header_frame(opaque: int, ext: bytes) -> bytes:
    header = (
        struct.pack(">hBhii", 0, 0, 479, opaque, 1) + struct.pack(">i", 0) + struct.pack(">i", len(ext)) + ext
    )
    return struct.pack(">iI", 4 + len(header), (1 << 24) | len(header)) + header


# What a NameServer (or anything listening where one should be) may answer, by the exception each
# answer let escape before: the frame for a request's opaque.
HOSTILE: dict[str, Callable[[int], bytes]] = {
    "body not UTF-8 (UnicodeDecodeError)": lambda opaque: response(opaque, b'{"queueDatas":"\xff\xfe"}'),
    "body nested 100,000 deep (RecursionError)": lambda opaque: response(opaque, b"[" * 100_000),
    "body with 1e400 queues (OverflowError)": lambda opaque: response(
        opaque, b'{"queueDatas":[{"brokerName":"a","readQueueNums":1e400,"writeQueueNums":1,"perm":6}]}'
    ),
    "brokerAddrs a list (AttributeError)": lambda opaque: response(
        opaque, b'{"brokerDatas":[{"brokerName":"a","brokerAddrs":[1]}]}'
    ),
    "header nested 100,000 deep (RecursionError)": lambda opaque: json_header_frame(b"[" * 100_000),
    "header opaque 1e400 (OverflowError)": lambda opaque: json_header_frame(
        b'{"code":0,"flag":1,"opaque":1e400}'
    ),
    # A value length that walks the position back to where it was: the decoder looped for ever.
    "binary header length -7 (endless loop)": lambda opaque: binary_header_frame(
        opaque, struct.pack(">H", 1) + b"k" + struct.pack(">i", -7) + b"padding"
    ),
}


@contextlib.asynccontextmanager
async def hostile_server(answer: Callable[[int], bytes]) -> AsyncIterator[str]:
    """A server on 127.0.0.1 that reads each request and answers ``answer(its opaque)``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while True:
                request = decode_payload(await reader.readexactly(frame_length(await reader.readexactly(4))))
                writer.write(answer(request.opaque))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == kind)
    return found


def status_patches(h: Harness, plural: str) -> list[dict[str, Any]]:
    """The statuses merge-patched on resources of ``plural``, in order."""
    return [
        p["status"] for path, p in h.api.merge_patches if f"/{plural}/" in path and path.endswith("/status")
    ]


async def until(check: Callable[[], bool], seconds: float = 30.0) -> None:
    """Let the loop run until ``check`` holds (reads over loopback take real time)."""
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail("the condition never held")


@pytest.mark.timeout(60)  # the endless loop blocked the event loop: only the test's timeout ended it
@pytest.mark.parametrize("answer", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_hostile_name_server_is_a_failed_read_not_an_exception(
    answer: Callable[[int], bytes],
) -> None:
    async with hostile_server(answer) as address:
        read = await RouteReader(timeout=5.0).read("orders", [address])
        failure = await OffsetReader(timeout=5.0).consume_stats("broker-a", address, "g", "orders")
    assert read.brokers is None
    assert read.reason in ("RequestFailed", "NameServerUnreachable"), read
    assert address in read.message
    # The lag loop's broker read: a failure, or no offsets (a route's body is a ConsumeStats of none).
    assert failure == {} or isinstance(failure, BrokerFailure), failure
    assert not isinstance(failure, BrokerFailure) or failure.reason in ("QueryRefused", "BrokerUnreachable")


async def test_topics_on_hostile_name_servers_leave_the_workers_to_the_groups() -> None:
    """More such Topics than workers: before, each killed the worker that read it, and no group
    was reconciled any more. Now each reports the read that failed, and the groups go on."""
    hostile = hostile_server(HOSTILE["body not UTF-8 (UnicodeDecodeError)"])
    async with hostile as address, Harness(RouteReader(timeout=5.0)) as h:
        c = h.world
        for i in range(3):  # the harness runs two workers
            spec = {"topicName": f"t{i}", "nameServer": {"addresses": [address]}}
            meta = {"namespace": NS, "name": f"bad{i}", "generation": 1}
            c.on_topic((NS, f"bad{i}"), None, {"metadata": meta, "spec": spec, "status": {}})
        c.synced.set()
        await until(lambda: len(status_patches(h, "topics")) == 3 and not c.queue.busy)
        assert all(not t.done() for t in h.tasks)
        for patch in status_patches(h, "topics"):
            available = condition(patch, "RouteAvailable")
            assert (available["status"], available["reason"]) == ("False", "RequestFailed")
            assert "unreadable route" in available["message"]
        await start(h, group(debounce=0.0), [pod("p1")])
        c.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        assert h.published_generations() == [1, 2]


class RaisingRoutes(FakeRoutes):
    """Raises ``error`` at the first read, then answers as FakeRoutes."""

    def __init__(self, error: BaseException, *answers: RouteRead) -> None:
        super().__init__(*answers)
        self.error: BaseException | None = error

    async def read(self, topic: str, addresses: Any = ()) -> RouteRead:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return await super().read(topic, addresses)


async def test_a_topic_reconcile_that_raises_is_reported_and_retried_with_backoff() -> None:
    spec = {"topicName": "orders", "nameServer": {"addresses": ["10.0.0.5:9876"]}}
    route = {
        "nameServer": "10.0.0.5:9876",
        "brokers": [{"name": "a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6, "master": True}],
    }
    topic = {
        "metadata": {"namespace": NS, "name": "t", "generation": 1, "uid": "t-uid"},
        "spec": spec,
        "status": {"route": route},
    }
    unreachable = RouteRead(None, reason="NameServerUnreachable", message="no NameServer answered")
    routes = RaisingRoutes(RecursionError("maximum recursion depth exceeded"), unreachable)
    async with Harness(routes) as h:
        h.world.on_topic((NS, "t"), None, topic)
        h.world.synced.set()
        await h.settle()
        assert all(not t.done() for t in h.tasks), "the worker lives on"
        assert h.counter("mqbalance_reconcile_errors_total", kind="internal") == 1
        [event] = [e for e in h.api.events if e["reason"] == "ReconcileFailed"]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "Topic"
        assert event["involvedObject"]["uid"] == "t-uid"
        assert "RecursionError: maximum recursion depth exceeded; retrying in 1s" in event["message"]
        [patch] = status_patches(h, "topics")
        available = condition(patch, "RouteAvailable")
        assert (available["status"], available["reason"]) == ("False", "ReconcileFailed")
        assert (
            available["message"]
            == "RecursionError: maximum recursion depth exceeded; keeping the route read before"
        )
        assert patch.get("route", {}) == {}  # the route read before stays as it is

        h.timer.advance(0.99)
        await h.settle()
        assert routes.asked == []
        h.timer.advance(0.01)  # the backoff's first second
        await h.settle()
        assert len(routes.asked) == 1


async def test_a_topic_that_keeps_failing_backs_off_although_its_status_comes_back() -> None:
    class Failing(FakeRoutes):
        async def read(self, topic: str, addresses: Any = ()) -> RouteRead:
            self.asked.append((topic, list(addresses)))
            raise KeyError("brokerName")

    spec = {"nameServer": {"addresses": ["10.0.0.5:9876"]}}
    topic = {"metadata": {"namespace": NS, "name": "t", "generation": 1}, "spec": spec, "status": {}}
    routes = Failing()
    async with Harness(routes) as h:
        h.world.on_topic((NS, "t"), None, topic)
        h.world.synced.set()
        await h.settle()
        [patch] = status_patches(h, "topics")
        echo = merge(topic, {"status": patch})
        h.world.on_topic((NS, "t"), topic, echo)  # our write comes back: the Topic is queued at once
        await h.settle()
        assert len(routes.asked) == 2
        assert len(status_patches(h, "topics")) == 1  # the same failure writes nothing more...
        h.timer.advance(1.99)  # ...so nothing cuts the backoff short again
        await h.settle()
        assert len(routes.asked) == 2
        h.timer.advance(0.01)
        await h.settle()
        assert len(routes.asked) == 3
        messages = [e["message"] for e in h.api.events if e["reason"] == "ReconcileFailed"]
        assert messages == [f"KeyError: 'brokerName'; retrying in {d}s" for d in (1, 2, 4)]


async def test_a_group_reconcile_that_raises_keeps_its_assignment_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = reconcile
    failures = [ZeroDivisionError("division by zero")] * 2

    def crashing(observed: Any) -> Any:
        if failures and observed.pods and len(observed.pods) > 1:
            raise failures.pop()
        return real(observed)

    monkeypatch.setattr(group_reconciler, "reconcile", crashing)  # where the reconciler looks it up
    async with Harness() as h:
        await start(h, group(debounce=0.0), [pod("p1")])
        published = h.api.objects[f"{CM_PATH}/{configmap_name('g')}"]
        h.world.on_pod((NS, "p2"), None, pod("p2"))
        await h.settle()
        assert all(not t.done() for t in h.tasks)
        assert h.api.objects[f"{CM_PATH}/{configmap_name('g')}"] is published  # the assignment stays
        assert h.counter("mqbalance_reconcile_errors_total", kind="internal") == 1
        ready = condition(h.world.groups[(NS, "g")].publication.status or {}, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ReconcileFailed")
        assert ready["message"] == "ZeroDivisionError: division by zero; generation 1 stays published"
        messages = [e["message"] for e in h.api.events if e["reason"] == "ReconcileFailed"]
        assert messages == ["ZeroDivisionError: division by zero; retrying in 1s"]

        h.timer.advance(1.0)  # fails again, then 2 s later succeeds
        await h.settle()
        assert h.counter("mqbalance_reconcile_errors_total", kind="internal") == 2
        h.timer.advance(2.0)
        await h.settle()
        assert h.published_generations() == [1, 2]
        ready = condition(h.world.groups[(NS, "g")].publication.status or {}, "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "Published")


async def test_an_exception_outside_the_reconcilers_is_retried_with_backoff_by_the_same_worker() -> None:
    async with Harness() as h:
        c = h.world
        c.on_topic((NS, "t"), None, TOPIC)
        raised: list[str] = []

        def owns(namespace: str, name: str) -> bool:
            if name == "g" and not raised:
                raised.append(name)
                raise RuntimeError("a bug in the shard lookup")
            return True

        h.controller.owns = owns
        c.on_pod((NS, "p1"), None, pod("p1"))
        c.on_group((NS, "g"), None, group(debounce=0.0))
        c.synced.set()
        await h.settle()
        assert all(not t.done() for t in h.tasks)
        assert h.counter("mqbalance_reconcile_errors_total", kind="internal") == 1
        assert h.published_generations() == []
        assert c.queue.due_at(("group", NS, "g")) == 1.0
        h.timer.advance(1.0)
        await h.settle()
        assert h.published_generations() == [1]


# -- /healthz ------------------------------------------------------------------------------------


def runtime_of(h: Harness, deadline: float = 300.0) -> Runtime:
    runtime = Runtime(OperatorConfig(namespaces=(NS,), progress_deadline=deadline))
    runtime.controller = h.controller
    runtime._workers = h.tasks[:2]
    return runtime


async def healthz(runtime: Runtime, aiohttp_client: Any) -> tuple[int, dict[str, Any]]:
    client = await aiohttp_client(create_app(CollectorRegistry(), runtime._health))
    answer = await client.get("/healthz")
    body: dict[str, Any] = await answer.json()
    return answer.status, body


async def test_healthz_fails_when_a_worker_has_died(aiohttp_client: Any) -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0), [pod("p1")])
        runtime = runtime_of(h)
        assert await healthz(runtime, aiohttp_client) == (
            200,
            {"status": "ok", "groups": 1, "work": {"queued": 0, "working": 0, "later": 0}},
        )
        h.tasks[0].cancel()
        await asyncio.gather(h.tasks[0], return_exceptions=True)
        status, body = await healthz(runtime, aiohttp_client)
        assert status == 503
        assert body["status"] == "failing"
        assert body["problems"] == ["1 of 2 workers ended: cancelled"]


async def test_healthz_fails_when_keys_wait_behind_reconciles_that_never_end(aiohttp_client: Any) -> None:
    gate = asyncio.Event()

    class HangingRoutes(FakeRoutes):
        async def read(self, topic: str, addresses: Any = ()) -> RouteRead:
            await gate.wait()  # a read that ignores every timeout
            return await super().read(topic, addresses)

    async with Harness(HangingRoutes(RouteRead(None, reason="NameServerUnreachable"))) as h:
        c = h.world
        for name in ("t1", "t2"):  # both workers hang on these
            spec = {"nameServer": {"addresses": ["10.0.0.5:9876"]}}
            c.on_topic(
                (NS, name), None, {"metadata": {"namespace": NS, "name": name}, "spec": spec, "status": {}}
            )
        runtime = runtime_of(h, deadline=120.0)
        c.synced.set()
        await until(lambda: c.queue.busy == 2)
        h.timer.advance(600.0)  # busy for long, but nothing waits: a slow reconcile is no stuck loop
        assert (await healthz(runtime, aiohttp_client))[0] == 200
        c.on_topic((NS, "t3"), None, {**TOPIC, "metadata": {"namespace": NS, "name": "t3"}})
        h.timer.advance(119.0)
        assert (await healthz(runtime, aiohttp_client))[0] == 200
        h.timer.advance(1.0)
        status, body = await healthz(runtime, aiohttp_client)
        assert status == 503
        assert body["problems"] == [
            "1 keys queued and none taken or finished for 120 s (--progress-deadline 120); "
            "2 busy: topic ns/t1, topic ns/t2"
        ]
        gate.set()
        await h.settle()
        assert (await healthz(runtime, aiohttp_client))[0] == 200


async def test_a_standby_is_healthy_whatever_its_queue(aiohttp_client: Any) -> None:
    runtime = Runtime(OperatorConfig(namespaces=(NS,), leader_election="mq", lease_namespace=NS))
    assert runtime.standby
    client = await aiohttp_client(create_app(CollectorRegistry(), runtime._health))
    answer = await client.get("/healthz")
    assert (answer.status, await answer.json()) == (200, {"status": "ok", "standby": True, "groups": 0})


def named(name: str, app: str) -> dict[str, Any]:
    body = group(debounce=0.0)
    body["metadata"] = {**body["metadata"], "name": name, "uid": f"{name}-uid"}
    body["spec"] = {**body["spec"], "selector": {"matchLabels": {"app": app}}}
    return body


async def test_a_large_group_is_decided_off_the_loop_while_the_others_are_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One tenant's group within the bounds may take minutes of CPU to decide: decided on a thread of
    its own, it holds up no other group, and a second such group waits for its turn without holding a
    worker (the harness has two)."""
    release = threading.Event()
    entered: list[str] = []

    def slow(observed: Any) -> Any:  # stands for a decision taking minutes
        entered.append(observed.name)
        if observed.name.startswith("big") and not release.wait(30):
            raise TimeoutError("never released")
        return reconcile(observed)

    monkeypatch.setattr(group_reconciler, "reconcile", slow)
    monkeypatch.setattr(group_reconciler, "OFF_LOOP_WORK", 9)  # three pods of one topic, and up
    async with Harness() as h:
        c = h.world
        c.on_topic((NS, "t"), None, TOPIC)
        for name, app, pods in (("big", "big", 3), ("big2", "big2", 3), ("small", "small", 2)):
            for i in range(pods):
                c.on_pod((NS, f"{name}-{i}"), None, PodInfo(f"{name}-{i}", {"app": app}, "n1", True, True))
            c.on_group((NS, name), None, named(name, app))
        c.synced.set()
        await until(lambda: "small" in {r.group for r in h.journal.records})
        # The small group published while the first large one is still being decided, and the second
        # waits for the thread without holding the other worker.
        first, second = ("big", "big2") if "big" in entered else ("big2", "big")
        assert {r.group for r in h.journal.records} == {"small"}
        assert [n for n in entered if n.startswith("big")] == [first]
        assert c.queue.busy == 1
        assert c.queue.due_at(("group", NS, second)) is not None
        release.set()
        await until(lambda: {r.group for r in h.journal.records} == {"small", first})
        h.timer.advance(group_reconciler.BUSY_RETRY_SECONDS)  # the second one's turn
        await until(lambda: {r.group for r in h.journal.records} == {"small", first, second})
        assert all(not t.done() for t in h.tasks)
