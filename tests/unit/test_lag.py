"""Lag: the ConsumeStats codec (bodies as real 4.9.7 and 5.3.3 brokers write them), the arithmetic
per queue, member and group, rates from samples, the status and condition, the metrics, the broker
client against a fake broker, and the lag loop on the operator's loop with a fake API."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.lag import (
    ConsumeStatsError,
    QueueOffsets,
    Sample,
    _parse_body,
    decode_consume_stats,
    group_lag,
    most_behind,
    parse_fastjson_object_keys,
    rates,
)
from mqbalance.model import MessageQueue
from mqbalance.operator.lagpoll import LAG_CONDITION, LagPoller, LagSettings, lag_condition, lag_status
from mqbalance.operator.main import parse_args
from mqbalance.operator.metrics import LagFigures, OperatorMetrics
from mqbalance.operator.observation import LagReading, Observed
from mqbalance.operator.offsets import (
    BrokerFailure,
    GroupOffsets,
    OffsetReader,
    TokenBucket,
    broker_address,
    secret_credentials,
)
from mqbalance.operator.status import with_lag
from mqbalance.rocketmq.remoting import (
    Credentials,
    RemotingCommand,
    decode_payload,
    encode,
    frame_length,
    sign,
)
from tests.unit.test_operator_loop import NS, Harness, group, pod, start

# Captured from GET_CONSUME_STATS (group gX, topic probe, 10 messages over 2 queues, nothing consumed).
BODY_5_3_3 = (
    b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"probe"}:'
    b'{"brokerOffset":5,"consumerOffset":0,"lastTimestamp":0,"pullOffset":0},'
    b'{"brokerName":"broker-a","queueId":0,"topic":"probe"}:'
    b'{"brokerOffset":5,"consumerOffset":0,"lastTimestamp":0,"pullOffset":0}}}'
)
BODY_4_9_7 = (
    b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"probe"}:'
    b'{"brokerOffset":5,"consumerOffset":0,"lastTimestamp":0},'
    b'{"brokerName":"broker-a","queueId":0,"topic":"probe"}:'
    b'{"brokerOffset":5,"consumerOffset":0,"lastTimestamp":0}}}'
)
EMPTY = b'{"consumeTps":0.0,"offsetTable":{}}'


def mq(q: int, broker: str = "broker-a", topic: str = "probe") -> MessageQueue:
    return MessageQueue(topic, broker, q)


@pytest.mark.parametrize("body", [BODY_5_3_3, BODY_4_9_7])
def test_consume_stats_of_both_releases_decode(body: bytes) -> None:
    stats = decode_consume_stats(body)
    assert stats.offsets == {mq(0): QueueOffsets(5, 0), mq(1): QueueOffsets(5, 0)}
    assert stats.consume_tps == 0.0
    assert decode_consume_stats(EMPTY).offsets == {}
    # The fast path (object keys quoted, then the C parser) reads what the general parser reads.
    assert _parse_body(body.decode()) == parse_fastjson_object_keys(body.decode())


def test_never_committed_reads_as_zero_like_consumer_progress() -> None:
    body = (
        b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"b","queueId":3,"topic":"t"}:'
        b'{"brokerOffset":42,"consumerOffset":-1,"lastTimestamp":1700000000000,"pullOffset":-1}}}'
    )
    stats = decode_consume_stats(body)
    offsets = stats.offsets[MessageQueue("t", "b", 3)]
    assert (offsets.consumer_offset, offsets.lag, offsets.last_timestamp) == (0, 42, 1700000000000)
    assert stats.consume_tps == 1.5


def test_fastjson_parser_reads_keys_of_every_kind_and_refuses_garbage() -> None:
    assert parse_fastjson_object_keys('{0:"a", "k" : [1, -2.5e1, true, null], {"x":"y\\"z"}:{}}') == {
        0: "a",
        "k": [1, -25.0, True, None],
        (("x", 'y"z'),): {},
    }
    for bad in ('{"a":1', '{"a" 1}', "[1 2]", '{"a":1} x', "{'a':1}", ""):
        with pytest.raises(ConsumeStatsError):
            parse_fastjson_object_keys(bad)
    for bad_body in (b"[]", b'{"offsetTable":[1]}', b'{"offsetTable":{{"topic":"t"}:{}}}', b"\xff"):
        with pytest.raises(ConsumeStatsError):
            decode_consume_stats(bad_body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{" * 100_000, "nested deeper than 64"),  # the general parser's own recursion
        (b"[" * 100_000, "nested deeper than 64"),  # json's
        (b'{"offsetTable":{' + b'{"a":' * 70 + b"1" + b"}" * 70 + b":{}}}", "nested deeper than 64"),
        (b'{"consumeTps":' + b"9" * 400 + b"}", "too large to convert to float"),
        (b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{"brokerOffset":1e400}}}', "infinity"),
        (b"{1" + b"9" * 5000 + b":1}", "bad number"),
        (b'{"offsetTable":{{"topic":[1]}:{}}}', "a map key that cannot be one"),
        (b'{"offsetTable":{{"topic":"t",1:2}:{}}}', "a map key that cannot be one"),
    ],
)
def test_unreadable_consume_stats_are_its_error(body: bytes, message: str) -> None:
    with pytest.raises(ConsumeStatsError, match=message):
        decode_consume_stats(body)


def test_lag_is_never_negative() -> None:
    assert QueueOffsets(broker_offset=3, consumer_offset=5).lag == 0


def test_group_lag_splits_by_member_through_the_assignment() -> None:
    offsets = {mq(0): QueueOffsets(100, 40), mq(1): QueueOffsets(10, 10), mq(2): QueueOffsets(7, 0)}
    offsets[MessageQueue("other", "broker-a", 0)] = QueueOffsets(1000, 0)  # not subscribed: ignored
    lag = group_lag(offsets, {"probe": {"p1": (mq(0),), "p2": (mq(1), mq(3)), "p3": ()}})
    assert (lag.total, lag.queues, lag.unowned) == (67, 3, 7)  # mq(2) unassigned, mq(3) not read
    assert [(m.member, m.lag, m.queues) for m in lag.members] == [("p1", 60, 1), ("p2", 0, 1), ("p3", 0, 0)]
    assert [m.member for m in most_behind(lag, 5)] == ["p1"]
    assert most_behind(lag, 0) == []


def test_a_paused_group_that_assigns_nothing_still_has_its_lag() -> None:
    offsets = {mq(0): QueueOffsets(100, 40), mq(1): QueueOffsets(10, 0)}
    lag = group_lag(offsets, {"probe": {"p1": (), "p2": ()}})  # the document of a paused group
    assert (lag.total, lag.queues, lag.unowned) == (70, 2, 70)
    assert [(m.member, m.lag) for m in lag.members] == [("p1", 0), ("p2", 0)]


def test_rates_come_from_successive_samples_over_queues_read_both_times() -> None:
    first = Sample(10.0, {mq(0): QueueOffsets(100, 50), mq(1): QueueOffsets(10, 10)})
    second = Sample(
        20.0, {mq(0): QueueOffsets(200, 130), mq(1): QueueOffsets(5, 2), mq(2): QueueOffsets(900, 0)}
    )
    got = rates(first, second)
    assert got is not None
    assert (got.consume, got.produce) == (8.0, 10.0)  # mq(1) went backwards, mq(2) is new
    assert rates(None, second) is None
    assert rates(second, second) is None


def test_status_and_condition_say_what_was_read_and_what_was_not() -> None:
    lag = group_lag({mq(0): QueueOffsets(9, 1)}, {"probe": {"p1": (mq(0),)}})
    failure = BrokerFailure("BrokerUnreachable", "broker-b", "probe", "broker broker-b (x): refused")
    status = lag_status(lag, None, [failure], 1_800_000_000.0, 5)
    assert status == {
        "total": 8,
        "queues": 1,
        "mostBehind": [{"member": "p1", "lag": 8, "queues": 1}],
        "sampledAt": "2027-01-15T08:00:00Z",
        "brokersUnavailable": ["broker-b"],
    }
    kind, reason, message = lag_condition([failure], 1)
    assert (kind, reason) == ("False", "BrokerUnreachable")
    assert "broker-b" in message
    assert "assignment stays" in message
    assert lag_condition([], 4)[:2] == ("True", "OffsetsRead")
    many = [failure] * 5
    assert "and 2 more" in lag_condition(many, 0)[2]


def test_status_writes_carry_the_lag_and_its_condition() -> None:
    read = ("True", "OffsetsRead", "offsets of 4 queues read from their brokers")
    old = dict(
        zip(("status", "reason", "message"), read, strict=True), type=LAG_CONDITION, lastTransitionTime="then"
    )
    written = {"lag": {"total": 1}, "conditions": [{"type": "Ready", "status": "True"}, old]}
    status = {"members": 2, "conditions": [{"type": "Ready", "status": "True"}, old]}

    def observed(reading: LagReading | None) -> Observed:
        return Observed("ns", "g", {}, {}, (), {}, None, 1_800_000_000.0, 3, written, lag=reading)

    failed = LagReading({"total": 3}, ("False", "BrokerUnreachable", "broker b: refused"))
    out = with_lag(status, observed(failed))
    assert out["lag"] == {"total": 3}
    cond = out["conditions"][-1]
    assert [c["type"] for c in out["conditions"]] == ["Ready", LAG_CONDITION]
    assert (cond["status"], cond["reason"], cond["message"]) == failed.available
    assert (cond["lastTransitionTime"], cond["observedGeneration"]) == ("2027-01-15T08:00:00Z", 3)
    assert with_lag(status, observed(LagReading({"total": 5}, read)))["conditions"][-1] == old, "as written"
    # No reading yet (a restart): the lag the status showed stays, and the condition with it.
    assert with_lag(status, observed(None)) == {**status, "lag": {"total": 1}}
    assert with_lag(status, replace(observed(None), status={})) is status


def test_lag_metrics_per_group_and_member_and_per_queue_only_when_given() -> None:
    registry = CollectorRegistry()
    figures = [
        ("ns", "g", LagFigures(12, 2.5, None, (("p1", 10), ("p2", 2)), (), True)),
        ("ns", "h", LagFigures(5, None, None, (), ((mq(1), 5),), False)),
    ]
    metrics = OperatorMetrics(registry, list, lag=lambda: figures)
    value = registry.get_sample_value
    assert value("mqbalance_group_lag", {"namespace": "ns", "group": "g"}) == 12
    assert value("mqbalance_group_consume_rate", {"namespace": "ns", "group": "g"}) == 2.5
    assert value("mqbalance_group_produce_rate", {"namespace": "ns", "group": "g"}) is None
    assert value("mqbalance_member_lag", {"namespace": "ns", "group": "g", "member": "p1"}) == 10
    assert value("mqbalance_group_lag_available", {"namespace": "ns", "group": "h"}) == 0
    labels = {"namespace": "ns", "group": "h", "topic": "probe", "broker": "broker-a", "queue": "1"}
    assert value("mqbalance_queue_lag", labels) == 5
    metrics.observe_lag_read(3, ["BrokerUnreachable"])
    assert value("mqbalance_lag_requests_total", {"result": "ok"}) == 2
    assert value("mqbalance_lag_requests_total", {"result": "BrokerUnreachable"}) == 1


def test_lag_flags_are_checked() -> None:
    config = parse_args(["-n", "ns", "--lag-interval", "0", "--lag-queue-metrics"])
    assert (config.lag_interval, config.lag_timeout, config.lag_rate) == (0, 3, 50)
    assert config.lag_queue_metrics
    assert parse_args(["-n", "ns"]).lag_interval == 30
    for bad in (["--lag-interval", "0.5"], ["--lag-timeout", "0"], ["--lag-requests-per-second", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(["-n", "ns", *bad])


def test_broker_address_prefers_the_master() -> None:
    assert broker_address({1: "s1", 0: "m"}) == "m"
    assert broker_address({2: "s2", 1: "s1"}) == "s1"
    assert broker_address({}) is None


# -- the client against a fake broker ------------------------------------------------------------


@contextlib.asynccontextmanager
async def fake_broker(answer: Callable[[RemotingCommand], RemotingCommand | None]) -> AsyncIterator[str]:
    """A server speaking the remoting protocol; ``answer`` None: never answers."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while True:
                length = frame_length(await reader.readexactly(4))
                command = decode_payload(await reader.readexactly(length))
                response = answer(command)
                if response is not None:
                    writer.write(encode(response))
                    await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.close()


