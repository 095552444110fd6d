"""The sidecar API's handlers (documented in ``openapi.json``), in one route table."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from mqbalance.contract import HandoverMode, releases_configmap_name
from mqbalance.kube import ApiError as KubeApiError
from mqbalance.model import MessageQueue
from mqbalance.producer import KeySelector, NoWritableQueueError, QueueSelector
from mqbalance.sidecar.answers import RouteEntry, route_json
from mqbalance.sidecar.errors import ApiError
from mqbalance.sidecar.keys import CONFIG, OPENAPI, RECORDER, STATE
from mqbalance.sidecar.moves import REPORTED, reported_steps
from mqbalance.sidecar.params import (
    check_broker,
    check_params,
    finite_number,
    group_of,
    group_served,
    json_body,
    named_group,
    route_of,
    served_of,
)
from mqbalance.sidecar.state import GroupState

JAVA_LONG_MAX = 2**63 - 1
ROUND_ROBIN = "round_robin"
SELECTORS = (ROUND_ROBIN, *(s.value for s in KeySelector))
JSON = "application/json"


routes = web.RouteTableDef()


def _json_bytes(body: bytes) -> web.Response:
    return web.Response(body=body, content_type=JSON)


@routes.get("/v1/queues")
async def get_queues(request: web.Request) -> web.Response:
    group, served = await group_served(request)
    return _json_bytes(group.queues_body(served))


@routes.get("/v1/assignment")
async def get_assignment(request: web.Request) -> web.Response:
    return _json_bytes((await served_of(request)).assignment_body)


_SELECT_FIELDS: dict[str, tuple[type, ...]] = {
    "lastBroker": (str,),
    "faultTolerance": (bool,),
    "selector": (str,),
    "shardingKey": (str,),
}


# Registered before the route endpoint: the router tries the /v1/topics resources in
# order, and selection is the one called per message.
@routes.post("/v1/topics/{topic}/select")
async def select_queue(request: web.Request) -> web.Response:
    check_params(request, ())
    body = await json_body(request, _SELECT_FIELDS)
    entry = route_of(request)
    app = request.app
    producer = app[STATE].selector
    try:
        if body:
            mq = _select_as_asked(app, producer, entry, body)
        else:
            # A plain send: round robin with the sidecar's own fault tolerance setting.
            mq = producer.select_queue(entry.route, queues=entry.queues)
    except NoWritableQueueError as e:
        raise ApiError(409, str(e)) from None
    return web.Response(body=entry.answer(mq), content_type=JSON)


def _select_as_asked(
    app: web.Application, producer: QueueSelector, entry: RouteEntry, body: dict[str, Any]
) -> MessageQueue:
    selector_name = body.get("selector") or ROUND_ROBIN
    if selector_name not in SELECTORS:
        raise ApiError(400, f"unknown selector {selector_name!r}; use one of {', '.join(SELECTORS)}")
    if selector_name == ROUND_ROBIN:
        return producer.select_queue(
            entry.route,
            last_broker=body.get("lastBroker"),
            fault_tolerance=body.get("faultTolerance"),
            queues=entry.queues,
        )
    key = body.get("shardingKey")
    if selector_name == KeySelector.HASH and key is None:
        raise ApiError(400, "the hash selector needs shardingKey (the message's sharding key)")
    zone = app[CONFIG].zone or None
    if selector_name == KeySelector.MACHINE_ROOM and zone is None:
        raise ApiError(
            400, "the machine_room selector needs the sidecar's zone: set MQBALANCE_ZONE or --zone"
        )
    return producer.select_by_key(entry.route, selector_name, key, zone=zone, queues=entry.queues)


@routes.get("/v1/topics/{topic}/route")
async def get_route(request: web.Request) -> web.Response:
    check_params(request, ())
    entry = route_of(request)
    return web.json_response(route_json(entry.resource, entry.route))


@routes.post("/v1/sends")
async def report_send(request: web.Request) -> web.Response:
    check_params(request, ())
    body = await json_body(
        request,
        {"broker": (str,), "latencyMs": (int, float), "failed": (bool,), "reachable": (bool,)},
    )
    broker = body.get("broker")
    raw_latency = body.get("latencyMs")
    if not broker:
        raise ApiError(400, "field 'broker' is required: the broker name the send went to")
    # An integer stays exact (a float would round 2**63 - 2 up past a Java long); a float must be
    # below 2**63, where its truncation still fits one.
    latency: float | None = (
        raw_latency
        if isinstance(raw_latency, int)
        else None
        if raw_latency is None
        else finite_number(raw_latency)
    )
    if (
        latency is None
        or not 0 <= latency <= JAVA_LONG_MAX
        or (isinstance(latency, float) and latency >= 2**63)
    ):
        raise ApiError(
            400,
            f"field 'latencyMs' is required and must be a number from 0 to {JAVA_LONG_MAX} "
            f"(RocketMQ keeps it in a Java long), got {raw_latency!r}",
        )
    check_broker(request, broker)
    failed = bool(body.get("failed") or False)
    reachable = body.get("reachable")
    state = request.app[STATE]
    producer = state.selector
    table = producer.faults.table
    window_ms = table.not_available_duration(table.failure_latency_ms if failed else latency)
    item = producer.report(broker, latency, failed=failed, reachable=True if reachable is None else reachable)
    metrics = state.metrics
    metrics.send_latency.observe(latency / 1000.0)
    if window_ms > 0:
        metrics.broker_isolations.labels(broker).inc()
    return web.json_response({**item.to_json(), "isolationMs": window_ms})


@routes.get("/v1/faults")
async def get_faults(request: web.Request) -> web.Response:
    check_params(request, ())
    return web.json_response(request.app[STATE].faults_json())


def _group_in(request: web.Request, body: dict[str, Any]) -> GroupState:
    """The group a body's ``group`` names, else the one the request is for (the sidecar's only one)."""
    name = body.get("group") or None
    return named_group(request.app[STATE], name) if name else group_of(request)


_RELEASE_FIELDS: dict[str, tuple[type, ...]] = {
    "group": (str,),
    "generation": (int,),
    "all": (bool,),
    **dict.fromkeys(REPORTED, (int, float)),
}


@routes.post("/v1/release")
async def release(request: web.Request) -> web.Response:
    """The application let go of every queue outside generation N's share (or of all of them)."""
    check_params(request, ())
    body = await json_body(request, _RELEASE_FIELDS)
    group = _group_in(request, body)
    generation = body.get("generation")
    if generation is None or generation < 0:
        raise ApiError(400, "field 'generation' is required: the generation whose share you now hold exactly")
    served = group.served
    if served is None:
        raise ApiError(503, f"no assignment received yet for group {group.resource!r}")
    if generation > served.generation:
        raise ApiError(
            409,
            f"generation {generation} is not served yet (this sidecar serves {served.generation}); "
            "release only what you have read",
        )
    try:
        reported = reported_steps(body)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    ack = group.ack_for(generation, bool(body.get("all")))
    group.acked = ack
    if not ack.absent:
        group.moves.released(generation, reported)
    answer: dict[str, Any] = {"group": group.resource, "generation": generation, "all": ack.all}
    recorder = request.app[RECORDER]
    if served.document.handover is HandoverMode.OFF:
        return web.json_response({**answer, "recorded": False, "reason": "handover is Off for this group"})
    if recorder is None:
        reason = "the assignment comes from a file: there is no API to record the release in"
        return web.json_response({**answer, "recorded": False, "reason": reason})
    try:
        await recorder.record(group.resource, ack)
    except KubeApiError as e:
        if e.status == 404:
            # The operator creates it before it publishes the first revocation: until then
            # nothing waits for a release.
            missing = releases_configmap_name(group.resource)
            reason = f"no ConfigMap {missing} yet: no revocation awaits a release"
            return web.json_response({**answer, "recorded": False, "reason": reason})
        raise ApiError(503, f"the release could not be recorded ({e}); try again") from None
    group.moves.recorded(generation)
    group.wake()
    return web.json_response({**answer, "recorded": True})


