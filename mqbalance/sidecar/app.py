"""The sidecar's HTTP API (documented in ``openapi.json``) and its metrics endpoint.

Every 4xx and 5xx answer is ``{"error": "...", "status": N}`` with a message that
names the problem, whichever layer raised it (a handler, the router, aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mqbalance.contract import Ack, HandoverMode, releases_configmap_name
from mqbalance.kube import ApiError as KubeApiError
from mqbalance.model import MessageQueue
from mqbalance.producer import KeySelector, NoWritableQueueError, QueueSelector, wall_ms
from mqbalance.sidecar.config import SidecarConfig
from mqbalance.sidecar.state import GroupState, RouteEntry, Served, SidecarState, route_json
from mqbalance.sidecar.watch import AckRecorder, AssignmentSource

log = logging.getLogger(__name__)

STATE = web.AppKey("state", SidecarState)
CONFIG = web.AppKey("config", SidecarConfig)
RECORDER: web.AppKey[AckRecorder | None] = web.AppKey("recorder")
SOURCE_TASK: web.AppKey[asyncio.Task[None]] = web.AppKey("source_task")
OPENAPI = web.AppKey("openapi", bytes)

JAVA_LONG_MAX = 2**63 - 1
DEFAULT_WAIT = 30.0
"""Long-poll timeout when ``after`` is given without ``timeout``."""
ROUND_ROBIN = "round_robin"
SELECTORS = (ROUND_ROBIN, *(s.value for s in KeySelector))
JSON = "application/json"


class ApiError(Exception):
    """An answer other than success, with the message the client sees."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if isinstance(e, web.HTTPNotFound):
            message = f"no endpoint {request.method} {request.path}; the API is described at /openapi.json"
        elif isinstance(e, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(e.allowed_methods))
            message = f"method {e.method} is not allowed on {request.path}; use {allowed}"
            return error_response(e.status, message, {"Allow": ",".join(sorted(e.allowed_methods))})
        else:
            message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
        return error_response(e.status, message)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(e).__name__}: {e}")


routes = web.RouteTableDef()


# -- helpers ---------------------------------------------------------------------


def _json_bytes(body: bytes) -> web.Response:
    return web.Response(body=body, content_type=JSON)


def _check_params(request: web.Request, allowed: tuple[str, ...]) -> None:
    if not request.query_string:
        return
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        known = ", ".join(allowed) if allowed else "none"
        raise ApiError(400, f"unknown query parameter(s) {', '.join(unknown)}; known: {known}")


def _group(request: web.Request) -> GroupState:
    state = request.app[STATE]
    name = request.query.get("group")
    if name is None:
        if len(state.groups) > 1:
            raise ApiError(
                400, f"several groups are served ({', '.join(state.groups)}); name one with ?group=NAME"
            )
        name = state.default_group
    group = state.groups.get(name)
    if group is None:
        raise ApiError(404, f"group {name!r} is not served here; served: {', '.join(state.groups)}")
    return group


def _long_poll(request: web.Request) -> tuple[int, float] | None:
    """(after, timeout) of a long-poll, or None for an immediate answer."""
    after_text = request.query.get("after")
    timeout_text = request.query.get("timeout")
    if after_text is None:
        if timeout_text is not None:
            raise ApiError(400, "timeout needs after: pass ?after=GENERATION&timeout=SECONDS")
        return None
    try:
        after = int(after_text)
    except ValueError:
        raise ApiError(400, f"after must be an integer generation (-1 for any), got {after_text!r}") from None
    if after < -1:
        raise ApiError(400, f"after must be -1 or more, got {after}")
    max_wait = request.app[CONFIG].max_wait
    if timeout_text is None:
        return after, min(DEFAULT_WAIT, max_wait)
    timeout = _number(timeout_text)
    if timeout is None or not 0 <= timeout <= max_wait:
        raise ApiError(
            400, f"timeout must be a number of seconds from 0 to {max_wait:g}, got {timeout_text!r}"
        )
    return after, timeout


def _number(value: str | float) -> float | None:
    """``value`` as a finite float, or None (JSON integers may be too large for a float)."""
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


async def _served(request: web.Request) -> Served:
    return (await _group_served(request))[1]


async def _group_served(request: web.Request) -> tuple[GroupState, Served]:
    if not request.query_string:
        # The hot path: no group to pick, no long-poll, nothing to validate.
        state = request.app[STATE]
        if len(state.groups) == 1:
            only = state.groups[state.default_group]
            if (served := only.served) is not None:
                return only, served
    else:
        _check_params(request, ("group", "after", "timeout"))
    group = _group(request)
    poll = _long_poll(request)
    served = group.served if poll is None else await group.wait_change(*poll)
    if served is None:
        raise ApiError(
            503,
            f"no assignment received yet for group {group.resource!r} "
            "(is the operator running and the ConfigMap published?)",
        )
    return group, served


