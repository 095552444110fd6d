"""The sidecar's watches against a scripted API server: relist after 410 Gone, retry after errors,
a ConfigMap without a document kept out, Topics read by the contract's reader."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument
from mqbalance.kube import Backoff, KubeClient
from mqbalance.model import UNKNOWN_ZONE
from mqbalance.sidecar.watch import KubernetesSource, topic_snapshot
from tests.unit.sidecar.sidecar_support import FakeClock, document, make_config, make_state

pytestmark = pytest.mark.asyncio

PATH = "/api/v1/namespaces/shop/configmaps"


def configmap(rv: int, generation: int | None) -> dict[str, Any]:
    data = {} if generation is None else {CONFIGMAP_KEY: document(generation).encode()}
    return {"metadata": {"name": "orders-assignment", "resourceVersion": str(rv)}, "data": data}


class ScriptedApi:
    """Answers lists and watches from scripts; records every request's query."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.queries: list[dict[str, str]] = []
        self.parked = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        script = (self.watches if "watch" in request.query else self.lists).pop(0)
        if isinstance(script, int):
            return web.json_response({"kind": "Status", "code": script, "message": "scripted"}, status=script)
        if "watch" not in request.query:
            rv, items = script
            return web.json_response({"metadata": {"resourceVersion": str(rv)}, "items": items})
        resp = web.StreamResponse()
        await resp.prepare(request)
        for event in script or []:
            await resp.write(json.dumps(event).encode() + b"\n")
        if script is None:  # the last watch: stay open until the test ends
            self.parked.set()
            await asyncio.Event().wait()
        return resp


async def test_watch_relists_after_gone_and_retries_after_errors(aiohttp_server: AiohttpServer) -> None:
    api = ScriptedApi(
        lists=[500, (10, [configmap(10, 1)]), (20, [configmap(20, 3)])],
        watches=[
            [{"type": "MODIFIED", "object": configmap(11, 2)}, {"type": "ERROR", "object": {"code": 410}}],
            [
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "21"}}},
                {"type": "DELETED", "object": configmap(22, 3)},
                {"type": "ADDED", "object": configmap(23, None)},  # no document: ignored
                {"type": "MODIFIED", "object": configmap(24, 5)},
            ],
            None,
        ],
    )
    app = web.Application()
    app.router.add_get(PATH, api.handle)
    server = await aiohttp_server(app)
    config = make_config()
    state = make_state(config, FakeClock())
    seen: list[int | None] = []
    publish, withdraw = state.publish, state.withdraw

    def recording_publish(group: str, doc: AssignmentDocument) -> bool:
        seen.append(doc.generation)
        return publish(group, doc)

    def recording_withdraw(group: str) -> None:
        seen.append(None)
        withdraw(group)

    state.publish = recording_publish  # type: ignore[method-assign]
    state.withdraw = recording_withdraw  # type: ignore[method-assign]

    async with aiohttp.ClientSession() as session:
        kube = KubeClient(str(server.make_url("")).rstrip("/"), session)
        informer = KubernetesSource(kube, "shop", ["orders"]).configmap_informer(state, "orders")
        informer._backoff = Backoff(initial=0.01, maximum=0.05)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(api.parked.wait(), 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    assert seen == [1, 2, 3, None, 5]
    served = state.groups["orders"].served
    assert served is not None
    assert served.generation == 5
    assert all(q["fieldSelector"] == "metadata.name=orders-assignment" for q in api.queries)
    watches = [q for q in api.queries if "watch" in q]
    assert [w["resourceVersion"] for w in watches] == ["10", "20", "24"]
    restarts = state.metrics.registry.get_sample_value(
        "mqbalance_sidecar_watch_restarts_total", {"resource": "configmap"}
    )
    assert restarts == 2  # the 500 and the 410
    invalid = state.metrics.registry.get_sample_value(
        "mqbalance_sidecar_invalid_documents_total", {"group": "orders"}
    )
    assert invalid == 1


async def test_topic_resources_become_routes() -> None:
    state = make_state(make_config(), FakeClock())
    informer = KubernetesSource(None, "shop", ["orders"]).topic_informer(state)  # type: ignore[arg-type]
    orders: dict[str, Any] = {
        "metadata": {"name": "orders-topic"},
        "spec": {
            "topicName": "orders",
            "brokers": [
                {"name": "broker-a", "zone": "zone-a", "readQueueNums": 4, "writeQueueNums": 2},
                {"name": "broker-b", "readQueueNums": 4, "writeQueueNums": 4, "perm": 4},
            ],
        },
    }
    unnamed = {"metadata": {"name": "audit"}, "spec": {"brokers": [{"name": "b", "readQueueNums": 1}]}}
    informer.on_list(
        {("shop", "orders-topic"): topic_snapshot(orders), ("shop", "audit"): topic_snapshot(unnamed)}
    )
    found = state.route("orders")  # the malformed one is skipped, not fatal
    assert found is not None
    resource, route = found
    assert resource == "orders-topic"
    assert [(b.name, b.zone, b.perm) for b in route.brokers] == [
        ("broker-a", "zone-a", 6),
        ("broker-b", UNKNOWN_ZONE, 4),
    ]
    assert len(route.writable_queues()) == 2
    assert state.route("audit") is None
    fixed = {"brokers": [{"name": "b", "readQueueNums": 1, "writeQueueNums": 1}]}
    informer.on_event("MODIFIED", ("shop", "audit"), topic_snapshot({"spec": fixed}))
    assert state.route("audit") is not None  # topicName defaults to the resource name
    informer.on_event("DELETED", ("shop", "orders-topic"), topic_snapshot(orders))
    assert state.route("orders") is None
    # The same reader as the operator's: a broker listed twice is refused, not half-served.
    twice = {"brokers": [fixed["brokers"][0], fixed["brokers"][0]]}
    informer.on_event("MODIFIED", ("shop", "audit"), topic_snapshot({"spec": twice}))
    assert state.route("audit") is None


async def test_a_topic_read_from_a_name_server_is_served_once_its_route_is_read() -> None:
    state = make_state(make_config(), FakeClock())
    informer = KubernetesSource(None, "shop", ["orders"]).topic_informer(state)  # type: ignore[arg-type]
    topic: dict[str, Any] = {
        "metadata": {"name": "orders"},
        "spec": {"nameServer": {"addresses": ["10.0.0.5:9876"]}, "brokers": [{"name": "a", "zone": "z1"}]},
    }
    informer.on_list({("shop", "orders"): topic_snapshot(topic)})
    assert state.route("orders") is None  # nothing read yet: nothing to serve
    topic["status"] = {
        "route": {
            "nameServer": "10.0.0.5:9876",
            "brokers": [
                {"name": "a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6, "master": True},
                {"name": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6, "master": False},
            ],
        }
    }
    informer.on_event("MODIFIED", ("shop", "orders"), topic_snapshot(topic))
    found = state.route("orders")
    assert found is not None
    route = found[1]
    assert [(b.name, b.zone) for b in route.brokers] == [("a", "z1"), ("b", UNKNOWN_ZONE)]
    assert len(route.readable_queues()) == 4  # a consumer reads from a slave too
    assert {mq.broker_name for mq in route.writable_queues()} == {"a"}  # a producer needs a master