_TRACE_FIELDS: dict[str, tuple[type, ...]] = {
    "group": (str,),
    "generation": (int,),
    "pulledMs": (int, float),
    "consumedMs": (int, float),
}


@routes.post("/v1/trace")
async def trace(request: web.Request) -> web.Response:
    """The application's steps of a move that only it sees: its first pull and its first consumption
    of what it gained."""
    check_params(request, ())
    body = await json_body(request, _TRACE_FIELDS)
    group = _group_in(request, body)
    generation = body.get("generation")
    if generation is None or generation < 0:
        raise ApiError(400, "field 'generation' is required: the generation whose move you timed")
    try:
        reported = reported_steps(body, ("pulledMs", "consumedMs"))
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    if "consumedMs" not in reported:
        raise ApiError(400, "field 'consumedMs' is required: milliseconds from reading the generation")
    traced = group.moves.consumed(generation, reported["consumedMs"], reported.get("pulledMs"))
    return web.json_response({"group": group.resource, "generation": generation, "traced": traced})


@routes.get("/v1/drain")
async def drain(request: web.Request) -> web.Response:
    """Wait until this pod has nothing left to hand over (a preStop hook), at most ``timeout`` seconds."""
    check_params(request, ("group", "timeout"))
    group = group_of(request)
    text = request.query.get("timeout", "30")
    timeout = finite_number(text)
    max_wait = request.app[CONFIG].max_wait
    if timeout is None or not 0 <= timeout <= max_wait:
        raise ApiError(400, f"timeout must be a number of seconds from 0 to {max_wait:g}, got {text!r}")
    drained = await group.wait_drained(timeout)
    served = group.served
    return web.json_response(
        {"group": group.resource, "drained": drained, "generation": served.generation if served else None}
    )


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    missing = state.missing_groups()
    if missing:
        raise ApiError(503, f"no assignment received yet for group(s) {', '.join(missing)}")
    return web.json_response(
        {
            "status": "ready",
            "generations": {g: s.served.generation for g, s in state.groups.items() if s.served},
        }
    )


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return _json_bytes(request.app[OPENAPI])