async def _body(request: web.Request, fields: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """The request's JSON object; fields and their types checked, unknown ones refused."""
    raw = await request.read()
    if raw == b"{}" or not raw or raw.isspace():
        # {} is what a plain send posts: nothing to parse or check.
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if unknown := body.keys() - fields.keys():
        known = ", ".join(fields)
        raise ApiError(400, f"unknown field(s) {', '.join(sorted(unknown))}; known: {known}")
    for name, value in body.items():
        types = fields[name]
        # bool is an int in Python; JSON true is not a latency.
        if value is not None and (
            not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        ):
            expected = " or ".join(_JSON_TYPES[t] for t in types)
            raise ApiError(400, f"field {name!r} must be {expected}, got {json.dumps(value)}")
    return body


_JSON_TYPES = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def _route_of(request: web.Request) -> RouteEntry:
    state = request.app[STATE]
    topic = request.match_info["topic"]
    found = state.route_entry(topic)
    if found is None:
        config = request.app[CONFIG]
        if not config.watch_topics:
            hint = "the sidecar runs with --no-topics, so it knows no routes"
        else:
            known = ", ".join(state.topic_names()) or "none"
            hint = f"no Topic resource in namespace {config.namespace!r} has that topic name (known: {known})"
        raise ApiError(404, f"no route for topic {topic!r}: {hint}")
    return found


# -- handlers --------------------------------------------------------------------


@routes.get("/v1/queues")
async def get_queues(request: web.Request) -> web.Response:
    group, served = await _group_served(request)
    return _json_bytes(group.queues_body(served))


@routes.get("/v1/assignment")
async def get_assignment(request: web.Request) -> web.Response:
    return _json_bytes((await _served(request)).assignment_body)


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
    _check_params(request, ())
    body = await _body(request, _SELECT_FIELDS)
    entry = _route_of(request)
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
    _check_params(request, ())
    entry = _route_of(request)
    return web.json_response(route_json(entry.resource, entry.route))


@routes.post("/v1/sends")
async def report_send(request: web.Request) -> web.Response:
    _check_params(request, ())
    body = await _body(
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
        raw_latency if isinstance(raw_latency, int) else None if raw_latency is None else _number(raw_latency)
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
    _check_params(request, ())
    return web.json_response(request.app[STATE].faults_json())


_RELEASE_FIELDS: dict[str, tuple[type, ...]] = {"group": (str,), "generation": (int,), "all": (bool,)}


@routes.post("/v1/release")
async def release(request: web.Request) -> web.Response:
    """The application let go of every queue outside generation N's share (or of all of them)."""
    _check_params(request, ())
    body = await _body(request, _RELEASE_FIELDS)
    state = request.app[STATE]
    name = body.get("group") or None
    group = state.groups.get(name) if name else _group(request)
    if group is None:
        raise ApiError(404, f"group {name!r} is not served here; served: {', '.join(state.groups)}")
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
    ack = Ack(generation, bool(body.get("all")))
    group.acked = ack
    answer: dict[str, Any] = {"group": group.resource, "generation": generation, "all": ack.all}
    recorder = request.app[RECORDER]
    if served.document.handover == HandoverMode.OFF:
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
    group.wake()
    return web.json_response({**answer, "recorded": True})


@routes.get("/v1/drain")
async def drain(request: web.Request) -> web.Response:
    """Wait until this pod has nothing left to hand over (a preStop hook), at most ``timeout`` seconds."""
    _check_params(request, ("group", "timeout"))
    group = _group(request)
    text = request.query.get("timeout", "30")
    timeout = _number(text)
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


# -- factories -------------------------------------------------------------------


def load_openapi() -> bytes:
    return resources.files("mqbalance.sidecar").joinpath("openapi.json").read_bytes()


def create_app(
    config: SidecarConfig,
    *,
    source: AssignmentSource | None,
    state: SidecarState | None = None,
    recorder: AckRecorder | None = None,
) -> web.Application:
    """The API application; ``source`` feeds it in the background while it runs."""
    if state is None:
        # Wall-clock milliseconds, as RocketMQ's System.currentTimeMillis: isolatedUntilMs is unix ms.
        selector = QueueSelector(
            generation=config.fault_table.generation, fault_tolerance=config.fault_tolerance, clock=wall_ms
        )
        state = SidecarState(config.pod_name, config.groups, selector)
    app = web.Application(middlewares=[json_errors], client_max_size=64 * 1024)
    app[CONFIG] = config
    app[STATE] = state
    app[RECORDER] = recorder
    app[OPENAPI] = load_openapi()
    app.add_routes(routes)
    # aiohttp waits for running handlers after on_shutdown: long-polls must not hold a stopping
    # pod until they time out.
    app.on_shutdown.append(_stop_waiting)
    if source is not None:
        app.cleanup_ctx.append(_run_source(source))
    return app


async def _stop_waiting(app: web.Application) -> None:
    app[STATE].stop_waiting()


def _run_source(source: AssignmentSource) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(source.run(app[STATE]), name="assignment-source")
        app[SOURCE_TASK] = task
        yield
        task.cancel()
        # A failure was already reported by whoever watched the task; shutdown goes on.
        await asyncio.gather(task, return_exceptions=True)

    return ctx


def create_metrics_app(state: SidecarState) -> web.Application:
    """``/metrics`` for Prometheus, on its own port."""
    registry = state.metrics.registry

    async def metrics(request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/metrics", metrics)
    return app
