"""The standard-library Python client against a running sidecar app."""

from __future__ import annotations

import asyncio

import pytest
from pytest_aiohttp import AiohttpServer

from mqbalance.sidecar.app import create_app
from mqbalance.sidecar.client import SidecarClient, SidecarError
from tests.unit.sidecar.sidecar_support import POD, ROUTE, FakeClock, document, make_config, make_state

pytestmark = pytest.mark.asyncio


async def test_client_covers_the_api(aiohttp_server: AiohttpServer) -> None:
    config = make_config()
    state = make_state(config, FakeClock())
    server = await aiohttp_server(create_app(config, source=None, state=state))
    client = SidecarClient(str(server.make_url("")))

    assert await asyncio.to_thread(client.ready) is False
    with pytest.raises(SidecarError) as err:
        await asyncio.to_thread(client.queues)
    assert err.value.status == 503
    assert "orders" in err.value.message

    state.publish("orders", document(1))
    assert await asyncio.to_thread(client.ready) is True
    view = await asyncio.to_thread(client.queues)
    assert view["generation"] == 1
    assert view["member"] == POD
    assert (await asyncio.to_thread(client.assignment))["generation"] == 1

    waiting = asyncio.create_task(asyncio.to_thread(client.wait_for_change, 1, 5))
    while state.groups["orders"].waiting == 0:
        await asyncio.sleep(0.01)
    state.publish("orders", document(2))
    assert (await waiting)["generation"] == 2
    unchanged = await asyncio.to_thread(client.wait_for_change, 2, 0.05)
    assert unchanged["generation"] == 2

    state.put_route("orders", ROUTE)
    assert (await asyncio.to_thread(client.route, "orders"))["topic"] == "orders"
    picked = await asyncio.to_thread(lambda: client.select_queue("orders", last_broker="broker-a"))
    assert picked["broker"] == "broker-b"
    result = await asyncio.to_thread(lambda: client.report("broker-b", 10, failed=True))
    assert result["available"] is False
    faults = await asyncio.to_thread(client.faults)
    assert {b["broker"] for b in faults["brokers"]} == {"broker-a", "broker-b"}
    with pytest.raises(SidecarError, match="shardingKey") as err:
        await asyncio.to_thread(lambda: client.select_queue("orders", selector="hash"))
    assert err.value.status == 400

    # Generation 2 changed nothing of this pod's: no move to trace; the steps reach the sidecar all the same.
    released = await asyncio.to_thread(lambda: client.release(2, applied_ms=3, committed_ms=4.5))
    assert released["generation"] == 2
    assert (await asyncio.to_thread(client.report_consumed, 2, 12.5, 3.0))["traced"] is False


async def test_an_unreachable_sidecar_is_status_0(unused_tcp_port: int) -> None:
    client = SidecarClient(f"http://127.0.0.1:{unused_tcp_port}", timeout=2)
    with pytest.raises(SidecarError) as err:
        await asyncio.to_thread(client.queues)
    assert err.value.status == 0
