"""Every endpoint of the sidecar's API through aiohttp's test client, bad requests included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import ClientResponse
from pytest_aiohttp import AiohttpClient

from mqbalance.contract import AssignmentDocument
from mqbalance.model import Broker, TopicRoute
from mqbalance.producer import QueueSelector, select_by_hash, writable_queues
from mqbalance.sidecar.app import create_metrics_app
from tests.unit.sidecar.sidecar_support import (
    OTHER,
    POD,
    ROUTE,
    Factory,
    FakeClock,
    MemorySource,
    document,
    state_of,
)

pytestmark = pytest.mark.asyncio


async def error_of(resp: ClientResponse, status: int) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["status"] == status
    assert isinstance(body["error"], str)
    assert body["error"]
    return str(body["error"])


# -- health and readiness ----------------------------------------------------------


async def test_healthz_and_readyz_follow_the_assignment(make_client: Factory) -> None:
    client = await make_client()
    assert (await client.get("/healthz")).status == 200
    assert "orders" in await error_of(await client.get("/readyz"), 503)
    state_of(client).publish("orders", document(3))
    resp = await client.get("/readyz")
    assert resp.status == 200
    assert (await resp.json())["generations"] == {"orders": 3}


async def test_readyz_waits_for_every_group(make_client: Factory) -> None:
    client = await make_client(groups=("orders", "payments"))
    state_of(client).publish("orders", document(1))
    message = await error_of(await client.get("/readyz"), 503)
    assert "payments" in message
    assert "orders" not in message


# -- this pod's queues -------------------------------------------------------------


async def test_queues_before_any_assignment_is_503_naming_the_group(make_client: Factory) -> None:
    client = await make_client()
    message = await error_of(await client.get("/v1/queues"), 503)
    assert "'orders'" in message


async def test_queues_serve_this_pods_share(make_client: Factory) -> None:
    client = await make_client()
    doc = document(7, computed_at=123.5)
    state_of(client).publish("orders", doc)
    resp = await client.get("/v1/queues")
    assert resp.status == 200
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert body["generation"] == 7
    assert body["member"] == POD
    assert body["isMember"] is True
    assert body["strategy"] == "STICKY"
    assert body["computedAt"] == 123.5
    expected = [{"brokerName": mq.broker_name, "queueId": mq.queue_id} for mq in doc.topics["orders"][POD]]
    assert body["queues"] == {"orders": expected}
    assert body["queueCount"] == len(expected)


async def test_a_pod_outside_the_group_gets_no_queues(make_client: Factory) -> None:
    client = await make_client(pod_name="orders-7f9c-zzzzz")
    state_of(client).publish("orders", document(2))
    body = await (await client.get("/v1/queues")).json()
    assert body["isMember"] is False
    assert body["queues"] == {"orders": []}


async def test_a_member_of_a_paused_group_holds_nothing(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).publish("orders", document(3, {"orders": {POD: [], OTHER: []}}, reason="paused"))
    body = await (await client.get("/v1/queues")).json()
    assert (body["isMember"], body["reason"], body["queueCount"]) == (True, "paused", 0)
    assert body["queues"] == {"orders": []}


async def test_whole_assignment_is_the_published_document(make_client: Factory) -> None:
    client = await make_client()
    doc = document(4)
    state_of(client).publish("orders", doc)
    resp = await client.get("/v1/assignment")
    assert resp.status == 200
    assert AssignmentDocument.decode(await resp.text()) == doc


async def test_several_groups_need_a_group_parameter(make_client: Factory) -> None:
    client = await make_client(groups=("orders", "payments"))
    state_of(client).publish("payments", document(9, group="payments-consumer"))
    assert "?group=" in await error_of(await client.get("/v1/queues"), 400)
    assert "served: orders, payments" in await error_of(await client.get("/v1/queues?group=nope"), 404)
    body = await (await client.get("/v1/queues?group=payments")).json()
    assert body["generation"] == 9
    assert body["groupResource"] == "payments"
    await error_of(await client.get("/v1/assignment?group=orders"), 503)


# -- long-poll ---------------------------------------------------------------------


async def test_long_poll_returns_when_a_new_generation_arrives(make_client: Factory) -> None:
    client = await make_client()
    state = state_of(client)
    state.publish("orders", document(1))
    poll = asyncio.create_task(client.get("/v1/queues?after=1&timeout=5"))
    while state.groups["orders"].waiting == 0:  # the request is parked on the group
        await asyncio.sleep(0.01)
    assert not poll.done()
    state.publish("orders", document(2, {"orders": {POD: [("broker-b", 3)]}}))
    resp = await poll
    body = await resp.json()
    assert body["generation"] == 2
    assert body["queues"] == {"orders": [{"brokerName": "broker-b", "queueId": 3}]}


async def test_long_poll_answers_at_once_when_the_generation_already_differs(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).publish("orders", document(5))
    resp = await client.get("/v1/queues?after=3&timeout=5")
    assert (await resp.json())["generation"] == 5
    assert state_of(client).groups["orders"].waiting == 0


async def test_long_poll_times_out_with_the_unchanged_assignment(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).publish("orders", document(5))
    resp = await client.get("/v1/queues?after=5&timeout=0.05")
    assert resp.status == 200
    assert (await resp.json())["generation"] == 5


async def test_long_poll_without_timeout_waits_at_most_max_wait(make_client: Factory) -> None:
    # The default wait (30 s) is capped by a smaller --max-wait instead of being refused.
    client = await make_client(max_wait=0.05)
    state_of(client).publish("orders", document(5))
    resp = await client.get("/v1/queues?after=5")
    assert resp.status == 200
    assert (await resp.json())["generation"] == 5


async def test_republishing_the_same_generation_does_not_wake_a_long_poll(make_client: Factory) -> None:
    client = await make_client()
    state = state_of(client)
    state.publish("orders", document(5))
    assert state.publish("orders", document(5)) is False
    resp = await client.get("/v1/queues?after=5&timeout=0.05")
    assert (await resp.json())["generation"] == 5


async def test_shutting_down_answers_waiting_long_polls_at_once(make_client: Factory) -> None:
    # A stopping sidecar (SIGTERM: aiohttp's on_shutdown, then it waits for handlers) must not keep
    # its pod alive until every long-poll times out (up to --max-wait).
    client = await make_client(max_wait=30.0)
    state = state_of(client)
    state.publish("orders", document(4))
    poll = asyncio.create_task(client.get("/v1/queues?after=4&timeout=30"))
    while state.groups["orders"].waiting < 1:
        await asyncio.sleep(0.01)
    await client.app.shutdown()
    resp = await asyncio.wait_for(poll, 2)
    assert resp.status == 200
    assert (await resp.json())["generation"] == 4
    # Requests that still come in answer at once too.
    resp = await asyncio.wait_for(client.get("/v1/queues?after=4&timeout=30"), 2)
    assert (await resp.json())["generation"] == 4


async def test_long_poll_for_the_first_assignment(make_client: Factory) -> None:
    client = await make_client()
    state = state_of(client)
    await error_of(await client.get("/v1/queues?after=-1&timeout=0.01"), 503)
    poll = asyncio.create_task(client.get("/v1/assignment?after=-1&timeout=5"))
    while state.groups["orders"].waiting == 0:
        await asyncio.sleep(0.01)
    state.publish("orders", document(1))
    assert (await (await poll).json())["generation"] == 1


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("after=x", "after"),
        ("after=1.5", "after"),
        ("after=-2", "after"),
        ("after=1&timeout=soon", "timeout"),
        ("after=1&timeout=-1", "timeout"),
        ("after=1&timeout=nan", "timeout"),
        ("after=1&timeout=6", "5"),  # above the configured max_wait of 5 s
        ("timeout=3", "after"),
        ("afterr=3", "afterr"),
    ],
)
async def test_bad_long_poll_parameters_are_400_naming_them(
    make_client: Factory, query: str, names: str
) -> None:
    client = await make_client()
    state_of(client).publish("orders", document(1))
    for path in ("/v1/queues", "/v1/assignment"):
        assert names in await error_of(await client.get(f"{path}?{query}"), 400)


# -- routes and selection ----------------------------------------------------------


async def test_route_by_topic_name_and_by_resource_name(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).put_route("orders-topic", ROUTE)
    for name in ("orders", "orders-topic"):
        body = await (await client.get(f"/v1/topics/{name}/route")).json()
        assert body["topic"] == "orders"
        assert body["resource"] == "orders-topic"
        assert [b["name"] for b in body["brokers"]] == ["broker-a", "broker-b"]
        assert body["writableQueues"] == len(ROUTE.writable_queues())
    message = await error_of(await client.get("/v1/topics/nope/route"), 404)
    assert "'nope'" in message
    assert "known: orders" in message


async def test_route_of_a_sidecar_without_topics_says_why(make_client: Factory) -> None:
    client = await make_client(watch_topics=False)
    assert "--no-topics" in await error_of(await client.get("/v1/topics/orders/route"), 404)


async def test_round_robin_selection_matches_the_producer_library(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    reference = QueueSelector(index_start=0)
    picked = []
    for _ in range(2 * len(ROUTE.writable_queues())):
        resp = await client.post("/v1/topics/orders/select", json={})
        body = await resp.json()
        mq = reference.select_queue(ROUTE)
        assert body == {"topic": "orders", "broker": mq.broker_name, "queueId": mq.queue_id}
        picked.append((body["broker"], body["queueId"]))
    # round robin: every writable queue exactly twice
    assert sorted(picked) == sorted(2 * [(q.broker_name, q.queue_id) for q in ROUTE.writable_queues()])


async def test_an_empty_body_selects_too(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    resp = await client.post("/v1/topics/orders/select")
    assert resp.status == 200


async def test_a_retry_avoids_the_last_broker(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    for last in ("broker-a", "broker-b") * 4:
        body = await (await client.post("/v1/topics/orders/select", json={"lastBroker": last})).json()
        assert body["broker"] != last


async def test_hash_selector_keeps_a_key_on_its_queue(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    for key in ("order-1", "order-2", "customer-42"):
        expected = select_by_hash(writable_queues(ROUTE), key)
        for _ in range(2):
            body = await (
                await client.post("/v1/topics/orders/select", json={"selector": "hash", "shardingKey": key})
            ).json()
            assert (body["broker"], body["queueId"]) == (expected.broker_name, expected.queue_id)


async def test_random_and_machine_room_selectors(make_client: Factory) -> None:
    client = await make_client(zone="zone-b")
    state_of(client).put_route("orders", ROUTE)
    body = await (await client.post("/v1/topics/orders/select", json={"selector": "random"})).json()
    assert body["broker"] in {"broker-a", "broker-b"}
    for _ in range(6):  # the sidecar's zone is zone-b, where only broker-b runs
        body = await (await client.post("/v1/topics/orders/select", json={"selector": "machine_room"})).json()
        assert body["broker"] == "broker-b"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"selector": "hash"}, "shardingKey"),
        ({"selector": "fastest"}, "fastest"),
        ({"lastBroker": 3}, "lastBroker"),
        ({"faultTolerance": "yes"}, "faultTolerance"),
        ({"shardingkey": "k"}, "shardingkey"),
        ([1, 2], "JSON object"),
        ("{not json", "not JSON"),
    ],
)
async def test_bad_select_requests_are_400_naming_the_problem(
    make_client: Factory, body: Any, names: str
) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    data = body if isinstance(body, str) else json.dumps(body)
    resp = await client.post(
        "/v1/topics/orders/select", data=data, headers={"Content-Type": "application/json"}
    )
    assert names in await error_of(resp, 400)


async def test_machine_room_without_a_zone_is_400(make_client: Factory) -> None:
    client = await make_client(zone="")
    state_of(client).put_route("orders", ROUTE)
    resp = await client.post("/v1/topics/orders/select", json={"selector": "machine_room"})
    assert "MQBALANCE_ZONE" in await error_of(resp, 400)


async def test_select_on_unknown_topic_is_404_and_without_writable_queue_409(make_client: Factory) -> None:
    client = await make_client()
    assert "'nope'" in await error_of(await client.post("/v1/topics/nope/select", json={}), 404)
    read_only = TopicRoute("audit", (Broker("broker-a", 4, 4, perm=4),))
    state_of(client).put_route("audit", read_only)
    assert "writable" in await error_of(await client.post("/v1/topics/audit/select", json={}), 409)


# -- send reports and faults -------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"latencyMs": 5}, "broker"),
        ({"broker": "broker-a"}, "latencyMs"),
        ({"broker": "broker-a", "latencyMs": -1}, "latencyMs"),
        ({"broker": "broker-a", "latencyMs": True}, "latencyMs"),
        ({"broker": "broker-a", "latencyMs": 10**400}, "latencyMs"),  # beyond any float
        ({"broker": "broker-a", "latencyMs": 1.7e308}, "latencyMs"),  # a float beyond a Java long
        ({"broker": "broker-a", "latencyMs": 2**63}, "latencyMs"),
        ({"broker": "broker-a", "latencyMs": 5, "failed": "no"}, "failed"),
        ({"broker": "broker-a", "latencyMs": 5, "topic": "x"}, "topic"),
    ],
)
async def test_bad_send_reports_are_400_naming_the_field(make_client: Factory, body: Any, names: str) -> None:
    client = await make_client()
    assert names in await error_of(await client.post("/v1/sends", json=body), 400)


async def test_faults_list_route_brokers_and_reported_ones(make_client: Factory) -> None:
    client = await make_client()
    state = state_of(client)
    state.put_route("audit", TopicRoute("audit", (Broker("broker-c", 4, 4),)))
    await client.post("/v1/sends", json={"broker": "broker-c", "latencyMs": 20})
    state.put_route("orders", ROUTE)
    state.delete_route("audit")  # broker-c left the routes: its reported state stays listed
    body = await (await client.get("/v1/faults")).json()
    assert body["generation"] == "5.x"
    by_name = {b["broker"]: b for b in body["brokers"]}
    assert sorted(by_name) == ["broker-a", "broker-b", "broker-c"]
    assert by_name["broker-a"]["reported"] is False
    assert by_name["broker-a"]["available"] is True
    assert by_name["broker-c"]["reported"] is True
    assert by_name["broker-c"]["currentLatencyMs"] == 20


async def test_a_send_report_naming_no_route_broker_is_404_and_changes_nothing(
    make_client: Factory, aiohttp_client: AiohttpClient
) -> None:
    client = await make_client()
    state = state_of(client)
    metrics = await aiohttp_client(create_metrics_app(state))
    state.put_route("orders", ROUTE)
    for i in range(50):
        broker = f"made-up-{i}-" + "x" * 1000
        body = {"broker": broker, "latencyMs": 60_000, "failed": True}
        message = await error_of(await client.post("/v1/sends", json=body), 404)
        assert f"made-up-{i}-" in message
        assert "broker-a, broker-b" in message
        assert len(message) < 300  # the client's string is not echoed in full
    faults = await (await client.get("/v1/faults")).json()
    assert [b["broker"] for b in faults["brokers"]] == ["broker-a", "broker-b"]
    text = await (await metrics.get("/metrics")).text()
    assert "made-up" not in text
    without_topics = await make_client(watch_topics=False)
    resp = await without_topics.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 1})
    assert "--no-topics" in await error_of(resp, 404)


DEEP = 50_000
"""Nesting far beyond what Python's json decodes (its recursion limit), within the 64 KiB body limit."""


