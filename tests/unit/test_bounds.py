"""The bounds on what a Topic or a group may ask (mqbalance/contract/bounds.py): the CRDs and the docs
carry the code's numbers; a route or a group over one is refused from its queue numbers, before any
queue is built, with a condition that names the bound and the value, while the last good assignment
stays; memory stays small whatever the route says.

Peak memory is measured with tracemalloc in this process: what the reconcile allocates on top of what
was there before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tracemalloc
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from mqbalance.contract import read_topic
from mqbalance.contract.bounds import (
    MAX_ASSIGNMENT_BYTES,
    MAX_BROKERS_PER_TOPIC,
    MAX_HISTORY,
    MAX_MEMBERS_PER_GROUP,
    MAX_MIN_READY_SECONDS,
    MAX_QUEUES_PER_BROKER,
    MAX_QUEUES_PER_GROUP,
    MAX_QUEUES_PER_TOPIC,
    MAX_QUEUES_TIMES_MEMBERS,
    MAX_RESET_QUEUES,
    MAX_TOPICS_PER_GROUP,
    OverBound,
)
from mqbalance.contract.topic import route_status
from mqbalance.model import Broker, TopicRoute
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.reconcile import Observed, Outcome, reconcile
from mqbalance.operator.topics import topic_status
from mqbalance.rocketmq.remoting import RemotingCommand, decode_payload, encode, frame_length

ROOT = Path(__file__).resolve().parents[2]
BILLION = 10**9
T0 = 1_800_000_000.0
NODES = {f"n{i}": {"topology.kubernetes.io/zone": f"zone-{i}"} for i in range(3)}
MiB = 1024 * 1024
R = TypeVar("R")


def peak_of(work: Callable[[], R]) -> tuple[R, int]:
    """``work()`` and the most memory it held at once, in bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


def brokers(count: int, read: int, write: int | None = None) -> list[dict[str, Any]]:
    return [
        {"name": f"broker-{i:02d}", "readQueueNums": read, "writeQueueNums": read if write is None else write}
        for i in range(count)
    ]


def pods(count: int, name: str = "consumer-{:04d}") -> list[PodInfo]:
    return [PodInfo(name.format(i), {"app": "a"}, f"n{i % 3}", True, True) for i in range(count)]


def observe(topics: dict[str, Any], members: list[PodInfo], **spec: Any) -> Observed:
    group = {"topics": list(topics), "selector": {"matchLabels": {"app": "a"}}, "strategy": {"name": "AVG"}}
    return Observed("ns", "g", {**group, **spec}, topics, members, NODES, None, T0, 1)


def after(obs: Observed, out: Outcome, **changes: Any) -> Observed:
    """The next observation once ``out`` was written."""
    return replace(obs, previous=out.document or obs.previous, status=out.status, now=obs.now + 10, **changes)


def invalid(out: Outcome) -> tuple[str, str]:
    c = next(c for c in out.status["conditions"] if c["type"] == "Invalid")
    assert c["status"] == "True", c
    return c["reason"], c["message"]


# -- one source: the code's numbers in the CRDs and the docs --------------------------------------------


def schema(crd: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "crds" / crd).read_text())
    spec: dict[str, Any] = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def status_schema(crd: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "crds" / crd).read_text())
    status: dict[str, Any] = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"
    ]
    return status


def test_the_crds_carry_the_bounds_of_the_code() -> None:
    topic = schema("mqbalance.io_topics.yaml")["properties"]["brokers"]
    assert topic["maxItems"] == MAX_BROKERS_PER_TOPIC
    for key in ("readQueueNums", "writeQueueNums"):
        assert topic["items"]["properties"][key]["maximum"] == MAX_QUEUES_PER_BROKER
    assert [r["rule"] for r in topic["x-kubernetes-validations"]] == [
        f"self.map(b, has(b.{key}) ? b.{key} : 0).sum() <= {MAX_QUEUES_PER_TOPIC}"
        for key in ("readQueueNums", "writeQueueNums")
    ]
    for rule in topic["x-kubernetes-validations"]:
        assert f"more than {MAX_QUEUES_PER_TOPIC}, the bound of queues per topic" in rule["message"]
    assert (
        f"At most {MAX_BROKERS_PER_TOPIC} brokers, {MAX_QUEUES_PER_BROKER} queues each and "
        f"{MAX_QUEUES_PER_TOPIC} read and {MAX_QUEUES_PER_TOPIC} write queues in all"
    ) in topic["description"]
    min_ready = schema("mqbalance.io_consumergroups.yaml")["properties"]["minReadySeconds"]
    assert min_ready["maximum"] == MAX_MIN_READY_SECONDS
    assert f"At most {MAX_MIN_READY_SECONDS}." in min_ready["description"]
    history = status_schema("mqbalance.io_consumergroups.yaml")["properties"]["history"]
    assert history["maxItems"] == MAX_HISTORY
    assert f"(at most {MAX_HISTORY})" in history["description"]
    topics = schema("mqbalance.io_consumergroups.yaml")["properties"]["topics"]
    assert topics["maxItems"] == MAX_TOPICS_PER_GROUP
    reset = schema("mqbalance.io_offsetresets.yaml")["properties"]
    assert reset["topics"]["maxItems"] == MAX_TOPICS_PER_GROUP
    assert reset["to"]["properties"]["offsets"]["maxItems"] == MAX_RESET_QUEUES
    reset_status = status_schema("mqbalance.io_offsetresets.yaml")["properties"]
    assert reset_status["queues"]["maxItems"] == MAX_RESET_QUEUES
    assert (
        f"at most {MAX_TOPICS_PER_GROUP}, with {MAX_QUEUES_PER_GROUP} read queues in all"
        in topics["description"]
    )