def response(
    request: RemotingCommand, code: int, body: bytes = b"", remark: str | None = None
) -> RemotingCommand:
    return RemotingCommand(code=code, opaque=request.opaque, flag=1, body=body, remark=remark)


@pytest.mark.asyncio
async def test_consume_stats_request_and_its_failures() -> None:
    asked: list[dict[str, str]] = []

    def ok(request: RemotingCommand) -> RemotingCommand:
        asked.append(dict(request.ext_fields))
        assert request.code == 208
        return response(request, 0, BODY_5_3_3)

    reader = OffsetReader(timeout=0.5)
    async with fake_broker(ok) as address:
        got = await reader.consume_stats("broker-a", address, "gX", "probe")
    assert got == {mq(0): QueueOffsets(5, 0), mq(1): QueueOffsets(5, 0)}
    assert asked == [{"consumerGroup": "gX", "topic": "probe"}]

    async with fake_broker(lambda r: response(r, 16, remark="no permission")) as address:
        refused = await reader.consume_stats("broker-a", address, "gX", "probe")
    assert isinstance(refused, BrokerFailure)
    assert refused.reason == "QueryRefused"
    assert "no permission" in refused.message

    silent_asked: list[RemotingCommand] = []

    def never(request: RemotingCommand) -> None:
        silent_asked.append(request)

    async with fake_broker(never) as address:
        silent = await reader.consume_stats("broker-a", address, "gX", "probe")
        assert isinstance(silent, BrokerFailure)
        assert silent.reason == "BrokerUnreachable"
        assert "no answer within 0.5 s" in silent.message
        # The rest of the round does not wait for it again; the next round asks it again.
        again = await reader.consume_stats("broker-a", address, "gY", "probe")
        assert again == BrokerFailure("BrokerUnreachable", "broker-a", "probe", silent.message)
        assert len(silent_asked) == 1
        reader.begin_round()
        await reader.consume_stats("broker-a", address, "gY", "probe")
        assert len(silent_asked) == 2

    with contextlib.closing(__import__("socket").socket()) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: refused
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
        refused_conn = await reader.consume_stats("broker-b", closed, "gX", "probe")
    assert isinstance(refused_conn, BrokerFailure)
    assert refused_conn.reason == "BrokerUnreachable"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_credentials_come_from_the_secrets_access_and_secret_key() -> None:
    secret = {"data": {"accessKey": b64("mqbalance-client"), "secretKey": b64("s3cret")}}
    assert secret_credentials(secret) == Credentials("mqbalance-client", "s3cret")
    for data in ({"accessKey": b64("a")}, {"accessKey": b64("a"), "secretKey": "%%%"}, None):
        with pytest.raises(ValueError, match="has no key"):
            secret_credentials({"data": data} if data is not None else {})