@pytest.mark.parametrize("path", ["/v1/sends", "/v1/topics/orders/select", "/v1/release"])
@pytest.mark.parametrize(
    ("body", "headers", "status", "complaint"),
    [
        (b"[" * DEEP, {}, 400, "too deeply"),
        (b'{"broker": ' + b"[" * DEEP + b"}", {}, 400, "too deeply"),
        (b'{"broker": "\xff\xfe"}', {}, 400, "not JSON"),
        (b"\x1f\x8b garbage", {"Content-Encoding": "gzip"}, 400, "gzip"),
        (b'{"broker": "' + b"b" * 70_000 + b'"}', {}, 413, "size"),
    ],
    ids=["deep", "deep-in-a-field", "not-utf-8", "broken-gzip", "too-large"],
)
async def test_a_malformed_body_is_a_4xx_json_error(
    make_client: Factory, path: str, body: bytes, headers: dict[str, str], status: int, complaint: str
) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    state_of(client).publish("orders", document(1))
    resp = await client.post(path, data=body, headers={"Content-Type": "application/json", **headers})
    assert complaint in await error_of(resp, status)


# -- errors from the router --------------------------------------------------------


async def test_unknown_path_and_wrong_method_are_json(make_client: Factory) -> None:
    client = await make_client()
    assert "/openapi.json" in await error_of(await client.get("/v2/queues"), 404)
    resp = await client.post("/v1/queues", json={})
    assert "GET" in await error_of(resp, 405)
    assert "GET" in resp.headers["Allow"]