def test_the_docs_list_every_bound() -> None:
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("\n## Bounds\n", 1)[1].split("\n## ", 1)[0]
    for value in (
        MAX_QUEUES_PER_BROKER,
        MAX_BROKERS_PER_TOPIC,
        MAX_QUEUES_PER_TOPIC,
        MAX_TOPICS_PER_GROUP,
        MAX_QUEUES_PER_GROUP,
        MAX_MEMBERS_PER_GROUP,
    ):
        assert f"| {value:,} |" in section, value
    assert f"| {MAX_ASSIGNMENT_BYTES // MiB} MiB |" in section
    for reason in ("RouteTooLarge", "TooManyTopics", "TooManyQueues", "TooManyMembers", "AssignmentTooLarge"):
        assert f"`{reason}`" in section, reason


# -- a route: written by hand, or in status.route --------------------------------------------------------


@pytest.mark.parametrize(
    ("spec_brokers", "message"),
    [
        (
            brokers(1, BILLION),
            "broker broker-00 has readQueueNums 1000000000, over the bound of 1024 queues per broker",
        ),
        (brokers(1, 8, BILLION), "broker broker-00 has writeQueueNums 1000000000, over the bound of 1024"),
        (brokers(64, 1024, 1), "the route has 65536 read queues, over the bound of 4096 queues per topic"),
        (brokers(8, 1, 1024), "the route has 8192 write queues, over the bound of 4096 queues per topic"),
        (brokers(65, 1), "the route has 65 brokers, over the bound of 64 brokers per topic"),
    ],
)
def test_a_route_over_a_bound_is_refused_from_its_counts(
    spec_brokers: list[dict[str, Any]], message: str
) -> None:
    def read() -> OverBound:
        with pytest.raises(OverBound) as caught:
            read_topic("orders", {"brokers": spec_brokers})
        return caught.value

    error, peak = peak_of(read)
    assert error.reason == "RouteTooLarge"
    assert str(error).startswith(f"Topic 'orders': {message}")
    assert str(error).endswith("(docs/operator.md, Bounds)")
    assert peak < MiB  # no queue was built
    # The Topic's status says so too.
    status = topic_status("orders", {"brokers": spec_brokers}, 1, {}, None, T0)
    available = next(c for c in status["conditions"] if c["type"] == "RouteAvailable")
    assert (available["status"], available["reason"]) == ("False", "RouteTooLarge")
    assert message in available["message"]


def test_a_route_at_the_bounds_is_read_and_counted_as_built() -> None:
    route = read_topic("orders", {"brokers": brokers(64, 64)})
    assert route.readable_count() == len(route.readable_queues()) == MAX_QUEUES_PER_TOPIC
    assert read_topic("orders", {"brokers": brokers(4, 1024)}).writable_count() == MAX_QUEUES_PER_TOPIC


def test_counting_agrees_with_the_queues_built() -> None:
    route = TopicRoute(
        "t",
        (
            Broker("a", 4, 2),
            Broker("b", 3, 5, perm=4),  # read-only
            Broker("c", 2, 2, perm=2),  # write-only
            Broker("d", 6, 6, has_master=False),
            Broker("a", 7, 1),  # named twice: the larger count, once
        ),
    )
    assert route.readable_count() == len(route.readable_queues()) == 7 + 3 + 6
    assert route.writable_count() == len(route.writable_queues()) == 2 + 2


def test_a_status_route_edited_over_a_bound_is_refused() -> None:
    spec = {"nameServer": {"addresses": ["10.0.0.5:9876"]}}
    route = route_status("10.0.0.5:9876", [Broker("a", BILLION, 4)])
    with pytest.raises(OverBound, match="Topic 'orders': broker a has readQueueNums 1000000000"):
        read_topic("orders", spec, route)
    status = topic_status("orders", spec, 1, {"route": route}, None, T0)
    available = next(c for c in status["conditions"] if c["type"] == "RouteAvailable")
    assert (available["status"], available["reason"]) == ("False", "RouteTooLarge")


