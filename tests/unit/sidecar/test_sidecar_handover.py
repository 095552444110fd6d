"""The sidecar's side of a handover: what this pod must release, POST /v1/release, GET /v1/drain."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from pytest_aiohttp import AiohttpClient

from mqbalance.contract import Ack, AssignmentDocument, HandoverMode, Release
from mqbalance.kube import ApiError
from mqbalance.model import MessageQueue
from mqbalance.sidecar import drain
from mqbalance.sidecar.app import create_app
from tests.unit.sidecar.sidecar_support import (
    OTHER,
    POD,
    Client,
    FakeClock,
    document,
    make_config,
    make_state,
    state_of,
)

pytestmark = pytest.mark.asyncio


class Recorder:
    """Records acknowledgements as the releases ConfigMap would; fails when told to."""

    def __init__(self) -> None:
        self.acks: list[tuple[str, Ack]] = []
        self.fail = False
        self.missing = False

    async def record(self, group: str, ack: Ack) -> None:
        if self.fail:
            raise ApiError(503, "the API server is restarting")
        if self.missing:
            raise ApiError(404, f'configmaps "{group}-releases" not found', "NotFound")
        self.acks.append((group, ack))


async def client_with(aiohttp_client: AiohttpClient, recorder: Recorder | None) -> Client:
    config = make_config()
    app = create_app(config, source=None, state=make_state(config, FakeClock()), recorder=recorder)  # type: ignore[arg-type]
    return await aiohttp_client(app)


def revoking(generation: int) -> AssignmentDocument:
    """A document that revoked broker-a:1 from this pod in ``generation``."""
    doc = document(
        generation, {"orders": {POD: [("broker-a", 0)], OTHER: [("broker-b", 0), ("broker-b", 1)]}}
    )
    queue = MessageQueue("orders", "broker-a", 1)
    return replace(doc, handover=HandoverMode.RELEASE, releasing=(Release(POD, generation, 100.0, (queue,)),))


async def test_the_member_view_names_what_this_pod_must_release(aiohttp_client: AiohttpClient) -> None:
    client = await client_with(aiohttp_client, Recorder())
    state = state_of(client)
    state.publish("orders", revoking(4))
    view = await (await client.get("/v1/queues")).json()
    assert view["handover"] == "Release"
    assert view["queues"] == {"orders": [{"brokerName": "broker-a", "queueId": 0}]}
    assert view["releasing"] == [
        {"generation": 4, "queues": {"orders": [{"brokerName": "broker-a", "queueId": 1}]}}
    ]
    # Without a handover the view is what it always was.
    state.publish("orders", document(5))
    plain = await (await client.get("/v1/queues")).json()
    assert "handover" not in plain
    assert "releasing" not in plain


async def test_a_release_is_recorded_for_the_operator(aiohttp_client: AiohttpClient) -> None:
    recorder = Recorder()
    client = await client_with(aiohttp_client, recorder)
    state = state_of(client)
    state.publish("orders", revoking(4))
    resp = await client.post("/v1/release", json={"generation": 4})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"group": "orders", "generation": 4, "all": False, "recorded": True}
    assert recorder.acks == [("orders", Ack(4))]
    # A generation not read yet cannot be released; a failed write is a 503 to retry.
    resp = await client.post("/v1/release", json={"generation": 5})
    assert resp.status == 409
    assert "not served yet" in (await resp.json())["error"]
    recorder.fail = True
    resp = await client.post("/v1/release", json={"generation": 4, "all": True})
    assert resp.status == 503
    assert "try again" in (await resp.json())["error"]
    for bad in ({}, {"generation": "4"}, {"generation": 4, "every": True}, {"generation": -1}):
        assert (await client.post("/v1/release", json=bad)).status == 400, bad


async def test_a_release_may_name_the_rocketmq_group_the_view_gave(aiohttp_client: AiohttpClient) -> None:
    # The view's "group" is spec.groupName (RocketMQ's name, e.g. GID_ORDERS); "groupResource" the
    # resource's. A client that sends back the first is acknowledged for the same group.
    recorder = Recorder()
    client = await client_with(aiohttp_client, recorder)
    state_of(client).publish("orders", replace(revoking(4), group="GID_ORDERS"))
    view = await (await client.get("/v1/queues?group=GID_ORDERS")).json()
    assert (view["group"], view["groupResource"]) == ("GID_ORDERS", "orders")
    resp = await client.post("/v1/release", json={"group": "GID_ORDERS", "generation": 4})
    assert resp.status == 200, await resp.text()
    assert recorder.acks == [("orders", Ack(4))]
    resp = await client.post("/v1/release", json={"group": "GID_OTHER", "generation": 4})
    assert resp.status == 404
    assert "not served here" in (await resp.json())["error"]


async def test_a_release_before_any_revocation_needs_no_releases_configmap(
    aiohttp_client: AiohttpClient,
) -> None:
    # The operator creates <group>-releases before it publishes the first revocation, so while it
    # does not exist nothing waits for a release: the application's first acknowledgement (at
    # start) is answered, not refused with a 503 it would retry until the group's first move.
    recorder = Recorder()
    recorder.missing = True
    client = await client_with(aiohttp_client, recorder)
    state = state_of(client)
    state.publish("orders", replace(document(2), handover=HandoverMode.RELEASE))
    resp = await client.post("/v1/release", json={"generation": 2})
    assert resp.status == 200, await resp.text()
    answer = await resp.json()
    assert answer["recorded"] is False
    assert "orders-releases" in answer["reason"]
    assert recorder.acks == []


async def test_a_release_without_a_handover_is_harmless(aiohttp_client: AiohttpClient) -> None:
    recorder = Recorder()
    client = await client_with(aiohttp_client, recorder)
    state = state_of(client)
    state.publish("orders", document(2))
    answer = await (await client.post("/v1/release", json={"generation": 2})).json()
    assert (answer["recorded"], answer["reason"]) == (False, "handover is Off for this group")
    assert recorder.acks == []


async def test_drain_waits_until_this_pod_holds_and_releases_nothing(aiohttp_client: AiohttpClient) -> None:
    client = await client_with(aiohttp_client, Recorder())
    state = state_of(client)
    state.publish("orders", revoking(4))
    assert (await (await client.get("/v1/drain?timeout=0.1")).json())["drained"] is False
    waiting = asyncio.ensure_future(client.get("/v1/drain?timeout=5"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    # The operator gave everything away: this pod is no member, holds nothing, releases nothing.
    handed_over = document(5, {"orders": {OTHER: [("broker-a", 0), ("broker-a", 1), ("broker-b", 0)]}})
    state.publish("orders", replace(handed_over, handover=HandoverMode.RELEASE))
    answer = await (await waiting).json()
    assert answer == {"group": "orders", "drained": True, "generation": 5}
    assert (await client.get("/v1/drain?timeout=x")).status == 400


async def test_the_drain_hook_drains_every_group_the_sidecar_serves(
    aiohttp_client: AiohttpClient, capsys: pytest.CaptureFixture[str]
) -> None:
    # The preStop hook runs in the sidecar's container: MQBALANCE_GROUP names what it serves.
    config = make_config(groups=("orders", "audit"))
    app = create_app(config, source=None, state=make_state(config, FakeClock()), recorder=Recorder())  # type: ignore[arg-type]
    client = await aiohttp_client(app)
    state = state_of(client)
    handed_over = document(5, {"orders": {OTHER: [("broker-a", 0)]}})
    state.publish("orders", replace(handed_over, handover=HandoverMode.RELEASE))
    state.publish("audit", revoking(4))  # still to release broker-a:1
    argv = ["--port", str(client.server.port), "--timeout", "0.5"]
    assert await asyncio.to_thread(drain.main, argv, {"MQBALANCE_GROUP": "orders, audit"}) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mqbalance drain: group orders: drained (generation 5)",
        "mqbalance drain: group audit: not drained after 0.5 s (generation 4)",
    ]
    # Without the environment (or with one group) the sidecar's only group is asked for.
    assert await asyncio.to_thread(drain.main, [*argv, "--group", "orders"], {}) == 0
    assert "group orders: drained" in capsys.readouterr().out
    assert await asyncio.to_thread(drain.main, argv, {}) == 0
    assert "several groups are served" in capsys.readouterr().err