async def test_an_oversized_body_is_413_json(make_client: Factory) -> None:
    client = await make_client()
    await error_of(await client.post("/v1/sends", data=b"x" * 100_000), 413)


# -- the source in cleanup_ctx and the metrics app ---------------------------------


async def test_a_source_feeds_the_app_while_it_runs(make_client: Factory) -> None:
    source = MemorySource()
    client = await make_client(source=source)
    source.publish("orders", document(11))
    source.put_route("orders", ROUTE)
    body = await (await client.get("/v1/queues?after=-1&timeout=5")).json()
    assert body["generation"] == 11
    assert (await client.get("/v1/topics/orders/route")).status == 200


async def test_metrics_follow_rebalances_and_sends(
    make_client: Factory, aiohttp_client: AiohttpClient, clock: FakeClock
) -> None:
    client = await make_client()
    state = state_of(client)
    metrics = await aiohttp_client(create_metrics_app(state))
    state.publish("orders", document(1, computed_at=clock.now - 3))
    clock.advance(10)
    # pod gains broker-b/0 and keeps broker-a/0; loses broker-a/1
    state.publish(
        "orders",
        document(
            2,
            {"orders": {POD: [("broker-a", 0), ("broker-b", 0)], OTHER: [("broker-a", 1)]}},
            computed_at=clock.now - 0.25,
        ),
    )
    state.put_route("orders", ROUTE)
    await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 10, "failed": True})
    await client.post("/v1/sends", json={"broker": "broker-b", "latencyMs": 20})
    text = await (await metrics.get("/metrics")).text()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    g = '{group="orders"}'
    assert samples[f"mqbalance_sidecar_assignment_generation{g}"] == 2
    assert samples[f"mqbalance_sidecar_owned_queues{g}"] == 2
    assert samples[f"mqbalance_sidecar_rebalances_total{g}"] == 2
    assert samples[f"mqbalance_sidecar_queues_added_total{g}"] == 3  # 2 at first, then broker-b/0
    assert samples[f"mqbalance_sidecar_queues_revoked_total{g}"] == 1
    # only the replacement is a propagation (the first may be old news): 0.25 s
    assert samples[f"mqbalance_sidecar_propagation_delay_seconds_count{g}"] == 1
    assert samples[f"mqbalance_sidecar_propagation_delay_seconds_sum{g}"] == pytest.approx(0.25)
    assert samples['mqbalance_sidecar_broker_available{broker="broker-a"}'] == 0
    assert samples['mqbalance_sidecar_broker_available{broker="broker-b"}'] == 1
    assert samples['mqbalance_sidecar_broker_isolations_total{broker="broker-a"}'] == 1
    assert 'mqbalance_sidecar_broker_isolations_total{broker="broker-b"}' not in samples
    assert samples["mqbalance_sidecar_send_latency_seconds_count"] == 2
    assert samples["mqbalance_sidecar_send_latency_seconds_sum"] == pytest.approx(0.03)
    only = await (
        await metrics.get(
            "/metrics",
            params=[
                ("name[]", "mqbalance_sidecar_owned_queues"),
                ("name[]", "mqbalance_sidecar_broker_available"),
            ],
        )
    ).text()
    series = {line.rsplit(" ", 1)[0] for line in only.splitlines() if line and not line.startswith("#")}
    assert series == {
        f"mqbalance_sidecar_owned_queues{g}",
        'mqbalance_sidecar_broker_available{broker="broker-a"}',
        'mqbalance_sidecar_broker_available{broker="broker-b"}',
    }