@pytest.mark.asyncio
async def test_signed_reads_carry_the_signature_and_a_secret_is_read_once_a_round() -> None:
    asked: list[RemotingCommand] = []

    def ok(request: RemotingCommand) -> RemotingCommand:
        asked.append(request)
        return response(request, 0, BODY_5_3_3)

    reads: list[tuple[str, str]] = []

    async def secrets(namespace: str, name: str) -> dict[str, Any]:
        reads.append((namespace, name))
        if name == "missing":
            raise LookupError("404 secrets missing not found")
        return {"data": {"accessKey": b64("ak"), "secretKey": b64("sk")}}

    reader = OffsetReader(timeout=0.5, secrets=secrets)
    creds = await reader.credentials("shop", "rmq", "probe")
    assert creds == Credentials("ak", "sk")
    assert await reader.credentials("shop", "rmq", "other") == creds
    assert reads == [("shop", "rmq")]
    async with fake_broker(ok) as address:
        await reader.consume_stats("broker-a", address, "gX", "probe", creds)
    unsigned = RemotingCommand(code=208, ext_fields={"consumerGroup": "gX", "topic": "probe"})
    assert dict(asked[0].ext_fields) == dict(sign(unsigned, creds).ext_fields)

    missing = await reader.credentials("shop", "missing", "probe")
    assert isinstance(missing, BrokerFailure)
    assert missing.reason == "NoCredentials"
    assert "shop/missing" in missing.message
    assert "404" in missing.message
    got = await reader.read_group("g", [("probe", ())], {"probe": missing})
    assert got.failures == (missing,)
    assert got.requests == 0
    reader.begin_round()
    await reader.credentials("shop", "rmq", "probe")
    assert reads.count(("shop", "rmq")) == 2  # read again each round: a rotated key is picked up

    nothing = await OffsetReader().credentials("shop", "rmq", "probe")
    assert isinstance(nothing, BrokerFailure)
    assert "reads no Secrets" in nothing.message