# -- a route read from a NameServer -----------------------------------------------------------------------


def route_body(read: int, *, logical: int | None = None) -> bytes:
    """A NameServer's answer: broker-a with ``read`` queues, or a static topic of ``logical`` queues."""
    body: dict[str, Any] = {
        "queueDatas": [
            {
                "brokerName": "broker-a",
                "readQueueNums": read,
                "writeQueueNums": 8,
                "perm": 6,
                "topicSysFlag": 0,
            }
        ],
        "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:10911"}}],
    }
    if logical is not None:
        body["topicQueueMappingByBroker"] = {
            "broker-a": {
                "bname": "broker-a",
                "scope": "__global__",
                "totalQueues": logical,
                "epoch": 1,
                "currIdMap": {"0": 0},
            }
        }
    return json.dumps(body).encode()


@contextlib.asynccontextmanager
async def fake_name_server(answer: list[bytes]) -> AsyncIterator[str]:
    """A NameServer on 127.0.0.1 that answers every route request with ``answer[0]``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request = decode_payload(await reader.readexactly(frame_length(await reader.readexactly(4))))
                writer.write(encode(RemotingCommand(code=0, opaque=request.opaque, flag=1, body=answer[0])))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            route_body(BILLION),
            "broker broker-a has readQueueNums 1000000000, over the bound of 1024 queues per broker",
        ),
        (route_body(8, logical=BILLION), "broker __syslo__global__ has readQueueNums 1000000000"),
    ],
)
async def test_a_name_server_answering_a_billion_queues_keeps_the_route_read_before(
    body: bytes, message: str
) -> None:
    answer = [route_body(4)]
    async with fake_name_server(answer) as address:
        spec = {"nameServer": {"addresses": [address]}}
        reader = RouteReader(timeout=5)
        good = await reader.read("orders", [address])
        assert good.brokers is not None
        before = topic_status("orders", spec, 1, {}, good, T0)
        answer[0] = body
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            read = await reader.read("orders", [address])
            # Refused as it came: a route taken would build its queues in the status below.
            assert (read.brokers, read.reason) == (None, "RouteTooLarge")
            status = topic_status("orders", spec, 1, before, read, T0 + 30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert read.message.startswith(f"NameServer {address}: topic 'orders': {message}")
    assert status["route"] == before["route"]  # the last good route stays, and so the groups' assignments
    assert status["readableQueues"] == 4
    available = next(c for c in status["conditions"] if c["type"] == "RouteAvailable")
    assert (available["status"], available["reason"]) == ("False", "RouteTooLarge")
    assert available["message"].endswith("(docs/operator.md, Bounds); keeping the route read before")
    assert peak - base < MiB


# -- a group: the last good assignment stays ---------------------------------------------------------------


def test_a_topic_grown_to_a_million_queues_leaves_the_assignment_in_force_and_memory_small() -> None:
    members = pods(4)
    obs = observe({"orders": {"brokers": brokers(1, 4)}}, members)
    first = reconcile(obs)
    assert first.document is not None
    grown = after(
        obs,
        first,
        topics={"orders": {"brokers": [{"name": "broker-00", "readQueueNums": 10**6, "writeQueueNums": 4}]}},
    )
    out, peak = peak_of(lambda: reconcile(grown))
    assert out.document is None
    assert out.status["assignmentGeneration"] == first.document.generation
    reason, message = invalid(out)
    assert reason == "RouteTooLarge"
    assert "broker broker-00 has readQueueNums 1000000, over the bound of 1024 queues per broker" in message
    assert peak < MiB, f"{peak / MiB:.1f} MiB"
    # Back under the bounds: published again.
    shrunk = after(grown, out, topics={"orders": {"brokers": brokers(2, 4)}})
    back = reconcile(shrunk)
    assert back.document is not None
    assert back.document.generation == first.document.generation + 1
    assert [c["status"] for c in back.status["conditions"] if c["type"] == "Invalid"] == ["False"]


def spread(topics: int, queues_each: int) -> dict[str, Any]:
    """``topics`` Topics of ``queues_each`` queues, on as few brokers as the per-broker bound allows."""
    per_broker = min(queues_each, MAX_QUEUES_PER_BROKER)
    return {
        f"topic-{i:02d}": {
            "topicName": f"TOPIC_{i:02d}",
            "brokers": brokers(queues_each // per_broker, per_broker),
        }
        for i in range(topics)
    }


@pytest.mark.parametrize(
    ("topics", "members", "spec", "reason", "message"),
    [
        (
            spread(5, 4096),
            4,
            {},
            "TooManyQueues",
            "the group's topics have 20480 read queues, over the bound of 16384 queues per group",
        ),
        (
            spread(1, 4),
            MAX_MEMBERS_PER_GROUP + 1,
            {},
            "TooManyMembers",
            "the selector matches 257 members (Running and Ready pods), over the bound of 256 members "
            "per group",
        ),
        (
            spread(1, 65),
            MAX_MEMBERS_PER_GROUP,
            {"messageModel": "BROADCASTING"},
            "TooManyQueues",
            "BROADCASTING gives each of 256 members all 65 read queues: 16640 queues held, over the bound "
            "of 16384 queues per group",
        ),
        (
            spread(65, 1),
            4,
            {},
            "TooManyTopics",
            "spec.topics lists 65 Topics, over the bound of 64 topics per group",
        ),
        (
            spread(4, 4096),
            129,
            {},
            "TooManyQueues",
            "the group's 16384 read queues over its 129 members make 2113536 queue-member pairs, over the "
            "bound of 2097152 per group: fewer queues or members make it fit, and members beyond the queue "
            "count hold nothing anyway",
        ),
    ],
    ids=["queues", "members", "broadcasting", "topics", "pairs"],
)
def test_a_group_over_a_bound_is_invalid_and_keeps_its_assignment(
    topics: dict[str, Any], members: int, spec: dict[str, Any], reason: str, message: str
) -> None:
    small = observe(dict(list(topics.items())[:1]), pods(2), **spec)
    first = reconcile(small)
    assert first.document is not None
    grown = after(small, first, topics=topics, pods=pods(members), spec=observe(topics, [], **spec).spec)
    out, peak = peak_of(lambda: reconcile(grown))
    assert out.document is None
    assert out.status["assignmentGeneration"] == first.document.generation
    assert invalid(out) == (reason, f"{message} (docs/operator.md, Bounds)")
    assert peak < 4 * MiB, f"{peak / MiB:.1f} MiB"


def test_an_assignment_too_large_for_its_configmap_is_invalid() -> None:
    # 64 topics x 256 members with long pod names: every member is listed under every topic.
    topics = spread(64, 1)
    name = "a-consumer-with-a-long-deployment-name-of-the-orders-team-7f9c4b8d6-{:05d}"
    obs = observe(topics, pods(MAX_MEMBERS_PER_GROUP, name))
    out = reconcile(obs)
    assert out.document is None
    reason, message = invalid(out)
    assert reason == "AssignmentTooLarge"
    size = int(re.search(r"document is (\d+) bytes", message).group(1))  # type: ignore[union-attr]
    assert size > MAX_ASSIGNMENT_BYTES
    assert f"over the bound of {MAX_ASSIGNMENT_BYTES} bytes a ConfigMap holds" in message
    # A quarter of the topics fit.
    fits = reconcile(observe(spread(16, 1), pods(MAX_MEMBERS_PER_GROUP, name)))
    assert fits.document is not None
    assert len(fits.document.encode()) <= MAX_ASSIGNMENT_BYTES


@pytest.mark.parametrize(
    ("per_broker", "members"),
    [
        (64, MAX_QUEUES_TIMES_MEMBERS // MAX_QUEUES_PER_GROUP),
        pytest.param(32, MAX_MEMBERS_PER_GROUP, marks=pytest.mark.slow),  # half a minute under tracemalloc
    ],
    ids=["most-queues", "most-members"],
)
def test_the_largest_groups_the_bounds_allow_stay_far_inside_the_operators_memory_limit(
    per_broker: int, members: int
) -> None:
    # 64 topics of 4 brokers in three zones, STICKY placing queues in their zone (the costliest
    # strategy measured): every queue the bounds allow over the members they allow with it, or every
    # member over the queues they allow with it. Short pod names, so that the document fits.
    topics = {
        f"t{i:02d}": {
            "brokers": [
                {
                    "name": f"b{b}",
                    "zone": f"zone-{b % 3}",
                    "readQueueNums": per_broker,
                    "writeQueueNums": per_broker,
                }
                for b in range(4)
            ]
        }
        for i in range(MAX_TOPICS_PER_GROUP)
    }
    obs = observe(topics, pods(members, "c{:03d}"), strategy={"name": "STICKY", "zoneAffinity": True})
    out, peak = peak_of(lambda: reconcile(obs))
    assert out.document is not None
    assert out.status["queues"] * out.status["members"] <= MAX_QUEUES_TIMES_MEMBERS
    assert peak < 128 * MiB, f"{peak / MiB:.1f} MiB"
    # A member leaves: the costliest step (the handover, the fewest-moves figure).
    left, peak = peak_of(lambda: reconcile(after(obs, out, pods=pods(members, "c{:03d}")[1:])))
    assert left.document is not None
    assert peak < 128 * MiB, f"{peak / MiB:.1f} MiB"
