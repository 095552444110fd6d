"""The isolation windows of RocketMQ's 4.x and 5.x fault tables, reproduced through the HTTP API.

The tables are written out here as design.md states them (not read from the
producer library), so a change to the library's constants fails these tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from mqbalance.model import Broker, TopicRoute
from mqbalance.producer import Generation
from tests.unit.sidecar.sidecar_support import ROUTE, Client, Factory, FakeClock, state_of

pytestmark = pytest.mark.asyncio

# latencyMax (ms) -> notAvailableDuration (ms), and what a failure counts as.
TABLE_4X = [
    (50, 0),
    (100, 0),
    (550, 30_000),
    (1000, 60_000),
    (2000, 120_000),
    (3000, 180_000),
    (15000, 600_000),
]
TABLE_5X = [(50, 0), (100, 0), (550, 2_000), (1800, 5_000), (3000, 6_000), (5000, 10_000), (15000, 30_000)]
FAILURE = {Generation.V4: 600_000, Generation.V5: 10_000}
TABLES = {Generation.V4: TABLE_4X, Generation.V5: TABLE_5X}


def windows(generation: Generation) -> list[tuple[float, int]]:
    """(latency, expected window): each row's bound, just under it, and far beyond the last."""
    rows = TABLES[generation]
    cases: list[tuple[float, int]] = [(0, 0)]
    for i, (bound, duration) in enumerate(rows):
        cases.append((bound, duration))
        cases.append((bound - 1, rows[i - 1][1] if i else 0))
    cases.append((60_000, rows[-1][1]))
    return cases


def route_naming(client: Client, *brokers: str) -> None:
    """A route through ``brokers``: a send report may name only a broker of a route."""
    state_of(client).put_route("faults", TopicRoute("faults", tuple(Broker(b, 4, 4) for b in brokers)))


async def fault(client: Client, broker: str) -> dict[str, Any]:
    body = await (await client.get("/v1/faults")).json()
    return next(b for b in body["brokers"] if b["broker"] == broker)


@pytest.mark.parametrize("generation", list(Generation))
async def test_each_latency_isolates_for_its_window(
    make_client: Factory, clock: FakeClock, generation: Generation
) -> None:
    client = await make_client(generation=generation)
    route_naming(client, *(f"broker-{i}" for i in range(len(windows(generation)))))
    for i, (latency, window_ms) in enumerate(windows(generation)):
        broker = f"broker-{i}"  # a fresh broker per case: 5.x only ever lengthens a window
        resp = await client.post("/v1/sends", json={"broker": broker, "latencyMs": latency})
        assert (await resp.json())["isolationMs"] == window_ms, (generation, latency)
        if window_ms == 0:
            assert (await fault(client, broker))["available"] is True
            continue
        clock.advance(window_ms / 1000 - 0.001)
        item = await fault(client, broker)
        assert item["available"] is False
        assert item["isolatedForMs"] == 1
        clock.advance(0.001)
        assert (await fault(client, broker))["available"] is True


@pytest.mark.parametrize("generation", list(Generation))
async def test_a_failure_isolates_for_the_tables_failure_window(
    make_client: Factory, clock: FakeClock, generation: Generation
) -> None:
    client = await make_client(generation=generation)
    state_of(client).put_route("orders", ROUTE)
    resp = await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 3, "failed": True})
    assert (await resp.json())["isolationMs"] == FAILURE[generation]
    clock.advance(FAILURE[generation] / 1000 - 0.5)
    assert (await fault(client, "broker-a"))["available"] is False
    clock.advance(0.5)
    assert (await fault(client, "broker-a"))["available"] is True


async def test_4x_overwrites_a_window_and_5x_only_extends_it(make_client: Factory, clock: FakeClock) -> None:
    for generation, available_after_fast_send in ((Generation.V4, True), (Generation.V5, False)):
        client = await make_client(generation=generation)
        state_of(client).put_route("orders", ROUTE)
        await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 1, "failed": True})
        await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 1})
        assert (await fault(client, "broker-a"))["available"] is available_after_fast_send


@pytest.mark.parametrize("generation", list(Generation))
async def test_selection_avoids_an_isolated_broker_until_its_window_ends(
    make_client: Factory, clock: FakeClock, generation: Generation
) -> None:
    client = await make_client(generation=generation, fault_tolerance=True)
    state_of(client).put_route("orders", ROUTE)
    await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 1, "failed": True})
    picks = [await (await client.post("/v1/topics/orders/select", json={})).json() for _ in range(8)]
    assert {p["broker"] for p in picks} == {"broker-b"}
    # a request may switch fault tolerance off: round robin reaches broker-a again
    picks = [
        await (await client.post("/v1/topics/orders/select", json={"faultTolerance": False})).json()
        for _ in range(8)
    ]
    assert {p["broker"] for p in picks} == {"broker-a", "broker-b"}
    clock.advance(FAILURE[generation] / 1000)
    picks = [await (await client.post("/v1/topics/orders/select", json={})).json() for _ in range(8)]
    assert {p["broker"] for p in picks} == {"broker-a", "broker-b"}


async def test_unreachable_brokers_are_reported(make_client: Factory) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 5, "reachable": False})
    item = await fault(client, "broker-a")
    assert item["reachable"] is False
    assert item["available"] is True


async def test_fault_times_are_whole_milliseconds_and_fractions_truncate(
    make_client: Factory, clock: FakeClock
) -> None:
    client = await make_client()
    state_of(client).put_route("orders", ROUTE)
    body = await (await client.post("/v1/sends", json={"broker": "broker-a", "latencyMs": 549.9})).json()
    assert (body["currentLatencyMs"], body["isolationMs"], body["available"]) == (549, 0, True)
    body = await (await client.post("/v1/sends", json={"broker": "broker-b", "latencyMs": 550.7})).json()
    assert body == {
        "broker": "broker-b",
        "currentLatencyMs": 550,
        "isolatedUntilMs": clock.ms() + 2000,
        "isolatedForMs": 2000,
        "available": False,
        "reachable": True,
        "isolationMs": 2000,
    }
    clock.advance(1.999)  # the window's last millisecond
    item = await fault(client, "broker-b")
    assert (item["isolatedForMs"], item["available"]) == (1, False)
    never = await fault(client, "broker-a")
    assert never["isolatedUntilMs"] == 0  # 5.x: a broker never isolated keeps startTimestamp 0