@pytest.mark.asyncio
async def test_no_name_server_means_no_route() -> None:
    got = await OffsetReader().read_group("g", [("probe", ())])
    assert [f.reason for f in got.failures] == ["NoNameServer"]


@pytest.mark.asyncio
async def test_token_bucket_paces_requests() -> None:
    bucket = TokenBucket(rate=200.0, burst=2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(6):
        await bucket.take()
    assert loop.time() - started >= 4 / 200.0 * 0.9  # two from the burst, four paced
    with pytest.raises(ValueError, match="rate must be above 0"):
        TokenBucket(0, 1)


# -- the lag loop with the operator's loop and a fake API ---------------------------------------------


class FakeReader(OffsetReader):
    def __init__(self) -> None:
        super().__init__(default_name_server="127.0.0.1:9876")
        self.answer = GroupOffsets({})
        self.asked: list[tuple[str, list[tuple[str, Any]]]] = []

    async def read_group(self, group: str, topics: Any, credentials: Any = None) -> GroupOffsets:
        topics = list(topics)
        self.asked.append((group, topics))
        return self.answer


def lag_patches(h: Harness) -> list[dict[str, Any]]:
    return [p["status"] for _, p in h.controller.writer.client.merge_patches]  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_lag_loop_writes_status_lag_and_a_condition_while_the_assignment_stays() -> None:
    async with Harness() as h:
        await start(h, group(), [pod("p1"), pod("p2")])
        c = h.world
        state = c.groups[(NS, "g")]
        assert h.published_generations() == [1]
        reader = FakeReader()
        times = iter(range(0, 1000, 10))
        poller = LagPoller(
            c, reader, LagSettings(interval=1), h.metrics, monotonic=lambda: float(next(times))
        )
        doc = state.publication.configmap.document  # type: ignore[union-attr]
        assert doc is not None
        held = {m: qs for m, qs in doc.topics["t"].items()}
        q1, q2 = held["p1"][0], held["p2"][0]
        reader.answer = GroupOffsets({q1: QueueOffsets(50, 20), q2: QueueOffsets(10, 0)}, requests=1)
        await poller.poll_once()
        await h.settle()
        assert reader.asked[0] == ("g", [("t", [])])
        written = state.publication.status or {}
        assert written["lag"]["total"] == 40
        assert written["lag"]["mostBehind"][0] == {"member": "p1", "lag": 30, "queues": 1}
        cond = next(x for x in written["conditions"] if x["type"] == LAG_CONDITION)
        assert (cond["status"], cond["reason"]) == ("True", "OffsetsRead")
        patches_before = len(lag_patches(h))

        # Next sample: rates from the one before, a patch that changes status.lag alone (a nested
        # object that did not change is an empty patch of it).
        reader.answer = GroupOffsets({q1: QueueOffsets(150, 120), q2: QueueOffsets(10, 0)}, requests=1)
        await poller.poll_once()
        await h.settle()
        last = lag_patches(h)[-1]
        assert {key for key, patch in last.items() if patch != {}} == {"lag"}
        assert (last["lag"]["consumeRate"], last["lag"]["produceRate"]) == (10.0, 10.0)
        assert len(lag_patches(h)) == patches_before + 1

        # A broker stops answering: the condition (through the worker), the assignment stays.
        failure = BrokerFailure("BrokerUnreachable", "b", "t", "broker b (127.0.0.1:1): refused")
        reader.answer = GroupOffsets({q1: QueueOffsets(150, 120)}, (failure,), requests=2)
        await poller.poll_once()
        await h.settle()
        written = state.publication.status or {}
        cond = next(x for x in written["conditions"] if x["type"] == LAG_CONDITION)
        assert (cond["status"], cond["reason"]) == ("False", "BrokerUnreachable")
        assert written["lag"]["brokersUnavailable"] == ["b"]
        assert next(x for x in written["conditions"] if x["type"] == "Ready")["status"] == "True"
        assert h.published_generations() == [1]
        assert h.counter("mqbalance_lag_requests_total", result="BrokerUnreachable") == 1

        # A reconcile (a new member) keeps the lag and the condition in what it writes.
        c.on_pod((NS, "p3"), None, pod("p3"))
        h.timer.advance(5)
        await h.settle()
        assert h.published_generations() == [1, 2]
        written = state.publication.status or {}
        assert written["lag"]["brokersUnavailable"] == ["b"]
        assert any(x["type"] == LAG_CONDITION for x in written["conditions"])
        assert c.lag_gauges()[0][2].available is False


@pytest.mark.asyncio
async def test_broadcasting_groups_and_groups_without_a_name_server_are_not_read() -> None:
    async with Harness() as h:
        await start(h, group(messageModel="BROADCASTING"), [pod("p1")])
        reader = FakeReader()
        await LagPoller(h.world, reader, LagSettings(), h.metrics).poll_once()
        assert reader.asked == []
    async with Harness() as h:
        await start(h, group(), [pod("p1")])
        reader = FakeReader()
        reader.default_name_server = None
        await LagPoller(h.world, reader, LagSettings(), h.metrics).poll_once()
        assert reader.asked == []
        assert LAG_CONDITION not in str(h.world.groups[(NS, "g")].publication.status)
